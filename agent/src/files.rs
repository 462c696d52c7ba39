//! Reading a task's output for the master (`ReadFile` → `FileData`, docs/protocol.md "Task
//! output"), after Mesos' `/files/read`: a window of `<sandbox>/stdout` or `<sandbox>/stderr`
//! given by offset and length, and the file's whole size, so a reader can follow the file.
//!
//! Any task the agent has a sandbox for is served, running or ended, from its newest run
//! ([`crate::sandbox::latest_run`]; a task that still runs has no newer one). The file is opened as
//! [`crate::sandbox::open_output`] opens it (no symlink, no FIFO, the sandbox owner's regular
//! file with one link), and at most [`MAX_READ_BYTES`] are read per request. Everything that
//! goes wrong becomes the answer's `error`, never a panic. The reads are blocking file I/O:
//! the session runs [`read`] on the blocking pool.

use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::path::Path;

use ringmaster_proto::{FileData, FileKind, ReadFile};

use crate::sandbox::{latest_run, open_output, run_dir};

/// The most bytes one `ReadFile` returns, whatever its `length`.
pub const MAX_READ_BYTES: u32 = 64 * 1024;

/// The file name in the sandbox of a `FileKind`.
pub fn file_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Stdout => "stdout",
        FileKind::Stderr => "stderr",
    }
}

/// Answers one `ReadFile` from the sandboxes under `work_dir`.
pub fn read(work_dir: &Path, request: &ReadFile) -> FileData {
    let mut answer = FileData {
        request_id: request.request_id,
        offset: request.offset,
        ..Default::default()
    };
    let Ok(kind) = FileKind::try_from(request.file) else {
        answer.error = format!("unknown file kind {}", request.file);
        return answer;
    };
    let name = file_name(kind);
    let Some(run) = latest_run(work_dir, &request.framework_id, &request.task_id) else {
        answer.error = format!(
            "no sandbox for task {:?} of framework {:?} on this agent",
            request.task_id, request.framework_id
        );
        return answer;
    };
    let sandbox = run_dir(work_dir, &request.framework_id, &request.task_id, &run);
    match read_window(&sandbox, name, request.offset, request.length) {
        Ok((data, size)) => {
            answer.data = data;
            answer.size = size;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            answer.error = if std::fs::symlink_metadata(&sandbox).is_err() {
                format!(
                    "no sandbox for task {:?} of framework {:?} on this agent",
                    request.task_id, request.framework_id
                )
            } else {
                format!("task {:?} has no {name} file", request.task_id)
            };
        }
        Err(e) => {
            answer.error = format!("cannot read {name} of task {:?}: {e}", request.task_id);
        }
    }
    answer
}

/// At most `min(length, MAX_READ_BYTES)` bytes of `<sandbox>/<name>` from `offset` (none at or
/// past the end), and the file's size.
fn read_window(sandbox: &Path, name: &str, offset: u64, length: u32) -> io::Result<(Vec<u8>, u64)> {
    let mut file = open_output(sandbox, name)?;
    let size = file.metadata()?.len();
    let length = u64::from(length.min(MAX_READ_BYTES));
    if offset >= size || length == 0 {
        return Ok((Vec::new(), size));
    }
    file.seek(SeekFrom::Start(offset))?;
    let mut data = Vec::with_capacity(length.min(size - offset) as usize);
    file.take(length).read_to_end(&mut data)?;
    Ok((data, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(task_id: &str, file: FileKind, offset: u64, length: u32) -> ReadFile {
        ReadFile {
            request_id: 7,
            framework_id: "fw".into(),
            task_id: task_id.into(),
            file: file as i32,
            offset,
            length,
        }
    }

    /// A work dir with a sandbox for task `t` holding `stdout` and `stderr`.
    fn work_dir(stdout: &[u8], stderr: &[u8]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let sandbox = run_dir(dir.path(), "fw", "t", "0000000000001");
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::write(sandbox.join("stdout"), stdout).unwrap();
        std::fs::write(sandbox.join("stderr"), stderr).unwrap();
        dir
    }

    #[test]
    fn reads_a_window_and_reports_the_size() {
        let dir = work_dir(b"hello world\n", b"oops\n");
        let all = read(dir.path(), &request("t", FileKind::Stdout, 0, 1000));
        assert_eq!(all.request_id, 7);
        assert_eq!(all.error, "");
        assert_eq!(all.data, b"hello world\n");
        assert_eq!((all.offset, all.size), (0, 12));
        let part = read(dir.path(), &request("t", FileKind::Stdout, 6, 5));
        assert_eq!(part.data, b"world");
        assert_eq!((part.offset, part.size), (6, 12));
        let err = read(dir.path(), &request("t", FileKind::Stderr, 0, 100));
        assert_eq!(err.data, b"oops\n");
    }

    #[test]
    fn past_the_end_is_empty_with_the_size() {
        let dir = work_dir(b"abc", b"");
        for offset in [3, 4, u64::MAX] {
            let answer = read(dir.path(), &request("t", FileKind::Stdout, offset, 10));
            assert_eq!(answer.error, "");
            assert!(answer.data.is_empty());
            assert_eq!(answer.size, 3);
            assert_eq!(answer.offset, offset);
        }
        let zero = read(dir.path(), &request("t", FileKind::Stdout, 0, 0));
        assert!(zero.data.is_empty());
        assert_eq!(zero.size, 3);
    }

    #[test]
    fn a_read_is_clamped_to_64_kib() {
        let big = vec![b'x'; 200 * 1024];
        let dir = work_dir(&big, b"");
        let answer = read(dir.path(), &request("t", FileKind::Stdout, 10, u32::MAX));
        assert_eq!(answer.data.len(), MAX_READ_BYTES as usize);
        assert_eq!(answer.size, big.len() as u64);
        let tail = read(
            dir.path(),
            &request("t", FileKind::Stdout, 200 * 1024 - 5, 100),
        );
        assert_eq!(tail.data.len(), 5);
    }

    #[test]
    fn unknown_task_missing_file_and_bad_kind_are_errors() {
        let dir = work_dir(b"x", b"y");
        let unknown = read(dir.path(), &request("other", FileKind::Stdout, 0, 10));
        assert!(unknown.error.contains("no sandbox"), "{}", unknown.error);
        assert!(unknown.data.is_empty());
        let hostile = read(dir.path(), &request("../t", FileKind::Stdout, 0, 10));
        assert!(hostile.error.contains("no sandbox"), "{}", hostile.error);
        std::fs::remove_file(run_dir(dir.path(), "fw", "t", "0000000000001").join("stderr"))
            .unwrap();
        let missing = read(dir.path(), &request("t", FileKind::Stderr, 0, 10));
        assert!(missing.error.contains("no stderr"), "{}", missing.error);
        let mut bad = request("t", FileKind::Stdout, 0, 10);
        bad.file = 9;
        let bad = read(dir.path(), &bad);
        assert!(bad.error.contains("unknown file kind"), "{}", bad.error);
    }

    #[test]
    fn a_symlink_or_hard_link_to_a_secret_is_refused() {
        let dir = work_dir(b"", b"");
        let secret = dir.path().join("agent_secret");
        std::fs::write(&secret, "top secret\n").unwrap();
        let sandbox = run_dir(dir.path(), "fw", "t", "0000000000001");
        std::fs::remove_file(sandbox.join("stdout")).unwrap();
        std::os::unix::fs::symlink(&secret, sandbox.join("stdout")).unwrap();
        let symlink = read(dir.path(), &request("t", FileKind::Stdout, 0, 100));
        assert!(symlink.data.is_empty());
        assert!(
            symlink.error.contains("cannot read stdout"),
            "{}",
            symlink.error
        );
        std::fs::remove_file(sandbox.join("stdout")).unwrap();
        std::fs::hard_link(&secret, sandbox.join("stdout")).unwrap();
        let hard = read(dir.path(), &request("t", FileKind::Stdout, 0, 100));
        assert!(hard.data.is_empty());
        assert!(hard.error.contains("hard links"), "{}", hard.error);
    }
}
