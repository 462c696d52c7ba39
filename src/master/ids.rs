//! Identifier minting. Ids carry the master's start time so ids from a restarted master
//! never collide with ids an earlier incarnation handed out.

use std::time::{SystemTime, UNIX_EPOCH};

/// Mints agent, framework, offer and update ids.
pub(crate) struct IdMint {
    epoch: String,
    next: u64,
}

impl IdMint {
    pub fn new() -> Self {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        IdMint {
            epoch: format!("{secs:x}"),
            next: 0,
        }
    }

    /// Ids under a given epoch (unix seconds): after a restart from a registry, an epoch
    /// later than every earlier incarnation's, even when restarted within the same second.
    pub fn with_epoch(secs: u64) -> Self {
        IdMint {
            epoch: format!("{secs:x}"),
            next: 0,
        }
    }

    fn mint(&mut self, kind: &str) -> String {
        self.next += 1;
        format!("{}-{kind}{}", self.epoch, self.next)
    }

    pub fn agent(&mut self) -> String {
        self.mint("A")
    }
    pub fn framework(&mut self) -> String {
        self.mint("F")
    }
    pub fn offer(&mut self) -> String {
        self.mint("O")
    }
    /// Update ids carry their sequence number, so an acknowledgement finds its update
    /// without a search: see [`IdMint::minted_update_seq`].
    pub fn update(&self, seq: u64) -> String {
        format!("{}-U{seq}", self.epoch)
    }

    /// The sequence number of an update id minted by [`IdMint::update`] of this mint (this
    /// epoch); `None` for anything else.
    pub fn minted_update_seq(&self, update_id: &str) -> Option<u64> {
        let seq = update_id
            .strip_prefix(self.epoch.as_str())?
            .strip_prefix("-U")?;
        // The canonical form only: `-U007` is not the id of update 7.
        if seq.starts_with('0') || seq.starts_with('+') {
            return None;
        }
        seq.parse().ok()
    }
}
