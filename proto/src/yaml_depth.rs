//! A cheap nesting-depth check run on YAML text before it is parsed.
//!
//! The YAML parser underneath serde_norway (libyaml) spends time quadratic in the nesting depth
//! (a document nested 100,000 levels deep, `[[[[...`, takes about 15 s of CPU before serde's
//! own recursion limit refuses it), so every YAML text the components read (the master's and
//! the agent's configuration, job specs, dry-run scenarios, batch files) is first scanned once
//! here and refused past [`MAX_DEPTH`] levels with an error naming the line and, where known,
//! the key path.
//!
//! The scan is one pass over the text, linear in its size. It counts flow collections (`[`,
//! `{` outside quoted scalars and comments) and block collections (a `- ` entry or a `key:` at
//! a deeper indentation than its parent, including compact ones such as `- - - x`). It skips
//! comments, quoted scalars (also over several lines) and block scalars (`|`, `>`). It is an
//! estimate made to err low on unusual documents, never high on ordinary ones: any document it
//! lets through still meets serde's own recursion limit, which is then cheap to reach.

use crate::yaml_error::{path_string, ConfigError, Seg};

/// The deepest nesting accepted: 64 collections inside each other (configurations and job
/// specs need fewer than 10).
pub const MAX_DEPTH: usize = 64;

/// One open block collection.
struct Level {
    /// Column of its entries (`- ` indicators or keys).
    col: usize,
    /// Its current key, for a mapping.
    key: Option<String>,
    /// Its current entry, for a sequence (also a sequence of a key's value at the key's own
    /// indentation, `key:\n- a`, which then counts as one more level).
    index: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Quote {
    Single,
    Double,
}

struct Scan<'a> {
    file: &'a str,
    levels: Vec<Level>,
    /// Open flow collections.
    flow: usize,
    /// Inside a quoted scalar (possibly spanning lines).
    quote: Option<Quote>,
    /// Inside a block scalar: its lines are indented more than this column.
    block_scalar: Option<usize>,
    /// The last content line ended where a nested node starts on the next line (`key:`, `-`).
    opener: bool,
    line: usize,
}

/// Refuses `text` when its collections nest more than [`MAX_DEPTH`] deep; `file` names it in
/// the error (`FILE:LINE: KEY: nested more than 64 levels deep ...`).
pub fn check_depth(text: &str, file: &str) -> Result<(), ConfigError> {
    let mut scan = Scan {
        file,
        levels: Vec::new(),
        flow: 0,
        quote: None,
        block_scalar: None,
        opener: false,
        line: 0,
    };
    for (n, line) in text.split('\n').enumerate() {
        scan.line = n + 1;
        let line = line.strip_suffix('\r').unwrap_or(line).as_bytes();
        scan.line_of(line)?;
    }
    Ok(())
}

fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// A separator or the end of the line follows position `at`.
fn ends_token(line: &[u8], at: usize) -> bool {
    line.get(at).is_none_or(|&b| is_space(b))
}

impl Scan<'_> {
    fn depth(&self) -> usize {
        let block: usize = self
            .levels
            .iter()
            .map(|l| 1 + usize::from(l.key.is_some() && l.index.is_some()))
            .sum();
        block + self.flow
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.depth() <= MAX_DEPTH {
            return Ok(());
        }
        let mut path = Vec::new();
        for level in &self.levels {
            if let Some(key) = &level.key {
                path.push(Seg::Key(key.clone()));
            }
            if let Some(index) = level.index {
                path.push(Seg::Index(index));
            }
        }
        Err(ConfigError {
            file: self.file.to_string(),
            line: Some(self.line),
            key: path_string(&path),
            message: format!(
                "nested more than {MAX_DEPTH} levels deep: refused before parsing \
                 (flatten the document)"
            ),
        })
    }

    /// The level for block entries at column `col`, opened if deeper than the current one.
    fn enter(&mut self, col: usize) -> Result<&mut Level, ConfigError> {
        if self.levels.last().is_none_or(|l| l.col < col) {
            self.levels.push(Level {
                col,
                key: None,
                index: None,
            });
        }
        self.check()?;
        Ok(self.levels.last_mut().expect("just ensured"))
    }

    fn line_of(&mut self, line: &[u8]) -> Result<(), ConfigError> {
        let indent = line.iter().take_while(|&&b| b == b' ').count();
        let blank = line[indent..].iter().all(|&b| is_space(b));
        if let Some(parent) = self.block_scalar {
            if blank || indent > parent {
                return Ok(());
            }
            self.block_scalar = None;
        }
        if self.quote.is_some() || self.flow > 0 {
            // A quoted scalar or a flow collection going on from an earlier line.
            return self.scan(line, 0, None);
        }
        if blank || line[indent] == b'#' {
            return Ok(());
        }
        if indent == 0
            && (line.starts_with(b"---") || line.starts_with(b"..."))
            && ends_token(line, 3)
        {
            // A new document.
            self.levels.clear();
            self.opener = false;
            return Ok(());
        }
        while self.levels.last().is_some_and(|l| l.col > indent) {
            self.levels.pop();
        }
        if !self.opener && self.levels.last().is_some_and(|l| l.col < indent) {
            // More indented without a `key:` or `-` before: a plain scalar going on.
            return Ok(());
        }
        self.opener = false;
        // Sequence entries and complex keys, possibly compact: `- - - x`.
        let mut at = indent;
        while matches!(line.get(at), Some(b'-' | b'?')) && ends_token(line, at + 1) {
            let level = self.enter(at)?;
            if line[at] == b'-' {
                level.index = Some(level.index.map_or(0, |i| i + 1));
            }
            self.check()?;
            let owner = at;
            at += 1;
            while line.get(at).is_some_and(|&b| is_space(b)) {
                at += 1;
            }
            if at >= line.len() || line[at] == b'#' {
                self.opener = true;
                return Ok(());
            }
            if !matches!(line[at], b'-' | b'?') || !ends_token(line, at + 1) {
                return self.scan(line, at, Some(owner));
            }
        }
        self.scan(line, at, Some(at))
    }

    /// Scans `line` from `from`. `owner`: in block context (a node, maybe a key, starts at
    /// `from`), the column of the `-` entry or key the node belongs to; `None` going on inside a
    /// flow collection or quoted scalar.
    fn scan(&mut self, line: &[u8], from: usize, owner: Option<usize>) -> Result<(), ConfigError> {
        let mut at = from;
        // Block context: where the current key or value starts, whether a key was seen.
        let mut node_start = owner.map(|_| from);
        let mut key_seen = false;
        // Whether what came last on the line leaves the next line a nested node.
        let mut opens = false;
        while at < line.len() {
            let b = line[at];
            if let Some(quote) = self.quote {
                match (quote, b) {
                    (Quote::Double, b'\\') => at += 1,
                    (Quote::Single, b'\'') if line.get(at + 1) == Some(&b'\'') => at += 1,
                    (Quote::Double, b'"') | (Quote::Single, b'\'') => self.quote = None,
                    _ => {}
                }
                at += 1;
                continue;
            }
            let after_separator = at == 0 || is_space(line[at - 1]);
            let at_node = node_start == Some(at);
            if self.flow > 0 {
                match b {
                    b'[' | b'{' => {
                        self.flow += 1;
                        self.check()?;
                    }
                    b']' | b'}' => {
                        self.flow -= 1;
                        if self.flow == 0 {
                            // Back in block context; the rest of the line ends this node.
                            node_start = None;
                            opens = false;
                        }
                    }
                    b'"' | b'\'' if after_separator || b"[{,:".contains(&line[at - 1]) => {
                        self.quote = Some(if b == b'"' {
                            Quote::Double
                        } else {
                            Quote::Single
                        });
                    }
                    b'#' if after_separator => return Ok(()),
                    _ => {}
                }
                at += 1;
                continue;
            }
            if b == b'#' && after_separator {
                break;
            }
            if is_space(b) {
                if node_start == Some(at) {
                    node_start = Some(at + 1);
                }
                at += 1;
                continue;
            }
            opens = false;
            match b {
                b'[' | b'{' if at_node => {
                    self.flow = 1;
                    self.check()?;
                }
                b'"' | b'\'' if at_node => {
                    self.quote = Some(if b == b'"' {
                        Quote::Double
                    } else {
                        Quote::Single
                    });
                }
                b'&' | b'!' if at_node => {
                    // An anchor or a tag: the node itself follows it.
                    while at < line.len() && !is_space(line[at]) {
                        at += 1;
                    }
                    node_start = Some(at);
                    opens = true;
                    continue;
                }
                b'|' | b'>' if at_node => {
                    let rest = &line[at + 1..];
                    let header = rest
                        .iter()
                        .take_while(|&&c| c.is_ascii_digit() || c == b'+' || c == b'-')
                        .count();
                    if ends_token(rest, header) || rest.get(header) == Some(&b'#') {
                        // Its lines are indented more than its key, or its `-`.
                        self.block_scalar = Some(if key_seen {
                            from
                        } else {
                            owner.unwrap_or(from)
                        });
                        return Ok(());
                    }
                }
                b':' if owner.is_some() && !key_seen && ends_token(line, at + 1) => {
                    let key = String::from_utf8_lossy(&line[from..at]);
                    let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
                    let level = self.enter(from)?;
                    level.key = Some(key.to_string());
                    level.index = None;
                    key_seen = true;
                    node_start = Some(at + 1);
                    opens = true;
                    at += 1;
                    continue;
                }
                _ => {}
            }
            if node_start == Some(at) {
                node_start = None;
            }
            at += 1;
        }
        if self.flow == 0 && self.quote.is_none() {
            self.opener = opens;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_ok(text: &str) -> bool {
        check_depth(text, "t.yaml").is_ok()
    }

    fn flow(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    /// `a:` nested `depth` mappings deep, one space of indentation per level.
    fn block(depth: usize) -> String {
        let mut text = String::new();
        for i in 0..depth {
            text.push_str(&" ".repeat(i));
            text.push_str(if i + 1 == depth { "a: 1\n" } else { "a:\n" });
        }
        text
    }

    fn compact(depth: usize) -> String {
        format!("{}x\n", "- ".repeat(depth))
    }

    #[test]
    fn the_limit_is_64_levels_in_every_style() {
        for make in [flow, block, compact] {
            assert!(depth_ok(&make(MAX_DEPTH)), "{}", make(MAX_DEPTH));
            assert!(!depth_ok(&make(MAX_DEPTH + 1)), "{}", make(MAX_DEPTH + 1));
        }
        // Flow inside block inside flow-free keys.
        let mixed = format!("a:\n  b:\n    - {}\n", flow(MAX_DEPTH - 3));
        assert!(depth_ok(&mixed), "{mixed}");
        let mixed = format!("a:\n  b:\n    - {}\n", flow(MAX_DEPTH - 2));
        assert!(!depth_ok(&mixed), "{mixed}");
        let braces = format!(
            "{}{}",
            "{a: ".repeat(MAX_DEPTH + 1),
            "}".repeat(MAX_DEPTH + 1)
        );
        assert!(!depth_ok(&braces));
    }

    #[test]
    fn a_deep_document_is_refused_quickly_with_its_line_and_path() {
        let text = format!("master:\n  tags:\n    {}", flow(100_000));
        let error = check_depth(&text, "deep.yaml").unwrap_err();
        assert_eq!(error.line, Some(3), "{error}");
        assert_eq!(error.key, "master.tags", "{error}");
        assert!(error
            .to_string()
            .starts_with("deep.yaml:3: master.tags: nested more than 64"));
        let error = check_depth(&compact(100_000), "deep.yaml").unwrap_err();
        assert_eq!(error.line, Some(1));
        let error = check_depth(&block(2_000), "deep.yaml").unwrap_err();
        assert_eq!(error.line, Some(MAX_DEPTH + 1));
        assert_eq!(error.key, vec!["a"; MAX_DEPTH].join("."));
    }

    #[test]
    fn ordinary_documents_pass() {
        let text = r#"
# a comment with [[[[ brackets {{{{
master:
  allocation_interval: 5ms   # [not flow
  name: "quoted [[[[ ]] {{ and \" escaped"
  other: 'single [[[[ it''s'
  plain: a[b {c
  url: http://example.com/[x
rings:
  mem: { base: 1, bounds: [1, 2, [3, 4]] }
  list:
    - a: 1
      b: [x, y]
    - - nested
      - seq
script: |
  echo [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
  - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - -
folded: >-
  {{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{
multi: "a string
  over [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
  lines"
key:
- seq at the key's indentation
- another
"#;
        check_depth(text, "ok.yaml").unwrap();
        // Many siblings are not depth.
        let wide = "k: v\n".repeat(10_000) + &"- x\n".repeat(10_000);
        assert!(depth_ok(&wide));
        let many_flows = "[[1]]\n".repeat(10_000);
        assert!(depth_ok(&many_flows));
    }
}
