//! What can end [`crate::run`] and what a [`crate::Driver`] call can fail with.
//!
//! Transient trouble (a dropped connection, a master restarting) never surfaces here: the
//! session retries it. These errors are the ones retrying cannot fix.

/// Why [`crate::run`] ended without a clean [`crate::Driver::stop`].
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// The master does not speak this SDK's protocol version; retrying cannot help.
    #[error("protocol version mismatch: {0}")]
    VersionMismatch(String),
    /// The master refused the framework (e.g. its id is connected elsewhere, or bad fields).
    #[error("the master refused the framework: {0}")]
    Refused(String),
    /// No subscription succeeded within [`crate::FrameworkConfig::give_up_after`].
    #[error("could not reach the master at {master}: {reason}")]
    Connect {
        /// The configured master address.
        master: String,
        /// The last failure seen.
        reason: String,
    },
    /// A [`crate::FrameworkConfig`] field is unusable.
    #[error("invalid framework configuration: {0}")]
    InvalidConfig(String),
}

/// A [`crate::Driver`] call made after [`crate::run`] has returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the framework driver has stopped")]
pub struct DriverStopped;
