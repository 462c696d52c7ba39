//! Where a task runs: `<work_dir>/sandboxes/<framework_id>/<task_id>/<run>`.
//!
//! Ids come from frameworks over the network, so they are escaped before they become path
//! components: a task id like `../../etc` must never leave the sandbox tree.
//!
//! Every launch gets a fresh run directory (as Mesos' `runs/<container-id>`): a task id that
//! is launched again never finds what an earlier run left, such as a `stdout` replaced by a
//! symlink. Everything above the run directory (`sandboxes`, the framework's and the task's
//! directories) is the agent's own (0711), so a task cannot replace a path component the agent
//! walks; the run directory is created empty by the agent and handed to the task's user by its
//! descriptor, and the task creates its `stdout` and `stderr` there itself.
//!
//! [`stderr_tail`] reads the end of a task's `stderr` for the status message of a task that
//! failed, without trusting what the task may have put in its sandbox in its place.

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::os::fd::{AsRawFd as _, FromRawFd as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// At most this many lines of a task's `stderr` go into its status message.
pub const STDERR_TAIL_LINES: usize = 10;
/// At most this many bytes are read from the end of a task's `stderr`.
pub const STDERR_TAIL_BYTES: u64 = 2048;

/// Escapes an id into one safe path component. Letters, digits, `-`, `_` and `.` stay as they
/// are, except a leading `.` (no `.`, `..` or hidden names); every other byte becomes `%XX`.
/// The empty id becomes `%`, which no non-empty id escapes to. Distinct ids stay distinct.
pub fn escape_component(id: &str) -> String {
    if id.is_empty() {
        return "%".to_string();
    }
    let mut out = String::with_capacity(id.len());
    for (i, byte) in id.bytes().enumerate() {
        let plain = byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' || byte == b'.';
        if plain && !(i == 0 && byte == b'.') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The directory of one task's runs (not created).
pub fn sandbox_dir(work_dir: &Path, framework_id: &str, task_id: &str) -> PathBuf {
    work_dir
        .join(SANDBOXES)
        .join(escape_component(framework_id))
        .join(escape_component(task_id))
}

/// The sandboxes' directory under the work dir.
pub const SANDBOXES: &str = "sandboxes";

/// The run directory of one run of a task (not created).
pub fn run_dir(work_dir: &Path, framework_id: &str, task_id: &str, run: &str) -> PathBuf {
    sandbox_dir(work_dir, framework_id, task_id).join(run)
}

/// True for a run's name as [`create_run`] makes them: digits, then optionally `-` and digits.
pub fn is_run_name(name: &str) -> bool {
    let (ms, n) = name.split_once('-').unwrap_or((name, "0"));
    !ms.is_empty()
        && !n.is_empty()
        && ms.bytes().all(|b| b.is_ascii_digit())
        && n.bytes().all(|b| b.is_ascii_digit())
}

fn cpath(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt as _;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a path"))
}

/// Opens a directory without following a symlink in its last component.
fn open_dir_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
}

/// Makes `path` a directory of the agent's own with `mode`, creating it when missing. A
/// directory that is not the agent's (a sandbox of an older agent, which belonged to the task's
/// user) is moved aside as `NAME%legacy-MS` (a name no escaped id takes), left for the garbage
/// collector, and a fresh one is made.
fn own_dir(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for _ in 0..3 {
        match std::fs::DirBuilder::new().mode(mode).create(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let meta = std::fs::symlink_metadata(path)?;
        if meta.is_dir() && meta.uid() == me {
            if meta.permissions().mode() & 0o7777 != mode {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            }
            return Ok(());
        }
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::other("no name"))?
            .to_string_lossy()
            .into_owned();
        let aside = path.with_file_name(format!("{name}%legacy-{}", crate::updates::unix_ms()));
        tracing::warn!(path = %path.display(), aside = %aside.display(),
            "a sandbox directory not owned by the agent (an older agent's?) moved aside");
        std::fs::rename(path, &aside)?;
    }
    Err(io::Error::other(format!(
        "{} keeps being replaced",
        path.display()
    )))
}

/// Creates a fresh run directory for a task and hands it to `owner` (uid, gid) by its
/// descriptor: `(run name, path)`. The run's name is the time in ms (and `-N` when taken).
pub fn create_run(
    work_dir: &Path,
    framework_id: &str,
    task_id: &str,
    owner: Option<(u32, u32)>,
    now_ms: u64,
) -> io::Result<(String, PathBuf)> {
    std::fs::create_dir_all(work_dir)?;
    let sandboxes = work_dir.join(SANDBOXES);
    own_dir(&sandboxes, 0o711)?;
    let framework = sandboxes.join(escape_component(framework_id));
    own_dir(&framework, 0o711)?;
    let task = framework.join(escape_component(task_id));
    own_dir(&task, 0o711)?;
    let task_dir = open_dir_nofollow(&task)?;
    for n in 0..1000u32 {
        let run = if n == 0 {
            format!("{now_ms:013}")
        } else {
            format!("{now_ms:013}-{n}")
        };
        let name = cpath(Path::new(&run))?;
        // SAFETY: a valid descriptor and NUL-terminated name.
        let r = unsafe { libc::mkdirat(task_dir.as_raw_fd(), name.as_ptr(), 0o700) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::AlreadyExists {
                continue;
            }
            return Err(e);
        }
        let path = task.join(&run);
        if let Some((uid, gid)) = owner {
            let dir = open_dir_nofollow(&path)?;
            std::os::unix::fs::fchown(&dir, Some(uid), Some(gid))?;
        }
        return Ok((run, path));
    }
    Err(io::Error::other("no free run name"))
}

/// The newest run of a task (by name), or `None` without one.
pub fn latest_run(work_dir: &Path, framework_id: &str, task_id: &str) -> Option<String> {
    std::fs::read_dir(sandbox_dir(work_dir, framework_id, task_id))
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| is_run_name(name))
        .max_by(|a, b| run_order(a).cmp(&run_order(b)))
}

/// The directory of a task's newest run, or (without one) the task's directory: where its
/// output is (tests and tools; the agent itself knows each task's run).
pub fn latest_run_dir(work_dir: &Path, framework_id: &str, task_id: &str) -> PathBuf {
    match latest_run(work_dir, framework_id, task_id) {
        Some(run) => run_dir(work_dir, framework_id, task_id, &run),
        None => sandbox_dir(work_dir, framework_id, task_id),
    }
}

fn run_order(name: &str) -> (u64, u64) {
    let (ms, n) = name.split_once('-').unwrap_or((name, "0"));
    (ms.parse().unwrap_or(0), n.parse().unwrap_or(0))
}

/// The last lines of `<sandbox>/stderr` (see [`tail_text`]; at most [`STDERR_TAIL_LINES`]
/// lines from the last [`STDERR_TAIL_BYTES`] bytes), or `None` when it is absent, empty,
/// unreadable or not to be trusted. The task owns its sandbox and could have put a symlink, a
/// FIFO or a hard link to another user's file there: only a regular file, opened without
/// following a symlink and owned by the sandbox's owner, is read.
pub fn stderr_tail(sandbox: &Path) -> Option<String> {
    let file = open_output(sandbox, "stderr").ok()?;
    let (bytes, cut) = read_tail(file, STDERR_TAIL_BYTES).ok()?;
    let tail = tail_text(&bytes, cut, STDERR_TAIL_LINES);
    (!tail.is_empty()).then_some(tail)
}

/// Opens `<sandbox>/<name>` (a task's `stdout` or `stderr`) for reading without trusting the
/// task, which owns its sandbox: the sandbox must be a directory (not a symlink); the file is
/// opened without following a symlink and without blocking on a FIFO, and must be a regular
/// file owned by the sandbox's owner with one link only (a hard link to a file of the agent's
/// own user, e.g. a secret in its work dir, is refused even when the task runs as that user).
pub fn open_output(sandbox: &Path, name: &str) -> io::Result<File> {
    let refuse = |why: &str| io::Error::new(io::ErrorKind::PermissionDenied, why.to_string());
    // Walked by descriptor: the directory opened without following a symlink, the file
    // opened beneath it without following one either.
    let dir_file = match open_dir_nofollow(sandbox) {
        Ok(dir) => dir,
        Err(e)
            if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            return Err(refuse("the sandbox is not a directory"))
        }
        Err(e) => return Err(e),
    };
    let dir = dir_file.metadata()?;
    if name.contains('/') || name.is_empty() || name == "." || name == ".." {
        return Err(refuse("not a file name"));
    }
    let cname = cpath(Path::new(name))?;
    // SAFETY: a valid descriptor and NUL-terminated name; the result is checked.
    let fd = unsafe {
        libc::openat(
            dir_file.as_raw_fd(),
            cname.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refuse("not a regular file"));
    }
    if meta.uid() != dir.uid() {
        return Err(refuse("not owned by the sandbox's owner"));
    }
    if meta.nlink() != 1 {
        return Err(refuse("the file has other hard links"));
    }
    Ok(file)
}

/// The last `max_bytes` bytes of `file` (never more, whatever its size), and whether anything
/// came before them.
fn read_tail(mut file: File, max_bytes: u64) -> io::Result<(Vec<u8>, bool)> {
    let len = file.metadata()?.len();
    let start = len.saturating_sub(max_bytes);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(max_bytes).read_to_end(&mut bytes)?;
    Ok((bytes, start > 0))
}

/// The last `max_lines` lines of `bytes`, the end of some output (`cut`: the output went on
/// before `bytes`, so their first line may be partial and is dropped when a whole line
/// follows; `…` marks what is left of a cut line). Invalid UTF-8 becomes U+FFFD, a carriage
/// return (alone or before a line feed) a line break, other control characters (escape
/// sequences) U+FFFD; blank lines at either end are dropped. Empty when nothing visible is
/// left.
pub fn tail_text(bytes: &[u8], cut: bool, max_lines: usize) -> String {
    let mut bytes = bytes;
    let mut partial = cut;
    if cut {
        if let Some(newline) = bytes.iter().position(|&b| b == b'\n') {
            let rest = &bytes[newline + 1..];
            if rest.iter().any(|b| !b.is_ascii_whitespace()) {
                bytes = rest;
                partial = false;
            }
        }
    }
    let text: String = String::from_utf8_lossy(bytes)
        .replace("\r\n", "\n")
        .chars()
        .map(|c| match c {
            '\r' => '\n',
            '\n' | '\t' => c,
            c if c.is_control() => char::REPLACEMENT_CHARACTER,
            c => c,
        })
        .collect();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .skip_while(|line| line.is_empty())
        .collect();
    let end = lines
        .iter()
        .rposition(|line| !line.is_empty())
        .map_or(0, |i| i + 1);
    let start = end.saturating_sub(max_lines);
    let tail = lines[start..end].join("\n");
    if partial && start == 0 && !tail.is_empty() {
        format!("…{tail}")
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Component;

    fn tail_of(content: &[u8]) -> Option<String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stderr"), content).unwrap();
        stderr_tail(dir.path())
    }

    #[test]
    fn tail_of_empty_missing_and_short_files() {
        assert_eq!(tail_of(b""), None);
        assert_eq!(tail_of(b"\n \n\t\n"), None);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(stderr_tail(dir.path()), None, "no stderr file");
        assert_eq!(stderr_tail(&dir.path().join("absent")), None);
        assert_eq!(tail_of(b"no newline").as_deref(), Some("no newline"));
        assert_eq!(
            tail_of(b"\nfirst\n\nthird\n\n").as_deref(),
            Some("first\n\nthird")
        );
    }

    #[test]
    fn only_the_last_lines_are_kept() {
        let text: String = (1..=25).map(|i| format!("line {i}\n")).collect();
        let tail = tail_of(text.as_bytes()).unwrap();
        let want: Vec<String> = (16..=25).map(|i| format!("line {i}")).collect();
        assert_eq!(tail, want.join("\n"));
        assert_eq!(tail_text(b"a\nb\nc", false, 0), "");
        assert_eq!(tail_text(b"a\nb\nc", false, 2), "b\nc");
    }

    #[test]
    fn a_huge_file_is_read_from_its_end_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stderr");
        // 64 MiB of one endless line, then two short ones; sparse, so cheap to write.
        let file = File::create(&path).unwrap();
        file.set_len(64 << 20).unwrap();
        drop(file);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        io::Write::write_all(&mut file, b"\nsecond to last\nlast\n").unwrap();
        drop(file);
        let (bytes, cut) = read_tail(File::open(&path).unwrap(), STDERR_TAIL_BYTES).unwrap();
        assert_eq!(bytes.len() as u64, STDERR_TAIL_BYTES);
        assert!(cut);
        // The NULs of the cut line are dropped with it.
        assert_eq!(
            stderr_tail(dir.path()).as_deref(),
            Some("second to last\nlast")
        );
        // One line longer than the bytes read: what is left of it, marked as cut.
        let long = "x".repeat(5000);
        let tail = tail_of(long.as_bytes()).unwrap();
        assert_eq!(tail, format!("…{}", "x".repeat(STDERR_TAIL_BYTES as usize)));
        // A cut line followed only by blank lines is kept.
        assert_eq!(tail_text(b"end of it\n\n", true, 10), "…end of it");
    }

    #[test]
    fn binary_and_control_characters_are_made_safe() {
        let tail = tail_of(b"ok \xff\xfe bytes\n\x1b[31mred\x1b[0m\r\nbell\x07\n").unwrap();
        assert_eq!(
            tail,
            "ok \u{FFFD}\u{FFFD} bytes\n\u{FFFD}[31mred\u{FFFD}[0m\nbell\u{FFFD}"
        );
        // A multi-byte character cut by the start of the read does not survive as garbage.
        let mut bytes = "é".repeat(1500).into_bytes();
        bytes.extend_from_slice(b"\ntail\n");
        assert_eq!(tail_of(&bytes).as_deref(), Some("tail"));
        let progress = tail_of(b"10%\r50%\r100%\n").unwrap();
        assert_eq!(progress, "10%\n50%\n100%");
    }

    #[test]
    fn a_symlink_or_fifo_in_place_of_stderr_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "top secret\n").unwrap();
        let sandbox = dir.path().join("box");
        std::fs::create_dir(&sandbox).unwrap();
        std::os::unix::fs::symlink(&secret, sandbox.join("stderr")).unwrap();
        assert_eq!(stderr_tail(&sandbox), None);
        std::fs::remove_file(sandbox.join("stderr")).unwrap();
        let fifo =
            std::ffi::CString::new(sandbox.join("stderr").into_os_string().into_encoded_bytes())
                .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(
            stderr_tail(&sandbox),
            None,
            "a FIFO must neither block nor be read"
        );
        std::fs::remove_file(sandbox.join("stderr")).unwrap();
        std::fs::create_dir(sandbox.join("stderr")).unwrap();
        assert_eq!(stderr_tail(&sandbox), None);
    }

    #[test]
    fn a_hard_link_in_place_of_stderr_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "top secret\n").unwrap();
        let sandbox = dir.path().join("box");
        std::fs::create_dir(&sandbox).unwrap();
        std::fs::hard_link(&secret, sandbox.join("stderr")).unwrap();
        assert_eq!(stderr_tail(&sandbox), None);
        let error = open_output(&sandbox, "stderr").unwrap_err();
        assert!(error.to_string().contains("hard links"), "{error}");
    }

    #[test]
    fn a_sandbox_that_is_a_symlink_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("stdout"), "out\n").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(open_output(&real, "stdout").is_ok());
        assert!(open_output(&link, "stdout").is_err());
    }

    #[test]
    fn plain_ids_are_kept() {
        assert_eq!(escape_component("web-1_a.b"), "web-1_a.b");
        assert_eq!(
            sandbox_dir(Path::new("/w"), "fw", "t1"),
            PathBuf::from("/w/sandboxes/fw/t1")
        );
    }

    #[test]
    fn hostile_ids_stay_inside_the_sandbox_tree() {
        for id in [
            "..",
            ".",
            "../../etc",
            "/abs",
            "a/b",
            ".hidden",
            "",
            "a b",
            "é",
        ] {
            let escaped = escape_component(id);
            let path = Path::new(&escaped);
            let components: Vec<_> = path.components().collect();
            assert_eq!(components.len(), 1, "{id:?} -> {escaped:?}");
            assert!(
                matches!(components[0], Component::Normal(_)),
                "{id:?} -> {escaped:?}"
            );
            assert!(!escaped.starts_with('.'), "{id:?} -> {escaped:?}");
        }
        assert_eq!(escape_component("../x"), "%2E.%2Fx");
        assert_eq!(escape_component(""), "%");
        assert_ne!(escape_component("a/b"), escape_component("a%2Fb"));
    }
}
