//! Who may use the master's HTTP API (docs/security.md, "HTTP API"): one axum middleware in
//! front of every route, deciding with the pure [`authorize`].
//!
//! - Credentials: HTTP Basic (`principal:secret`, the secret compared in constant time) or a
//!   bearer token `v1.PRINCIPAL.EXPIRY.MAC` made from the principal's secret
//!   ([`crate::security::http_token`], `ringmaster token`), checked with the same secret; an
//!   expired token is refused.
//! - Roles (`operator`, `viewer` in a principal's `roles:`): an operator may use every route, a
//!   viewer the read routes ([`Route::access`]); task logs are the operator's.
//! - With `auth.required` every route but `/health` needs a principal, except the read routes
//!   listed in `http.anonymous`. Without it anonymous clients may do everything (as before),
//!   but presented credentials must be right and a principal is held to its roles.
//! - No credentials: `401` with `WWW-Authenticate: Basic realm="ringmaster"`; wrong or expired
//!   ones: `401`; a principal without the role: `403`. Bodies are `{"error": "..."}` (the
//!   dashboard page's 401 is HTML). Each refusal counts in
//!   `ringmaster_http_auth_failures_total{reason}`.

use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;

use crate::security::{
    base64_decode, parse_http_token, AnonymousRoute, AuthConfig, HttpConfig, HttpRole, STANDARD,
};

/// The realm of the `WWW-Authenticate` challenge.
pub const REALM: &str = "ringmaster";

/// What the HTTP API's middleware needs of the master's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpAuth {
    pub auth: AuthConfig,
    pub http: HttpConfig,
}

impl HttpAuth {
    pub fn from_config(config: &crate::config::Config) -> Self {
        HttpAuth {
            auth: config.auth.clone(),
            http: config.http.clone(),
        }
    }
}

/// The routes of the HTTP API, by what they do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /`.
    Dashboard,
    State,
    Metrics,
    Health,
    /// `GET /jobs`.
    JobsList,
    /// `GET /jobs/{name}`.
    JobGet,
    /// `POST /jobs/plan`.
    JobPlan,
    /// `POST /jobs`.
    JobPut,
    JobStop,
    JobScale,
    JobLogs,
    FilesRead,
    /// `GET /cluster/members`.
    MembersList,
    /// `POST /cluster/members`.
    MemberAdd,
    /// `DELETE /cluster/members/{id}`.
    MemberRemove,
    /// Anything else (404 or 405): a read when the method is GET or HEAD.
    Other {
        write: bool,
    },
}

/// What a route asks of its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone, with or without credentials (`/health`).
    Public,
    /// Viewers and operators; anonymous clients too when `http.anonymous` lists the route.
    Read(Option<AnonymousRoute>),
    /// Operators.
    Write,
    /// Task output: operators (the owner of the task's framework is not looked up here).
    Logs,
}

impl Route {
    /// The route of a request.
    pub fn of(method: &Method, path: &str) -> Route {
        let read = *method == Method::GET || *method == Method::HEAD;
        let post = *method == Method::POST;
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (segments.as_slice(), read, post) {
            ([""], true, _) => Route::Dashboard,
            (["state"], true, _) => Route::State,
            (["metrics"], true, _) => Route::Metrics,
            (["health"], true, _) => Route::Health,
            (["jobs"], true, _) => Route::JobsList,
            (["jobs"], _, true) => Route::JobPut,
            (["jobs", "plan"], _, true) => Route::JobPlan,
            (["jobs", name], true, _) if !name.is_empty() => Route::JobGet,
            (["jobs", _, "stop"], _, true) => Route::JobStop,
            (["jobs", _, "scale"], _, true) => Route::JobScale,
            (["jobs", _, "logs"], true, _) => Route::JobLogs,
            (["files", "read"], true, _) => Route::FilesRead,
            (["cluster", "members"], true, _) => Route::MembersList,
            (["cluster", "members"], _, true) => Route::MemberAdd,
            (["cluster", "members", _], _, _) if *method == Method::DELETE => Route::MemberRemove,
            _ => Route::Other { write: !read },
        }
    }

    pub fn access(self) -> Access {
        match self {
            Route::Health => Access::Public,
            Route::Dashboard => Access::Read(Some(AnonymousRoute::Dashboard)),
            Route::State => Access::Read(Some(AnonymousRoute::State)),
            Route::Metrics => Access::Read(Some(AnonymousRoute::Metrics)),
            Route::JobsList
            | Route::JobGet
            | Route::JobPlan
            | Route::MembersList
            | Route::Other { write: false } => Access::Read(None),
            Route::JobPut
            | Route::JobStop
            | Route::JobScale
            | Route::MemberAdd
            | Route::MemberRemove
            | Route::Other { write: true } => Access::Write,
            Route::JobLogs | Route::FilesRead => Access::Logs,
        }
    }
}

/// What a request presented in its `Authorization` header.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    None,
    Basic {
        principal: String,
        secret: Vec<u8>,
    },
    Bearer(String),
    /// A header that is neither (another scheme, bad base64, no `:`).
    Malformed,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::None => f.write_str("None"),
            Credentials::Basic { principal, .. } => write!(f, "Basic({principal:?}, <redacted>)"),
            Credentials::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Credentials::Malformed => f.write_str("Malformed"),
        }
    }
}

impl Credentials {
    /// Reads an `Authorization` header (schemes are case-insensitive).
    pub fn from_header(value: Option<&HeaderValue>) -> Credentials {
        let Some(value) = value else {
            return Credentials::None;
        };
        let Ok(text) = value.to_str() else {
            return Credentials::Malformed;
        };
        let (scheme, rest) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("basic") {
            let Some(decoded) = base64_decode(rest, STANDARD) else {
                return Credentials::Malformed;
            };
            let Some(colon) = decoded.iter().position(|&b| b == b':') else {
                return Credentials::Malformed;
            };
            match std::str::from_utf8(&decoded[..colon]) {
                Ok(principal) if !principal.is_empty() => Credentials::Basic {
                    principal: principal.to_string(),
                    secret: decoded[colon + 1..].to_vec(),
                },
                _ => Credentials::Malformed,
            }
        } else if scheme.eq_ignore_ascii_case("bearer") && !rest.is_empty() {
            Credentials::Bearer(rest.to_string())
        } else {
            Credentials::Malformed
        }
    }
}

/// The client a request was let in as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// `None`: anonymous.
    pub name: Option<String>,
    /// May read every task's output (an operator, or anyone where authentication is not
    /// required); else only its own frameworks' tasks' (`GET /files/read`).
    pub all_logs: bool,
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No credentials where a principal is required (401).
    Missing,
    /// Unknown principal, wrong secret, a bad token or header (401).
    BadCredentials(String),
    /// A token past its expiry (401).
    Expired(String),
    /// A principal without the role the route needs (403).
    Forbidden(String),
}

impl Refusal {
    /// Its label in `ringmaster_http_auth_failures_total{reason}` (one of
    /// `metrics::HTTP_AUTH_FAILURE_REASONS`).
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::BadCredentials(_) => "bad_credentials",
            Refusal::Expired(_) => "expired",
            Refusal::Forbidden(_) => "forbidden",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
            _ => StatusCode::UNAUTHORIZED,
        }
    }

    pub fn message(&self) -> String {
        match self {
            Refusal::Missing => "authentication required: send HTTP Basic (principal:secret) or \
                                 a bearer token (`ringmaster token`); docs/security.md"
                .to_string(),
            Refusal::BadCredentials(why) | Refusal::Expired(why) | Refusal::Forbidden(why) => {
                why.clone()
            }
        }
    }
}

fn wrong(principal: &str) -> Refusal {
    Refusal::BadCredentials(format!(
        "authentication failed for principal {principal:?}: unknown principal or wrong secret"
    ))
}

/// Checks presented credentials against the principals: the principal's name, or why not.
fn authenticate(credentials: &Credentials, auth: &AuthConfig, now: u64) -> Result<String, Refusal> {
    match credentials {
        Credentials::None => Err(Refusal::Missing),
        Credentials::Malformed => Err(Refusal::BadCredentials(
            "unreadable Authorization header: expected `Basic base64(principal:secret)` or \
             `Bearer TOKEN`"
                .into(),
        )),
        Credentials::Basic { principal, secret } => match auth.principals.get(principal) {
            Some(grant) if grant.verify_secret(secret) => Ok(principal.clone()),
            _ => Err(wrong(principal)),
        },
        Credentials::Bearer(token) => {
            let Some((principal, expiry, mac)) = parse_http_token(token) else {
                return Err(Refusal::BadCredentials(
                    "not a ringmaster token (v1.PRINCIPAL.EXPIRY.MAC; `ringmaster token`)".into(),
                ));
            };
            match auth.principals.get(principal) {
                Some(grant) if grant.verify_http_token(principal, expiry, &mac) => {
                    if expiry <= now {
                        Err(Refusal::Expired(format!(
                            "the token of principal {principal:?} expired at {expiry} (Unix \
                             time; now {now}): make a new one with `ringmaster token`"
                        )))
                    } else {
                        Ok(principal.to_string())
                    }
                }
                _ => Err(wrong(principal)),
            }
        }
    }
}

/// HTTP Basic sends the secret itself: on a listener that is plain HTTP and not loopback (no
/// `tls:`) it is refused, whatever the secret, so no client is taught to send it in clear.
/// Bearer tokens (`ringmaster token`, what the CLIs send) expire and are accepted there.
pub fn basic_refused(credentials: &Credentials, basic_in_clear: bool) -> Option<Refusal> {
    (basic_in_clear && matches!(credentials, Credentials::Basic { .. })).then(|| {
        Refusal::BadCredentials(
            "HTTP Basic would send the secret in clear here (plain HTTP, not loopback): send a \
             bearer token (`ringmaster token`; the CLIs do) or serve HTTPS (`tls:`)"
                .into(),
        )
    })
}

/// May a request with these credentials use `route`? `now` is the Unix time in seconds
/// (for token expiry). The decision of the middleware, as a pure function.
pub fn authorize(
    route: Route,
    credentials: &Credentials,
    auth: &HttpAuth,
    now: u64,
) -> Result<Principal, Refusal> {
    let access = route.access();
    if access == Access::Public {
        return Ok(Principal {
            name: None,
            all_logs: false,
        });
    }
    let anonymous_ok = !auth.auth.required
        || matches!(access, Access::Read(Some(r)) if auth.http.anonymous.contains(&r));
    if *credentials == Credentials::None {
        return if anonymous_ok {
            Ok(Principal {
                name: None,
                all_logs: !auth.auth.required,
            })
        } else {
            Err(Refusal::Missing)
        };
    }
    let name = authenticate(credentials, &auth.auth, now)?;
    let grant = &auth.auth.principals[&name];
    let operator = grant.allows_http_role(HttpRole::Operator);
    let viewer = operator || grant.allows_http_role(HttpRole::Viewer);
    let (allowed, needs) = match access {
        Access::Public => (true, ""),
        Access::Read(Some(r)) if auth.http.anonymous.contains(&r) => (true, ""),
        Access::Read(_) => (viewer, "viewer or operator"),
        Access::Write => (operator, "operator"),
        // A framework's principal reads its own tasks' output (the actor checks the owner);
        // a job's tasks are the jobs framework's, so their logs are the operator's.
        Access::Logs => (
            operator
                || (route == Route::FilesRead
                    && grant.allows_role(ringmaster_proto::security::AuthRole::Framework)),
            "operator (or framework, for its own tasks' `/files/read`)",
        ),
    };
    if allowed {
        Ok(Principal {
            name: Some(name),
            all_logs: operator,
        })
    } else {
        Err(Refusal::Forbidden(format!(
            "principal {name:?} may not use this route: it needs the role {needs}"
        )))
    }
}

/// The Unix time in seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The answer to a refused request.
pub fn refusal_response(route: Route, refusal: &Refusal) -> Response {
    let status = refusal.status();
    let message = refusal.message();
    let mut response = if route == Route::Dashboard && status == StatusCode::UNAUTHORIZED {
        (
            status,
            Html(format!(
                "<!doctype html><title>ringmaster: sign in</title><h1>401</h1><p>{}</p>",
                message.replace('&', "&amp;").replace('<', "&lt;")
            )),
        )
            .into_response()
    } else {
        (status, Json(serde_json::json!({ "error": message }))).into_response()
    };
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if status == StatusCode::UNAUTHORIZED {
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"ringmaster\""),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::{base64_encode, http_token, AllowedUsers, PrincipalGrant};
    use ringmaster_proto::security::AuthRole;
    use std::collections::BTreeSet;

    const NOW: u64 = 1_700_000_000;

    fn grant(secret: &str, http: &[HttpRole], wire: &[AuthRole]) -> PrincipalGrant {
        PrincipalGrant::new(
            secret.as_bytes().to_vec(),
            wire.iter().copied().collect(),
            AllowedUsers::Any,
        )
        .with_http_roles(http.iter().copied().collect())
    }

    fn config(required: bool, anonymous: &[AnonymousRoute]) -> HttpAuth {
        let mut auth = AuthConfig {
            required,
            ..Default::default()
        };
        auth.principals.insert(
            "ops".into(),
            grant("ops-secret", &[HttpRole::Operator], &[]),
        );
        auth.principals.insert(
            "eyes".into(),
            grant("eyes-secret", &[HttpRole::Viewer], &[]),
        );
        auth.principals.insert(
            "spark".into(),
            grant("spark-secret", &[], &[AuthRole::Framework]),
        );
        HttpAuth {
            auth,
            http: HttpConfig {
                anonymous: anonymous.iter().copied().collect::<BTreeSet<_>>(),
            },
        }
    }

    fn basic(principal: &str, secret: &str) -> Credentials {
        let header = format!(
            "Basic {}",
            base64_encode(format!("{principal}:{secret}").as_bytes(), STANDARD, true)
        );
        Credentials::from_header(Some(&HeaderValue::from_str(&header).unwrap()))
    }

    fn bearer(token: &str) -> Credentials {
        Credentials::from_header(Some(
            &HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        ))
    }

    const WRITES: [(&str, &str, Route); 6] = [
        ("POST", "/jobs", Route::JobPut),
        ("POST", "/jobs/web/stop", Route::JobStop),
        ("POST", "/jobs/web/scale", Route::JobScale),
        ("POST", "/cluster/members", Route::MemberAdd),
        ("DELETE", "/cluster/members/4", Route::MemberRemove),
        ("DELETE", "/jobs/web", Route::Other { write: true }),
    ];

    const READS: [(&str, &str, Route); 7] = [
        ("GET", "/", Route::Dashboard),
        ("GET", "/state", Route::State),
        ("GET", "/metrics", Route::Metrics),
        ("GET", "/jobs", Route::JobsList),
        ("GET", "/jobs/web", Route::JobGet),
        ("POST", "/jobs/plan", Route::JobPlan),
        ("GET", "/cluster/members", Route::MembersList),
    ];

    const LOGS: [(&str, &str, Route); 2] = [
        ("GET", "/jobs/web/logs", Route::JobLogs),
        ("GET", "/files/read", Route::FilesRead),
    ];

    fn route(method: &str, path: &str) -> Route {
        Route::of(&Method::from_bytes(method.as_bytes()).unwrap(), path)
    }

    #[test]
    fn requests_map_to_their_routes() {
        for (method, path, expected) in WRITES.iter().chain(&READS).chain(&LOGS) {
            assert_eq!(route(method, path), *expected, "{method} {path}");
        }
        assert_eq!(route("GET", "/health"), Route::Health);
        assert_eq!(route("GET", "/nope"), Route::Other { write: false });
        assert_eq!(route("PUT", "/state"), Route::Other { write: true });
    }

    #[test]
    fn every_write_route_needs_an_operator() {
        let auth = config(true, &AnonymousRoute::ALL);
        let expired = http_token("ops", b"ops-secret", NOW - 1);
        let forged = http_token("ops", b"not-the-secret", NOW + 60);
        let valid = http_token("ops", b"ops-secret", NOW + 60);
        for (method, path, _) in WRITES {
            let r = route(method, path);
            let check = |c: &Credentials| authorize(r, c, &auth, NOW);
            assert_eq!(check(&Credentials::None), Err(Refusal::Missing), "{path}");
            assert_eq!(
                check(&basic("ops", "wrong")).unwrap_err().reason(),
                "bad_credentials"
            );
            assert_eq!(
                check(&basic("nobody", "x")).unwrap_err().reason(),
                "bad_credentials"
            );
            assert_eq!(
                check(&bearer(&forged)).unwrap_err().reason(),
                "bad_credentials"
            );
            assert_eq!(check(&bearer(&expired)).unwrap_err().reason(), "expired");
            assert_eq!(
                check(&basic("eyes", "eyes-secret")).unwrap_err().reason(),
                "forbidden"
            );
            assert_eq!(
                check(&basic("spark", "spark-secret")).unwrap_err().reason(),
                "forbidden"
            );
            let ops = Principal {
                name: Some("ops".into()),
                all_logs: true,
            };
            assert_eq!(
                check(&basic("ops", "ops-secret")),
                Ok(ops.clone()),
                "{path}"
            );
            assert_eq!(check(&bearer(&valid)), Ok(ops), "{path}");
        }
    }

    #[test]
    fn viewers_read_and_frameworks_read_nothing() {
        let auth = config(true, &[]);
        for (method, path, _) in READS {
            let r = route(method, path);
            let check = |c: &Credentials| authorize(r, c, &auth, NOW);
            assert_eq!(check(&Credentials::None), Err(Refusal::Missing), "{path}");
            assert!(check(&basic("eyes", "eyes-secret")).is_ok(), "{path}");
            assert!(check(&basic("ops", "ops-secret")).is_ok(), "{path}");
            assert_eq!(
                check(&basic("spark", "spark-secret")).unwrap_err().reason(),
                "forbidden",
                "{path}"
            );
        }
        for (method, path, _) in LOGS {
            let r = route(method, path);
            let check = |c: &Credentials| authorize(r, c, &auth, NOW);
            assert!(
                check(&basic("ops", "ops-secret")).unwrap().all_logs,
                "{path}"
            );
            assert_eq!(
                check(&basic("eyes", "eyes-secret")).unwrap_err().reason(),
                "forbidden"
            );
            // A framework's principal reads its own tasks' output (the actor checks the
            // owner), never a job's.
            let spark = check(&basic("spark", "spark-secret"));
            match r {
                Route::FilesRead => assert_eq!(
                    spark,
                    Ok(Principal {
                        name: Some("spark".into()),
                        all_logs: false
                    })
                ),
                _ => assert_eq!(spark.unwrap_err().reason(), "forbidden", "{path}"),
            }
        }
        // /health is open to everyone, whatever they present.
        let health = route("GET", "/health");
        assert!(authorize(health, &Credentials::None, &auth, NOW).is_ok());
        assert!(authorize(health, &basic("ops", "wrong"), &auth, NOW).is_ok());
    }

    #[test]
    fn anonymous_routes_open_only_what_is_listed() {
        let auth = config(true, &[AnonymousRoute::Metrics]);
        let none = |r: Route| authorize(r, &Credentials::None, &auth, NOW);
        assert!(none(Route::Metrics).is_ok());
        assert_eq!(none(Route::State), Err(Refusal::Missing));
        assert_eq!(none(Route::Dashboard), Err(Refusal::Missing));
        assert_eq!(none(Route::JobsList), Err(Refusal::Missing));
        // Listed, yet wrong credentials are still refused; a framework principal may read it.
        assert!(authorize(Route::Metrics, &basic("ops", "x"), &auth, NOW).is_err());
        assert!(authorize(Route::Metrics, &basic("spark", "spark-secret"), &auth, NOW).is_ok());
    }

    #[test]
    fn without_required_auth_anonymous_clients_do_everything_but_bad_credentials_fail() {
        let auth = config(false, &[]);
        for (method, path, _) in WRITES.iter().chain(&READS).chain(&LOGS) {
            let r = route(method, path);
            assert_eq!(
                authorize(r, &Credentials::None, &auth, NOW),
                Ok(Principal {
                    name: None,
                    all_logs: true
                })
            );
            assert_eq!(
                authorize(r, &basic("ops", "wrong"), &auth, NOW)
                    .unwrap_err()
                    .status(),
                StatusCode::UNAUTHORIZED
            );
            assert!(authorize(r, &basic("ops", "ops-secret"), &auth, NOW).is_ok());
        }
        assert_eq!(
            authorize(Route::JobPut, &basic("eyes", "eyes-secret"), &auth, NOW)
                .unwrap_err()
                .status(),
            StatusCode::FORBIDDEN,
            "a principal is held to its roles"
        );
    }

    #[test]
    fn basic_is_refused_in_clear_beyond_loopback_and_tokens_are_not() {
        let basic = Credentials::Basic {
            principal: "ops".into(),
            secret: b"s".to_vec(),
        };
        assert!(matches!(
            basic_refused(&basic, true),
            Some(Refusal::BadCredentials(_))
        ));
        assert_eq!(basic_refused(&basic, false), None);
        assert_eq!(basic_refused(&Credentials::None, true), None);
    }

    #[test]
    fn headers_are_read_strictly() {
        let header =
            |text: &str| Credentials::from_header(Some(&HeaderValue::from_str(text).unwrap()));
        assert_eq!(header("Digest abc"), Credentials::Malformed);
        assert_eq!(header("Basic !!!"), Credentials::Malformed);
        let no_colon = base64_encode(b"ops", STANDARD, true);
        assert_eq!(header(&format!("Basic {no_colon}")), Credentials::Malformed);
        assert_eq!(header("Bearer "), Credentials::Malformed);
        assert_eq!(
            header(&format!(
                "basic {}",
                base64_encode(b"a:b:c", STANDARD, true)
            )),
            Credentials::Basic {
                principal: "a".into(),
                secret: b"b:c".to_vec()
            }
        );
        let auth = config(true, &[]);
        assert_eq!(
            authorize(Route::State, &bearer("v1.ops.x.y"), &auth, NOW)
                .unwrap_err()
                .reason(),
            "bad_credentials"
        );
        assert_eq!(
            authorize(Route::State, &header("Digest x"), &auth, NOW)
                .unwrap_err()
                .reason(),
            "bad_credentials"
        );
    }

    #[test]
    fn refusals_answer_json_with_a_challenge() {
        let missing = refusal_response(Route::JobPut, &Refusal::Missing);
        assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            missing.headers()[header::WWW_AUTHENTICATE],
            "Basic realm=\"ringmaster\""
        );
        assert!(missing.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("application/json"));
        let page = refusal_response(Route::Dashboard, &Refusal::Missing);
        assert!(page.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html"));
        let forbidden = refusal_response(Route::JobPut, &Refusal::Forbidden("no".into()));
        assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
        assert!(forbidden.headers().get(header::WWW_AUTHENTICATE).is_none());
    }
}
