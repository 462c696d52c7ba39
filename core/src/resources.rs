//! Resources: named scalar quantities and their arithmetic, in one place.
//!
//! Every scalar is kept as fixed-point thousandths of its unit (`cpus:1.5` is 1500 milli-cpus,
//! `mem:8192` is 8192 MiB = 8_192_000 milli-MiB), so arithmetic is exact and comparisons never
//! meet floating-point surprises. The text form is Mesos-style: `cpus:4;mem:8192;gpus:1`.
//! Entries are kept sorted by name and zero amounts are dropped, so two equal bundles have
//! one representation and print the same.

use std::fmt;
use std::str::FromStr;

use compact_str::CompactString;

/// Scalars carry three decimal places.
pub const MILLI: u64 = 1000;

/// Names up to this many bytes are compared byte by byte by [`name_order`].
const SHORT_NAME: usize = 16;

/// `a.cmp(b)` without the `memcmp` call of the full comparison for short names, which for
/// names of a few bytes costs more than the comparison (and mispredicts its branches on
/// lengths): decided by the first byte when the first bytes differ (names of the usual
/// dimensions do: `cpus`, `gpus`, `mem`), else byte by byte. Bundles and the cluster's
/// dimensions are searched by name on every placement.
pub(crate) fn name_order(a: &str, b: &str) -> std::cmp::Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    match (a.first(), b.first()) {
        (Some(x), Some(y)) if x != y => x.cmp(y),
        _ if a.len() <= SHORT_NAME && b.len() <= SHORT_NAME => {
            for (x, y) in a.iter().zip(b) {
                if x != y {
                    return x.cmp(y);
                }
            }
            a.len().cmp(&b.len())
        }
        _ => a.cmp(b),
    }
}

/// Where `name` is (`Ok`) or would go (`Err`) among entries sorted by name, by
/// [`name_order`]: the one search of a bundle's amounts and of the cluster's dimension index.
pub(crate) fn find_name<T>(entries: &[(CompactString, T)], name: &str) -> Result<usize, usize> {
    entries.binary_search_by(|(n, _)| name_order(n, name))
}

/// A bundle of named scalar resources, each at most once, sorted by name, none zero.
///
/// Names are short (`cpus`, `mem`, `gpu_milli`) and kept inline ([`CompactString`] holds up
/// to 24 bytes without allocating): a bundle of any number of dimensions costs one allocation,
/// and bundles are cloned per offer, task and launch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    entries: Vec<(CompactString, u64)>,
}

/// Why resource text or arithmetic was refused. Each variant names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    #[error("`{part}` is not `name:amount` (in `{text}`)")]
    Malformed { part: String, text: String },
    #[error("`{name}` is not a valid resource name (letters, digits, `_` and `-`, starting with a letter)")]
    BadName { name: String },
    #[error(
        "`{part}`: amount `{amount}` is not a non-negative finite number with at most 3 decimals"
    )]
    BadAmount { part: String, amount: String },
    #[error("`{name}` appears more than once")]
    Duplicate { name: String },
    #[error("`{name}` overflows")]
    Overflow { name: String },
    #[error("not enough `{name}`: {have} < {need}")]
    Insufficient {
        name: String,
        have: String,
        need: String,
    },
}

impl Resources {
    /// The empty bundle.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `name:amount;name:amount`. Whitespace around parts is ignored; an empty text is
    /// the empty bundle.
    pub fn parse(text: &str) -> Result<Self, ResourceError> {
        let mut pairs = Vec::new();
        for raw in text.split(';') {
            let part = raw.trim();
            if part.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(ResourceError::Malformed {
                    part: raw.to_string(),
                    text: text.to_string(),
                });
            }
            let (name, amount) = part
                .split_once(':')
                .ok_or_else(|| ResourceError::Malformed {
                    part: part.to_string(),
                    text: text.to_string(),
                })?;
            let name = name.trim();
            check_name(name)?;
            let milli = parse_amount(amount.trim()).ok_or_else(|| ResourceError::BadAmount {
                part: part.to_string(),
                amount: amount.trim().to_string(),
            })?;
            pairs.push((name.to_string(), milli));
        }
        Self::from_milli(pairs)
    }

    /// Builds a bundle from (name, milli) pairs; duplicate or invalid names are refused.
    pub fn from_milli<N: Into<String>>(
        pairs: impl IntoIterator<Item = (N, u64)>,
    ) -> Result<Self, ResourceError> {
        let mut entries: Vec<(CompactString, u64)> = Vec::new();
        for (name, milli) in pairs {
            let name: String = name.into();
            check_name(&name)?;
            if entries.iter().any(|(n, _)| *n == name) {
                return Err(ResourceError::Duplicate { name });
            }
            entries.push((CompactString::from(name), milli));
        }
        entries.retain(|(_, m)| *m > 0);
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Resources { entries })
    }

    /// One dimension in whole units and thousandths, e.g. `Resources::scalar("cpus", 2.0)`.
    /// Panics on a bad name or amount: for literals in code and tests only.
    pub fn scalar(name: &str, amount: f64) -> Self {
        Self::parse(&format!("{name}:{amount}")).expect("valid literal resources")
    }

    /// The amount of `name` in thousandths (0 when absent).
    pub fn milli(&self, name: &str) -> u64 {
        match find_name(&self.entries, name) {
            Ok(i) => self.entries[i].1,
            Err(_) => 0,
        }
    }

    /// The amount of `name` in units, for display and ratios.
    pub fn amount(&self, name: &str) -> f64 {
        self.milli(name) as f64 / MILLI as f64
    }

    /// Sets one dimension (0 removes it).
    pub fn set_milli(&mut self, name: &str, milli: u64) {
        match find_name(&self.entries, name) {
            Ok(i) if milli == 0 => {
                self.entries.remove(i);
            }
            Ok(i) => self.entries[i].1 = milli,
            Err(_) if milli == 0 => {}
            Err(i) => self.entries.insert(i, (CompactString::from(name), milli)),
        }
    }

    /// (name, milli) pairs sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.entries.iter().map(|(n, m)| (n.as_str(), *m))
    }

    /// Dimension names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when every dimension of `other` is at most this bundle's amount.
    pub fn contains(&self, other: &Resources) -> bool {
        other.iter().all(|(name, need)| self.milli(name) >= need)
    }

    /// The dimensions of `demand` this bundle falls short of.
    pub fn shortfalls<'a>(&'a self, demand: &'a Resources) -> impl Iterator<Item = &'a str> + 'a {
        demand
            .iter()
            .filter(move |(name, need)| self.milli(name) < *need)
            .map(|(name, _)| name)
    }

    /// Sum, refusing overflow.
    pub fn checked_add(&self, other: &Resources) -> Result<Resources, ResourceError> {
        let mut out = self.clone();
        for (name, m) in other.iter() {
            let sum = out
                .milli(name)
                .checked_add(m)
                .ok_or_else(|| ResourceError::Overflow {
                    name: name.to_string(),
                })?;
            out.set_milli(name, sum);
        }
        Ok(out)
    }

    /// Difference, refusing to go below zero in any dimension.
    pub fn checked_sub(&self, other: &Resources) -> Result<Resources, ResourceError> {
        let mut out = self.clone();
        for (name, m) in other.iter() {
            let have = out.milli(name);
            let left = have
                .checked_sub(m)
                .ok_or_else(|| ResourceError::Insufficient {
                    name: name.to_string(),
                    have: format_milli(have),
                    need: format_milli(m),
                })?;
            out.set_milli(name, left);
        }
        Ok(out)
    }

    /// Where `name` is or would go, trying `hint` first (the position after the previous
    /// name of an ascending walk) before a binary search.
    fn position_from(&self, hint: usize, name: &str) -> Result<usize, usize> {
        match self.entries.get(hint) {
            Some((n, _)) if name_order(n, name).is_eq() => Ok(hint),
            _ => find_name(&self.entries, name),
        }
    }

    /// Takes `other` out in place, refusing (and changing nothing) if any dimension would go
    /// below zero; `each(name, old, new)` sees every dimension of `other` as it changes. One
    /// search per dimension (a walk, both bundles being sorted), where
    /// [`checked_sub`](Self::checked_sub) copies the bundle and searches it three times.
    pub fn checked_sub_assign_with(
        &mut self,
        other: &Resources,
        mut each: impl FnMut(&str, u64, u64),
    ) -> Result<(), ResourceError> {
        let mut at = 0;
        for (name, need) in other.iter() {
            let have = match self.position_from(at, name) {
                Ok(i) => {
                    at = i + 1;
                    self.entries[i].1
                }
                Err(i) => {
                    at = i;
                    0
                }
            };
            if have < need {
                return Err(ResourceError::Insufficient {
                    name: name.to_string(),
                    have: format_milli(have),
                    need: format_milli(need),
                });
            }
        }
        let (mut at, mut emptied) = (0, false);
        for (name, m) in other.iter() {
            // Present: checked above, and amounts of a bundle are never zero.
            if let Ok(i) = self.position_from(at, name) {
                let old = self.entries[i].1;
                self.entries[i].1 = old - m;
                emptied |= old == m;
                at = i + 1;
                each(name, old, old - m);
            }
        }
        if emptied {
            self.entries.retain(|(_, m)| *m > 0);
        }
        Ok(())
    }

    /// Adds each `(name, amount)` in place, clamping at `u64::MAX` (an allocation's running
    /// sum): one search per name, none when the names come in this bundle's order.
    pub fn saturating_add_each<'a>(&mut self, other: impl IntoIterator<Item = (&'a str, u64)>) {
        let mut at = 0;
        for (name, m) in other {
            match self.position_from(at, name) {
                Ok(i) => {
                    let sum = self.entries[i].1.saturating_add(m);
                    self.entries[i].1 = sum;
                    at = i + 1;
                }
                Err(i) if m > 0 => {
                    self.entries.insert(i, (CompactString::from(name), m));
                    at = i + 1;
                }
                Err(i) => at = i,
            }
        }
    }

    /// Adds `other` in place, clamping each dimension at `u64::MAX` instead of failing (sums
    /// for reports, where a hostile agent's amounts must not stop the count).
    pub fn saturating_add_assign(&mut self, other: &Resources) {
        for (name, m) in other.iter() {
            let sum = self.milli(name).saturating_add(m);
            self.set_milli(name, sum);
        }
    }

    /// Difference, clamped at zero in every dimension.
    pub fn saturating_sub(&self, other: &Resources) -> Resources {
        let mut out = self.clone();
        for (name, m) in other.iter() {
            let left = out.milli(name).saturating_sub(m);
            out.set_milli(name, left);
        }
        out
    }

    /// The first dimension (by name) that `limits` names and this bundle exceeds: its name,
    /// this bundle's amount and the limit, in thousandths. Dimensions `limits` does not name
    /// are not limited.
    pub fn first_above<'a>(&'a self, limits: &Resources) -> Option<(&'a str, u64, u64)> {
        self.iter().find_map(|(name, have)| {
            let max = limits.milli(name);
            (limits.names().any(|n| n == name) && have > max).then_some((name, have, max))
        })
    }

    /// How many copies of `unit` fit in this bundle (u64::MAX for an empty unit).
    pub fn copies_of(&self, unit: &Resources) -> u64 {
        unit.iter()
            .map(|(name, m)| self.milli(name) / m)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The names of this bundle that are not in `known`, sorted (see [`STANDARD_NAMES`] and
    /// [`check_known_names`]). A zero amount is not kept, so its name is never reported.
    pub fn unknown_names(&self, known: &[&str]) -> Vec<&str> {
        self.names().filter(|name| !known.contains(name)).collect()
    }
}

/// The resource names the cluster itself uses: what agents detect or are given (`cpus`, `mem`,
/// `disk`) and the GPU scalars of docs/devices.md (`gpus` in task text, `gpu_milli`,
/// `gpu_mem`). `gpu_model` is task text only and never a scalar. Other names are custom
/// resources, which a typo also creates (`cpu:4`): [`check_known_names`] refuses them.
pub const STANDARD_NAMES: [&str; 6] = ["cpus", "mem", "disk", "gpus", "gpu_milli", "gpu_mem"];

/// The name of `known` that `name` most likely meant, for a "did you mean" hint: a spelled-out
/// form of a standard name (`memory` → `mem`, `gpu` → `gpus`), else the nearest known name
/// within edit distance 2 (and less than the name's length), case ignored (`cpu` → `cpus`,
/// `gpu_mili` → `gpu_milli`); `None` when nothing is that near.
pub fn did_you_mean<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let lower = name.to_ascii_lowercase();
    // Spelled-out forms people type for the short names.
    let alias = match lower.as_str() {
        "memory" | "ram" => Some("mem"),
        "cpu" | "cores" | "cpu_cores" | "vcpus" => Some("cpus"),
        "gpu" => Some("gpus"),
        "storage" | "disks" => Some("disk"),
        _ => None,
    };
    if let Some(alias) = alias.and_then(|a| known.iter().find(|k| **k == a)) {
        return Some(alias);
    }
    known
        .iter()
        .map(|k| (edit_distance(&lower, &k.to_ascii_lowercase()), *k))
        .filter(|(d, _)| *d <= 2 && *d < lower.chars().count())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Refuses a bundle with a name outside `known`: one line naming each unknown name, with a
/// suggestion where one is near (`unknown resource `cpu` (did you mean `cpus`?)`).
pub fn check_known_names(resources: &Resources, known: &[&str]) -> Result<(), String> {
    let unknown = resources.unknown_names(known);
    if unknown.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = unknown
        .iter()
        .map(|name| match did_you_mean(name, known) {
            Some(near) => format!("unknown resource `{name}` (did you mean `{near}`?)"),
            None => format!("unknown resource `{name}`"),
        })
        .collect();
    Err(format!("{}; known: {}", parts.join(", "), known.join(", ")))
}

/// Levenshtein distance in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

fn check_name(name: &str) -> Result<(), ResourceError> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ResourceError::BadName {
            name: name.to_string(),
        })
    }
}

/// Parses a decimal with at most three fractional digits into thousandths, exactly.
fn parse_amount(text: &str) -> Option<u64> {
    let (whole, frac) = match text.split_once('.') {
        Some((w, f)) => (w, f),
        None => (text, ""),
    };
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None; // rejects signs, NaN, inf, exponents
    }
    if frac.len() > 3 && frac[3..].bytes().any(|b| b != b'0') {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut frac_milli = 0u64;
    for (i, b) in frac.bytes().take(3).enumerate() {
        frac_milli += u64::from(b - b'0') * 10u64.pow(2 - i as u32);
    }
    whole.checked_mul(MILLI)?.checked_add(frac_milli)
}

/// Prints thousandths as a decimal without trailing zeros: 1500 → `1.5`, 8192000 → `8192`.
pub fn format_milli(milli: u64) -> String {
    let whole = milli / MILLI;
    let frac = milli % MILLI;
    if frac == 0 {
        whole.to_string()
    } else {
        let digits = format!("{frac:03}");
        format!("{whole}.{}", digits.trim_end_matches('0'))
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, m)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{name}:{}", format_milli(m))?;
        }
        Ok(())
    }
}

impl FromStr for Resources {
    type Err = ResourceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Resources::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    #[test]
    fn unknown_names_are_those_outside_the_known_set() {
        assert!(r("cpus:1;mem:64;gpu_milli:500")
            .unknown_names(&STANDARD_NAMES)
            .is_empty());
        assert_eq!(
            r("cpu:4;mem:64;memory:2;foo:1").unknown_names(&STANDARD_NAMES),
            ["cpu", "foo", "memory"]
        );
        // A zero amount is dropped, so never reported.
        assert!(r("cpu:0;mem:1").unknown_names(&STANDARD_NAMES).is_empty());
        assert_eq!(r("ports:2").unknown_names(&["ports"]), Vec::<&str>::new());
    }

    #[test]
    fn did_you_mean_suggests_only_near_names() {
        let table = [
            ("cpu", Some("cpus")),
            ("CPUS", Some("cpus")),
            ("cpsu", Some("cpus")),
            ("mme", Some("mem")),
            ("memory", Some("mem")),
            ("gpu", Some("gpus")),
            ("gpu_mili", Some("gpu_milli")),
            ("gpumem", Some("gpu_mem")),
            ("dsik", Some("disk")),
            ("foo", None),
            ("x", None),
            ("bandwidth", None),
        ];
        for (name, want) in table {
            assert_eq!(did_you_mean(name, &STANDARD_NAMES), want, "{name}");
        }
        // Aliases only point at names that are known.
        assert_eq!(did_you_mean("memory", &["cpus"]), None);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn check_known_names_explains_each_unknown_name() {
        assert_eq!(
            check_known_names(&r("cpus:1;mem:2"), &STANDARD_NAMES),
            Ok(())
        );
        let err = check_known_names(&r("cpu:4;mem:64"), &STANDARD_NAMES).unwrap_err();
        assert!(
            err.starts_with("unknown resource `cpu` (did you mean `cpus`?); known: cpus, mem"),
            "{err}"
        );
        let err = check_known_names(&r("foo:1;memory:2"), &STANDARD_NAMES).unwrap_err();
        assert!(
            err.starts_with(
                "unknown resource `foo`, unknown resource `memory` (did you mean `mem`?)"
            ),
            "{err}"
        );
    }

    #[test]
    fn parses_and_prints_mesos_syntax() {
        let res = r("mem:8192; cpus:1.5;gpus:1");
        assert_eq!(res.milli("cpus"), 1500);
        assert_eq!(res.milli("mem"), 8_192_000);
        assert_eq!(res.to_string(), "cpus:1.5;gpus:1;mem:8192");
        assert_eq!(r("").to_string(), "");
        assert_eq!(r("cpus:0;mem:1").to_string(), "mem:1");
        assert_eq!(r("cpus:.25").milli("cpus"), 250);
        assert_eq!(r("cpus:2.5000").milli("cpus"), 2500);
    }

    #[test]
    fn refuses_bad_text_naming_the_part() {
        let cases = [
            ("cpus", "`cpus` is not `name:amount`"),
            ("cpus:-1", "`cpus:-1`: amount `-1`"),
            ("cpus:NaN", "amount `NaN`"),
            ("cpus:inf", "amount `inf`"),
            ("cpus:1e3", "amount `1e3`"),
            ("cpus:0.0001", "amount `0.0001`"),
            ("cpus:1;cpus:2", "`cpus` appears more than once"),
            ("cpus:1;;mem:2", "`` is not"),
            ("4cpus:1", "`4cpus` is not a valid resource name"),
            ("cpus:", "amount ``"),
            ("cpus:99999999999999999999", "amount"),
        ];
        for (text, expected) in cases {
            let err = Resources::parse(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn checked_arithmetic() {
        let a = r("cpus:4;mem:8192");
        let b = r("cpus:2;mem:1024");
        assert_eq!(a.checked_sub(&b).unwrap(), r("cpus:2;mem:7168"));
        assert_eq!(a.checked_add(&b).unwrap(), r("cpus:6;mem:9216"));
        let err = b.checked_sub(&a).unwrap_err();
        assert_eq!(err.to_string(), "not enough `cpus`: 2 < 4");
        let big = Resources::from_milli([("x", u64::MAX)]).unwrap();
        assert!(big.checked_add(&r("x:1")).is_err());
        assert!(a.contains(&b) && !b.contains(&a));
        assert!(a.contains(&Resources::new()));
        assert!(!a.contains(&r("gpus:1")));
        assert_eq!(a.copies_of(&b), 2);
        assert_eq!(b.saturating_sub(&a), Resources::new());
        assert_eq!(
            a.shortfalls(&r("cpus:5;mem:1")).collect::<Vec<_>>(),
            ["cpus"]
        );
    }

    #[test]
    fn first_above_names_the_dimension_and_its_limit() {
        let limits = r("cpus:64;mem:1024");
        assert_eq!(r("cpus:64;mem:1024;disk:99999").first_above(&limits), None);
        assert_eq!(
            r("cpus:65;mem:2048").first_above(&limits),
            Some(("cpus", 65_000, 64_000))
        );
        assert_eq!(
            r("cpus:1;mem:1024.001").first_above(&limits),
            Some(("mem", 1_024_001, 1_024_000))
        );
        assert_eq!(r("cpus:1000").first_above(&Resources::new()), None);
    }

    /// SPEC seed 001: an agent with 4 CPU and 8 GB free runs (2 CPU, 1 GB) and (2 CPU, 2 GB)
    /// and is left with 0 CPU and 5 GB.
    #[test]
    fn seed_001_example() {
        let free = r("cpus:4;mem:8192");
        let left = free
            .checked_sub(&r("cpus:2;mem:1024"))
            .unwrap()
            .checked_sub(&r("cpus:2;mem:2048"))
            .unwrap();
        assert_eq!(left.milli("cpus"), 0);
        assert_eq!(left, r("mem:5120"));
    }

    #[test]
    fn saturating_add_clamps_each_dimension() {
        let mut sum = r("cpus:1;mem:10");
        sum.saturating_add_assign(&r("cpus:2;gpus:1"));
        assert_eq!(sum, r("cpus:3;mem:10;gpus:1"));
        sum.set_milli("mem", u64::MAX - 1);
        sum.saturating_add_assign(&r("mem:1"));
        assert_eq!(sum.milli("mem"), u64::MAX);
    }

    /// A bundle of up to four of five names (some sharing first bytes), amounts 0..4 (a zero
    /// is dropped), as milli.
    fn bundle() -> impl proptest::strategy::Strategy<Value = Resources> {
        let names = ["cpus", "gpus", "gpu_milli", "mem", "m"];
        proptest::collection::vec((0..names.len(), 0u64..4), 0..4).prop_map(move |entries| {
            let mut out = Resources::new();
            for (n, m) in entries {
                out.set_milli(names[n], m * 500);
            }
            out
        })
    }

    use proptest::strategy::Strategy;

    proptest::proptest! {
        /// Taking in place is `checked_sub`: the same result or the same refusal (then nothing
        /// changed), and `each` sees every dimension taken with its old and new amount.
        #[test]
        fn taking_in_place_is_checked_sub(have in bundle(), take in bundle()) {
            let mut in_place = have.clone();
            let mut seen = Vec::new();
            let result = in_place.checked_sub_assign_with(&take, |name, old, new| {
                seen.push((name.to_string(), old, new));
            });
            match have.checked_sub(&take) {
                Ok(expected) => {
                    proptest::prop_assert!(result.is_ok());
                    proptest::prop_assert_eq!(&in_place, &expected);
                    let want: Vec<_> = take
                        .iter()
                        .map(|(n, m)| (n.to_string(), have.milli(n), have.milli(n) - m))
                        .collect();
                    proptest::prop_assert_eq!(seen, want);
                }
                Err(e) => {
                    proptest::prop_assert_eq!(result, Err(e));
                    proptest::prop_assert_eq!(&in_place, &have);
                }
            }
        }

        /// Adding name by name, in the bundle's order or not, is `saturating_add_assign`.
        #[test]
        fn adding_each_is_saturating_add(have in bundle(), add in bundle(), reverse: bool) {
            let mut expected = have.clone();
            expected.saturating_add_assign(&add);
            let mut each = have.clone();
            let mut items: Vec<_> = add.iter().collect();
            if reverse {
                items.reverse();
            }
            each.saturating_add_each(items);
            proptest::prop_assert_eq!(each, expected);
        }

        /// The name order is `str`'s, on names that share first bytes or not, and the empty one.
        #[test]
        fn name_order_is_str_order(a in "[a-c_]{0,20}", b in "[a-c_]{0,20}") {
            proptest::prop_assert_eq!(name_order(&a, &b), a.cmp(&b));
        }
    }
}
