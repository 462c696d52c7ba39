//! The one encoding of everything replication stores or sends: log entries, Raft's own
//! records (vote, purge point) and the RPCs between masters.
//!
//! Why MessagePack (`rmp-serde`) with named fields: an entry's payload holds the jobs
//! framework's JSON records (`serde_json::Value`), so the encoding must be self-describing, and
//! named fields keep records with defaulted or skipped fields decodable. It replaced JSON,
//! which took most of the leader's CPU (escaping and parsing every string of every entry on
//! each append, read and send; docs/benchmarks.md, "Replicated masters"). A record that does
//! not decode is an error for the caller to report, never a panic.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes `value`.
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, String> {
    rmp_serde::to_vec_named(value).map_err(|e| e.to_string())
}

/// Decodes what [`encode`] wrote.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    rmp_serde::from_slice(bytes).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::registry::RegistryBatch;

    #[test]
    fn a_batch_with_json_job_records_survives_the_round_trip() {
        let batch = RegistryBatch {
            jobs: vec![
                (
                    "web".into(),
                    Some(
                        serde_json::json!({"spec": {"count": 2, "cmd": "a \"quoted\" b"},
                        "ids": [1, -2, 3.5], "none": null, "ok": true}),
                    ),
                ),
                ("gone".into(), None),
            ],
            id_epoch: Some(7),
            ..Default::default()
        };
        let back: RegistryBatch = decode(&encode(&batch).unwrap()).unwrap();
        assert_eq!(back, batch);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(decode::<RegistryBatch>(b"\xc1\xff{not").is_err());
        assert!(decode::<RegistryBatch>(b"").is_err());
    }
}
