//! Located YAML errors: [`ConfigError`] names the file, the line and the key; [`YamlSource`]
//! parses a document and places errors found after parsing with [`locate`], which asks the
//! YAML parser where a key is.
//!
//! It lives in the protocol crate, which every component depends on, so the master's
//! configuration (`ringmaster::config`, `ringmaster::security`, job specs) and the agent's
//! config file (`ringmaster_agent`'s `--config`) report errors the same way:
//! `FILE:LINE: KEY: MESSAGE`. The master's public paths stay
//! `ringmaster::config::{ConfigError, Seg, YamlSource, locate, path_string}`.

use std::fmt;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

pub use crate::yaml_error::{path_string, ConfigError, Seg};

/// A parsed YAML document that can place errors found after parsing.
pub struct YamlSource<'a> {
    pub text: &'a str,
    pub file: &'a str,
}

impl YamlSource<'_> {
    /// Deserializes the whole document, turning serde_norway's error into a located one.
    /// A document nested more than [`crate::yaml_depth::MAX_DEPTH`] levels deep is refused
    /// first, before the parser spends time on it.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        crate::yaml_depth::check_depth(self.text, self.file)?;
        serde_yaml::from_str(self.text).map_err(|err| self.serde_error(&err))
    }

    fn serde_error(&self, err: &serde_yaml::Error) -> ConfigError {
        let mut text = err.to_string();
        let line = err.location().map(|loc| {
            let suffix = format!(" at line {} column {}", loc.line(), loc.column());
            if let Some(at) = text.find(&suffix) {
                text.replace_range(at..at + suffix.len(), "");
            }
            loc.line()
        });
        // serde_norway writes `path: message` when the error is below the root.
        let (key, message) = match text.split_once(": ") {
            Some((path, rest)) if !path.is_empty() && !path.contains(char::is_whitespace) => {
                (path.to_string(), rest.to_string())
            }
            _ => (String::new(), text),
        };
        ConfigError {
            file: self.file.to_string(),
            line,
            key,
            message,
        }
    }

    /// An error about the key at `path` (its line looked up in the text).
    pub fn error(&self, path: &[Seg], message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            line: locate(self.text, path),
            key: path_string(path),
            message: message.into(),
        }
    }
}

const FOUND: &str = "\u{0}ringmaster-locate\u{0}";

/// The 1-based line of the key at `path` (of the element, for a trailing index), found by
/// walking the document with serde_norway and stopping with a marker error at the target:
/// serde_norway stamps every error with the position of the node being read.
pub fn locate(text: &str, path: &[Seg]) -> Option<usize> {
    let de = serde_yaml::Deserializer::from_str(text);
    match (Probe { path }).deserialize(de) {
        Err(err) if err.to_string().contains(FOUND) => err.location().map(|l| l.line()),
        _ => None,
    }
}

struct Probe<'p> {
    path: &'p [Seg],
}

impl<'de> DeserializeSeed<'de> for Probe<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Probe<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((Seg::Key(want), rest)) = self.path.split_first() else {
            return Err(de::Error::custom(FOUND));
        };
        while let Some(hit) = map.next_key_seed(KeyProbe {
            want,
            last: rest.is_empty(),
        })? {
            if hit {
                return map.next_value_seed(Probe { path: rest });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((Seg::Index(want), rest)) = self.path.split_first() else {
            return Err(de::Error::custom(FOUND));
        };
        let mut i = 0;
        loop {
            if i == *want {
                return seq.next_element_seed(Probe { path: rest }).map(|_| ());
            }
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.scalar()
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.scalar()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.scalar()
    }
}

impl Probe<'_> {
    /// A scalar is the target only when the path ends here.
    fn scalar<E: de::Error>(&self) -> Result<(), E> {
        if self.path.is_empty() {
            Err(E::custom(FOUND))
        } else {
            Ok(())
        }
    }
}

/// Reads one mapping key; true when it is the one wanted. When it is the last step, stops
/// right here so the position is the key's own.
struct KeyProbe<'p> {
    want: &'p str,
    last: bool,
}

impl<'de> DeserializeSeed<'de> for KeyProbe<'_> {
    type Value = bool;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyProbe<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping key")
    }
    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        match key == self.want {
            true if self.last => Err(E::custom(FOUND)),
            hit => Ok(hit),
        }
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
}
