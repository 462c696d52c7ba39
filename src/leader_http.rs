//! The HTTP clients (`ringmaster status`, `ringmaster job ...`) against replicated masters.
//!
//! `--master` (or `RINGMASTER_MASTER`) is one address or a comma-separated list,
//! `a:5050,b:5050,c:5050` (each `HOST:PORT`, `http://HOST:PORT` or `https://HOST:PORT`; a bare
//! `HOST:PORT` is HTTPS when `--tls-ca` is given, [`use_tls`]). Each request goes to the
//! masters in turn until one answers; a master that is not the leader answers
//! `503 Service Unavailable` with the JSON body `{"error": "...", "leader": "host:port"}`
//! (`leader` empty when it knows none), and the request goes to that leader next (see
//! docs/protocol.md, "Leaders and terms"). A 503 without a `leader` key is an ordinary error.

use ringmaster_proto::masters::{ask_each, check_master_address, Asked, HTTP_NOT_LEADER_STATUS};

/// The addresses of `--master`, each `HOST:PORT`, `http://HOST:PORT[/]` or
/// `https://HOST:PORT[/]` (kept as given); the error names the flag and the bad entry.
pub fn parse_masters(spec: &str) -> Result<Vec<String>, String> {
    let flag = |m: String| format!("--master `{spec}`: {m}");
    if spec.trim().is_empty() {
        return Err(
            "--master is empty; give the master's address, e.g. 127.0.0.1:5050 (or a list, \
             a:5050,b:5050,c:5050)"
                .into(),
        );
    }
    let mut out: Vec<String> = Vec::new();
    for entry in spec.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(flag(
                "an entry is empty (expected HOST:PORT[,HOST:PORT...])".into(),
            ));
        }
        let bare = entry
            .strip_prefix("http://")
            .or_else(|| entry.strip_prefix("https://"))
            .unwrap_or(entry)
            .trim_end_matches('/');
        check_master_address(bare).map_err(|m| {
            if spec.contains(',') {
                flag(format!("entry `{entry}`: {m}"))
            } else {
                flag(m)
            }
        })?;
        if !out.iter().any(|e| e == entry) {
            out.push(entry.to_string());
        }
    }
    Ok(out)
}

/// A master's "I am not the leader" answer: status 503 with a JSON body holding a `leader`
/// key. Returns the leader it names (empty when unknown) and its `error` text.
pub fn not_leader(status: u16, body: &str) -> Option<(String, String)> {
    if status != HTTP_NOT_LEADER_STATUS {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let leader = value.get("leader")?;
    let leader = leader.as_str().unwrap_or("").to_string();
    let message = value["error"]
        .as_str()
        .unwrap_or("not the leader")
        .to_string();
    Some((leader, message))
}

/// How long a CLI waits for a group that has no leader (an election under way) before it
/// gives up.
pub const LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(15);
/// The pause between two rounds while the group has no leader.
pub const LEADER_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// Parses `--master` and asks each master in turn ([`ask_each`]) until one answers. While the
/// masters that answer are followers (the group is electing a leader, or they still name one
/// that died) and none answers as the leader, the round is asked again every [`LEADER_RETRY`]
/// for up to [`LEADER_WAIT`]. When no master answers at all, the error comes at once.
pub fn with_leader<T>(spec: &str, mut ask: impl FnMut(&str) -> Asked<T>) -> Result<T, String> {
    let masters = parse_masters(spec)?;
    if !tls_on() {
        if let Some(https) = masters.iter().find(|m| m.starts_with("https://")) {
            return Err(format!(
                "--master {https}: HTTPS needs the CA that signed the master's certificate: \
                 give --tls-ca FILE (or RINGMASTER_TLS_CA)"
            ));
        }
    }
    let deadline = std::time::Instant::now() + LEADER_WAIT;
    loop {
        let mut electing = false;
        let result = ask_each(&masters, |address| {
            let asked = ask(address);
            electing |= matches!(asked, Asked::NotLeader { .. });
            asked
        });
        match result {
            Err(_) if electing && std::time::Instant::now() + LEADER_RETRY < deadline => {
                std::thread::sleep(LEADER_RETRY);
            }
            result => return result,
        }
    }
}

/// How the HTTP clients reach a master that serves HTTPS (`tls:` in its config): the CA
/// they trust and, for a master that wants client certificates (`tls.client_ca`), their own.
struct ClientTls {
    config: ureq::tls::TlsConfig,
}

static CLIENT_TLS: std::sync::OnceLock<ClientTls> = std::sync::OnceLock::new();

/// Makes this process's HTTP clients (`job`, `status`, `cluster`) speak HTTPS to every
/// `--master` entry not written `http://...`, trusting the CA certificates in `ca` and
/// presenting `identity` (certificate chain, key; PEM) when given. The error names the flag
/// and the file.
pub fn use_tls(
    ca: &std::path::Path,
    identity: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<(), String> {
    use ringmaster_proto::transport::{load_certificates, load_private_key};
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
    let roots: Vec<Certificate<'static>> = load_certificates("TLS CA", ca)
        .map_err(|e| format!("--tls-ca: {e}"))?
        .iter()
        .map(|c| Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    let client = match identity {
        None => None,
        Some((cert, key)) => {
            let chain: Vec<Certificate<'static>> = load_certificates("TLS certificate", cert)
                .map_err(|e| format!("--tls-cert: {e}"))?
                .iter()
                .map(|c| Certificate::from_der(c.as_ref()).to_owned())
                .collect();
            load_private_key(key).map_err(|e| format!("--tls-key: {e}"))?;
            let pem = std::fs::read(key)
                .map_err(|e| format!("--tls-key: cannot read {}: {e}", key.display()))?;
            let key = PrivateKey::from_pem(&pem)
                .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
            Some(ClientCert::new_with_certs(&chain, key))
        }
    };
    let config = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(std::sync::Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .root_certs(RootCerts::new_with_certs(&roots))
        .client_cert(client)
        .build();
    let _ = CLIENT_TLS.set(ClientTls { config });
    Ok(())
}

/// Whether [`use_tls`] was called: bare `HOST:PORT` entries are then HTTPS.
pub fn tls_on() -> bool {
    CLIENT_TLS.get().is_some()
}

/// The TLS settings for the HTTP clients' agents: [`use_tls`]'s, else none trusted at all (an
/// `https://` entry without `--tls-ca` is refused before any request, [`with_leader`]).
pub fn tls_config() -> ureq::tls::TlsConfig {
    match CLIENT_TLS.get() {
        Some(tls) => tls.config.clone(),
        None => ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(std::sync::Arc::new(
                tokio_rustls::rustls::crypto::ring::default_provider(),
            ))
            .root_certs(ureq::tls::RootCerts::new_with_certs(&[]))
            .build(),
    }
}

/// The URL base of one `--master` entry: `http://` and `https://` entries as given (without a
/// trailing `/`), a bare `HOST:PORT` with `https://` after [`use_tls`], else `http://`.
pub fn base(master: &str) -> String {
    let master = master.trim().trim_end_matches('/');
    if master.starts_with("http://") || master.starts_with("https://") {
        master.to_string()
    } else if tls_on() {
        format!("https://{master}")
    } else {
        format!("http://{master}")
    }
}

/// What to add to "cannot reach the master at URL: ERROR": a plain-HTTP request that reached
/// something which did not answer HTTP (e.g. a master serving HTTPS, which closes the
/// connection with a TLS alert) suggests `--tls-ca`; an HTTPS request answered by something
/// that is not HTTP (a TLS master's protocol port) names the `--http` port; another failed
/// HTTPS request suggests checking `--tls-ca`.
pub fn unreachable_hint(url: &str, error: &ureq::Error) -> &'static str {
    let nobody = match error {
        ureq::Error::Io(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed | ureq::Error::Timeout(_) => true,
        _ => false,
    };
    if nobody {
        ""
    } else if url.starts_with("http://") {
        "\n(no HTTP answer: if the master serves HTTPS (`tls:` in its config), give --tls-ca \
         FILE, the CA that signed its certificate, or set RINGMASTER_TLS_CA)"
    } else if matches!(error, ureq::Error::Protocol(_)) {
        "\n(TLS but no HTTP answer: a master with `tls:` serves its HTTP API on its --http port \
         only, not on its protocol port --listen)"
    } else {
        "\n(HTTPS: --tls-ca must name the CA that signed the master's certificate, and the \
         host in --master one of the certificate's names; a master with tls.client_ca also \
         wants --tls-cert and --tls-key)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_lists_for_the_clis() {
        assert_eq!(parse_masters("m:5050").unwrap(), vec!["m:5050"]);
        assert_eq!(
            parse_masters("a:1, http://b:2/ ,a:1").unwrap(),
            vec!["a:1", "http://b:2/"]
        );
        let err = parse_masters("a:1,b").unwrap_err();
        assert_eq!(err, "--master `a:1,b`: entry `b`: expected HOST:PORT");
        let err = parse_masters("a:1,,b:2").unwrap_err();
        assert!(
            err.starts_with("--master `a:1,,b:2`: an entry is empty"),
            "{err}"
        );
        assert_eq!(
            parse_masters("https://m:1/,m:2").unwrap(),
            vec!["https://m:1/", "m:2"]
        );
        assert_eq!(base("https://m:1/"), "https://m:1");
        assert_eq!(base("http://m:1"), "http://m:1");
        // No `use_tls` in this process's unit tests: bare entries are plain HTTP.
        assert_eq!(base("m:1"), "http://m:1");
        let err = with_leader("https://m:1", |_| Asked::Answer(())).unwrap_err();
        assert!(err.contains("--tls-ca"), "{err}");
        assert!(parse_masters(" ")
            .unwrap_err()
            .starts_with("--master is empty"));
        assert_eq!(
            parse_masters("m").unwrap_err(),
            "--master `m`: expected HOST:PORT"
        );
    }

    #[test]
    fn a_not_leader_answer_is_a_503_naming_the_leader() {
        let body = r#"{"error": "not the leader", "leader": "b:5050"}"#;
        assert_eq!(
            not_leader(503, body),
            Some(("b:5050".into(), "not the leader".into()))
        );
        assert_eq!(
            not_leader(503, r#"{"error": "election", "leader": ""}"#),
            Some((String::new(), "election".into()))
        );
        // Other 503s (no jobs framework, a proxy's page) and other statuses are not.
        assert_eq!(not_leader(503, r#"{"error": "no jobs framework"}"#), None);
        assert_eq!(not_leader(503, "<html>busy</html>"), None);
        assert_eq!(not_leader(500, body), None);
    }
}
