//! `--state-file`: what a restarted `ringmaster-exec` needs to fail over to its running tasks
//! instead of running them again.
//!
//! A small JSON object, `{"name": ..., "framework_id": ..., "tasks": [...]}`: the framework id
//! as soon as the master assigned it, and the id of every task as soon as exec sends its launch.
//! Each write goes to `<path>.tmp` first and is renamed over the file, so a reader (or an exec
//! killed mid-write) sees the old or the new content, never half of one. Exec removes the file
//! when it ends normally (every task ended, or Ctrl-C); it stays when exec dies or cannot reach
//! the master, for the next run to take over.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The content of a state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecState {
    /// `--name` of the run that wrote it (task ids are `<name>-<index>`).
    pub name: String,
    /// The framework to take over.
    pub framework_id: String,
    /// The tasks whose launch was sent, in launch order.
    #[serde(default)]
    pub tasks: Vec<String>,
}

impl ExecState {
    /// Reads the file at `path`: `Ok(None)` when there is none; `Err` says what is wrong with it.
    pub fn load(path: &Path) -> Result<Option<ExecState>, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let state: ExecState = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not an exec state file: {e}", path.display()))?;
        if state.framework_id.trim().is_empty() {
            return Err(format!("{}: framework_id is empty", path.display()));
        }
        Ok(Some(state))
    }

    /// The file's JSON text.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string(self).expect("strings always serialise");
        text.push('\n');
        text
    }

    /// Writes the file atomically: `<path>.tmp`, flushed to disk, renamed over `path`.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = tmp_path(path);
        let result = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(self.to_json().as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

/// Removes the state file (and a leftover temporary); a missing file is fine.
pub fn remove(path: &Path) {
    let _ = std::fs::remove_file(tmp_path(path));
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => eprintln!(
            "ringmaster-exec: cannot remove the state file {}: {e}",
            path.display()
        ),
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ExecState {
        ExecState {
            name: "job \"x\"\\\t\u{1}é".into(),
            framework_id: "fw-1".into(),
            tasks: vec!["job-0".into(), "job-1".into()],
        }
    }

    #[test]
    fn saves_json_and_loads_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exec.json");
        assert_eq!(ExecState::load(&path), Ok(None), "no file: a fresh run");
        let state = sample();
        state.save(&path).unwrap();
        assert_eq!(ExecState::load(&path), Ok(Some(state.clone())));
        assert!(!tmp_path(&path).exists(), "the temporary was renamed");
        let plain = ExecState {
            name: "job".into(),
            ..state
        };
        assert_eq!(
            plain.to_json(),
            "{\"name\":\"job\",\"framework_id\":\"fw-1\",\"tasks\":[\"job-0\",\"job-1\"]}\n"
        );
        remove(&path);
        assert!(!path.exists());
        remove(&path); // twice is fine
    }

    #[test]
    fn a_bad_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exec.json");
        for text in [
            "",
            "{",
            "[1, 2]",
            "{\"name\": \"j\"}",
            "{\"name\": \"j\", \"framework_id\": \"\"}",
            "{\"name\": \"j\", \"framework_id\": \"f\", \"tasks\": 3}",
            "{\"name\": \"j\", \"framework_id\": \"f\", \"other\": 1}",
            "\u{0}\u{1}binary",
        ] {
            std::fs::write(&path, text).unwrap();
            assert!(ExecState::load(&path).is_err(), "{text:?}");
        }
        // A directory where the file should be.
        assert!(ExecState::load(dir.path()).is_err());
    }
}
