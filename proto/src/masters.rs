//! Lists of masters and which one a client tries next.
//!
//! With replicated masters (one leader, the others followers) every client is given the list
//! of masters, `a:5050,b:5050,c:5050`, and talks to whichever leads. A follower answers with
//! `Error{code: NOT_LEADER, leader}`: the client goes straight to `leader` when it is set (even
//! an address not in the list), else on to the next master of the list. [`MasterRotation`] is
//! that choice, apart from sockets so it can be tested; the sessions of the agent and of the
//! SDK wait out their backoff only after a full pass over the list without success.

/// While the masters that answer are followers (the group is electing a leader, or still
/// names a dead one), agents and frameworks ask the list again after at most this long
/// instead of their backoff…
pub const NO_LEADER_RETRY: std::time::Duration = std::time::Duration::from_millis(250);
/// …for at most this long; a group without a leader longer than that (no quorum) is asked
/// with the usual backoff again, so many clients do not keep hammering it.
pub const NO_LEADER_FAST_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// Checks one `HOST:PORT` entry.
pub fn check_master_address(master: &str) -> Result<(), String> {
    let Some((host, port)) = master.rsplit_once(':') else {
        return Err("expected HOST:PORT".into());
    };
    if host.is_empty() {
        return Err("the host is empty (expected HOST:PORT)".into());
    }
    if host.chars().any(char::is_whitespace) {
        return Err(format!(
            "`{host}` contains white space (expected HOST:PORT)"
        ));
    }
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "`{port}` is not a port number (expected HOST:PORT)"
        ));
    }
    Ok(())
}

/// Parses a comma-separated list of masters, `a:5050,b:5050` (white space around entries is
/// ignored; a single address is a list of one). Every entry must be `HOST:PORT`; duplicates
/// are dropped. The error names the bad entry, for the caller to prefix with its flag.
pub fn parse_master_list(spec: &str) -> Result<Vec<String>, String> {
    if spec.trim().is_empty() {
        return Err("no master address (expected HOST:PORT[,HOST:PORT...])".into());
    }
    let mut out: Vec<String> = Vec::new();
    for entry in spec.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(format!(
                "empty entry in `{spec}` (expected HOST:PORT[,HOST:PORT...])"
            ));
        }
        check_master_address(entry).map_err(|m| {
            if spec.contains(',') {
                format!("entry `{entry}`: {m}")
            } else {
                m
            }
        })?;
        if !out.iter().any(|e| e == entry) {
            out.push(entry.to_string());
        }
    }
    Ok(out)
}

/// Which master to try next: the list in order, or the leader a follower named.
#[derive(Debug, Clone)]
pub struct MasterRotation {
    list: Vec<String>,
    /// The entry of `list` tried when no redirect is pending.
    index: usize,
    /// A leader named by a follower that is not in the list; tried next.
    redirect: Option<String>,
    /// Failed attempts since the last success or the last backoff.
    failures: usize,
}

impl MasterRotation {
    /// A rotation over `list` (at least one entry), starting with its first entry.
    pub fn new(list: Vec<String>) -> Self {
        assert!(!list.is_empty(), "a master list has at least one entry");
        MasterRotation {
            list,
            index: 0,
            redirect: None,
            failures: 0,
        }
    }

    /// Parses `spec` ([`parse_master_list`]) into a rotation.
    pub fn parse(spec: &str) -> Result<Self, String> {
        parse_master_list(spec).map(Self::new)
    }

    /// The configured masters.
    pub fn list(&self) -> &[String] {
        &self.list
    }

    /// The master to try now.
    pub fn current(&self) -> &str {
        self.redirect
            .as_deref()
            .unwrap_or(self.list[self.index].as_str())
    }

    /// The attempt on [`Self::current`] failed (unreachable, closed, refused for a reason that
    /// retrying may fix): move on to the next master. True when a full pass (as many failed
    /// attempts as there are masters) is over without success: back off before the next one.
    pub fn failed(&mut self) -> bool {
        if self.redirect.take().is_none() {
            self.index = (self.index + 1) % self.list.len();
        }
        self.count_failure()
    }

    /// [`Self::current`] answered `NOT_LEADER`, naming `leader` (empty when it does not know
    /// one): the next attempt goes to `leader`, else to the next master of the list. The
    /// result is as for [`Self::failed`], so followers pointing at each other cannot make a
    /// client spin.
    pub fn not_leader(&mut self, leader: &str) -> bool {
        let leader = leader.trim();
        let usable =
            !leader.is_empty() && leader != self.current() && check_master_address(leader).is_ok();
        if !usable {
            return self.failed();
        }
        self.redirect = None;
        match self.list.iter().position(|m| m == leader) {
            Some(i) => self.index = i,
            None => {
                // Back on the list after the redirect, after the master that sent it.
                self.index = (self.index + 1) % self.list.len();
                self.redirect = Some(leader.to_string());
            }
        }
        self.count_failure()
    }

    /// A registration or subscription succeeded with [`Self::current`]: it is tried first
    /// again after a lost connection, and the pass starts anew.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    fn count_failure(&mut self) -> bool {
        self.failures += 1;
        if self.failures >= self.list.len() {
            self.failures = 0;
            true
        } else {
            false
        }
    }
}

/// HTTP status a master that is not the leader answers its HTTP API with (docs/protocol.md,
/// "Leaders and terms"): `503 Service Unavailable`, JSON body `{"error": "...", "leader":
/// "host:port"}` (`leader` empty or absent when unknown).
pub const HTTP_NOT_LEADER_STATUS: u16 = 503;

/// What one request to one master gave, for [`ask_each`].
#[derive(Debug)]
pub enum Asked<T> {
    /// An answer to keep: a success, or a refusal another master would repeat.
    Answer(T),
    /// No answer (connection refused, timeout, not HTTP): try the next master.
    Unreachable(String),
    /// The master is not the leader (HTTP 503); `leader` is the one it names, empty if none.
    NotLeader { leader: String, message: String },
}

/// For one-shot clients (the CLIs): asks each master in turn until one answers, going
/// straight to the leader a follower names (once per address, even one not in the list).
/// The error lists what each master said.
pub fn ask_each<T>(masters: &[String], mut ask: impl FnMut(&str) -> Asked<T>) -> Result<T, String> {
    let mut tried: Vec<String> = Vec::new();
    let mut errors: Vec<(String, String)> = Vec::new();
    let mut redirect: Option<String> = None;
    loop {
        let address = match redirect.take() {
            Some(leader) => leader,
            None => match masters.iter().find(|m| !tried.contains(m)) {
                Some(next) => next.clone(),
                None => break,
            },
        };
        tried.push(address.clone());
        match ask(&address) {
            Asked::Answer(answer) => return Ok(answer),
            Asked::Unreachable(error) => errors.push((address, error)),
            Asked::NotLeader { leader, message } => {
                let leader = leader.trim().to_string();
                let follow = !leader.is_empty()
                    && !tried.contains(&leader)
                    && check_master_address(&leader).is_ok();
                let said = if leader.is_empty() {
                    format!("not the leader, and knows no leader yet ({message})")
                } else {
                    format!("not the leader; the leader is {leader} ({message})")
                };
                errors.push((address, said));
                if follow {
                    redirect = Some(leader);
                }
            }
        }
    }
    Err(match errors.as_slice() {
        [(_, only)] => only.clone(),
        all => {
            let mut text = String::from("no master answered as the leader:");
            for (address, error) in all {
                text.push_str(&format!("\n  {address}: {error}"));
            }
            text
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(spec: &str) -> Vec<String> {
        parse_master_list(spec).unwrap()
    }

    #[test]
    fn lists_parse_with_spaces_and_without_duplicates() {
        assert_eq!(list("m:5050"), vec!["m:5050"]);
        assert_eq!(
            list("a:5050, b:5050 ,c:1,a:5050"),
            vec!["a:5050", "b:5050", "c:1"]
        );
        assert_eq!(
            list("[::1]:5050,10.0.0.1:1"),
            vec!["[::1]:5050", "10.0.0.1:1"]
        );
    }

    #[test]
    fn bad_lists_name_the_entry() {
        let err = |spec: &str| parse_master_list(spec).unwrap_err();
        assert!(err("").contains("no master address"));
        assert!(
            err("a:1,,b:2").contains("empty entry"),
            "{}",
            err("a:1,,b:2")
        );
        assert!(err("a:1,").contains("empty entry"));
        let e = err("a:1,localhost,b:2");
        assert!(
            e.contains("entry `localhost`") && e.contains("HOST:PORT"),
            "{e}"
        );
        let e = err("a:1,b:99999");
        assert!(e.contains("`99999` is not a port number"), "{e}");
        assert_eq!(err("localhost"), "expected HOST:PORT");
        assert!(err(":5050").contains("host is empty"));
        assert!(err("a b:1").contains("white space"));
    }

    #[test]
    fn failures_go_round_the_list_and_back_off_after_a_pass() {
        let mut r = MasterRotation::new(list("a:1,b:1,c:1"));
        assert_eq!(r.current(), "a:1");
        assert!(!r.failed());
        assert_eq!(r.current(), "b:1");
        assert!(!r.failed());
        assert_eq!(r.current(), "c:1");
        assert!(r.failed(), "a full pass failed");
        assert_eq!(r.current(), "a:1");
        assert!(!r.failed());
        r.succeeded();
        assert_eq!(r.current(), "b:1", "the master that worked is kept");
        assert!(!r.failed());
        assert!(!r.failed());
        assert!(r.failed());
    }

    #[test]
    fn a_single_master_backs_off_after_every_failure() {
        let mut r = MasterRotation::new(list("m:1"));
        assert!(r.failed());
        assert!(r.failed());
        assert!(r.not_leader(""));
        assert_eq!(r.current(), "m:1");
    }

    #[test]
    fn not_leader_goes_to_the_named_leader() {
        let mut r = MasterRotation::new(list("a:1,b:1,c:1"));
        // A leader in the list: straight to it.
        assert!(!r.not_leader("c:1"));
        assert_eq!(r.current(), "c:1");
        r.succeeded();
        // A leader outside the list: tried next, then the list goes on after the sender.
        assert!(!r.not_leader("elsewhere:7"));
        assert_eq!(r.current(), "elsewhere:7");
        assert!(!r.failed());
        assert_eq!(r.current(), "a:1");
        // Unknown leader: the next of the list.
        assert!(r.not_leader(""));
        assert_eq!(r.current(), "b:1");
        // A garbled or self-naming leader counts as unknown.
        assert!(!r.not_leader("b:1"));
        assert_eq!(r.current(), "c:1");
        assert!(!r.not_leader("nonsense"));
        assert_eq!(r.current(), "a:1");
    }

    #[test]
    fn followers_naming_each_other_still_back_off() {
        let mut r = MasterRotation::new(list("a:1,b:1"));
        assert!(!r.not_leader("b:1"));
        assert!(
            r.not_leader("a:1"),
            "two redirects without success make a pass"
        );
        assert!(!r.not_leader("b:1"));
        assert!(r.not_leader("a:1"));
    }

    #[test]
    fn one_shot_clients_ask_each_master_and_follow_the_leader() {
        let masters = list("a:1,b:1,c:1");
        let mut asked = Vec::new();
        let answer = ask_each(&masters, |m| {
            asked.push(m.to_string());
            match m {
                "a:1" => Asked::Unreachable("refused".into()),
                "b:1" => Asked::NotLeader {
                    leader: "x:9".into(),
                    message: "follower".into(),
                },
                "x:9" => Asked::Answer(42),
                _ => panic!("{m} asked"),
            }
        });
        assert_eq!(answer, Ok(42));
        assert_eq!(asked, vec!["a:1", "b:1", "x:9"]);

        // Followers naming each other are asked once each; every entry is tried.
        let mut asked = Vec::new();
        let err = ask_each(&masters, |m| -> Asked<()> {
            asked.push(m.to_string());
            Asked::NotLeader {
                leader: if m == "a:1" { "b:1" } else { "a:1" }.into(),
                message: "election".into(),
            }
        })
        .unwrap_err();
        assert_eq!(asked, vec!["a:1", "b:1", "c:1"]);
        assert!(
            err.starts_with("no master answered as the leader:"),
            "{err}"
        );
        assert!(
            err.contains("\n  c:1: not the leader; the leader is a:1 (election)"),
            "{err}"
        );

        // One master: its own error, unchanged.
        let err = ask_each(&list("m:1"), |_| -> Asked<()> {
            Asked::Unreachable("down".into())
        });
        assert_eq!(err.unwrap_err(), "down");
    }
}
