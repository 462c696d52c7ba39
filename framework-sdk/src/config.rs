//! How a framework introduces itself and how hard it tries to stay connected.
//!
//! One struct with defaults, validated once in [`crate::run`] so a bad value is reported before
//! any connection is attempted.

use std::time::Duration;

use ringmaster_proto::transport::ClientSecurity;

use crate::SdkError;

/// Everything [`crate::run`] needs to subscribe a framework.
#[derive(Clone, Debug, PartialEq)]
pub struct FrameworkConfig {
    /// The master's address, `host:port`, or every master of a replicated cluster as a
    /// comma-separated list, `a:5050,b:5050,c:5050`: the SDK subscribes with whichever leads,
    /// following `NOT_LEADER` (docs/protocol.md).
    pub master: String,
    /// Human-readable framework name, shown in the master's state.
    pub name: String,
    /// The user the framework runs as; priorities and quotas are per user.
    pub user: String,
    /// The partition the framework's tasks run in (agents with attribute `partition` equal to
    /// it; `default` for agents without one). Empty means `default`.
    pub partition: String,
    /// DRF weight, > 0 (a framework with weight 2 gets twice the share).
    pub weight: f64,
    /// How long the master keeps the framework and its tasks after the connection drops.
    pub failover_timeout: Duration,
    /// A framework id to take over (failover of a previous process); `None` subscribes anew.
    pub framework_id: Option<String>,
    /// The longest wait between reconnect attempts (the backoff starts at 100 ms and doubles).
    pub reconnect_max_backoff: Duration,
    /// Give up with [`SdkError::Connect`] when no subscription succeeded for this long, counted
    /// from the start or from the last lost connection. `None` retries forever.
    pub give_up_after: Option<Duration>,
    /// TLS and credential for the master connection (default: plain TCP, anonymous); see
    /// docs/security.md.
    pub security: ClientSecurity,
}

/// The failover timeout used by [`FrameworkConfig::new`]: one minute.
pub const DEFAULT_FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// The backoff cap used by [`FrameworkConfig::new`]: five seconds.
pub const DEFAULT_RECONNECT_MAX_BACKOFF: Duration = Duration::from_secs(5);

impl FrameworkConfig {
    /// A configuration with defaults: user from `$USER` (else `root`), weight 1, failover
    /// timeout 60 s, a new framework id, backoff capped at 5 s, retrying forever.
    pub fn new(master: impl Into<String>, name: impl Into<String>) -> Self {
        FrameworkConfig {
            master: master.into(),
            name: name.into(),
            user: default_user(),
            partition: String::new(),
            weight: 1.0,
            failover_timeout: DEFAULT_FAILOVER_TIMEOUT,
            framework_id: None,
            reconnect_max_backoff: DEFAULT_RECONNECT_MAX_BACKOFF,
            give_up_after: None,
            security: ClientSecurity::default(),
        }
    }

    /// Checks the values the master would refuse, naming the bad field.
    pub fn validate(&self) -> Result<(), SdkError> {
        if self.master.trim().is_empty() {
            return Err(SdkError::InvalidConfig(
                "master address is empty (expected host:port)".into(),
            ));
        }
        ringmaster_proto::masters::parse_master_list(&self.master)
            .map_err(|e| SdkError::InvalidConfig(format!("master `{}`: {e}", self.master)))?;
        if self.name.trim().is_empty() {
            return Err(SdkError::InvalidConfig("framework name is empty".into()));
        }
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return Err(SdkError::InvalidConfig(format!(
                "weight must be a finite number > 0, got {}",
                self.weight
            )));
        }
        if self.reconnect_max_backoff.is_zero() {
            return Err(SdkError::InvalidConfig(
                "reconnect_max_backoff must be > 0".into(),
            ));
        }
        if matches!(&self.framework_id, Some(id) if id.is_empty()) {
            return Err(SdkError::InvalidConfig(
                "framework_id is Some(\"\"); use None to subscribe anew".into(),
            ));
        }
        Ok(())
    }
}

/// `$USER`, or `root` when unset or empty.
pub fn default_user() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "root".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let config = FrameworkConfig::new("127.0.0.1:5050", "fw");
        assert!(config.validate().is_ok());
        assert_eq!(config.weight, 1.0);
        assert_eq!(config.reconnect_max_backoff, Duration::from_secs(5));
        assert!(!config.user.is_empty());
    }

    #[test]
    fn master_may_be_a_list() {
        let config = FrameworkConfig::new("a:5050, b:5050,c:5050", "fw");
        assert!(config.validate().is_ok());
        for (bad, word) in [
            ("a:5050,b", "entry `b`: expected HOST:PORT"),
            ("a:5050,,b:1", "empty entry"),
            ("localhost", "master `localhost`: expected HOST:PORT"),
        ] {
            let err = FrameworkConfig::new(bad, "fw")
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains(word), "{err} should mention {word}");
        }
    }

    #[test]
    fn bad_values_are_named() {
        let base = FrameworkConfig::new("127.0.0.1:5050", "fw");
        let cases: Vec<(FrameworkConfig, &str)> = vec![
            (
                FrameworkConfig {
                    master: " ".into(),
                    ..base.clone()
                },
                "master",
            ),
            (
                FrameworkConfig {
                    name: "".into(),
                    ..base.clone()
                },
                "name",
            ),
            (
                FrameworkConfig {
                    weight: 0.0,
                    ..base.clone()
                },
                "weight",
            ),
            (
                FrameworkConfig {
                    weight: f64::NAN,
                    ..base.clone()
                },
                "weight",
            ),
            (
                FrameworkConfig {
                    reconnect_max_backoff: Duration::ZERO,
                    ..base.clone()
                },
                "reconnect_max_backoff",
            ),
            (
                FrameworkConfig {
                    framework_id: Some(String::new()),
                    ..base.clone()
                },
                "framework_id",
            ),
        ];
        for (config, word) in cases {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(word), "{err} should mention {word}");
        }
    }
}
