//! Sandbox garbage collection, after Mesos' `--gc_delay` and `--disk_watermark_gc`.
//!
//! A run's sandbox (and its meta directory) is kept for `--sandbox-gc-delay` after the master
//! acknowledged the task's terminal update, so its output can still be read; then it is
//! removed. When the work dir's file system is fuller than `--disk-watermark`, the sandboxes
//! waiting for collection go at once, oldest first, until it is not. A sandbox of a task that
//! runs, or whose end the master has not acknowledged, is never scheduled. Runs the agent
//! finds without a record at startup (an older agent's layout, a run whose record was never
//! written) are scheduled as if acknowledged then.
//!
//! [`Collector`] decides (pure: times and disk use come in as arguments); [`remove`] does the
//! file-system work, which the session runs off its loop. Removal never follows a symlink a
//! task left in its sandbox (`std::fs::remove_dir_all` works by descriptor, beneath the
//! directory it removes).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One sandbox waiting for collection.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// When its task's end was acknowledged (ms since the epoch); the order of collection.
    pub acked_ms: u64,
    /// The run's sandbox.
    pub run_dir: PathBuf,
    /// The run's meta directory, when it has one.
    pub meta_dir: Option<PathBuf>,
}

/// The sandboxes waiting for collection.
#[derive(Debug, Default)]
pub struct Collector {
    entries: BTreeSet<Entry>,
}

/// How full the work dir's file system is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskSpace {
    /// Bytes an unprivileged writer may still use.
    pub available: u64,
    /// Bytes free, the blocks reserved for root included.
    pub free: u64,
    pub total: u64,
}

impl DiskSpace {
    /// The fraction in use, 0 to 1, as `df` shows it: what is used over what is used plus
    /// what an unprivileged writer may still use. Blocks reserved for root count on neither
    /// side (a file system that reserves much, 60% on some machines, is not "full" because
    /// of it).
    pub fn used(&self) -> f64 {
        let used = self.total.saturating_sub(self.free);
        let usable = used.saturating_add(self.available);
        if usable == 0 {
            return 0.0;
        }
        (used as f64 / usable as f64).min(1.0)
    }
}

impl Collector {
    pub fn schedule(&mut self, entry: Entry) {
        self.entries.insert(entry);
    }

    /// Sandboxes waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when `run_dir` waits for collection.
    pub fn contains(&self, run_dir: &Path) -> bool {
        self.entries.iter().any(|e| e.run_dir == run_dir)
    }

    /// The entries to remove now: those acknowledged at least `delay` before `now_ms`, and,
    /// while `disk` (the file system's use after removing what is taken so far, as the caller
    /// measures it) is above `watermark`, the oldest of the others. `disk` is asked once per
    /// entry taken for pressure; taking stops when it says `None`.
    pub fn due(
        &mut self,
        now_ms: u64,
        delay: Duration,
        watermark: f64,
        mut freed: impl FnMut(&[Entry]) -> Option<f64>,
    ) -> Vec<Entry> {
        let delay_ms = delay.as_millis().min(u64::MAX as u128) as u64;
        let mut taken: Vec<Entry> = Vec::new();
        while let Some(first) = self.entries.first() {
            if first.acked_ms.saturating_add(delay_ms) <= now_ms {
                taken.push(self.entries.pop_first().expect("a first entry"));
            } else {
                break;
            }
        }
        while !self.entries.is_empty() {
            match freed(&taken) {
                Some(used) if used > watermark => {
                    taken.push(self.entries.pop_first().expect("not empty"));
                }
                _ => break,
            }
        }
        taken
    }
}

/// Removes an entry's sandbox and meta directory (blocking file-system work). Returns the
/// bytes it could not remove as an error message, or `Ok`.
pub fn remove(entry: &Entry) -> Result<(), String> {
    let mut errors = Vec::new();
    for dir in [Some(&entry.run_dir), entry.meta_dir.as_ref()]
        .into_iter()
        .flatten()
    {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("{}: {e}", dir.display())),
        }
        // The task's and the framework's directories go once empty.
        let mut parent = dir.parent();
        for _ in 0..2 {
            match parent {
                Some(p) if std::fs::remove_dir(p).is_ok() => parent = p.parent(),
                _ => break,
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// The space left on the file system of `path` (`statvfs`).
pub fn disk_space(path: &Path) -> Option<DiskSpace> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a valid NUL-terminated path and an out-struct statvfs fills.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    let unit = stat.f_frsize as u64;
    Some(DiskSpace {
        available: (stat.f_bavail as u64).saturating_mul(unit),
        free: (stat.f_bfree as u64).saturating_mul(unit),
        total: (stat.f_blocks as u64).saturating_mul(unit),
    })
}

/// The run sandboxes (and other leftovers) under `<work_dir>/sandboxes` that are not in
/// `known`: runs without a record, and what an older agent left (a task directory that holds
/// files instead of runs, a directory moved aside as `…%legacy-…`).
pub fn orphans(work_dir: &Path, known: &BTreeSet<PathBuf>) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let list = |dir: &Path| -> Vec<(PathBuf, bool)> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| {
                        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
                        (e.path(), is_dir)
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    for (framework, is_dir) in list(&work_dir.join(crate::sandbox::SANDBOXES)) {
        if !is_dir {
            continue;
        }
        for (task, is_dir) in list(&framework) {
            if !is_dir {
                continue;
            }
            let name = task.file_name().map(|n| n.to_string_lossy().into_owned());
            let entries = list(&task);
            let legacy = name.as_deref().is_some_and(|n| n.contains("%legacy-"))
                || entries.iter().any(|(path, is_dir)| {
                    !is_dir
                        || !path
                            .file_name()
                            .is_some_and(|n| crate::sandbox::is_run_name(&n.to_string_lossy()))
                });
            if legacy {
                found.push(task);
                continue;
            }
            for (run, _) in entries {
                if !known.contains(&run) {
                    found.push(run);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(acked_ms: u64, name: &str) -> Entry {
        Entry {
            acked_ms,
            run_dir: PathBuf::from(name),
            meta_dir: None,
        }
    }

    #[test]
    fn entries_go_after_the_delay_oldest_first() {
        let mut gc = Collector::default();
        gc.schedule(entry(2_000, "b"));
        gc.schedule(entry(1_000, "a"));
        gc.schedule(entry(9_000, "c"));
        let delay = Duration::from_secs(5);
        assert!(gc.due(5_999, delay, 0.9, |_| Some(0.1)).is_empty());
        let due = gc.due(7_000, delay, 0.9, |_| Some(0.1));
        assert_eq!(due, vec![entry(1_000, "a"), entry(2_000, "b")]);
        assert_eq!(gc.len(), 1);
        assert!(gc.contains(Path::new("c")));
    }

    #[test]
    fn above_the_watermark_the_oldest_go_at_once_until_below() {
        let mut gc = Collector::default();
        for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
            gc.schedule(entry(1_000 * (i as u64 + 1), name));
        }
        // Every removal frees 5 %: from 0.97 it takes two to get to 0.87.
        let due = gc.due(0, Duration::from_secs(3600), 0.9, |taken| {
            Some(0.97 - 0.05 * taken.len() as f64)
        });
        assert_eq!(due, vec![entry(1_000, "a"), entry(2_000, "b")]);
        // A disk that cannot be measured takes nothing early.
        assert!(gc
            .due(0, Duration::from_secs(3600), 0.9, |_| None)
            .is_empty());
    }

    #[test]
    fn removal_does_not_follow_links_a_task_left() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let run = dir.path().join("sandboxes/fw/t/1");
        std::fs::create_dir_all(&run).unwrap();
        std::os::unix::fs::symlink(&outside, run.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.join("keep"), run.join("file")).unwrap();
        remove(&entry(0, run.to_str().unwrap())).unwrap();
        assert!(!run.exists());
        assert!(outside.join("keep").exists());
        // The empty task and framework directories went with it.
        assert!(!dir.path().join("sandboxes/fw").exists());
        assert!(dir.path().join("sandboxes").exists());
    }

    #[test]
    fn orphans_are_runs_without_records_and_old_layouts() {
        let dir = tempfile::tempdir().unwrap();
        let s = dir.path().join("sandboxes");
        for d in ["fw/t/1", "fw/t/2", "fw/old", "fw/u%legacy-5/x"] {
            std::fs::create_dir_all(s.join(d)).unwrap();
        }
        std::fs::write(s.join("fw/old/stdout"), "").unwrap();
        let known: BTreeSet<PathBuf> = [s.join("fw/t/1")].into();
        let mut found = orphans(dir.path(), &known);
        found.sort();
        assert_eq!(
            found,
            vec![s.join("fw/old"), s.join("fw/t/2"), s.join("fw/u%legacy-5")]
        );
    }

    /// Before, the fraction was 1 − available/total: on a file system with many reserved
    /// blocks (this one: 252 GB, 72 GB used, 20 GB available to users) it read 0.92, above
    /// the 0.9 watermark, and every ended sandbox was collected at once.
    #[test]
    fn reserved_blocks_do_not_count_as_used() {
        let gb = 1u64 << 30;
        let space = DiskSpace {
            available: 20 * gb,
            free: 180 * gb,
            total: 252 * gb,
        };
        assert!(
            (space.used() - 72.0 / 92.0).abs() < 1e-9,
            "{}",
            space.used()
        );
        let full = DiskSpace {
            available: 0,
            free: 5 * gb,
            total: 100 * gb,
        };
        assert_eq!(full.used(), 1.0);
        let empty = DiskSpace {
            available: 0,
            free: 0,
            total: 0,
        };
        assert_eq!(empty.used(), 0.0);
    }

    #[test]
    fn disk_space_is_read() {
        let space = disk_space(Path::new("/")).unwrap();
        assert!(space.total > 0 && space.available <= space.total);
        assert!((0.0..=1.0).contains(&space.used()));
    }
}
