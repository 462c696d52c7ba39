//! The master's YAML configuration, and the one place YAML errors are turned into messages.
//!
//! Every error a person sees names the file, the line and the key, e.g.
//! `cluster.yaml:4: rings.mem.bounds: bounds must be strictly increasing (4096 after 16384)`.
//! Syntax and shape errors (unknown keys, wrong types) come from serde_norway with their
//! position; checks made after parsing (a layout that is not increasing, a bad duration) find
//! their key's line with [`locate`], which asks the same YAML parser where the key is. Those
//! located errors ([`ConfigError`], [`YamlSource`], [`Seg`]) are defined in `crate::yaml` and
//! re-exported here; the `tls:` and `auth:` sections are read by [`crate::security`].
//!
//! ```yaml
//! placer: ring            # ring | linear-best-fit | first-fit | balance | least-requested | most-balanced
//! balance:                # settings of the balance placer (SPEC seed 000), all optional
//!   initial_weights: { cpus: 0.3333, mem: 0.3333, gpus: 0.3334 }
//!   threshold: 0.5
//!   require_improvement: false
//! rings:
//!   cpus: { base: 0, step: 1, buckets: 64, search_up: 2 }
//!   mem:  { bounds: [0, 1024, 4096, 16384, 65536], search_up: 1 }
//!   spare: [gpus]         # demands without these go first to agents with none free ([] = off)
//!   candidates: 8         # ring tie-break: how many best fits a caller's score ranks (≤ 64)
//! master:
//!   agent_timeout: 15s
//! limits:                 # per connection (docs/reliability.md, "Limits"); each optional
//!   { messages_per_sec: 50000, burst: 100000, outbound_queue: 65536 }
//! matching:               # batch matching scores (docs/batch.md); each optional
//!   { a: 0.5, b: 0.5, c: -1.0, d: -0.1, e: 1.0 }
//! priorities:             # SPEC seed 003, see docs/priorities.md; all optional
//!   base: 0               # the priority of tasks beyond their user's quota
//!   partitions: [default, gpu]
//!   users:
//!     alice: { gpu: { priority: 10, quota: "gpus:4" } }
//! devices:                # GPU devices (docs/devices.md)
//!   selection: least-used # least-used (spread) | most-used-that-fits (pack)
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::de::{self, MapAccess, Visitor};
use serde::Deserialize;

use ringmaster_core::placement::balance::BalanceSettingsError;
use ringmaster_core::placement::matching::MatchingCoefficients;
use ringmaster_core::placement::priority::PriorityConfigError;
use ringmaster_core::placement::{
    BalanceSettings, PlacerKind, PriorityConfig, Resources, RingLayout, RingSearch,
    RingSearchError, RingSpec, RingsConfig, UserGrant,
};
use ringmaster_proto::resources::MILLI;

pub use crate::yaml::{locate, path_string, ConfigError, Seg, YamlSource};

/// A YAML number for an amount in a dimension's units, kept exact (`0.5` cpus is 500 milli).
pub fn amount_milli(value: &serde_yaml::Value) -> Result<u64, String> {
    let serde_yaml::Value::Number(n) = value else {
        return Err(format!("expected a number, found {}", describe(value)));
    };
    if let Some(u) = n.as_u64() {
        return u
            .checked_mul(MILLI)
            .ok_or_else(|| format!("{u} is too large"));
    }
    if n.as_i64().is_some() || n.as_f64().is_some_and(|f| f < 0.0) {
        return Err(format!("{n} is negative"));
    }
    let text = n.as_f64().map(|f| f.to_string()).unwrap_or_default();
    Resources::parse(&format!("amount:{text}"))
        .map(|r| r.milli("amount"))
        .map_err(|_| format!("{n} is not a finite amount with at most 3 decimals"))
}

/// A non-negative integer (counts, bucket numbers).
pub fn whole_number(value: &serde_yaml::Value) -> Result<u64, String> {
    match value {
        serde_yaml::Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Ok(u),
            (None, Some(i)) => Err(format!("{i} is negative")),
            _ => Err(format!("{n} is not a whole number")),
        },
        other => Err(format!(
            "expected a whole number, found {}",
            describe(other)
        )),
    }
}

fn describe(value: &serde_yaml::Value) -> String {
    match value {
        serde_yaml::Value::Null => "nothing".to_string(),
        serde_yaml::Value::Bool(b) => format!("`{b}`"),
        serde_yaml::Value::Number(n) => format!("`{n}`"),
        serde_yaml::Value::String(s) => format!("the string `{s}`"),
        serde_yaml::Value::Sequence(_) => "a list".to_string(),
        serde_yaml::Value::Mapping(_) => "a mapping".to_string(),
        serde_yaml::Value::Tagged(_) => "a tagged value".to_string(),
    }
}

/// One dimension's ring as written in YAML (numbers checked after parsing, with their line).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRing {
    base: Option<serde_yaml::Value>,
    step: Option<serde_yaml::Value>,
    buckets: Option<serde_yaml::Value>,
    bounds: Option<Vec<serde_yaml::Value>>,
    search_up: Option<serde_yaml::Value>,
}

/// The `rings:` section: dimension name (or `"*"` for all others) → ring, plus the ring
/// search's options under the reserved names `spare` and `candidates`.
#[derive(Debug, Default)]
pub struct RawRings {
    dimensions: BTreeMap<String, RawRing>,
    spare: Option<Vec<String>>,
    candidates: Option<serde_yaml::Value>,
    largest: Option<serde_yaml::Value>,
}

/// The name under `rings:` that sets the ring of every dimension not named.
pub const FALLBACK_RING: &str = "*";
/// The name under `rings:` listing the dimensions to spare ([`ringmaster_core::placement::RingSearch`]).
pub const SPARE_KEY: &str = "spare";
/// The name under `rings:` giving how many candidates the caller's score ranks.
pub const CANDIDATES_KEY: &str = "candidates";
/// The name under `rings:` giving how many of the largest fitting agents it ranks beside them.
pub const LARGEST_KEY: &str = "largest";

impl<'de> Deserialize<'de> for RawRings {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(RawRingsVisitor)
    }
}

/// Reads `rings:` entry by entry from the YAML deserializer itself, so errors inside a ring
/// keep their line and path.
struct RawRingsVisitor;

impl<'de> Visitor<'de> for RawRingsVisitor {
    type Value = RawRings;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping of dimension names to rings, `spare`, `candidates` and `largest`")
    }
    fn visit_unit<E: de::Error>(self) -> Result<RawRings, E> {
        Ok(RawRings::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawRings, A::Error> {
        let mut rings = RawRings::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                SPARE_KEY => rings.spare = Some(map.next_value()?),
                CANDIDATES_KEY => rings.candidates = Some(map.next_value()?),
                LARGEST_KEY => rings.largest = Some(map.next_value()?),
                _ => {
                    let ring: RawRing = map.next_value()?;
                    rings.dimensions.insert(key, ring);
                }
            }
        }
        Ok(rings)
    }
}

/// Applies a `rings:` section (found at `at` in `source`) on top of `rings`.
pub fn apply_rings(
    source: &YamlSource,
    at: &[Seg],
    raw: &RawRings,
    rings: &mut RingsConfig,
) -> Result<(), ConfigError> {
    let key = |k: &str| {
        let mut p = at.to_vec();
        p.push(Seg::Key(k.to_string()));
        p
    };
    if raw.spare.is_some() || raw.candidates.is_some() || raw.largest.is_some() {
        let spare = match &raw.spare {
            None => rings.search().spare().to_vec(),
            Some(names) => {
                for (i, name) in names.iter().enumerate() {
                    if let Err(e) = Resources::from_milli([(name.as_str(), 1)]) {
                        let mut p = key(SPARE_KEY);
                        p.push(Seg::Index(i));
                        return Err(source.error(&p, e.to_string()));
                    }
                }
                names.clone()
            }
        };
        let candidates = match &raw.candidates {
            None => rings.search().candidates(),
            Some(v) => {
                let n = whole_number(v).map_err(|m| source.error(&key(CANDIDATES_KEY), m))?;
                usize::try_from(n).unwrap_or(usize::MAX)
            }
        };
        let largest = match &raw.largest {
            None => rings.search().largest(),
            Some(v) => {
                let n = whole_number(v).map_err(|m| source.error(&key(LARGEST_KEY), m))?;
                usize::try_from(n).unwrap_or(usize::MAX)
            }
        };
        let search = RingSearch::new(spare, candidates)
            .and_then(|search| search.with_largest(largest))
            .map_err(|e| {
                let at = match e {
                    RingSearchError::TooManyCandidates(_) => CANDIDATES_KEY,
                    RingSearchError::TooManyLargest(_) => LARGEST_KEY,
                    RingSearchError::DuplicateSpare(_) => SPARE_KEY,
                };
                source.error(&key(at), e.to_string())
            })?;
        rings.set_search(search);
    }
    for (name, ring) in &raw.dimensions {
        let mut path = at.to_vec();
        path.push(Seg::Key(name.clone()));
        if name != FALLBACK_RING {
            if let Err(e) = Resources::from_milli([(name.as_str(), 1)]) {
                return Err(source.error(&path, e.to_string()));
            }
        }
        let spec = ring_spec(source, &path, ring)?;
        if name == FALLBACK_RING {
            rings.set_fallback(spec);
        } else {
            rings.set(name.clone(), spec);
        }
    }
    Ok(())
}

fn ring_spec(source: &YamlSource, at: &[Seg], raw: &RawRing) -> Result<RingSpec, ConfigError> {
    let key = |k: &str| {
        let mut p = at.to_vec();
        p.push(Seg::Key(k.to_string()));
        p
    };
    let field =
        |k: &str, v: &serde_yaml::Value, f: fn(&serde_yaml::Value) -> Result<u64, String>| {
            f(v).map_err(|m| source.error(&key(k), m))
        };
    let search_up = match &raw.search_up {
        Some(v) => field("search_up", v, whole_number)?,
        None => 1,
    };
    let search_up = usize::try_from(search_up).unwrap_or(usize::MAX);
    let layout = match (&raw.bounds, &raw.base, &raw.step, &raw.buckets) {
        (Some(bounds), None, None, None) => {
            let mut milli = Vec::with_capacity(bounds.len());
            for (i, b) in bounds.iter().enumerate() {
                let mut p = key("bounds");
                p.push(Seg::Index(i));
                milli.push(amount_milli(b).map_err(|m| source.error(&p, m))?);
            }
            RingLayout::Bounds(milli)
        }
        (Some(_), ..) => {
            return Err(source.error(
                at,
                "give either `bounds` or `base`/`step`/`buckets`, not both",
            ))
        }
        (None, base, Some(step), Some(buckets)) => RingLayout::EqualSpans {
            base: match base {
                Some(v) => field("base", v, amount_milli)?,
                None => 0,
            },
            step: field("step", step, amount_milli)?,
            buckets: usize::try_from(field("buckets", buckets, whole_number)?)
                .unwrap_or(usize::MAX),
        },
        (None, ..) => {
            return Err(source.error(
                at,
                "give `bounds: [...]` or `step` and `buckets` (and optionally `base`)",
            ))
        }
    };
    let which = match layout {
        RingLayout::Bounds(_) => "bounds",
        RingLayout::EqualSpans { step: 0, .. } => "step",
        RingLayout::EqualSpans { .. } => "buckets",
    };
    RingSpec::new(layout, search_up).map_err(|e| source.error(&key(which), e.to_string()))
}

/// Timers and limits of the master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterConfig {
    /// An agent silent this long is lost.
    pub agent_timeout: Duration,
    /// An offer not answered this long is rescinded.
    pub offer_timeout: Duration,
    /// Time between allocation steps.
    pub allocation_interval: Duration,
    pub heartbeat_interval: Duration,
    /// How long a declined agent is not re-offered to the same framework by default.
    pub default_refuse: Duration,
    pub status_retry_interval: Duration,
    /// Largest frame accepted on any connection.
    pub max_frame_bytes: usize,
    /// After a restart from a registry (`--work-dir`): how long a recovered agent has to
    /// re-register before its tasks become LOST with reason `agent_lost` (docs/reliability.md).
    pub agent_reregister_timeout: Duration,
    /// The most an agent may register in each dimension named (`cpus:4096;mem:67108864`);
    /// an agent above it is refused. Dimensions not named are not limited (docs/operations.md).
    pub max_agent_resources: Resources,
    /// Ended tasks whose terminal update was acknowledged, kept per framework for
    /// reconciliation and `/state` (oldest dropped first, from memory and the registry).
    pub max_completed_tasks_per_framework: usize,
    /// A framework with this many status updates sent and not yet acknowledged gets no new
    /// offers until it catches up (0: no limit). Bounds what a framework that reads or
    /// acknowledges slowly makes the master hold (docs/reliability.md, "Load").
    pub max_unacked_updates: usize,
    /// Lost agents remembered (for `/state` and re-registration by id); oldest forgotten first.
    pub max_removed_agents: usize,
    /// Removed frameworks remembered (their ids may not subscribe again); oldest forgotten first.
    pub max_removed_frameworks: usize,
}

/// The default of `master.max_agent_resources`: far above any real machine, far below what
/// would make cluster sums meaningless.
pub const DEFAULT_MAX_AGENT_RESOURCES: &str =
    "cpus:4096;mem:67108864;disk:1073741824;gpus:64;gpu_milli:64000;gpu_mem:16777216";

/// The range every duration key of the `master:` section must lie in, by key: (least, most).
pub const MASTER_DURATION_RANGES: [(&str, Duration, Duration); 7] = [
    ("agent_timeout", Duration::from_millis(100), DAY),
    ("offer_timeout", Duration::from_millis(100), DAY),
    (
        "allocation_interval",
        Duration::from_millis(1),
        Duration::from_secs(60),
    ),
    (
        "heartbeat_interval",
        Duration::from_millis(100),
        Duration::from_secs(3600),
    ),
    ("default_refuse", Duration::ZERO, DAY),
    (
        "status_retry_interval",
        Duration::from_millis(100),
        Duration::from_secs(3600),
    ),
    ("agent_reregister_timeout", Duration::from_millis(100), DAY),
];

const DAY: Duration = Duration::from_secs(24 * 3600);

/// `master.max_frame_bytes` must lie in this range: 64 KiB to 1 GiB.
pub const FRAME_BYTES_RANGE: (usize, usize) = (64 * 1024, 1024 * 1024 * 1024);

/// The most `max_completed_tasks_per_framework`, `max_unacked_updates`, `max_removed_agents`
/// and `max_removed_frameworks` may be.
pub const MAX_HISTORY: u64 = 1_000_000;

/// Prints a duration for range messages: `100ms`, `1day`.
fn show_duration(d: Duration) -> String {
    if d.is_zero() {
        "0s".to_string()
    } else {
        humantime::format_duration(d).to_string()
    }
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            agent_timeout: Duration::from_secs(15),
            offer_timeout: Duration::from_secs(10),
            allocation_interval: Duration::from_millis(20),
            heartbeat_interval: Duration::from_secs(1),
            default_refuse: Duration::from_secs(5),
            status_retry_interval: Duration::from_secs(2),
            max_frame_bytes: 4 * 1024 * 1024,
            agent_reregister_timeout: Duration::from_secs(60),
            max_agent_resources: Resources::parse(DEFAULT_MAX_AGENT_RESOURCES)
                .expect("valid default"),
            max_completed_tasks_per_framework: 1000,
            max_unacked_updates: 2000,
            max_removed_agents: 1000,
            max_removed_frameworks: 1000,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMaster {
    agent_timeout: Option<String>,
    offer_timeout: Option<String>,
    allocation_interval: Option<String>,
    heartbeat_interval: Option<String>,
    default_refuse: Option<String>,
    status_retry_interval: Option<String>,
    max_frame_bytes: Option<serde_yaml::Value>,
    agent_reregister_timeout: Option<String>,
    max_agent_resources: Option<String>,
    max_completed_tasks_per_framework: Option<serde_yaml::Value>,
    max_unacked_updates: Option<serde_yaml::Value>,
    max_removed_agents: Option<serde_yaml::Value>,
    max_removed_frameworks: Option<serde_yaml::Value>,
}

/// Per-connection limits (see `master::limits` and docs/reliability.md, "Limits").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitsConfig {
    /// Messages per second a connection may send on average (token refill rate).
    pub messages_per_sec: u64,
    /// Messages a connection may send at once beyond the rate (bucket size).
    pub burst: u64,
    /// Messages the master may hold queued to one connection that it has not read yet.
    pub outbound_queue: usize,
    /// Bytes (encoded) the master may hold queued to one connection that it has not read yet;
    /// a message is always let into an empty queue, whatever its size.
    pub outbound_queue_bytes: usize,
    /// Connections open at once (all roles, handshakes included); more are closed at accept.
    pub max_connections: usize,
    /// Largest frame accepted before a connection's RegisterAgent or Subscribe (Hello, and
    /// Authenticate where `auth.required`); `master.max_frame_bytes` applies from the role
    /// message on.
    pub max_handshake_frame_bytes: usize,
    /// Pending TCP connections the kernel queues on the protocol port before the master accepts
    /// them (the `listen(2)` backlog; the kernel caps it at `net.core.somaxconn`).
    pub listen_backlog: u32,
}

/// Allowed range of `limits.listen_backlog`.
pub const LISTEN_BACKLOG_RANGE: std::ops::RangeInclusive<u64> = 16..=65_535;

/// Allowed range of `limits.outbound_queue_bytes`: 64 KiB to 1 GiB.
pub const OUTBOUND_QUEUE_BYTES_RANGE: std::ops::RangeInclusive<u64> = 64 * 1024..=1 << 30;

/// Allowed range of `limits.max_connections`.
pub const MAX_CONNECTIONS_RANGE: std::ops::RangeInclusive<u64> = 1..=1_000_000;
/// Allowed range of `limits.max_handshake_frame_bytes`: 1 KiB to 4 MiB.
pub const MAX_HANDSHAKE_FRAME_RANGE: std::ops::RangeInclusive<u64> = 1024..=4 * 1024 * 1024;

impl Default for LimitsConfig {
    fn default() -> Self {
        // Generous: well above what the load generator's busiest framework sends (about
        // 10,000 acknowledgements a second), far below what a flooding loop sends.
        LimitsConfig {
            messages_per_sec: 50_000,
            burst: 100_000,
            outbound_queue: 65_536,
            // Four of the largest frames (master.max_frame_bytes, 4 MiB); the busiest framework
            // of the load generator stays well below it.
            outbound_queue_bytes: 16 * 1024 * 1024,
            max_connections: 20_000,
            max_handshake_frame_bytes: 64 * 1024,
            // 128 (the old default) overflowed while 10,000 agents registered at once.
            listen_backlog: 4096,
        }
    }
}

/// The `limits:` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    messages_per_sec: Option<serde_yaml::Value>,
    burst: Option<serde_yaml::Value>,
    outbound_queue: Option<serde_yaml::Value>,
    outbound_queue_bytes: Option<serde_yaml::Value>,
    max_connections: Option<serde_yaml::Value>,
    max_handshake_frame_bytes: Option<serde_yaml::Value>,
    listen_backlog: Option<serde_yaml::Value>,
}

/// Reads a `limits:` section: every value a whole number of at least 1, the connection cap and
/// the handshake frame limit within their ranges.
fn apply_limits(
    source: &YamlSource,
    raw: &RawLimits,
    out: &mut LimitsConfig,
) -> Result<(), ConfigError> {
    let positive = |name: &str, value: &serde_yaml::Value| -> Result<u64, ConfigError> {
        let path = ["limits".into(), name.into()];
        match whole_number(value) {
            Ok(0) => Err(source.error(&path, "must be at least 1")),
            Ok(n) => Ok(n),
            Err(e) => Err(source.error(&path, e)),
        }
    };
    if let Some(v) = &raw.messages_per_sec {
        out.messages_per_sec = positive("messages_per_sec", v)?;
    }
    if let Some(v) = &raw.burst {
        out.burst = positive("burst", v)?;
    }
    if let Some(v) = &raw.outbound_queue {
        let n = positive("outbound_queue", v)?;
        out.outbound_queue = usize::try_from(n).map_err(|_| {
            source.error(
                &["limits".into(), "outbound_queue".into()],
                format!("{n} is too large"),
            )
        })?;
    }
    let in_range = |name: &str,
                    value: &serde_yaml::Value,
                    range: &std::ops::RangeInclusive<u64>|
     -> Result<usize, ConfigError> {
        let path = ["limits".into(), name.into()];
        let n = whole_number(value).map_err(|e| source.error(&path, e))?;
        if !range.contains(&n) {
            return Err(source.error(
                &path,
                format!(
                    "{n} is out of range: allowed {} to {}",
                    range.start(),
                    range.end()
                ),
            ));
        }
        usize::try_from(n).map_err(|_| source.error(&path, format!("{n} is too large")))
    };
    if let Some(v) = &raw.outbound_queue_bytes {
        out.outbound_queue_bytes =
            in_range("outbound_queue_bytes", v, &OUTBOUND_QUEUE_BYTES_RANGE)?;
    }
    if let Some(v) = &raw.max_connections {
        out.max_connections = in_range("max_connections", v, &MAX_CONNECTIONS_RANGE)?;
    }
    if let Some(v) = &raw.max_handshake_frame_bytes {
        out.max_handshake_frame_bytes =
            in_range("max_handshake_frame_bytes", v, &MAX_HANDSHAKE_FRAME_RANGE)?;
    }
    if let Some(v) = &raw.listen_backlog {
        out.listen_backlog = in_range("listen_backlog", v, &LISTEN_BACKLOG_RANGE)? as u32;
    }
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    placer: Option<String>,
    balance: Option<RawBalance>,
    rings: Option<RawRings>,
    master: Option<RawMaster>,
    matching: Option<RawMatching>,
    priorities: Option<RawPriorities>,
    limits: Option<RawLimits>,
    tls: Option<crate::security::RawTls>,
    auth: Option<crate::security::RawAuth>,
    http: Option<crate::security::RawHttp>,
    devices: Option<RawDevices>,
    cluster: Option<RawCluster>,
}

/// The `devices:` section: how the master picks a GPU task's devices on its agent.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevices {
    selection: Option<String>,
}

/// Device settings (docs/devices.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevicesConfig {
    /// `least-used` (spread, default) or `most-used-that-fits` (pack).
    pub selection: ringmaster_proto::devices::DeviceSelection,
}

/// The `matching:` section: coefficients of the batch-matching scores.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatching {
    a: Option<serde_yaml::Value>,
    b: Option<serde_yaml::Value>,
    c: Option<serde_yaml::Value>,
    d: Option<serde_yaml::Value>,
    e: Option<serde_yaml::Value>,
}

/// Applies a `matching:` section found at `at` on top of `out`: each coefficient a finite number.
pub fn apply_matching(
    source: &YamlSource,
    at: &[Seg],
    raw: &RawMatching,
    out: &mut MatchingCoefficients,
) -> Result<(), ConfigError> {
    let fields: [(&str, &Option<serde_yaml::Value>, &mut f64); 5] = [
        ("a", &raw.a, &mut out.a),
        ("b", &raw.b, &mut out.b),
        ("c", &raw.c, &mut out.c),
        ("d", &raw.d, &mut out.d),
        ("e", &raw.e, &mut out.e),
    ];
    for (name, value, slot) in fields {
        let Some(value) = value else { continue };
        match value.as_f64() {
            Some(x) if x.is_finite() => *slot = x,
            _ => {
                let mut path = at.to_vec();
                path.push(name.into());
                return Err(source.error(
                    &path,
                    format!("expected a finite number, found {}", describe(value)),
                ));
            }
        }
    }
    Ok(())
}

/// The `priorities:` section as written (checked after parsing, with its lines).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPriorities {
    base: Option<serde_yaml::Value>,
    partitions: Option<Vec<String>>,
    #[serde(default)]
    users: BTreeMap<String, BTreeMap<String, RawGrant>>,
}

/// One user's priority and quota in one partition.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGrant {
    priority: serde_yaml::Value,
    quota: String,
}

fn integer(value: &serde_yaml::Value) -> Result<i64, String> {
    match value {
        serde_yaml::Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| format!("{n} is not a whole number in range")),
        other => Err(format!(
            "expected a whole number, found {}",
            describe(other)
        )),
    }
}

/// Reads a `priorities:` section found at `at` in `source`.
pub fn apply_priorities(
    source: &YamlSource,
    at: &[Seg],
    raw: &RawPriorities,
) -> Result<PriorityConfig, ConfigError> {
    let path = |keys: &[&str]| -> Vec<Seg> {
        let mut p = at.to_vec();
        p.extend(keys.iter().map(|k| Seg::Key(k.to_string())));
        p
    };
    let base = match &raw.base {
        None => 0,
        Some(v) => integer(v).map_err(|e| source.error(&path(&["base"]), e))?,
    };
    let mut users: BTreeMap<String, BTreeMap<String, UserGrant>> = BTreeMap::new();
    for (user, grants) in &raw.users {
        for (partition, grant) in grants {
            let priority = integer(&grant.priority)
                .map_err(|e| source.error(&path(&["users", user, partition, "priority"]), e))?;
            let quota = Resources::parse(&grant.quota).map_err(|e| {
                source.error(
                    &path(&["users", user, partition, "quota"]),
                    format!(
                        "`{}` is not a resource list like gpus:4;cpus:8: {e}",
                        grant.quota
                    ),
                )
            })?;
            users
                .entry(user.clone())
                .or_default()
                .insert(partition.clone(), UserGrant { priority, quota });
        }
    }
    let partitions = raw.partitions.clone().unwrap_or_default();
    PriorityConfig::new(base, partitions, users).map_err(|e| {
        let at = match &e {
            PriorityConfigError::UnknownPartition {
                user, partition, ..
            } => path(&["users", user, partition]),
            PriorityConfigError::NotAboveBase {
                user, partition, ..
            } => path(&["users", user, partition, "priority"]),
            PriorityConfigError::DuplicatePartition(_)
            | PriorityConfigError::BadPartitionName(_) => path(&["partitions"]),
        };
        source.error(&at, e.to_string())
    })
}

/// The whole configuration file; every section is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub placer: PlacerKind,
    /// Settings of the balance placer (used when `placer: balance`).
    pub balance: BalanceSettings,
    pub rings: RingsConfig,
    pub master: MasterConfig,
    /// Coefficients of the batch-matching scores.
    pub matching: MatchingCoefficients,
    /// User priorities, quotas and partitions (no users: everything at base, no preemption).
    pub priorities: PriorityConfig,
    /// Per-connection message rate and outbound queue bounds.
    pub limits: LimitsConfig,
    /// TLS material of the protocol listener; `None` serves plain TCP (docs/security.md).
    pub tls: Option<ringmaster_proto::transport::TlsServerFiles>,
    /// Principals and what they may do (default: nobody is asked to authenticate).
    pub auth: crate::security::AuthConfig,
    /// The HTTP API's anonymous routes (`http.anonymous`; docs/security.md, "HTTP API").
    pub http: crate::security::HttpConfig,
    /// How GPU tasks get their devices.
    pub devices: DevicesConfig,
    /// The replication group this master belongs to; `None`: a single master.
    pub cluster: Option<ClusterConfig>,
}

/// The `balance:` section as written (checked after parsing, with its lines).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBalance {
    initial_weights: Option<serde_yaml::Mapping>,
    threshold: Option<serde_yaml::Value>,
    require_improvement: Option<bool>,
}

/// Applies a `balance:` section (found at `at` in `source`) on top of `settings`.
pub fn apply_balance(
    source: &YamlSource,
    at: &[Seg],
    raw: &RawBalance,
    settings: &mut BalanceSettings,
) -> Result<(), ConfigError> {
    let path = |keys: &[&str]| -> Vec<Seg> {
        let mut p = at.to_vec();
        p.extend(keys.iter().map(|k| Seg::Key(k.to_string())));
        p
    };
    let weights = match &raw.initial_weights {
        None => settings.initial_weights().map(<[_]>::to_vec),
        Some(map) => {
            let mut weights = Vec::with_capacity(map.len());
            for (name, value) in map {
                let Some(name) = name.as_str() else {
                    return Err(source.error(
                        &path(&["initial_weights"]),
                        format!("dimension names are text, found {}", describe(name)),
                    ));
                };
                let weight = match value {
                    serde_yaml::Value::Number(n) => n.as_f64(),
                    _ => None,
                };
                let Some(weight) = weight else {
                    return Err(source.error(
                        &path(&["initial_weights", name]),
                        format!("expected a number, found {}", describe(value)),
                    ));
                };
                weights.push((name.to_string(), weight));
            }
            Some(weights)
        }
    };
    let threshold = match &raw.threshold {
        None => settings.threshold(),
        Some(serde_yaml::Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
        Some(other) => {
            return Err(source.error(
                &path(&["threshold"]),
                format!("expected a number from 0 to 1, found {}", describe(other)),
            ))
        }
    };
    let require_improvement = raw
        .require_improvement
        .unwrap_or(settings.require_improvement());
    *settings = BalanceSettings::new(weights, threshold, require_improvement).map_err(|e| {
        let at = match &e {
            BalanceSettingsError::BadName(name)
            | BalanceSettingsError::Duplicate { name }
            | BalanceSettingsError::BadWeight { name, .. } => path(&["initial_weights", name]),
            BalanceSettingsError::TooFewDimensions(_) | BalanceSettingsError::Sum(_) => {
                path(&["initial_weights"])
            }
            BalanceSettingsError::Threshold(_) => path(&["threshold"]),
        };
        source.error(&at, e.to_string())
    })?;
    Ok(())
}

/// Parses a placer name found at `path`.
pub fn placer_kind(
    source: &YamlSource,
    path: &[Seg],
    name: &str,
) -> Result<PlacerKind, ConfigError> {
    name.parse()
        .map_err(|e: ringmaster_core::placement::placer::UnknownPlacer| {
            source.error(path, e.to_string())
        })
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Config::from_yaml(&text, &file)
    }

    /// Parses and checks configuration text; `file` names it in errors.
    pub fn from_yaml(text: &str, file: &str) -> Result<Config, ConfigError> {
        let source = YamlSource { text, file };
        let raw: Option<RawConfig> = source.parse()?;
        let raw = raw.unwrap_or_default();
        let mut config = Config::default();
        if let Some(name) = &raw.placer {
            config.placer = placer_kind(&source, &["placer".into()], name)?;
        }
        if let Some(balance) = &raw.balance {
            apply_balance(&source, &["balance".into()], balance, &mut config.balance)?;
        }
        if let Some(rings) = &raw.rings {
            apply_rings(&source, &["rings".into()], rings, &mut config.rings)?;
        }
        if let Some(m) = &raw.matching {
            apply_matching(&source, &["matching".into()], m, &mut config.matching)?;
        }
        if let Some(p) = &raw.priorities {
            config.priorities = apply_priorities(&source, &["priorities".into()], p)?;
        }
        if let Some(l) = &raw.limits {
            apply_limits(&source, l, &mut config.limits)?;
        }
        if let Some(t) = &raw.tls {
            config.tls = Some(crate::security::apply_tls(&source, &["tls".into()], t)?);
        }
        if let Some(a) = &raw.auth {
            config.auth = crate::security::apply_auth(&source, &["auth".into()], a)?;
        }
        if let Some(h) = &raw.http {
            config.http = crate::security::apply_http(&source, &["http".into()], h)?;
        }
        if let Some(selection) = raw.devices.as_ref().and_then(|d| d.selection.as_ref()) {
            config.devices.selection =
                selection
                    .parse()
                    .map_err(|e: ringmaster_proto::devices::DeviceError| {
                        source.error(&["devices".into(), "selection".into()], e.to_string())
                    })?;
        }
        if let Some(c) = &raw.cluster {
            config.cluster = Some(apply_cluster(&source, c)?);
        }
        if let Some(m) = &raw.master {
            let out = &mut config.master;
            let durations: [(&str, &Option<String>, &mut Duration); 7] = [
                ("agent_timeout", &m.agent_timeout, &mut out.agent_timeout),
                ("offer_timeout", &m.offer_timeout, &mut out.offer_timeout),
                (
                    "allocation_interval",
                    &m.allocation_interval,
                    &mut out.allocation_interval,
                ),
                (
                    "heartbeat_interval",
                    &m.heartbeat_interval,
                    &mut out.heartbeat_interval,
                ),
                ("default_refuse", &m.default_refuse, &mut out.default_refuse),
                (
                    "status_retry_interval",
                    &m.status_retry_interval,
                    &mut out.status_retry_interval,
                ),
                (
                    "agent_reregister_timeout",
                    &m.agent_reregister_timeout,
                    &mut out.agent_reregister_timeout,
                ),
            ];
            for (name, text, slot) in durations {
                if let Some(text) = text {
                    *slot = humantime::parse_duration(text).map_err(|e| {
                        source.error(
                            &["master".into(), name.into()],
                            format!("`{text}` is not a duration like 15s or 500ms: {e}"),
                        )
                    })?;
                }
            }
            if let Some(v) = &m.max_frame_bytes {
                let path = ["master".into(), "max_frame_bytes".into()];
                let n = whole_number(v).map_err(|e| source.error(&path, e))?;
                let (least, most) = FRAME_BYTES_RANGE;
                out.max_frame_bytes = match usize::try_from(n) {
                    Ok(n) if (least..=most).contains(&n) => n,
                    _ => {
                        return Err(source.error(
                            &path,
                            format!("{n} is out of range: the frame size must be from {least} (64 KiB) to {most} (1 GiB) bytes"),
                        ))
                    }
                };
            }
            if let Some(text) = &m.max_agent_resources {
                out.max_agent_resources = Resources::parse(text).map_err(|e| {
                    source.error(
                        &["master".into(), "max_agent_resources".into()],
                        format!("`{text}` is not a resource list like cpus:4096;mem:67108864: {e}"),
                    )
                })?;
            }
            let counts: [(&str, &Option<serde_yaml::Value>, &mut usize); 4] = [
                (
                    "max_unacked_updates",
                    &m.max_unacked_updates,
                    &mut out.max_unacked_updates,
                ),
                (
                    "max_completed_tasks_per_framework",
                    &m.max_completed_tasks_per_framework,
                    &mut out.max_completed_tasks_per_framework,
                ),
                (
                    "max_removed_agents",
                    &m.max_removed_agents,
                    &mut out.max_removed_agents,
                ),
                (
                    "max_removed_frameworks",
                    &m.max_removed_frameworks,
                    &mut out.max_removed_frameworks,
                ),
            ];
            for (name, value, slot) in counts {
                let Some(value) = value else { continue };
                let path = ["master".into(), name.into()];
                let n = whole_number(value).map_err(|e| source.error(&path, e))?;
                if n > MAX_HISTORY {
                    return Err(source.error(
                        &path,
                        format!("{n} is out of range: must be from 0 to {MAX_HISTORY}"),
                    ));
                }
                *slot = n as usize;
            }
        }
        check_master_ranges(&source, &config.master)?;
        Ok(config)
    }
}

/// A replicated master's group (docs/operations.md, "Cluster"): which master this is and how
/// to reach every master of the group, this one included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This master's id: one of `peers`.
    pub id: u64,
    /// Every master of the group by id (at least 1): its protocol address, `host:port`.
    pub peers: std::collections::BTreeMap<u64, String>,
    /// A follower that hears no leader this long (up to twice as long, at random) stands for
    /// election; the leader's heartbeat is a fifth of it.
    pub election_timeout: Duration,
    /// With `tls:`: the CA that signed the other masters' certificates (PEM), which this
    /// master trusts when it connects to them.
    pub ca: Option<std::path::PathBuf>,
    /// This master joins a group that already exists (a new master, or one whose work
    /// directory was wiped): it does not propose `peers` as the membership but waits for the
    /// leader, which adds it (`POST /cluster/members`), to replicate to it.
    pub join: bool,
    /// Entries applied since the last snapshot before a new snapshot of the registry is built
    /// and the log before it compacted.
    pub snapshot_threshold: u64,
}

/// The default `cluster.election_timeout`.
pub const DEFAULT_ELECTION_TIMEOUT: Duration = Duration::from_millis(750);

/// The default `cluster.snapshot_threshold`.
pub const DEFAULT_SNAPSHOT_THRESHOLD: u64 = 5000;

/// `cluster.snapshot_threshold` must lie in this range.
pub const SNAPSHOT_THRESHOLD_RANGE: (u64, u64) = (16, 10_000_000);

/// At most this many entries stay in the log behind a snapshot (fewer with a smaller
/// `snapshot_threshold`): a follower a little behind still catches up from the log.
pub const MAX_LOG_KEPT_AFTER_SNAPSHOT: u64 = 1000;

/// `cluster.election_timeout` must lie in this range.
pub const ELECTION_TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(150), Duration::from_secs(60));

impl ClusterConfig {
    /// openraft's settings for this group, with frames of at most `max_frame_bytes`
    /// (`master.max_frame_bytes`):
    /// - election timeout `election_timeout` to twice that (randomized), heartbeat a fifth of
    ///   it (openraft also uses the heartbeat as the append-entries RPC timeout);
    /// - snapshot chunks of a quarter of a frame (the replication encoding writes a byte as up
    ///   to 2; the transport splits a chunk further if it still would not fit);
    /// - a snapshot chunk may take the election timeout (at least 1 s) to install;
    /// - a snapshot every `snapshot_threshold` applied entries, keeping at most
    ///   `min(snapshot_threshold, 1000)` entries of the log behind it.
    pub fn raft_config(&self, max_frame_bytes: usize) -> openraft::Config {
        let election = (self.election_timeout.as_millis() as u64).max(1);
        openraft::Config {
            cluster_name: "ringmaster".into(),
            election_timeout_min: election,
            election_timeout_max: election * 2,
            heartbeat_interval: (election / 5).max(1),
            install_snapshot_timeout: election.max(1000),
            snapshot_max_chunk_size: (max_frame_bytes as u64 / 4).max(1024),
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_threshold),
            max_in_snapshot_log_to_keep: self.snapshot_threshold.min(MAX_LOG_KEPT_AFTER_SNAPSHOT),
            ..Default::default()
        }
    }
}

/// The `cluster:` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    id: Option<serde_yaml::Value>,
    peers: Option<serde_yaml::Mapping>,
    election_timeout: Option<String>,
    ca: Option<String>,
    join: Option<bool>,
    snapshot_threshold: Option<serde_yaml::Value>,
}

/// Checks `host:port`: a non-empty host (a name, an IPv4 address, or `[IPv6]`) and a port
/// from 1 to 65535.
pub(crate) fn check_host_port(address: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("`{address}` is not host:port ({why})"));
    let Some((host, port)) = address.rsplit_once(':') else {
        return bad("no port");
    };
    if host.is_empty() {
        return bad("no host");
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return bad("write an IPv6 address in brackets: [::1]:5050");
    }
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("spaces in the host");
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => bad("the port must be from 1 to 65535"),
        Ok(_) => Ok(()),
    }
}

/// Reads a `cluster:` section: `id` one of `peers`, ids from 1, addresses `host:port`, the
/// election timeout in its range.
fn apply_cluster(source: &YamlSource, raw: &RawCluster) -> Result<ClusterConfig, ConfigError> {
    let at = |keys: &[&str]| -> Vec<Seg> {
        let mut p = vec![Seg::Key("cluster".into())];
        p.extend(keys.iter().map(|k| Seg::Key(k.to_string())));
        p
    };
    let id_of = |value: &serde_yaml::Value, path: &[Seg]| -> Result<u64, ConfigError> {
        match whole_number(value) {
            Ok(0) => Err(source.error(path, "master ids start at 1")),
            Ok(n) => Ok(n),
            Err(e) => Err(source.error(path, e)),
        }
    };
    let Some(id) = &raw.id else {
        return Err(source.error(&at(&[]), "no id: give this master's id (one of peers)"));
    };
    let id = id_of(id, &at(&["id"]))?;
    let no_peers = "no peers: list every master of the group, this one included (id: host:port)";
    let Some(raw_peers) = &raw.peers else {
        return Err(source.error(&at(&[]), no_peers));
    };
    if raw_peers.is_empty() {
        return Err(source.error(&at(&["peers"]), no_peers));
    }
    let mut peers = std::collections::BTreeMap::new();
    for (key, value) in raw_peers {
        let shown = match key {
            serde_yaml::Value::String(s) => s.clone(),
            serde_yaml::Value::Number(n) => n.to_string(),
            other => describe(other),
        };
        let path = at(&["peers", &shown]);
        let peer = id_of(key, &path)?;
        let Some(address) = value.as_str() else {
            return Err(source.error(
                &path,
                format!("expected an address host:port, found {}", describe(value)),
            ));
        };
        check_host_port(address).map_err(|e| source.error(&path, e))?;
        if let Some((other, _)) = peers.iter().find(|(_, a)| *a == address) {
            return Err(source.error(
                &path,
                format!("`{address}` is master {other}'s address too"),
            ));
        }
        peers.insert(peer, address.to_string());
    }
    if !peers.contains_key(&id) {
        return Err(source.error(
            &at(&["id"]),
            format!(
                "master {id} is not one of peers ({})",
                peers
                    .keys()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let mut election_timeout = DEFAULT_ELECTION_TIMEOUT;
    if let Some(text) = &raw.election_timeout {
        let path = at(&["election_timeout"]);
        election_timeout = humantime::parse_duration(text).map_err(|e| {
            source.error(
                &path,
                format!("`{text}` is not a duration like 1s or 500ms: {e}"),
            )
        })?;
        let (least, most) = ELECTION_TIMEOUT_RANGE;
        if election_timeout < least || election_timeout > most {
            return Err(source.error(
                &path,
                format!(
                    "{} is out of range: must be from {} to {}",
                    show_duration(election_timeout),
                    show_duration(least),
                    show_duration(most)
                ),
            ));
        }
    }
    let ca = match &raw.ca {
        Some(file) => {
            let path = crate::security::resolve(source.file, file);
            ringmaster_proto::transport::TlsClient::load(&path, None)
                .map_err(|e| source.error(&at(&["ca"]), e.to_string()))?;
            Some(path)
        }
        None => None,
    };
    let mut snapshot_threshold = DEFAULT_SNAPSHOT_THRESHOLD;
    if let Some(value) = &raw.snapshot_threshold {
        let path = at(&["snapshot_threshold"]);
        let (least, most) = SNAPSHOT_THRESHOLD_RANGE;
        let out_of_range = |shown: String| {
            source.error(
                &path,
                format!("{shown} is out of range: must be from {least} to {most} entries"),
            )
        };
        snapshot_threshold = match whole_number(value) {
            Ok(n) if (least..=most).contains(&n) => n,
            Ok(n) => return Err(out_of_range(n.to_string())),
            Err(e) => match value.as_i64() {
                Some(n) => return Err(out_of_range(n.to_string())),
                None => return Err(source.error(&path, e)),
            },
        };
    }
    Ok(ClusterConfig {
        id,
        peers,
        election_timeout,
        ca,
        join: raw.join.unwrap_or(false),
        snapshot_threshold,
    })
}

/// Refuses timers outside their sane range (a zero `agent_timeout` would lose every agent at
/// once, a zero `offer_timeout` rescind every offer as it is made), naming the key's line.
fn check_master_ranges(source: &YamlSource, m: &MasterConfig) -> Result<(), ConfigError> {
    let values = [
        m.agent_timeout,
        m.offer_timeout,
        m.allocation_interval,
        m.heartbeat_interval,
        m.default_refuse,
        m.status_retry_interval,
        m.agent_reregister_timeout,
    ];
    for ((name, least, most), value) in MASTER_DURATION_RANGES.iter().zip(values) {
        if value < *least || value > *most {
            return Err(source.error(
                &["master".into(), (*name).into()],
                format!(
                    "{} is out of range: must be from {} to {}",
                    show_duration(value),
                    show_duration(*least),
                    show_duration(*most)
                ),
            ));
        }
    }
    if m.heartbeat_interval >= m.agent_timeout {
        return Err(source.error(
            &["master".into(), "heartbeat_interval".into()],
            format!(
                "{} must be shorter than master.agent_timeout ({}), or every agent is lost between two heartbeats",
                show_duration(m.heartbeat_interval),
                show_duration(m.agent_timeout)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = "\
placer: linear-best-fit
balance:
  initial_weights: { cpus: 0.25, mem: 0.25, gpus: 0.5 }
  threshold: 0.7
  require_improvement: true
rings:
  cpus: { base: 0.5, step: 0.5, buckets: 8, search_up: 3 }
  mem:
    bounds: [0, 1024, 4096, 16384, 65536]
    search_up: 0
  \"*\": { bounds: [0, 10] }
  spare: [gpus, fpgas]
  candidates: 4
master:
  agent_timeout: 30s
  allocation_interval: 500ms
  max_frame_bytes: 65536
matching: { a: 0.7, d: -1 }
";

    #[test]
    fn reads_every_section() {
        let config = Config::from_yaml(FULL, "cluster.yaml").unwrap();
        assert_eq!(config.placer, PlacerKind::LinearBestFit);
        let weights =
            [("cpus", 0.25), ("mem", 0.25), ("gpus", 0.5)].map(|(n, w)| (n.to_string(), w));
        assert_eq!(config.balance.initial_weights(), Some(&weights[..]));
        assert_eq!(config.balance.threshold(), 0.7);
        assert!(config.balance.require_improvement());
        let cpus = config.rings.spec_for("cpus");
        assert_eq!(
            cpus.layout(),
            &RingLayout::EqualSpans {
                base: 500,
                step: 500,
                buckets: 8
            }
        );
        assert_eq!(cpus.search_up(), 3);
        let mem = config.rings.spec_for("mem");
        assert_eq!(
            mem.layout(),
            &RingLayout::Bounds(vec![0, 1_024_000, 4_096_000, 16_384_000, 65_536_000])
        );
        assert_eq!(mem.search_up(), 0);
        assert_eq!(
            config.rings.spec_for("fpgas").layout(),
            &RingLayout::Bounds(vec![0, 10_000])
        );
        assert_eq!(config.rings.search().spare(), ["gpus", "fpgas"]);
        assert_eq!(config.rings.search().candidates(), 4);
        // Not given: the default number of largest candidates.
        assert_eq!(config.rings.search().largest(), 24);
        // Untouched dimensions keep their defaults.
        assert_eq!(
            config.rings.spec_for("gpus"),
            RingsConfig::default().spec_for("gpus")
        );
        assert_eq!(config.master.agent_timeout, Duration::from_secs(30));
        assert_eq!(
            config.master.allocation_interval,
            Duration::from_millis(500)
        );
        assert_eq!(config.master.offer_timeout, Duration::from_secs(10));
        assert_eq!(config.master.max_frame_bytes, 65536);
        assert_eq!(
            config.matching,
            MatchingCoefficients {
                a: 0.7,
                d: -1.0,
                ..MatchingCoefficients::default()
            }
        );
    }

    #[test]
    fn reads_priorities_and_locates_their_errors() {
        let text = "priorities:\n  base: -1\n  partitions: [default, gpu]\n  users:\n    alice:\n      gpu: { priority: 10, quota: \"gpus:4\" }\n";
        let config = Config::from_yaml(text, "c.yaml").unwrap();
        let p = &config.priorities;
        assert_eq!(p.base(), -1);
        assert_eq!(p.partitions(), ["default", "gpu"]);
        let grant = p.grant("alice", "gpu").unwrap();
        assert_eq!(
            (grant.priority, grant.quota.to_string()),
            (10, "gpus:4".to_string())
        );
        let cases = [
            (
                "priorities:\n  users:\n    alice:\n      gpu: { priority: 10, quota: \"gpus:4\" }\n",
                "c.yaml:4: priorities.users.alice.gpu: partition \"gpu\" is not among the partitions [\"default\"]",
            ),
            (
                "priorities:\n  base: 5\n  users:\n    alice:\n      default: { priority: 5, quota: \"gpus:4\" }\n",
                "c.yaml:5: priorities.users.alice.default.priority: priority 5 must be above the base priority 5",
            ),
            (
                "priorities:\n  users:\n    alice:\n      default:\n        priority: 3\n        quota: \"gpus:x\"\n",
                "c.yaml:6: priorities.users.alice.default.quota: `gpus:x` is not a resource list",
            ),
            (
                "priorities:\n  base: high\n",
                "c.yaml:2: priorities.base: expected a whole number, found the string `high`",
            ),
        ];
        for (text, want) in cases {
            let err = Config::from_yaml(text, "c.yaml").unwrap_err().to_string();
            assert!(err.starts_with(want), "{err}\nwanted {want}");
        }
    }

    #[test]
    fn empty_file_is_all_defaults() {
        for text in ["", "# nothing\n", "{}"] {
            assert_eq!(
                Config::from_yaml(text, "c.yaml").unwrap(),
                Config::default()
            );
        }
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let cases = [
            (
                "rings:\n  cpus: { step: 1, buckets: 4 }\n  mem:\n    bounds: [0, 1024, 16384, 4096]\n",
                "cluster.yaml:4: rings.mem.bounds: bounds must be strictly increasing (4096 after 16384)",
            ),
            (
                "placer: ring\nrings:\n  cpus: { step: 0, buckets: 4 }\n",
                "cluster.yaml:3: rings.cpus.step: step must be greater than 0",
            ),
            (
                "rings:\n  cpus:\n    step: 1\n    buckets: 0\n",
                "cluster.yaml:4: rings.cpus.buckets: buckets must be at least 1",
            ),
            (
                "rings:\n  cpus: { step: 1, buckets: 4, base: -1 }\n",
                "cluster.yaml:2: rings.cpus.base: -1 is negative",
            ),
            (
                "rings:\n  mem:\n    bounds:\n      - 0\n      - -5\n",
                "cluster.yaml:5: rings.mem.bounds[1]: -5 is negative",
            ),
            (
                "rings:\n  cpus: { step: 1, buckets: 4, search_up: -2 }\n",
                "cluster.yaml:2: rings.cpus.search_up: -2 is negative",
            ),
            (
                "rings:\n  cpus: { step: 1, bounds: [0] }\n",
                "cluster.yaml:2: rings.cpus: give either `bounds` or `base`/`step`/`buckets`, not both",
            ),
            (
                "rings:\n  cpus: { search_up: 1 }\n",
                "cluster.yaml:2: rings.cpus: give `bounds: [...]` or `step` and `buckets` (and optionally `base`)",
            ),
            (
                "rings:\n  cpus: { step: 1, buckets: 4 }\n  candidates: 65\n",
                "cluster.yaml:3: rings.candidates: at most 64 candidates are allowed, not 65",
            ),
            (
                "rings:\n  candidates: -1\n",
                "cluster.yaml:2: rings.candidates: -1 is negative",
            ),
            (
                "rings:\n  candidates: 8\n  largest: 65\n",
                "cluster.yaml:3: rings.largest: at most 64 largest candidates are allowed, not 65",
            ),
            (
                "rings:\n  largest: many\n",
                "cluster.yaml:2: rings.largest: expected a whole number, found the string `many`",
            ),
            (
                "rings:\n  spare: [gpus, gpus]\n",
                "cluster.yaml:2: rings.spare: `gpus` is listed twice",
            ),
            (
                "rings:\n  spare:\n    - gpus\n    - 9x\n",
                "cluster.yaml:4: rings.spare[1]: `9x` is not a valid resource name (letters, digits, `_` and `-`, starting with a letter)",
            ),
            (
                "rings:\n  9cpus: { bounds: [0] }\n",
                "cluster.yaml:2: rings.9cpus: `9cpus` is not a valid resource name (letters, digits, `_` and `-`, starting with a letter)",
            ),
            (
                "\nplacer: best\n",
                "cluster.yaml:2: placer: unknown placer `best` (expected ring, linear-best-fit, first-fit, balance, least-requested or most-balanced)",
            ),
            (
                "placer: balance\nbalance:\n  initial_weights:\n    cpus: 0.5\n    mem: 0.6\n",
                "cluster.yaml:3: balance.initial_weights: initial weights must sum to 1, they sum to 1.1",
            ),
            (
                "balance:\n  initial_weights:\n    cpus: 1.5\n    mem: -0.5\n",
                "cluster.yaml:4: balance.initial_weights.mem: weight of `mem` must be a finite number ≥ 0, not -0.5",
            ),
            (
                "balance:\n  initial_weights: { cpus: 0.5, mem: half }\n",
                "cluster.yaml:2: balance.initial_weights.mem: expected a number, found the string `half`",
            ),
            (
                "balance:\n  initial_weights: { cpus: 1 }\n",
                "cluster.yaml:2: balance.initial_weights: balance needs at least two dimensions, 1 given",
            ),
            (
                "balance:\n  initial_weights: { cpus: 0.5, 9mem: 0.5 }\n",
                "cluster.yaml:2: balance.initial_weights.9mem: `9mem` is not a valid resource name",
            ),
            (
                "balance:\n  require_improvement: true\n  threshold: 2\n",
                "cluster.yaml:3: balance.threshold: threshold must be a number from 0 to 1, not 2",
            ),
            (
                "balance:\n  threshold: high\n",
                "cluster.yaml:2: balance.threshold: expected a number from 0 to 1, found the string `high`",
            ),
            (
                "balance:\n  treshold: 0.5\n",
                "cluster.yaml:2: balance: unknown field `treshold`, expected one of `initial_weights`, `threshold`, `require_improvement`",
            ),
            (
                "master:\n  agent_timeout: 15s\n  offer_timeout: soon\n",
                "cluster.yaml:3: master.offer_timeout: `soon` is not a duration like 15s or 500ms: expected number at 0",
            ),
            (
                "master:\n  max_frame_bytes: 0\n",
                "cluster.yaml:2: master.max_frame_bytes: 0 is out of range: the frame size must be from 65536 (64 KiB) to 1073741824 (1 GiB) bytes",
            ),
            (
                "rings:\n  cpus: { step: 1, buckets: 4, sarch_up: 1 }\n",
                "cluster.yaml:2: rings.cpus: unknown field `sarch_up`, expected one of `base`, `step`, `buckets`, `bounds`, `search_up`",
            ),
            (
                "placer: ring\nmastr: {}\n",
                "cluster.yaml:2: unknown field `mastr`, expected one of `placer`, `balance`, `rings`, `master`, `matching`",
            ),
            (
                "master:\n  agent_timeout: [1]\n",
                "cluster.yaml:2: master.agent_timeout: invalid type: sequence, expected a string",
            ),
            (
                "matching:\n  a: 1\n  d: minus\n",
                "cluster.yaml:3: matching.d: expected a finite number, found the string `minus`",
            ),
            (
                "matching: { f: 1 }\n",
                "cluster.yaml:1: matching: unknown field `f`, expected one of `a`, `b`, `c`, `d`, `e`",
            ),
            (
                "placer: \"ring\n",
                "cluster.yaml:2: found unexpected end of stream, while scanning a quoted scalar",
            ),
        ];
        for (text, expected) in cases {
            let err = Config::from_yaml(text, "cluster.yaml").unwrap_err();
            let shown = err.to_string();
            assert!(
                shown.starts_with(expected),
                "{text:?}\n got: {shown}\nwant: {expected}"
            );
            assert!(!shown.contains('\n'), "one line: {shown}");
        }
    }

    #[test]
    fn locate_finds_keys_and_elements() {
        let text = "a:\n  b: 1\n  c:\n    - x\n    - { d: 2 }\n";
        let path = |segs: &[Seg]| locate(text, segs);
        assert_eq!(path(&["a".into()]), Some(1));
        assert_eq!(path(&["a".into(), "c".into()]), Some(3));
        assert_eq!(path(&["a".into(), "c".into(), 1.into()]), Some(5));
        assert_eq!(
            path(&["a".into(), "c".into(), 1.into(), "d".into()]),
            Some(5)
        );
        assert_eq!(path(&["a".into(), "c".into(), 0.into()]), Some(4));
        assert_eq!(path(&["a".into(), "z".into()]), None);
        assert_eq!(path(&["a".into(), "c".into(), 7.into()]), None);
    }

    #[test]
    fn reads_limits_and_locates_their_errors() {
        let config = Config::from_yaml(
            "limits:\n  messages_per_sec: 100\n  burst: 20\n  outbound_queue: 64\n",
            "c.yaml",
        )
        .unwrap();
        assert_eq!(
            config.limits,
            LimitsConfig {
                messages_per_sec: 100,
                burst: 20,
                outbound_queue: 64,
                ..LimitsConfig::default()
            }
        );
        let partial = Config::from_yaml("limits: { burst: 7 }\n", "c.yaml").unwrap();
        assert_eq!(partial.limits.burst, 7);
        assert_eq!(
            partial.limits.messages_per_sec,
            LimitsConfig::default().messages_per_sec
        );
        let cases = [
            (
                "limits:\n  burst: 5\n  messages_per_sec: 0\n",
                "c.yaml:3: limits.messages_per_sec: must be at least 1",
            ),
            (
                "limits:\n  burst: -5\n",
                "c.yaml:2: limits.burst: -5 is negative",
            ),
            (
                "limits:\n\n  outbound_queue: lots\n",
                "c.yaml:3: limits.outbound_queue: expected a whole number, found the string `lots`",
            ),
        ];
        for (text, want) in cases {
            let err = Config::from_yaml(text, "c.yaml").unwrap_err();
            assert_eq!(err.to_string(), want);
        }
        let config = Config::from_yaml(
            "limits:\n  max_connections: 3\n  max_handshake_frame_bytes: 4096\n",
            "c.yaml",
        )
        .unwrap();
        assert_eq!(config.limits.max_connections, 3);
        assert_eq!(config.limits.max_handshake_frame_bytes, 4096);
        assert_eq!(LimitsConfig::default().max_connections, 20_000);
        assert!(LimitsConfig::default().listen_backlog >= 1024);
        let backlog = Config::from_yaml("limits:\n  listen_backlog: 2048\n", "c.yaml").unwrap();
        assert_eq!(backlog.limits.listen_backlog, 2048);
        let err = Config::from_yaml("limits:\n  listen_backlog: 1\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "c.yaml:2: limits.listen_backlog: 1 is out of range: allowed 16 to 65535"
        );
        assert_eq!(LimitsConfig::default().max_handshake_frame_bytes, 65_536);
        assert_eq!(LimitsConfig::default().outbound_queue_bytes, 16 << 20);
        let bytes = Config::from_yaml("limits:\n  outbound_queue_bytes: 1048576\n", "c.yaml");
        assert_eq!(bytes.unwrap().limits.outbound_queue_bytes, 1 << 20);
        for (text, want) in [
            (
                "limits:\n  burst: 5\n  max_connections: 0\n",
                "c.yaml:3: limits.max_connections: 0 is out of range: allowed 1 to 1000000",
            ),
            (
                "limits:\n  max_handshake_frame_bytes: 100\n",
                "c.yaml:2: limits.max_handshake_frame_bytes: 100 is out of range: allowed 1024 to 4194304",
            ),
            (
                "limits:\n  outbound_queue_bytes: 1000\n",
                "c.yaml:2: limits.outbound_queue_bytes: 1000 is out of range: allowed 65536 to 1073741824",
            ),
        ] {
            let err = Config::from_yaml(text, "c.yaml").unwrap_err();
            assert_eq!(err.to_string(), want);
        }
        let err = Config::from_yaml("limits:\n  rate: 5\n", "c.yaml").unwrap_err();
        assert!(err.to_string().starts_with("c.yaml:2"), "{err}");
        assert!(err.to_string().contains("rate"), "{err}");
    }

    #[test]
    fn agent_reregister_timeout_is_read_and_checked() {
        assert_eq!(
            Config::default().master.agent_reregister_timeout,
            Duration::from_secs(60)
        );
        let config =
            Config::from_yaml("master:\n  agent_reregister_timeout: 2m\n", "c.yaml").unwrap();
        assert_eq!(
            config.master.agent_reregister_timeout,
            Duration::from_secs(120)
        );
        let err = Config::from_yaml("master:\n  agent_reregister_timeout: later\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("c.yaml:2: master.agent_reregister_timeout:"),
            "{err}"
        );
    }

    #[test]
    fn master_timers_and_sizes_out_of_range_are_refused() {
        let cases = [
            (
                "master:\n  agent_timeout: 0s\n",
                "c.yaml:2: master.agent_timeout: 0s is out of range: must be from 100ms to 1day",
            ),
            (
                "master:\n  agent_timeout: 2days\n",
                "c.yaml:2: master.agent_timeout: 2days is out of range: must be from 100ms to 1day",
            ),
            (
                "master:\n  agent_timeout: 5s\n  offer_timeout: 0s\n",
                "c.yaml:3: master.offer_timeout: 0s is out of range: must be from 100ms to 1day",
            ),
            (
                "master:\n  allocation_interval: 0s\n",
                "c.yaml:2: master.allocation_interval: 0s is out of range: must be from 1ms to 1m",
            ),
            (
                "master:\n  allocation_interval: 2m\n",
                "c.yaml:2: master.allocation_interval: 2m is out of range: must be from 1ms to 1m",
            ),
            (
                "master:\n  heartbeat_interval: 10ms\n",
                "c.yaml:2: master.heartbeat_interval: 10ms is out of range: must be from 100ms to 1h",
            ),
            (
                "master:\n  default_refuse: 3days\n",
                "c.yaml:2: master.default_refuse: 3days is out of range: must be from 0s to 1day",
            ),
            (
                "master:\n  status_retry_interval: 0s\n",
                "c.yaml:2: master.status_retry_interval: 0s is out of range: must be from 100ms to 1h",
            ),
            (
                "master:\n  agent_reregister_timeout: 1ms\n",
                "c.yaml:2: master.agent_reregister_timeout: 1ms is out of range: must be from 100ms to 1day",
            ),
            (
                "master:\n  agent_timeout: 1s\n  heartbeat_interval: 2s\n",
                "c.yaml:3: master.heartbeat_interval: 2s must be shorter than master.agent_timeout (1s)",
            ),
            (
                "master:\n  max_frame_bytes: 1\n",
                "c.yaml:2: master.max_frame_bytes: 1 is out of range: the frame size must be from 65536 (64 KiB) to 1073741824 (1 GiB) bytes",
            ),
            (
                "master:\n  max_frame_bytes: 2147483648\n",
                "c.yaml:2: master.max_frame_bytes: 2147483648 is out of range: the frame size must be from 65536 (64 KiB) to 1073741824 (1 GiB) bytes",
            ),
            (
                "master:\n  max_completed_tasks_per_framework: -1\n",
                "c.yaml:2: master.max_completed_tasks_per_framework: -1 is negative",
            ),
            (
                "master:\n  max_removed_agents: 2000000\n",
                "c.yaml:2: master.max_removed_agents: 2000000 is out of range: must be from 0 to 1000000",
            ),
            (
                "master:\n  max_removed_frameworks: many\n",
                "c.yaml:2: master.max_removed_frameworks: expected a whole number, found the string `many`",
            ),
            (
                "master:\n  max_agent_resources: \"cpus:lots\"\n",
                "c.yaml:2: master.max_agent_resources: `cpus:lots` is not a resource list like cpus:4096;mem:67108864:",
            ),
        ];
        for (text, want) in cases {
            let err = Config::from_yaml(text, "c.yaml").unwrap_err().to_string();
            assert!(err.starts_with(want), "{text:?}\n got: {err}\nwant: {want}");
        }
        // The bounds themselves are accepted.
        let edge = "master:\n  agent_timeout: 1day\n  offer_timeout: 100ms\n  \
                    allocation_interval: 1ms\n  heartbeat_interval: 100ms\n  default_refuse: 0s\n  \
                    status_retry_interval: 1h\n  agent_reregister_timeout: 100ms\n  \
                    max_frame_bytes: 65536\n";
        let config = Config::from_yaml(edge, "c.yaml").unwrap();
        assert_eq!(config.master.default_refuse, Duration::ZERO);
        assert_eq!(config.master.max_frame_bytes, 65536);
        let big = Config::from_yaml("master:\n  max_frame_bytes: 1073741824\n", "c.yaml").unwrap();
        assert_eq!(big.master.max_frame_bytes, 1 << 30);
    }

    #[test]
    fn history_and_agent_limits_are_read() {
        let d = Config::default().master;
        assert_eq!(d.max_completed_tasks_per_framework, 1000);
        assert_eq!(d.max_unacked_updates, 2000);
        let c = Config::from_yaml("master:\n  max_unacked_updates: 0\n", "c.yaml").unwrap();
        assert_eq!(c.master.max_unacked_updates, 0);
        let err = Config::from_yaml("master:\n  max_unacked_updates: 2000000\n", "c.yaml");
        assert_eq!(
            err.unwrap_err().to_string(),
            "c.yaml:2: master.max_unacked_updates: 2000000 is out of range: must be from 0 to 1000000"
        );
        assert_eq!(d.max_removed_agents, 1000);
        assert_eq!(d.max_removed_frameworks, 1000);
        assert_eq!(d.max_agent_resources.milli("cpus"), 4096 * MILLI);
        let text = "master:\n  max_agent_resources: \"cpus:64;mem:1024\"\n  \
                    max_completed_tasks_per_framework: 5\n  max_removed_agents: 0\n  \
                    max_removed_frameworks: 7\n";
        let m = Config::from_yaml(text, "c.yaml").unwrap().master;
        assert_eq!(m.max_agent_resources.to_string(), "cpus:64;mem:1024");
        assert_eq!(m.max_completed_tasks_per_framework, 5);
        assert_eq!(m.max_removed_agents, 0);
        assert_eq!(m.max_removed_frameworks, 7);
        let unlimited = Config::from_yaml("master:\n  max_agent_resources: \"\"\n", "c.yaml")
            .unwrap()
            .master;
        assert!(unlimited.max_agent_resources.is_empty());
    }

    #[test]
    fn the_cluster_section_is_read_and_makes_a_raft_config() {
        let text = "\
cluster:
  id: 2
  peers:
    1: 10.0.0.1:5050
    2: 10.0.0.2:5050
    3: \"[::1]:5050\"
  election_timeout: 500ms
";
        let cluster = Config::from_yaml(text, "c.yaml").unwrap().cluster.unwrap();
        assert_eq!(cluster.id, 2);
        assert_eq!(cluster.peers.len(), 3);
        assert_eq!(cluster.peers[&3], "[::1]:5050");
        assert_eq!(cluster.election_timeout, Duration::from_millis(500));
        let raft = cluster.raft_config(4 * 1024 * 1024);
        assert_eq!(
            (raft.election_timeout_min, raft.election_timeout_max),
            (500, 1000)
        );
        assert_eq!(raft.heartbeat_interval, 100);
        assert_eq!(raft.snapshot_max_chunk_size, 1024 * 1024);
        raft.validate().expect("a valid openraft config");
        let plain = Config::from_yaml("cluster:\n  id: 1\n  peers: { 1: m1:5050 }\n", "c.yaml");
        let plain = plain.unwrap().cluster.unwrap();
        assert_eq!(plain.election_timeout, DEFAULT_ELECTION_TIMEOUT);
        plain.raft_config(64 * 1024).validate().unwrap();
        let least = Config::from_yaml(
            "cluster:\n  id: 1\n  peers: { 1: m1:5050 }\n  election_timeout: 150ms\n",
            "c.yaml",
        );
        least
            .unwrap()
            .cluster
            .unwrap()
            .raft_config(1 << 20)
            .validate()
            .unwrap();
        assert_eq!(Config::from_yaml("", "c.yaml").unwrap().cluster, None);
    }

    #[test]
    fn join_and_snapshot_threshold_are_read_and_reach_the_raft_config() {
        let plain = Config::from_yaml("cluster:\n  id: 1\n  peers: { 1: m1:5050 }\n", "c.yaml")
            .unwrap()
            .cluster
            .unwrap();
        assert!(!plain.join, "a master forms its group unless told to join");
        assert_eq!(plain.snapshot_threshold, DEFAULT_SNAPSHOT_THRESHOLD);
        let raft = plain.raft_config(1 << 20);
        assert_eq!(
            raft.snapshot_policy,
            openraft::SnapshotPolicy::LogsSinceLast(5000)
        );
        assert_eq!(raft.max_in_snapshot_log_to_keep, 1000);
        let text = "cluster:\n  id: 4\n  peers: { 1: m1:5050, 4: m4:5050 }\n  join: true\n  \
                    snapshot_threshold: 16\n";
        let joining = Config::from_yaml(text, "c.yaml").unwrap().cluster.unwrap();
        assert!(joining.join);
        assert_eq!(joining.snapshot_threshold, 16);
        let raft = joining.raft_config(1 << 20);
        assert_eq!(
            raft.snapshot_policy,
            openraft::SnapshotPolicy::LogsSinceLast(16)
        );
        assert_eq!(raft.max_in_snapshot_log_to_keep, 16);
        raft.validate().expect("a valid openraft config");
        let most = Config::from_yaml(
            "cluster:\n  id: 1\n  peers: { 1: m1:5050 }\n  snapshot_threshold: 10000000\n",
            "c.yaml",
        )
        .unwrap()
        .cluster
        .unwrap();
        assert_eq!(most.snapshot_threshold, 10_000_000);
        assert_eq!(most.raft_config(1 << 20).max_in_snapshot_log_to_keep, 1000);
    }

    #[test]
    fn join_and_snapshot_threshold_errors_name_file_line_and_key() {
        let head = "cluster:\n  id: 1\n  peers: { 1: a:5050 }\n";
        let cases = [
            (
                format!("{head}  snapshot_threshold: 15\n"),
                "c.yaml:4: cluster.snapshot_threshold: 15 is out of range: must be from 16 to 10000000 entries",
            ),
            (
                format!("{head}  snapshot_threshold: 10000001\n"),
                "c.yaml:4: cluster.snapshot_threshold: 10000001 is out of range: must be from 16 to 10000000 entries",
            ),
            (
                format!("{head}  snapshot_threshold: -5\n"),
                "c.yaml:4: cluster.snapshot_threshold: -5 is out of range: must be from 16 to 10000000 entries",
            ),
            (
                format!("{head}  snapshot_threshold: 1.5\n"),
                "c.yaml:4: cluster.snapshot_threshold: 1.5 is not a whole number",
            ),
            (
                format!("{head}  snapshot_threshold: often\n"),
                "c.yaml:4: cluster.snapshot_threshold: expected a whole number, found the string `often`",
            ),
            (format!("{head}  join: maybe\n"), "c.yaml:"),
        ];
        for (text, prefix) in cases {
            let err = Config::from_yaml(&text, "c.yaml").unwrap_err().to_string();
            assert!(
                err.starts_with(prefix),
                "{err:?} should start with {prefix:?}"
            );
        }
        let err = Config::from_yaml(&format!("{head}  join: maybe\n"), "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("join"), "{err}");
    }

    #[test]
    fn cluster_errors_name_file_line_and_key() {
        let peers = "  peers:\n    1: a:5050\n    2: b:5050\n";
        let cases = [
            (
                format!("cluster:\n  id: 4\n{peers}"),
                "c.yaml:2: cluster.id: master 4 is not one of peers (1, 2)",
            ),
            (
                format!("cluster:\n  id: 0\n{peers}"),
                "c.yaml:2: cluster.id: master ids start at 1",
            ),
            (
                format!("cluster:\n{peers}"),
                "c.yaml:1: cluster: no id: give this master's id (one of peers)",
            ),
            (
                "cluster:\n  id: 1\n  peers: {}\n".to_string(),
                "c.yaml:3: cluster.peers: no peers: list every master of the group, this one included (id: host:port)",
            ),
            (
                "cluster:\n  id: 1\n".to_string(),
                "c.yaml:1: cluster: no peers",
            ),
            (
                "cluster:\n  id: 1\n  peers:\n    1: a:5050\n    0: b:5050\n".to_string(),
                "c.yaml:5: cluster.peers.0: master ids start at 1",
            ),
            (
                "cluster:\n  id: 1\n  peers:\n    1: a:5050\n    x: b:5050\n".to_string(),
                "c.yaml:5: cluster.peers.x: ",
            ),
            (
                "cluster:\n  id: 1\n  peers:\n    1: a\n".to_string(),
                "c.yaml:4: cluster.peers.1: `a` is not host:port (no port)",
            ),
            (
                "cluster:\n  id: 1\n  peers:\n    1: a:0\n".to_string(),
                "c.yaml:4: cluster.peers.1: `a:0` is not host:port (the port must be from 1 to 65535)",
            ),
            (
                "cluster:\n  id: 1\n  peers:\n    1: ::1:5050\n".to_string(),
                "c.yaml:4: cluster.peers.1: `::1:5050` is not host:port (write an IPv6 address in brackets: [::1]:5050)",
            ),
            (
                "cluster:\n  id: 1\n  peers:\n    1: a:5050\n    2: a:5050\n".to_string(),
                "c.yaml:5: cluster.peers.2: `a:5050` is master 1's address too",
            ),
            (
                "cluster:\n  id: 1\n  peers:\n    1: [a, b]\n".to_string(),
                "c.yaml:4: cluster.peers.1: expected an address host:port, found ",
            ),
            (
                format!("cluster:\n  id: 1\n{peers}  election_timeout: 100ms\n"),
                "c.yaml:6: cluster.election_timeout: 100ms is out of range: must be from 150ms to 1m",
            ),
            (
                format!("cluster:\n  id: 1\n{peers}  election_timeout: 2min\n"),
                "c.yaml:6: cluster.election_timeout: 2m is out of range: must be from 150ms to 1m",
            ),
            (
                format!("cluster:\n  id: 1\n{peers}  election_timeout: soon\n"),
                "c.yaml:6: cluster.election_timeout: `soon` is not a duration",
            ),
            (
                format!("cluster:\n  id: 1\n{peers}  heartbeat: 1s\n"),
                "c.yaml:",
            ),
        ];
        for (text, prefix) in cases {
            let err = Config::from_yaml(&text, "c.yaml").unwrap_err().to_string();
            assert!(
                err.starts_with(prefix),
                "{err:?} should start with {prefix:?}"
            );
        }
        let unknown = format!("cluster:\n  id: 1\n{peers}  heartbeat: 1s\n");
        let err = Config::from_yaml(&unknown, "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `heartbeat`"), "{err}");
    }

    #[test]
    fn load_names_a_missing_file() {
        let err = Config::load(Path::new("/nonexistent/cluster.yaml")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("/nonexistent/cluster.yaml: cannot read:"),
            "{err}"
        );
    }
}
