//! A task's last known health (`TaskStatus.health`, set by its agent's health check), kept in
//! one byte per task record: the master holds many tasks (docs/benchmarks.md).

use ringmaster_proto::TaskHealth;

/// The last health an agent reported for a task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Health {
    /// No health check, or none decided yet.
    #[default]
    Unknown,
    Healthy,
    Unhealthy,
}

impl Health {
    /// From `TaskStatus.health`; an unknown value is `Unknown`.
    pub(crate) fn from_wire(value: i32) -> Self {
        match TaskHealth::try_from(value) {
            Ok(TaskHealth::Healthy) => Health::Healthy,
            Ok(TaskHealth::Unhealthy) => Health::Unhealthy,
            _ => Health::Unknown,
        }
    }

    pub(crate) fn to_wire(self) -> i32 {
        match self {
            Health::Unknown => TaskHealth::Unknown as i32,
            Health::Healthy => TaskHealth::Healthy as i32,
            Health::Unhealthy => TaskHealth::Unhealthy as i32,
        }
    }

    /// `/state`'s `"healthy"`: absent when unknown.
    pub(crate) fn healthy(self) -> Option<bool> {
        match self {
            Health::Unknown => None,
            Health::Healthy => Some(true),
            Health::Unhealthy => Some(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_byte_and_the_wire_round_trips() {
        assert_eq!(std::mem::size_of::<Health>(), 1);
        for h in [Health::Unknown, Health::Healthy, Health::Unhealthy] {
            assert_eq!(Health::from_wire(h.to_wire()), h);
        }
        assert_eq!(Health::from_wire(99), Health::Unknown);
        assert_eq!(Health::Unhealthy.healthy(), Some(false));
        assert_eq!(Health::Unknown.healthy(), None);
    }
}
