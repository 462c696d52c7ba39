//! The operator surface over HTTP: `GET /state` (JSON), `GET /metrics` (Prometheus text),
//! `GET /health`, and the live dashboard at `/`.
//!
//! Handlers are clients of the actor like connection tasks are: each request sends one
//! [`Event`] and awaits the answer on a oneshot channel, so the state has one owner and a
//! request always sees a consistent picture. A master too busy to answer within
//! [`ACTOR_TIMEOUT`] gets a 503, never a hung request.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};

use super::metrics::Metrics;
use crate::master::events::Event;

/// How long a request waits for the actor's answer.
pub const ACTOR_TIMEOUT: Duration = Duration::from_secs(5);

/// The dashboard: one self-contained page (inline CSS and JS, no external resources).
const DASHBOARD: &str = include_str!("dashboard.html");

/// Content type of the OpenMetrics text format written by `prometheus-client`.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct HttpState {
    events: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
}

/// Serves the routes on `listener` until `shutdown` turns true.
pub(crate) async fn serve(
    listener: TcpListener,
    events: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/", get(dashboard))
        .route("/state", get(state))
        .route("/metrics", get(metrics_text))
        .route("/health", get(health))
        .fallback(not_found)
        .with_state(HttpState { events, metrics });
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

async fn not_found() -> (StatusCode, &'static str) {
    (
        StatusCode::NOT_FOUND,
        "not found; this master serves / (dashboard), /state, /metrics and /health\n",
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
