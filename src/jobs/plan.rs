//! The question and answer of `POST /jobs/plan`, which `ringmaster job plan` renders: where a
//! job's instances would go now, or why they cannot be placed (nothing is launched).

use serde::{Deserialize, Serialize};

use super::constraints::Constraint;

/// Where a job may run: its partition and its constraints.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub partition: String,
    pub constraints: Vec<Constraint>,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            partition: ringmaster_core::placement::DEFAULT_PARTITION.to_string(),
            constraints: Vec::new(),
        }
    }
}

/// The answer of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The agent of each instance that fits, in instance order.
    pub placed: Vec<String>,
    /// Instances that fit nowhere (the rest, from the first that did not fit).
    pub unplaced: u32,
    /// Why the first unplaced instance fits nowhere.
    pub why: Option<String>,
}
