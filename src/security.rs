//! The master's `tls:` and `auth:` configuration sections: what TLS material to serve, which
//! principals exist, what secret each proves, and what each may do.
//!
//! Kept apart from [`crate::config`] (which only calls [`apply_tls`] and [`apply_auth`]) so
//! the security rules live in one place; the dependency goes one way, `config -> security`,
//! with the located-error types of both in `crate::yaml`. Errors name file, line and key like every other
//! config error; a certificate or secret file that cannot be read is reported at load time
//! with the file's name, not when the first client connects.
//!
//! ```yaml
//! tls:
//!   cert: certs/master.pem       # relative paths are relative to the config file
//!   key: certs/master.key
//!   client_ca: certs/ca.pem      # optional: require client certificates (mutual TLS)
//! auth:
//!   required: true               # refuse agents and frameworks that do not authenticate
//!   principals:
//!     rack1:  { secret_file: secrets/rack1, roles: [agent] }
//!     spark:  { secret_file: secrets/spark, roles: [framework], users: [alice, bob] }
//!     ops:    { secret: "inline only for tests", roles: [agent, framework], users: ["*"] }
//!     peers:  { secret_file: secrets/masters, roles: [master] }  # replication (cluster:)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use ring::hmac;
use ringmaster_proto::security::{check_principal, read_secret_file, verify_mac, AuthRole};
use ringmaster_proto::transport::TlsServerFiles;
use serde::Deserialize;

use crate::yaml::{ConfigError, Seg, YamlSource};

/// The `tls:` section as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    cert: String,
    key: String,
    client_ca: Option<String>,
}

/// The `auth:` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    required: Option<bool>,
    #[serde(default)]
    principals: BTreeMap<String, RawPrincipal>,
}

/// One principal as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrincipal {
    secret: Option<String>,
    secret_file: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
    users: Option<Vec<String>>,
}

/// Which users a framework principal may subscribe as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowedUsers {
    /// `users: ["*"]`.
    Any,
    Only(BTreeSet<String>),
}

/// What a principal may do on the master's HTTP API (docs/security.md, "HTTP API"). Kept
/// apart from [`AuthRole`], the wire roles of the protocol handshake; both are listed in the
/// same `roles:` of a principal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HttpRole {
    /// Every route: job and membership changes, every read, every task's logs.
    Operator,
    /// The read-only views: `/`, `/state`, `/metrics`, `GET /jobs[/{name}]`,
    /// `GET /cluster/members`, `POST /jobs/plan`; no logs.
    Viewer,
}

impl HttpRole {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpRole::Operator => "operator",
            HttpRole::Viewer => "viewer",
        }
    }

    pub fn parse(name: &str) -> Option<HttpRole> {
        match name {
            "operator" => Some(HttpRole::Operator),
            "viewer" => Some(HttpRole::Viewer),
            _ => None,
        }
    }
}

/// What one principal proves and may do. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct PrincipalGrant {
    secret: Vec<u8>,
    pub roles: BTreeSet<AuthRole>,
    /// Its roles on the HTTP API (`operator`, `viewer` in `roles:`).
    pub http_roles: BTreeSet<HttpRole>,
    pub users: AllowedUsers,
    /// The users its frameworks' tasks may run as, when not `users` (the built-in jobs
    /// framework: it subscribes as `jobs`, its tasks run as their job specs say).
    task_users: Option<AllowedUsers>,
}

impl fmt::Debug for PrincipalGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrincipalGrant")
            .field("secret", &"<redacted>")
            .field("roles", &self.roles)
            .field("http_roles", &self.http_roles)
            .field("users", &self.users)
            .field("task_users", &self.task_users)
            .finish()
    }
}

impl PrincipalGrant {
    /// A grant with this secret, these roles and these users (tests, embedding).
    pub fn new(secret: Vec<u8>, roles: BTreeSet<AuthRole>, users: AllowedUsers) -> Self {
        PrincipalGrant {
            secret,
            roles,
            http_roles: BTreeSet::new(),
            users,
            task_users: None,
        }
    }

    /// The same grant with these HTTP roles.
    pub fn with_http_roles(mut self, roles: BTreeSet<HttpRole>) -> Self {
        self.http_roles = roles;
        self
    }

    pub fn allows_http_role(&self, role: HttpRole) -> bool {
        self.http_roles.contains(&role)
    }

    /// Is `secret` this principal's secret (HTTP Basic)? Constant time: both are reduced to
    /// an HMAC of a fixed text and the tags compared by `ring::hmac::verify`, so neither the
    /// position of a difference nor the secret's length shows in the time taken.
    pub fn verify_secret(&self, secret: &[u8]) -> bool {
        const CONTEXT: &[u8] = b"ringmaster-http-basic";
        let presented = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), CONTEXT);
        hmac::verify(
            &hmac::Key::new(hmac::HMAC_SHA256, &self.secret),
            CONTEXT,
            presented.as_ref(),
        )
        .is_ok()
    }

    /// Is `mac` the MAC of an HTTP token of `principal` valid until `expiry`? Constant time.
    pub fn verify_http_token(&self, principal: &str, expiry: u64, mac: &[u8]) -> bool {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.secret);
        hmac::verify(&key, &http_token_input(principal, expiry), mac).is_ok()
    }

    /// The same grant, whose frameworks' tasks may run as `users` instead of the users its
    /// frameworks may subscribe as.
    pub fn with_task_users(mut self, users: AllowedUsers) -> Self {
        self.task_users = Some(users);
        self
    }

    /// The users its frameworks' tasks may run as (`TaskInfo.user` on the master, the user an
    /// agent resolves; docs/security.md, "Task users"): its `users` unless set apart.
    pub fn task_users(&self) -> &AllowedUsers {
        self.task_users.as_ref().unwrap_or(&self.users)
    }

    /// Is `mac` the right answer to `challenge` for `principal` in `role`? Constant time.
    pub fn verify(&self, challenge: &[u8], principal: &str, role: AuthRole, mac: &[u8]) -> bool {
        verify_mac(&self.secret, challenge, principal, role.as_str(), mac)
    }

    pub fn allows_role(&self, role: AuthRole) -> bool {
        self.roles.contains(&role)
    }

    pub fn allows_user(&self, user: &str) -> bool {
        match &self.users {
            AllowedUsers::Any => true,
            AllowedUsers::Only(users) => users.contains(user),
        }
    }
}

/// Who may connect. With `required: false` and no principals (the default) every client is
/// accepted as today; a client that does authenticate is held to its grant either way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthConfig {
    pub required: bool,
    pub principals: BTreeMap<String, PrincipalGrant>,
}

impl AuthConfig {
    /// The credential a master presents to the other masters of its replication group
    /// (`cluster:`): the first principal (by name) with role `master`, whose secret every
    /// master of the group shares. `None`: no such principal (peers connect anonymously, which
    /// only a group without `auth.required` accepts).
    pub fn peer_credential(&self) -> Option<ringmaster_proto::security::Credential> {
        self.principals
            .iter()
            .find(|(_, grant)| grant.allows_role(AuthRole::Master))
            .and_then(|(name, grant)| {
                ringmaster_proto::security::Credential::new(name.clone(), grant.secret.clone()).ok()
            })
    }
}

/// The `http:` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    #[serde(default)]
    anonymous: Vec<String>,
}

/// Read routes of the HTTP API that `http.anonymous` may open to clients without
/// credentials when `auth.required` is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AnonymousRoute {
    /// `GET /`, the dashboard page (its data still comes from `/state`).
    Dashboard,
    /// `GET /state`.
    State,
    /// `GET /metrics`.
    Metrics,
    /// `GET /health` (always open; accepted for completeness).
    Health,
}

impl AnonymousRoute {
    pub const ALL: [AnonymousRoute; 4] = [
        AnonymousRoute::Dashboard,
        AnonymousRoute::State,
        AnonymousRoute::Metrics,
        AnonymousRoute::Health,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AnonymousRoute::Dashboard => "dashboard",
            AnonymousRoute::State => "state",
            AnonymousRoute::Metrics => "metrics",
            AnonymousRoute::Health => "health",
        }
    }

    pub fn parse(name: &str) -> Option<AnonymousRoute> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

/// The master's `http:` section: which read routes anonymous clients may use when
/// `auth.required` is on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpConfig {
    pub anonymous: BTreeSet<AnonymousRoute>,
}

/// Reads an `http:` section found at `at`.
pub fn apply_http(
    source: &YamlSource,
    at: &[Seg],
    raw: &RawHttp,
) -> Result<HttpConfig, ConfigError> {
    let mut anonymous = BTreeSet::new();
    for (i, name) in raw.anonymous.iter().enumerate() {
        let route = AnonymousRoute::parse(name.trim()).ok_or_else(|| {
            let mut path = at.to_vec();
            path.push("anonymous".into());
            path.push(Seg::Index(i));
            let allowed: Vec<&str> = AnonymousRoute::ALL.iter().map(|r| r.as_str()).collect();
            source.error(
                &path,
                format!(
                    "unknown route {name:?}: anonymous routes are {}",
                    allowed.join(", ")
                ),
            )
        })?;
        anonymous.insert(route);
    }
    Ok(HttpConfig { anonymous })
}

/// The version tag that starts every HTTP token.
pub const HTTP_TOKEN_VERSION: &str = "v1";

/// What an HTTP token's MAC covers: `ringmaster-http-token\0v1\0PRINCIPAL\0EXPIRY`.
fn http_token_input(principal: &str, expiry: u64) -> Vec<u8> {
    format!("ringmaster-http-token\0{HTTP_TOKEN_VERSION}\0{principal}\0{expiry}").into_bytes()
}

/// A bearer token for the master's HTTP API, made from the principal's secret without asking
/// the master: `v1.PRINCIPAL.EXPIRY.MAC`, EXPIRY in Unix seconds, MAC the unpadded base64url of
/// `HMAC-SHA256(secret, "ringmaster-http-token\0v1\0PRINCIPAL\0EXPIRY")`.
pub fn http_token(principal: &str, secret: &[u8], expiry: u64) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mac = hmac::sign(&key, &http_token_input(principal, expiry));
    format!(
        "{HTTP_TOKEN_VERSION}.{principal}.{expiry}.{}",
        base64_encode(mac.as_ref(), URL_SAFE, false)
    )
}

/// A token split into (principal, expiry, MAC); `None` when it is not of the form
/// `v1.PRINCIPAL.EXPIRY.MAC` (the principal may itself hold dots).
pub fn parse_http_token(token: &str) -> Option<(&str, u64, Vec<u8>)> {
    let rest = token.strip_prefix(HTTP_TOKEN_VERSION)?.strip_prefix('.')?;
    let (rest, mac) = rest.rsplit_once('.')?;
    let (principal, expiry) = rest.rsplit_once('.')?;
    if principal.is_empty() || expiry.is_empty() || !expiry.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((
        principal,
        expiry.parse().ok()?,
        base64_decode(mac, URL_SAFE)?,
    ))
}

/// A base64 alphabet (RFC 4648): the `base64` crate's engines, named for what uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alphabet {
    /// Section 4, used by HTTP Basic.
    Standard,
    /// Section 5, used by tokens.
    UrlSafe,
}

pub const STANDARD: Alphabet = Alphabet::Standard;
pub const URL_SAFE: Alphabet = Alphabet::UrlSafe;

/// `data` in base64 with `alphabet`, with `=` padding when `pad`.
pub fn base64_encode(data: &[u8], alphabet: Alphabet, pad: bool) -> String {
    use base64::engine::general_purpose as gp;
    use base64::Engine as _;
    match (alphabet, pad) {
        (Alphabet::Standard, true) => gp::STANDARD.encode(data),
        (Alphabet::Standard, false) => gp::STANDARD_NO_PAD.encode(data),
        (Alphabet::UrlSafe, true) => gp::URL_SAFE.encode(data),
        (Alphabet::UrlSafe, false) => gp::URL_SAFE_NO_PAD.encode(data),
    }
}

/// Decodes base64 in `alphabet`, padded or not; `None` when it is not base64.
pub fn base64_decode(text: &str, alphabet: Alphabet) -> Option<Vec<u8>> {
    use base64::engine::general_purpose as gp;
    use base64::Engine as _;
    match alphabet {
        Alphabet::Standard => gp::STANDARD_PAD_INDIFFERENT.decode(text),
        Alphabet::UrlSafe => gp::URL_SAFE_PAD_INDIFFERENT.decode(text),
    }
    .ok()
}

/// Resolves a path from the config file against the file's directory.
pub(crate) fn resolve(config_file: &str, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    match Path::new(config_file).parent() {
        Some(dir) => dir.join(path),
        None => path.to_path_buf(),
    }
}

/// Reads a `tls:` section found at `at`, and checks that the files load.
pub fn apply_tls(
    source: &YamlSource,
    at: &[Seg],
    raw: &RawTls,
) -> Result<TlsServerFiles, ConfigError> {
    let files = TlsServerFiles {
        cert: resolve(source.file, &raw.cert),
        key: resolve(source.file, &raw.key),
        client_ca: raw.client_ca.as_deref().map(|p| resolve(source.file, p)),
    };
    if let Err(e) = files.acceptor() {
        let key = if Some(&e.file) == files.client_ca.as_ref() {
            "client_ca"
        } else if e.file == files.key && e.what == "TLS key" {
            "key"
        } else {
            "cert"
        };
        let mut path = at.to_vec();
        path.push(key.into());
        return Err(source.error(&path, e.to_string()));
    }
    Ok(files)
}

/// Reads an `auth:` section found at `at`, reading every secret file.
pub fn apply_auth(
    source: &YamlSource,
    at: &[Seg],
    raw: &RawAuth,
) -> Result<AuthConfig, ConfigError> {
    let path = |keys: &[&str]| -> Vec<Seg> {
        let mut p = at.to_vec();
        p.extend(keys.iter().map(|k| Seg::Key(k.to_string())));
        p
    };
    let required = raw.required.unwrap_or(false);
    if required && raw.principals.is_empty() {
        return Err(source.error(
            &path(&["required"]),
            "authentication is required but no principals are configured: nobody could connect",
        ));
    }
    let mut principals = BTreeMap::new();
    for (name, p) in &raw.principals {
        check_principal(name)
            .map_err(|e| source.error(&path(&["principals", name]), e.to_string()))?;
        let secret = match (&p.secret, &p.secret_file) {
            (Some(_), Some(_)) => {
                return Err(source.error(
                    &path(&["principals", name]),
                    "give either secret or secret_file, not both",
                ))
            }
            (None, None) => {
                return Err(source.error(
                    &path(&["principals", name]),
                    "no secret: give secret_file (or secret)",
                ))
            }
            (Some(secret), None) if secret.is_empty() => {
                return Err(source.error(&path(&["principals", name, "secret"]), "secret is empty"))
            }
            (Some(secret), None) => secret.as_bytes().to_vec(),
            (None, Some(file)) => read_secret_file(&resolve(source.file, file)).map_err(|e| {
                source.error(&path(&["principals", name, "secret_file"]), e.to_string())
            })?,
        };
        let mut roles = BTreeSet::new();
        let mut http_roles = BTreeSet::new();
        for role in &p.roles {
            if let Some(http) = HttpRole::parse(role) {
                http_roles.insert(http);
                continue;
            }
            let parsed = AuthRole::parse(role).ok_or_else(|| {
                source.error(
                    &path(&["principals", name, "roles"]),
                    format!(
                        "unknown role {role:?}: roles are agent, framework, master, operator and viewer"
                    ),
                )
            })?;
            roles.insert(parsed);
        }
        if roles.is_empty() && http_roles.is_empty() {
            return Err(source.error(
                &path(&["principals", name, "roles"]),
                "no roles: list agent, framework, master, operator, viewer or several",
            ));
        }
        let users = match &p.users {
            Some(users) if users.iter().any(|u| u == "*") => AllowedUsers::Any,
            Some(users) if !users.is_empty() => AllowedUsers::Only(users.iter().cloned().collect()),
            _ if roles.contains(&AuthRole::Framework) => {
                return Err(source.error(
                    &path(&["principals", name]),
                    "a framework principal needs users: the users its frameworks may run as (or [\"*\"] for any)",
                ))
            }
            _ => AllowedUsers::Only(BTreeSet::new()),
        };
        principals.insert(
            name.clone(),
            PrincipalGrant {
                secret,
                roles,
                http_roles,
                users,
                task_users: None,
            },
        );
    }
    Ok(AuthConfig {
        required,
        principals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_proto::security::auth_mac;

    /// Reads the `tls:` and `auth:` sections of `text` as `Config::from_yaml` does.
    fn load(text: &str, file: &str) -> Result<(Option<TlsServerFiles>, AuthConfig), ConfigError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Sections {
            tls: Option<RawTls>,
            auth: Option<RawAuth>,
        }
        let source = YamlSource { text, file };
        let raw: Sections = source.parse()?;
        let tls = match &raw.tls {
            Some(t) => Some(apply_tls(&source, &["tls".into()], t)?),
            None => None,
        };
        let auth = match &raw.auth {
            Some(a) => apply_auth(&source, &["auth".into()], a)?,
            None => AuthConfig::default(),
        };
        Ok((tls, auth))
    }

    #[test]
    fn reads_principals_and_checks_their_grants() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rack1"), "agent-secret\n").unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::Permissions::from_mode(0o600);
            std::fs::set_permissions(dir.path().join("rack1"), mode).unwrap();
        }
        let file = dir.path().join("cluster.yaml");
        let text = "\
auth:
  required: true
  principals:
    rack1: { secret_file: rack1, roles: [agent] }
    spark: { secret: fw-secret, roles: [framework], users: [alice] }
    ops: { secret: x, roles: [agent, framework], users: ['*'] }
";
        let (_, auth) = load(text, &file.display().to_string()).unwrap();
        let auth = &auth;
        assert!(auth.required);
        let rack1 = &auth.principals["rack1"];
        let challenge = [7u8; 32];
        let mac = auth_mac(b"agent-secret", &challenge, "rack1", "agent");
        assert!(rack1.verify(&challenge, "rack1", AuthRole::Agent, &mac));
        assert!(!rack1.verify(&challenge, "rack1", AuthRole::Framework, &mac));
        assert!(rack1.allows_role(AuthRole::Agent));
        assert!(!rack1.allows_role(AuthRole::Framework));
        let spark = &auth.principals["spark"];
        assert!(spark.allows_user("alice") && !spark.allows_user("bob"));
        assert!(auth.principals["ops"].allows_user("anyone"));
        assert!(!format!("{auth:?}").contains("fw-secret"));
        // Tasks run as the users frameworks may subscribe as, unless set apart.
        assert_eq!(spark.task_users(), &spark.users);
        let apart = spark.clone().with_task_users(AllowedUsers::Any);
        assert_eq!(apart.task_users(), &AllowedUsers::Any);
        assert!(!apart.allows_user("bob"), "subscribing is still bounded");
    }

    #[test]
    fn a_master_principal_authenticates_peers() {
        let text = "auth:\n  principals:\n    peers: { secret: m, roles: [master] }\n";
        let (_, auth) = load(text, "cluster.yaml").unwrap();
        let peers = &auth.principals["peers"];
        assert!(peers.allows_role(AuthRole::Master));
        assert!(!peers.allows_role(AuthRole::Agent));
        let challenge = [3u8; 32];
        let mac = auth_mac(b"m", &challenge, "peers", "master");
        assert!(peers.verify(&challenge, "peers", AuthRole::Master, &mac));
        let credential = auth.peer_credential().expect("a master principal");
        assert_eq!(credential.principal(), "peers");
        let ack = ringmaster_proto::HelloAck {
            challenge: challenge.to_vec(),
            ..Default::default()
        };
        let answer = credential.answer(&ack, AuthRole::Master);
        assert!(peers.verify(&challenge, "peers", AuthRole::Master, &answer.mac));
        let text = "auth:\n  principals:\n    rack: { secret: a, roles: [agent] }\n";
        assert_eq!(
            load(text, "cluster.yaml").unwrap().1.peer_credential(),
            None
        );
    }

    #[test]
    fn errors_name_line_key_and_file() {
        let cases = [
            ("auth:\n  required: true\n", "cluster.yaml:2: auth.required: ", "no principals"),
            (
                "auth:\n  principals:\n    p: { roles: [agent] }\n",
                "cluster.yaml:3: auth.principals.p: ",
                "no secret",
            ),
            (
                "auth:\n  principals:\n    p: { secret: s, secret_file: f, roles: [agent] }\n",
                "cluster.yaml:3: auth.principals.p: ",
                "not both",
            ),
            (
                "auth:\n  principals:\n    p:\n      secret: s\n      roles: [agent, root]\n",
                "cluster.yaml:5: auth.principals.p.roles: ",
                "\"root\"",
            ),
            (
                "auth:\n  principals:\n    p: { secret: s, roles: [framework] }\n",
                "cluster.yaml:3: auth.principals.p: ",
                "needs users",
            ),
            (
                "auth:\n  principals:\n    p:\n      secret_file: /nonexistent/secret\n      roles: [agent]\n",
                "cluster.yaml:4: auth.principals.p.secret_file: ",
                "/nonexistent/secret",
            ),
            (
                "tls:\n  cert: /nonexistent/master.pem\n  key: /nonexistent/master.key\n",
                "cluster.yaml:2: tls.cert: ",
                "/nonexistent/master.pem",
            ),
            ("tls:\n  cert: a.pem\n", "cluster.yaml", "key"),
            ("auth:\n  principals:\n    p: { secret: s, roles: [agent], colour: red }\n", "cluster.yaml:3", "colour"),
        ];
        for (text, prefix, word) in cases {
            let err = load(text, "cluster.yaml").unwrap_err().to_string();
            assert!(
                err.starts_with(prefix),
                "{err:?} should start with {prefix:?}"
            );
            assert!(err.contains(word), "{err:?} should mention {word}");
        }
    }

    #[test]
    fn operator_and_viewer_are_http_roles() {
        let text = "auth:\n  required: true\n  principals:\n    ops: { secret: o, roles: [operator] }\n    eyes: { secret: e, roles: [viewer, agent] }\n";
        let (_, auth) = load(text, "cluster.yaml").unwrap();
        let ops = &auth.principals["ops"];
        assert!(ops.allows_http_role(HttpRole::Operator) && ops.roles.is_empty());
        let eyes = &auth.principals["eyes"];
        assert!(eyes.allows_http_role(HttpRole::Viewer));
        assert!(!eyes.allows_http_role(HttpRole::Operator));
        assert!(eyes.allows_role(AuthRole::Agent));
        assert!(ops.verify_secret(b"o") && !ops.verify_secret(b"o2") && !ops.verify_secret(b""));
        let err = load(
            "auth:\n  principals:\n    p:\n      secret: s\n      roles: [admin]\n",
            "cluster.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("cluster.yaml:5: auth.principals.p.roles: ")
                && err.contains("operator and viewer"),
            "{err}"
        );
    }

    #[test]
    fn tokens_carry_principal_and_expiry_under_the_secret() {
        let token = http_token("a.b", b"secret", 1_700_000_000);
        assert!(token.starts_with("v1.a.b.1700000000."), "{token}");
        let (principal, expiry, mac) = parse_http_token(&token).unwrap();
        assert_eq!((principal, expiry), ("a.b", 1_700_000_000));
        let grant = PrincipalGrant::new(b"secret".to_vec(), BTreeSet::new(), AllowedUsers::Any);
        assert!(grant.verify_http_token(principal, expiry, &mac));
        assert!(!grant.verify_http_token(principal, expiry + 1, &mac));
        assert!(!grant.verify_http_token("a", expiry, &mac));
        for bad in [
            "",
            "v1",
            "v2.a.1.AAAA",
            "v1.a.x.AAAA",
            "v1..1.AAAA",
            "v1.a.1.!!",
        ] {
            assert!(parse_http_token(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn base64_alphabets_and_padding_are_what_their_users_need() {
        // Basic: standard alphabet, padded; tokens: URL-safe, unpadded; both decode either way.
        let data = [0xfb, 0xff, 0xbf, 0x61];
        assert_eq!(base64_encode(&data, STANDARD, true), "+/+/YQ==");
        assert_eq!(base64_encode(&data, URL_SAFE, false), "-_-_YQ");
        assert_eq!(
            base64_decode("+/+/YQ", STANDARD).as_deref(),
            Some(&data[..])
        );
        assert_eq!(
            base64_decode("-_-_YQ==", URL_SAFE).as_deref(),
            Some(&data[..])
        );
        assert_eq!(base64_decode("-_-_YQ", STANDARD), None);
        assert_eq!(base64_decode("Zm9v!", STANDARD), None);
    }

    #[test]
    fn http_anonymous_names_known_routes() {
        let config =
            crate::config::Config::from_yaml("http:\n  anonymous: [metrics, state]\n", "m.yaml")
                .unwrap();
        assert_eq!(
            config.http.anonymous,
            BTreeSet::from([AnonymousRoute::Metrics, AnonymousRoute::State])
        );
        let err = crate::config::Config::from_yaml(
            "http:\n  anonymous:\n    - metrics\n    - jobs\n",
            "m.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("m.yaml:4: http.anonymous"), "{err}");
        assert!(
            err.contains("\"jobs\"") && err.contains("dashboard, state, metrics, health"),
            "{err}"
        );
        let err = crate::config::Config::from_yaml("http:\n  open: [x]\n", "m.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("m.yaml:2") && err.contains("open"), "{err}");
    }
}
