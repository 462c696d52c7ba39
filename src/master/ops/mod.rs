//! The operator surface: what a person or a monitoring system sees of the master.
//!
//! - [`http`]: `GET /state` (JSON), `/metrics` (Prometheus text), `/health` and the dashboard
//!   (`dashboard.html`, compiled in). A client of the actor: it asks through the event channel.
//! - [`auth`]: who may use the HTTP API (Basic, bearer tokens, operator and viewer roles):
//!   one middleware in front of every route.
//! - `logs`: task output over HTTP (`/files/read`, `/jobs/{name}/logs`), read through the
//!   actor from the task's agent.
//! - [`metrics`]: the shared Prometheus registry. Counted where things happen (connection
//!   tasks, the actor) and fed plain numbers read off the state; it knows no state types.
//! - [`model`]: the answers as plain data (`Snapshot` and its views, `Health`, `PendingView`).
//! - [`views`]: the reading of the state into those views and into metrics. The only module
//!   here that reads `MasterState`.

pub mod auth;
pub mod http;
mod logs;
pub mod metrics;
pub mod model;
mod shared;
pub(crate) mod views;
