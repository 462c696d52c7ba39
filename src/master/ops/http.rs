//! The operator surface over HTTP: `GET /state` (JSON), `GET /metrics` (Prometheus text),
//! `GET /health`, the live dashboard at `/`, `/jobs`, and task output (`/files/read`,
//! `/jobs/{name}/logs`, in [`super::logs`]).
//!
//! Handlers are clients of the actor like connection tasks are: each request sends one
//! [`Event`] and awaits the answer on a oneshot channel, so the state has one owner and a
//! request always sees a consistent picture. A master too busy to answer within
//! [`ACTOR_TIMEOUT`] gets a 503, never a hung request.

use std::sync::{Arc, OnceLock};
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

use super::metrics::Metrics;
use crate::jobs::runner::{ChangeError, JobsHandle};
use crate::jobs::spec::JobSpec;
use crate::master::events::Event;

/// How long a request waits for the actor's answer.
pub const ACTOR_TIMEOUT: Duration = Duration::from_secs(5);

/// The dashboard: one self-contained page (inline CSS and JS, no external resources).
const DASHBOARD: &str = include_str!("dashboard.html");

/// Content type of the OpenMetrics text format written by `prometheus-client`.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
pub(super) struct HttpState {
    pub(super) events: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
    pub(super) jobs: Arc<OnceLock<JobsHandle>>,
    /// This master's replication group, in cluster mode: a follower sends API clients to the
    /// leader.
    cluster: Option<crate::master::cluster::ClusterNode>,
}

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

/// Serves the routes on `listener`, and on the connections handed over through `handed`,
/// until `shutdown` turns true.
pub(crate) async fn serve(
    listener: TcpListener,
    handed: mpsc::Receiver<(TcpStream, SocketAddr)>,
    events: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
    jobs: Arc<OnceLock<JobsHandle>>,
    cluster: Option<crate::master::cluster::ClusterNode>,
    mut shutdown: watch::Receiver<bool>,
) {
    let shared = HttpState {
        events,
        metrics,
        jobs,
        cluster,
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
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            leader_only,
        ))
        .with_state(shared);
    let listener = HttpListener {
        own: listener,
        handed,
    };
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "operator HTTP server failed");
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
/// `/files/read`): a follower answers `503` with `{"error": …, "leader": "host:port"}` (empty
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

/// The jobs framework, or the answer saying it is not running.
fn jobs_of(http: &HttpState) -> Result<&JobsHandle, Box<Response>> {
    http.jobs.get().ok_or_else(|| {
        Box::new(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "this master runs no jobs framework (see its log and docs/jobs.md)\n",
            )
                .into_response(),
        )
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

async fn not_found() -> (StatusCode, &'static str) {
    (
        StatusCode::NOT_FOUND,
        "not found; this master serves / (dashboard), /state, /metrics, /health, /jobs and /files/read\n",
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
            // port is exposed: the dashboard and /state have no authentication.
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
    use super::http_address;

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
