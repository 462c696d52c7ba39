//! The located error every YAML reader reports ([`ConfigError`]: `FILE:LINE: KEY: MESSAGE`)
//! and the key paths it names; shared by the parser ([`crate::yaml`]) and the nesting bound
//! ([`crate::yaml_depth`]), which runs first.

use std::fmt;

/// A configuration or scenario error, located as precisely as the text allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Dotted path of the key, e.g. `rings.mem.bounds` (empty for the whole document).
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// One step of a path into a YAML document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

impl From<&str> for Seg {
    fn from(key: &str) -> Self {
        Seg::Key(key.to_string())
    }
}

impl From<usize> for Seg {
    fn from(index: usize) -> Self {
        Seg::Index(index)
    }
}

/// `rings.mem.bounds`, `agents[3].id`.
pub fn path_string(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}
