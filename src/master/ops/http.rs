//! The operator surface over HTTP: `GET /state` (JSON), `GET /metrics` (Prometheus text),
//! `GET /health`, the live dashboard at `/`, `/jobs`, and task output (`/files/read`,
//! `/jobs/{name}/logs`, in [`super::logs`]). Every route but `/health` is behind the
//! authentication middleware of [`super::auth`].
//!
//! Handlers are clients of the actor like connection tasks are: each request sends one
//! [`Event`] and awaits the answer on a oneshot channel, so the state has one owner and a
//! request always sees a consistent picture. A master too busy to answer within
//! `ACTOR_TIMEOUT` gets a 503, never a hung request. What the handlers share
//! (`HttpState`) is in `shared`, so `logs` needs nothing of this module.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::extract::{Path, Query};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::metrics::Metrics;
use super::shared::{HttpState, ACTOR_TIMEOUT};
use crate::jobs::runner::{ChangeError, JobsHandle};
use crate::jobs::spec::JobSpec;
use crate::master::events::Event;
use crate::master::jobs_launch::JobsSlot;

/// The dashboard: one self-contained page (inline CSS and JS, no external resources).
const DASHBOARD: &str = include_str!("dashboard.html");

/// Content type of the OpenMetrics text format written by `prometheus-client`.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The HTTP server's connections: its own port's, and those the protocol port handed over
/// (connections there that opened with an HTTP request).
struct HttpListener {
    own: TcpListener,
    handed: mpsc::Receiver<(TcpStream, SocketAddr)>,
}

impl axum::serve::Listener for HttpListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            tokio::select! {
                accepted = self.own.accept() => match accepted {
                    Ok(pair) => return pair,
                    Err(e) => {
                        tracing::warn!(error = %e, "HTTP accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(pair) = self.handed.recv() => return pair,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.own.local_addr()
    }
}

/// How long a client of the HTTPS port has for its TLS handshake (as on the protocol port).
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTPS server's connections (a master with `tls:`): each accepted socket goes through
/// the master's TLS acceptor in a task of its own, so a slow or silent client holds up no
/// other; a failed handshake closes that connection only (logged at debug).
struct TlsHttpListener {
    own: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: tokio::task::JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl axum::serve::Listener for TlsHttpListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        loop {
            tokio::select! {
                accepted = self.own.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let acceptor = self.acceptor.clone();
                        self.handshakes.spawn(async move {
                            match tokio::time::timeout(
                                TLS_HANDSHAKE_TIMEOUT,
                                acceptor.accept(stream),
                            )
                            .await
                            {
                                Ok(Ok(tls)) => Some((tls, peer)),
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "HTTPS: TLS handshake failed");
                                    None
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "HTTPS: no TLS handshake within 10 s");
                                    None
                                }
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "HTTP accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(done) = self.handshakes.join_next() => {
                    if let Ok(Some(pair)) = done {
                        return pair;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.own.local_addr()
    }
}

/// Serves the routes on `listener`, and on the connections handed over through `handed`,
/// until `shutdown` turns true; who may use them is `auth` (`HttpAuth::from_config`). With
/// `tls` (the master's `tls:`, the protocol port's acceptor) `listener` speaks HTTPS only and
/// nothing is handed over.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handed: mpsc::Receiver<(TcpStream, SocketAddr)>,
    events: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
    jobs: Arc<JobsSlot>,
    cluster: Option<crate::master::cluster::ClusterNode>,
    auth: Arc<super::auth::HttpAuth>,
    mut shutdown: watch::Receiver<bool>,
) {
    let basic_in_clear =
        tls.is_none() && !listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
    let shared = HttpState {
        events,
        metrics,
        jobs,
        cluster,
        auth,
        basic_in_clear,
    };
    let app = Router::new()
        .route("/", get(dashboard))
        .route("/state", get(state))
        .route("/metrics", get(metrics_text))
        .route("/health", get(health))
        .route("/jobs", get(jobs_list).post(job_put))
        .route("/jobs/plan", post(job_plan))
        .route("/jobs/{name}", get(job_get))
        .route("/jobs/{name}/stop", post(job_stop))
        .route("/jobs/{name}/scale", post(job_scale))
        .route("/jobs/{name}/logs", get(super::logs::job_logs))
        .route("/files/read", get(super::logs::files_read))
        .route("/cluster/members", get(members_list).post(member_add))
        .route(
            "/cluster/members/{id}",
            axum::routing::delete(member_remove),
        )
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            leader_only,
        ))
        // Outermost: a client is authenticated before anything else, even the answer naming
        // the leader (docs/security.md, "HTTP API").
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            require_auth,
        ))
        .with_state(shared);
    let stopped = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    let result = match tls {
        None => {
            let listener = HttpListener {
                own: listener,
                handed,
            };
            axum::serve(listener, app)
                .with_graceful_shutdown(stopped)
                .await
        }
        Some(acceptor) => {
            let listener = TlsHttpListener {
                own: listener,
                acceptor,
                handshakes: tokio::task::JoinSet::new(),
            };
            axum::serve(listener, app)
                .with_graceful_shutdown(stopped)
                .await
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "operator HTTP server failed");
    }
}

/// The middleware in front of every route ([`super::auth`]): lets a request through with its
/// principal in the request's extensions, or answers 401/403 and counts the refusal.
async fn require_auth(
    State(http): State<HttpState>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use super::auth::{
        authorize, basic_refused, refusal_response, unix_now, Credentials, Refusal, Route,
    };
    let route = Route::of(request.method(), request.uri().path());
    let credentials = Credentials::from_header(request.headers().get(header::AUTHORIZATION));
    let decided = match basic_refused(&credentials, http.basic_in_clear) {
        Some(refusal) => Err(refusal),
        None => authorize(route, &credentials, &http.auth, unix_now()),
    };
    match decided {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(refusal) => {
            http.metrics.http_auth_failed(refusal.reason());
            if refusal != Refusal::Missing {
                tracing::warn!(
                    method = %request.method(),
                    path = request.uri().path(),
                    reason = refusal.reason(),
                    "HTTP request refused: {}",
                    refusal.message()
                );
            }
            refusal_response(route, &refusal)
        }
    }
}

/// Sends one event and waits for the actor's answer.
async fn ask<T>(
    events: &mpsc::Sender<Event>,
    event: impl FnOnce(oneshot::Sender<T>) -> Event,
) -> Result<T, Response> {
    let unavailable = |why: &str| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("ringmaster master: {why}\n"),
        )
            .into_response()
    };
    let (tx, rx) = oneshot::channel();
    let answer = tokio::time::timeout(ACTOR_TIMEOUT, async {
        events
            .send(event(tx))
            .await
            .map_err(|_| "the master is stopping")?;
        rx.await.map_err(|_| "the master is stopping")
    })
    .await;
    match answer {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(why)) => Err(unavailable(why)),
        Err(_) => Err(unavailable("the master did not answer within 5 s")),
    }
}

/// In a replication group only the leader answers the API (`/state`, `/jobs…`,
/// `/files/read`, `/cluster/members`): a follower answers `503` with `{"error": …, "leader": "host:port"}` (empty
/// when it knows no leader), which the CLIs follow (docs/protocol.md, "Leaders and terms").
/// The dashboard page, `/health` and `/metrics` are every master's own.
async fn leader_only(
    State(http): State<HttpState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let own = matches!(request.uri().path(), "/" | "/health" | "/metrics");
    match &http.cluster {
        Some(node) if !own && !node.serves() => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "error": format!("master {} does not lead its group", node.id),
                "leader": node.leader_address().unwrap_or_default(),
            })),
        )
            .into_response(),
        _ => next.run(request).await,
    }
}

async fn dashboard() -> Html<&'static str> {
    Html(DASHBOARD)
}

async fn state(State(http): State<HttpState>) -> Response {
    match ask(&http.events, Event::Snapshot).await {
        Ok(snapshot) => ([(header::CACHE_CONTROL, "no-store")], Json(snapshot)).into_response(),
        Err(response) => response,
    }
}

async fn metrics_text(State(http): State<HttpState>) -> Response {
    match ask(&http.events, Event::PublishMetrics).await {
        Ok(()) => (
            [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
            http.metrics.encode(),
        )
            .into_response(),
        Err(response) => response,
    }
}

async fn health(State(http): State<HttpState>) -> Response {
    match ask(&http.events, Event::Health).await {
        Ok(health) => Json(health).into_response(),
        Err(response) => response,
    }
}

/// The jobs framework, or the answer saying it is not running. A group's leader starts it
/// with each lead: until it runs, the answer is the retryable "no leader yet" one (503 with an
/// empty `leader`), which the CLIs ask again.
fn jobs_of(http: &HttpState) -> Result<JobsHandle, Box<Response>> {
    http.jobs.get().ok_or_else(|| {
        Box::new(match &http.cluster {
            Some(node) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({
                    "error": format!(
                        "the jobs framework is starting on master {} (a new leader)",
                        node.id
                    ),
                    "leader": "",
                })),
            )
                .into_response(),
            None => (
                StatusCode::SERVICE_UNAVAILABLE,
                "this master runs no jobs framework (see its log and docs/jobs.md)\n",
            )
                .into_response(),
        })
    })
}

fn no_such_job(name: &str) -> Response {
    (StatusCode::NOT_FOUND, format!("no job named `{name}`\n")).into_response()
}

fn refused(why: String) -> Response {
    (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response()
}

/// A job change that was refused (400) or not recorded in the registry (503).
fn not_changed(error: ChangeError) -> Response {
    match error {
        ChangeError::Refused(why) => refused(why),
        ChangeError::NotRecorded(why) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response()
        }
    }
}

/// `GET /jobs`: every job with its instances.
async fn jobs_list(State(http): State<HttpState>) -> Response {
    match jobs_of(&http) {
        Ok(jobs) => Json(jobs.jobs().await).into_response(),
        Err(response) => *response,
    }
}

/// `GET /jobs/{name}`.
async fn job_get(State(http): State<HttpState>, Path(name): Path<String>) -> Response {
    let jobs = match jobs_of(&http) {
        Ok(jobs) => jobs,
        Err(response) => return *response,
    };
    match jobs
        .jobs()
        .await
        .into_iter()
        .find(|j| j.job.spec.name == name)
    {
        Some(job) => Json(job).into_response(),
        None => no_such_job(&name),
    }
}

/// `POST /jobs` with a [`JobSpec`] as JSON: creates or updates the job.
async fn job_put(State(http): State<HttpState>, body: String) -> Response {
    let jobs = match jobs_of(&http) {
        Ok(jobs) => jobs,
        Err(response) => return *response,
    };
    let spec: JobSpec = match serde_json::from_str(&body) {
        Ok(spec) => spec,
        Err(e) => return refused(format!("not a job spec: {e}")),
    };
    let name = spec.name.clone();
    match jobs.put(spec).await {
        Ok(created) => Json(serde_json::json!({
            "job": name,
            "created": created,
        }))
        .into_response(),
        Err(error) => not_changed(error),
    }
}

/// `POST /jobs/plan` with a [`JobSpec`]: where its instances would go now, nothing launched.
async fn job_plan(State(http): State<HttpState>, body: String) -> Response {
    let spec: JobSpec = match serde_json::from_str(&body) {
        Ok(spec) => spec,
        Err(e) => return refused(format!("not a job spec: {e}")),
    };
    if let Err(why) = spec.check() {
        return refused(why);
    }
    let (demand, count) = (spec.resources(), spec.count);
    let placement = crate::master::plan::Placement {
        partition: spec.partition,
        constraints: spec.constraints,
    };
    match ask(&http.events, |reply| Event::Plan {
        demand,
        count,
        placement,
        reply,
    })
    .await
    {
        Ok(plan) => Json(plan).into_response(),
        Err(response) => response,
    }
}

#[derive(serde::Deserialize)]
struct StopQuery {
    #[serde(default)]
    purge: bool,
}

/// `POST /jobs/{name}/stop[?purge=true]`.
async fn job_stop(
    State(http): State<HttpState>,
    Path(name): Path<String>,
    Query(query): Query<StopQuery>,
) -> Response {
    let jobs = match jobs_of(&http) {
        Ok(jobs) => jobs,
        Err(response) => return *response,
    };
    match jobs.stop(&name, query.purge).await {
        Ok(true) => Json(serde_json::json!({"job": name, "stopped": true})).into_response(),
        Ok(false) => no_such_job(&name),
        Err(error) => not_changed(error),
    }
}

#[derive(serde::Deserialize)]
struct ScaleBody {
    count: u32,
}

/// `POST /jobs/{name}/scale` with `{"count": N}`.
async fn job_scale(
    State(http): State<HttpState>,
    Path(name): Path<String>,
    body: String,
) -> Response {
    let jobs = match jobs_of(&http) {
        Ok(jobs) => jobs,
        Err(response) => return *response,
    };
    let scale: ScaleBody = match serde_json::from_str(&body) {
        Ok(scale) => scale,
        Err(e) => return refused(format!("expected {{\"count\": N}}: {e}")),
    };
    match jobs.scale(&name, scale.count).await {
        Ok(true) => Json(serde_json::json!({"job": name, "count": scale.count})).into_response(),
        Ok(false) => no_such_job(&name),
        Err(error) => not_changed(error),
    }
}

/// How long `POST /cluster/members` waits for the new master to catch up.
const MEMBER_CATCH_UP: Duration = crate::master::replication::raft::CATCH_UP_TIMEOUT;

/// A JSON error answer: `{"error": why}`.
fn json_error(status: StatusCode, why: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": why.into() }))).into_response()
}

/// The group of a replicated master, or the answer saying this master is a single one.
fn group_of(http: &HttpState) -> Result<&crate::master::cluster::ClusterNode, Box<Response>> {
    http.cluster.as_ref().ok_or_else(|| {
        Box::new(json_error(
            StatusCode::NOT_FOUND,
            "this master is not in a replication group (no cluster: section in its config)",
        ))
    })
}

/// The body of `POST /cluster/members`: `{"id": N, "address": "host:port"}`; refusals say
/// what is wrong.
pub(crate) fn parse_new_member(body: &str) -> Result<(u64, String), String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NewMember {
        id: u64,
        address: String,
    }
    let member: NewMember = serde_json::from_str(body).map_err(|e| {
        format!("expected {{\"id\": N, \"address\": \"host:port\"}} (N from 1): {e}")
    })?;
    if member.id == 0 {
        return Err("id: master ids start at 1".into());
    }
    let address = member.address.trim().to_string();
    crate::config::check_host_port(&address).map_err(|e| format!("address: {e}"))?;
    Ok((member.id, address))
}

/// The answer to a membership change that was not made.
fn membership_refused(
    node: &crate::master::cluster::ClusterNode,
    error: crate::master::replication::raft::MembershipError,
) -> Response {
    use crate::master::replication::raft::MembershipError as E;
    match error {
        E::Invalid(why) => json_error(StatusCode::BAD_REQUEST, why),
        E::NotMember(why) => json_error(StatusCode::NOT_FOUND, why),
        E::Conflict(why) => json_error(StatusCode::CONFLICT, why),
        E::Timeout(why) => json_error(StatusCode::GATEWAY_TIMEOUT, why),
        E::Failed(why) => json_error(StatusCode::INTERNAL_SERVER_ERROR, why),
        // Deposed meanwhile: the same answer a follower gives, so clients follow the leader.
        E::NotLeader => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "error": format!("master {} no longer leads its group", node.id),
                "leader": node.leader_address().unwrap_or_default(),
            })),
        )
            .into_response(),
    }
}

/// `GET /cluster/members`: voters and learners with their addresses, and the leader.
async fn members_list(State(http): State<HttpState>) -> Response {
    match group_of(&http) {
        Ok(node) => Json(node.replicator.members()).into_response(),
        Err(response) => *response,
    }
}

/// `POST /cluster/members` with `{"id": N, "address": "host:port"}`: adds a master (started
/// with `cluster.join: true`) as a learner, waits until it caught up, then makes it a voter.
async fn member_add(State(http): State<HttpState>, body: String) -> Response {
    let node = match group_of(&http) {
        Ok(node) => node,
        Err(response) => return *response,
    };
    let (id, address) = match parse_new_member(&body) {
        Ok(member) => member,
        Err(why) => return json_error(StatusCode::BAD_REQUEST, why),
    };
    tracing::info!(id, %address, "adding a master to the group");
    match node
        .replicator
        .add_voter(id, address.clone(), MEMBER_CATCH_UP)
        .await
    {
        Ok(added) => {
            let already = added == crate::master::replication::raft::Added::AlreadyVoter;
            Json(serde_json::json!({
                "id": id,
                "address": address,
                "added": !already,
                "members": node.replicator.members(),
            }))
            .into_response()
        }
        Err(error) => {
            tracing::warn!(id, %address, %error, "could not add a master");
            membership_refused(node, error)
        }
    }
}

/// `DELETE /cluster/members/{id}`: removes a master (voter or learner) from the group.
async fn member_remove(State(http): State<HttpState>, Path(id): Path<String>) -> Response {
    let node = match group_of(&http) {
        Ok(node) => node,
        Err(response) => return *response,
    };
    let id: u64 = match id.parse() {
        Ok(id) if id > 0 => id,
        _ => {
            return json_error(
                StatusCode::BAD_REQUEST,
                format!("`{id}` is not a master id (a whole number from 1)"),
            )
        }
    };
    tracing::info!(id, "removing a master from the group");
    match node.replicator.remove_member(id).await {
        Ok(()) => Json(serde_json::json!({
            "id": id,
            "removed": true,
            "members": node.replicator.members(),
        }))
        .into_response(),
        Err(error) => {
            tracing::warn!(id, %error, "could not remove a master");
            membership_refused(node, error)
        }
    }
}

async fn not_found() -> (StatusCode, &'static str) {
    (
        StatusCode::NOT_FOUND,
        "not found; this master serves / (dashboard), /state, /metrics, /health, /jobs, /files/read and /cluster/members\n",
    )
}

/// What `--http` asks for: an address, or `none` to serve no HTTP.
///
/// Without the flag the HTTP surface listens next to the protocol: the same host with the
/// port plus one (`127.0.0.1:5050` → `127.0.0.1:5051`; port 0, an ephemeral port, stays 0).
pub fn http_address(listen: &str, flag: Option<&str>) -> Result<Option<String>, String> {
    match flag.map(str::trim) {
        Some("none") => Ok(None),
        Some("") => Err("--http: empty address (give HOST:PORT or `none`)".into()),
        Some(addr) => {
            let (_, port) = addr
                .rsplit_once(':')
                .ok_or_else(|| format!("--http {addr}: expected HOST:PORT or `none`"))?;
            port.parse::<u16>()
                .map_err(|_| format!("--http {addr}: `{port}` is not a port number"))?;
            Ok(Some(addr.to_string()))
        }
        None => {
            // HTTP stays on loopback unless asked for explicitly, even when the protocol
            // port is exposed: without auth.required the dashboard and /state are open.
            let (host, port) = listen
                .rsplit_once(':')
                .ok_or_else(|| format!("--listen {listen}: expected HOST:PORT"))?;
            let port: u16 = port
                .parse()
                .map_err(|_| format!("--listen {listen}: `{port}` is not a port number"))?;
            let http_port = match port {
                0 => 0,
                p => p.checked_add(1).ok_or_else(|| {
                    format!("--listen {listen}: no port after {p} for HTTP; pass --http HOST:PORT")
                })?,
            };
            let loopback = if host.starts_with('[') {
                "[::1]"
            } else {
                "127.0.0.1"
            };
            Ok(Some(format!("{loopback}:{http_port}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{http_address, parse_new_member};

    #[test]
    fn a_new_member_needs_an_id_from_1_and_a_host_port() {
        assert_eq!(
            parse_new_member(r#"{"id": 4, "address": "10.0.0.4:5050"}"#),
            Ok((4, "10.0.0.4:5050".to_string()))
        );
        assert_eq!(
            parse_new_member(r#"{"id": 5, "address": " [::1]:5050 "}"#),
            Ok((5, "[::1]:5050".to_string()))
        );
        let refused = |body: &str| parse_new_member(body).unwrap_err();
        assert_eq!(
            refused(r#"{"id": 0, "address": "a:1"}"#),
            "id: master ids start at 1"
        );
        assert_eq!(
            refused(r#"{"id": 4, "address": "a"}"#),
            "address: `a` is not host:port (no port)"
        );
        assert_eq!(
            refused(r#"{"id": 4, "address": "a:0"}"#),
            "address: `a:0` is not host:port (the port must be from 1 to 65535)"
        );
        for body in [
            "",
            "{}",
            r#"{"id": 4}"#,
            r#"{"address": "a:1"}"#,
            r#"{"id": -1, "address": "a:1"}"#,
            r#"{"id": "4", "address": "a:1"}"#,
            r#"{"id": 4, "address": "a:1", "voter": false}"#,
            "[4]",
        ] {
            let why = refused(body);
            assert!(
                why.starts_with(r#"expected {"id": N, "address": "host:port"}"#),
                "{body}: {why}"
            );
        }
    }

    #[test]
    fn http_address_defaults_next_to_the_protocol_port() {
        type Case<'a> = (&'a str, Option<&'a str>, Result<Option<&'a str>, &'a str>);
        let cases: [Case; 9] = [
            ("127.0.0.1:5050", None, Ok(Some("127.0.0.1:5051"))),
            ("[::1]:5050", None, Ok(Some("[::1]:5051"))),
            ("127.0.0.1:0", None, Ok(Some("127.0.0.1:0"))),
            ("0.0.0.0:5050", None, Ok(Some("127.0.0.1:5051"))),
            ("127.0.0.1:5050", Some("none"), Ok(None)),
            (
                "127.0.0.1:5050",
                Some("0.0.0.0:8080"),
                Ok(Some("0.0.0.0:8080")),
            ),
            (
                "127.0.0.1:65535",
                None,
                Err(
                    "--listen 127.0.0.1:65535: no port after 65535 for HTTP; pass --http HOST:PORT",
                ),
            ),
            (
                "127.0.0.1:5050",
                Some("localhost"),
                Err("--http localhost: expected HOST:PORT or `none`"),
            ),
            (
                "127.0.0.1:5050",
                Some("h:99999"),
                Err("--http h:99999: `99999` is not a port number"),
            ),
        ];
        for (listen, flag, expected) in cases {
            let got = http_address(listen, flag);
            let expected = expected
                .map(|o| o.map(str::to_string))
                .map_err(str::to_string);
            assert_eq!(got, expected, "listen {listen} flag {flag:?}");
        }
    }
}
