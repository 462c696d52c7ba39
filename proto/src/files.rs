//! Private files: the modes the master and the agent give what they keep in their work dirs.
//!
//! A work dir is created private ([`create_work_dir`]) and, at every start, what an earlier
//! version left looser is tightened ([`tighten_work_dir`]): group and other permission bits are
//! cleared from the directory and everything in it, never following a symbolic link (a link is
//! left alone and reported). Files written later go through [`write_private`] or
//! [`create_private`] (0600) so they never depend on the process umask, which tasks inherit and
//! which is therefore left alone. Nothing here logs: the caller logs each [`Change`] (this crate
//! has no logger).

use std::ffi::CString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// Mode of a file the master or the agent keeps for itself.
pub const PRIVATE_FILE_MODE: u32 = 0o600;
/// Mode of a directory the master or the agent keeps for itself (the master's work dir too).
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode of the agent's work dir: not listable by others, but traversable, so a task's user
/// reaches its own run directory by its path (`$RINGMASTER_SANDBOX`) through the agent's
/// 0711 `sandboxes/` parents.
pub const TRAVERSABLE_DIR_MODE: u32 = 0o711;

/// One thing [`tighten_work_dir`] did or left alone, for the caller to log.
#[derive(Debug)]
pub enum Change {
    /// Group or other bits were cleared.
    Tightened {
        path: PathBuf,
        old_mode: u32,
        new_mode: u32,
    },
    /// A symbolic link: neither it nor its target was touched.
    SymlinkLeftAlone { path: PathBuf },
    /// Neither a regular file nor a directory (a socket, a FIFO, a device): left alone.
    SpecialLeftAlone { path: PathBuf, old_mode: u32 },
    /// Could not be checked or changed; the rest was still done.
    Failed { path: PathBuf, error: io::Error },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Tightened {
                path,
                old_mode,
                new_mode,
            } => write!(
                f,
                "{} was mode {old_mode:04o}, open to group or others: now {new_mode:04o}",
                path.display()
            ),
            Change::SymlinkLeftAlone { path } => write!(
                f,
                "{} is a symbolic link: left alone (neither it nor its target is tightened)",
                path.display()
            ),
            Change::SpecialLeftAlone { path, old_mode } => write!(
                f,
                "{} (mode {old_mode:04o}) is not a regular file or directory: left alone",
                path.display()
            ),
            Change::Failed { path, error } => {
                write!(f, "cannot tighten the mode of {}: {error}", path.display())
            }
        }
    }
}

/// Creates `dir` (and missing parents) with `mode` (normally [`PRIVATE_DIR_MODE`]) when it is
/// missing. An existing directory keeps its mode: see [`tighten_work_dir`].
pub fn create_work_dir(dir: &Path, mode: u32) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
}

/// [`create_work_dir`], then [`tighten_work_dir`]: what the master and the agent do at start.
pub fn prepare_work_dir(dir: &Path, dir_mode: u32, skip: &[&str]) -> io::Result<Vec<Change>> {
    create_work_dir(dir, dir_mode)?;
    tighten_work_dir(dir, dir_mode, skip)
}

/// Clears group and other permission bits from `dir` (keeping those of `dir_mode`) and from
/// everything beneath it (files at most 0600, directories 0700: owner bits are kept, nothing is
/// loosened), except the top-level entries named in `skip` (the agent's `sandboxes`, whose
/// modes are deliberate). `dir` itself may be reached through a symbolic link (the operator
/// named it); beneath it nothing is followed: every entry is opened relative to its parent's
/// descriptor with `O_NOFOLLOW`, and links are reported, not touched. `dir` is tightened first,
/// so nobody else can swap its entries while they are walked.
///
/// Errors only when `dir` itself cannot be opened or tightened; a failure beneath it is a
/// [`Change::Failed`] and the walk goes on.
pub fn tighten_work_dir(dir: &Path, dir_mode: u32, skip: &[&str]) -> io::Result<Vec<Change>> {
    let top = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)?;
    let mut changes = Vec::new();
    let old_mode = top.metadata()?.permissions().mode() & 0o7777;
    let new_mode = old_mode & !(0o077 & !dir_mode);
    if new_mode != old_mode {
        top.set_permissions(std::fs::Permissions::from_mode(new_mode))?;
        changes.push(Change::Tightened {
            path: dir.to_path_buf(),
            old_mode,
            new_mode,
        });
    }
    walk(&top, dir, skip, &mut changes);
    Ok(changes)
}

fn walk(parent: &File, parent_path: &Path, skip: &[&str], changes: &mut Vec<Change>) {
    // The names are listed by path; every one is then opened beneath `parent`'s descriptor.
    let entries = match std::fs::read_dir(parent_path) {
        Ok(entries) => entries,
        Err(error) => {
            changes.push(Change::Failed {
                path: parent_path.to_path_buf(),
                error,
            });
            return;
        }
    };
    for entry in entries {
        let name = match entry {
            Ok(entry) => entry.file_name(),
            Err(error) => {
                changes.push(Change::Failed {
                    path: parent_path.to_path_buf(),
                    error,
                });
                continue;
            }
        };
        if skip.iter().any(|s| name.as_bytes() == s.as_bytes()) {
            continue;
        }
        let path = parent_path.join(&name);
        match tighten_entry(parent, &name, &path, changes) {
            Ok(Some(dir)) => walk(&dir, &path, &[], changes),
            Ok(None) => {}
            Err(error) => changes.push(Change::Failed { path, error }),
        }
    }
}

/// Tightens one entry of `parent`; its descriptor when it is a directory to descend into.
fn tighten_entry(
    parent: &File,
    name: &std::ffi::OsStr,
    path: &Path,
    changes: &mut Vec<Change>,
) -> io::Result<Option<File>> {
    let cname = CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a name"))?;
    // The type first, without following a link and without opening (a FIFO or device).
    // SAFETY: a valid descriptor, a NUL-terminated name and a zeroed stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::fstatat(
            parent.as_raw_fd(),
            cname.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let kind = st.st_mode & libc::S_IFMT;
    let old_mode = st.st_mode & 0o7777;
    if kind == libc::S_IFLNK {
        changes.push(Change::SymlinkLeftAlone {
            path: path.to_path_buf(),
        });
        return Ok(None);
    }
    if kind != libc::S_IFREG && kind != libc::S_IFDIR {
        if old_mode & 0o077 != 0 {
            changes.push(Change::SpecialLeftAlone {
                path: path.to_path_buf(),
                old_mode,
            });
        }
        return Ok(None);
    }
    let mut flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    if kind == libc::S_IFDIR {
        flags |= libc::O_DIRECTORY;
    }
    // SAFETY: a valid descriptor and a NUL-terminated name.
    let fd = unsafe { libc::openat(parent.as_raw_fd(), cname.as_ptr(), flags) };
    if fd < 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ELOOP) {
            // Replaced by a link since the look: still not followed.
            changes.push(Change::SymlinkLeftAlone {
                path: path.to_path_buf(),
            });
            return Ok(None);
        }
        return Err(error);
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    let meta = file.metadata()?;
    let is_dir = meta.is_dir();
    if !is_dir && !meta.is_file() {
        return Ok(None);
    }
    let old_mode = meta.permissions().mode() & 0o7777;
    let new_mode = old_mode & !0o077;
    if new_mode != old_mode {
        file.set_permissions(std::fs::Permissions::from_mode(new_mode))?;
        changes.push(Change::Tightened {
            path: path.to_path_buf(),
            old_mode,
            new_mode,
        });
    }
    Ok(is_dir.then_some(file))
}

/// Clears group and other bits of the file at `path` (not following a final symbolic link):
/// for a file another library created with the umask's mode (`registry.redb`). Returns the
/// old mode when it changed.
pub fn restrict_file(path: &Path) -> io::Result<Option<u32>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    restrict_open_file(&file)
}

fn restrict_open_file(file: &File) -> io::Result<Option<u32>> {
    let old_mode = file.metadata()?.permissions().mode() & 0o7777;
    let new_mode = old_mode & !0o077;
    if new_mode == old_mode {
        return Ok(None);
    }
    file.set_permissions(std::fs::Permissions::from_mode(new_mode))?;
    Ok(Some(old_mode))
}

/// Creates (or truncates) `path` for writing with mode 0600, not following a final symbolic
/// link; an existing file open to group or others is tightened first.
pub fn create_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    restrict_open_file(&file)?;
    Ok(file)
}

/// `std::fs::write` with mode 0600: see [`create_private`].
pub fn write_private(path: &Path, contents: impl AsRef<[u8]>) -> io::Result<()> {
    use std::io::Write as _;
    create_private(path)?.write_all(contents.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_new_work_dir_is_private_and_private_files_are_0600() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/work");
        let changes = prepare_work_dir(&dir, PRIVATE_DIR_MODE, &[]).unwrap();
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(mode(&dir), 0o700);
        write_private(&dir.join("f"), "x").unwrap();
        assert_eq!(mode(&dir.join("f")), 0o600);
        // An existing looser file is tightened when it is rewritten.
        std::fs::write(dir.join("g"), "x").unwrap();
        chmod(&dir.join("g"), 0o644);
        write_private(&dir.join("g"), "y").unwrap();
        assert_eq!(mode(&dir.join("g")), 0o600);
        assert_eq!(std::fs::read_to_string(dir.join("g")).unwrap(), "y");
    }

    #[test]
    fn tightening_clears_group_and_other_bits_beneath_without_following_links() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("work");
        std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
        std::fs::create_dir_all(dir.join("sandboxes/fw")).unwrap();
        std::fs::write(dir.join("registry"), "x").unwrap();
        std::fs::write(dir.join("sub/deeper/f"), "x").unwrap();
        std::fs::write(dir.join("sandboxes/fw/out"), "x").unwrap();
        let outside = root.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        for p in ["", "sub", "sub/deeper", "sandboxes", "sandboxes/fw"] {
            chmod(&dir.join(p), 0o755);
        }
        for p in ["registry", "sub/deeper/f", "sandboxes/fw/out"] {
            chmod(&dir.join(p), 0o644);
        }
        chmod(&dir.join("sub/deeper/f"), 0o775);
        chmod(&outside, 0o644);

        let changes = tighten_work_dir(&dir, TRAVERSABLE_DIR_MODE, &["sandboxes"]).unwrap();
        assert_eq!(mode(&dir), 0o711);
        assert_eq!(mode(&dir.join("registry")), 0o600);
        assert_eq!(mode(&dir.join("sub")), 0o700);
        assert_eq!(mode(&dir.join("sub/deeper")), 0o700);
        assert_eq!(mode(&dir.join("sub/deeper/f")), 0o700, "owner bits kept");
        // Skipped and linked-to things are untouched.
        assert_eq!(mode(&dir.join("sandboxes")), 0o755);
        assert_eq!(mode(&dir.join("sandboxes/fw/out")), 0o644);
        assert_eq!(mode(&outside), 0o644);
        let shown: Vec<String> = changes.iter().map(ToString::to_string).collect();
        let tightened = changes
            .iter()
            .filter(|c| matches!(c, Change::Tightened { .. }))
            .count();
        assert_eq!(tightened, 5, "{shown:#?}");
        assert!(
            shown.iter().any(|s| s.contains("registry was mode 0644")),
            "{shown:#?}"
        );
        assert!(
            shown
                .iter()
                .any(|s| s.contains("link is a symbolic link: left alone")),
            "{shown:#?}"
        );

        // A second start changes nothing, and never loosens a stricter directory.
        chmod(&dir, 0o700);
        let again = tighten_work_dir(&dir, TRAVERSABLE_DIR_MODE, &["sandboxes"]).unwrap();
        assert!(
            again
                .iter()
                .all(|c| matches!(c, Change::SymlinkLeftAlone { .. })),
            "{again:?}"
        );
        assert_eq!(mode(&dir), 0o700);
        let private = tighten_work_dir(&dir, PRIVATE_DIR_MODE, &[]).unwrap();
        assert!(private.iter().any(|c| c.to_string().contains("sandboxes")));
        assert_eq!(mode(&dir.join("sandboxes/fw/out")), 0o600);
    }

    #[test]
    fn restrict_file_does_not_follow_a_link() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("target");
        std::fs::write(&target, "x").unwrap();
        chmod(&target, 0o644);
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(restrict_file(&link).is_err());
        assert_eq!(mode(&target), 0o644);
        assert_eq!(restrict_file(&target).unwrap(), Some(0o644));
        assert_eq!(mode(&target), 0o600);
        assert_eq!(restrict_file(&target).unwrap(), None);
    }
}
