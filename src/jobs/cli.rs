//! `ringmaster job run|status|stop|scale`: clients of the master's `/jobs` HTTP API.

use std::time::Duration;

use ringmaster_proto::masters::Asked;

use super::plan::Plan;
use super::spec::{parse_job_spec, JobKind, JobSpec};

/// How long one request may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often `job run --wait` looks at the job.
const WAIT_POLL: Duration = Duration::from_millis(500);

/// A failed command: its message and exit code (2: bad input, 1: everything else).
pub struct CliError {
    pub message: String,
    pub code: u8,
}

pub(crate) fn failure(message: impl Into<String>) -> CliError {
    CliError {
        message: message.into(),
        code: 1,
    }
}

/// The URL base of one `--master` entry ([`crate::leader_http::base`]: `https://` with
/// `--tls-ca`).
pub(crate) fn base(master: &str) -> String {
    crate::leader_http::base(master)
}

pub(crate) fn agent() -> ureq::Agent {
    agent_with(Some(HTTP_TIMEOUT))
}

/// The HTTP clients' agent: requests time out after `timeout`, carry the credential
/// ([`use_credential`]) and trust `--tls-ca` ([`crate::leader_http::use_tls`]).
pub(crate) fn agent_with(timeout: Option<Duration>) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(timeout)
        .http_status_as_error(false)
        .tls_config(crate::leader_http::tls_config())
        .middleware(add_authorization)
        .build()
        .into()
}

/// How long the token sent with each request is valid: long enough for a clock a few minutes
/// off, short enough that a token read off the wire is soon useless.
pub const REQUEST_TOKEN_TTL: Duration = Duration::from_secs(600);

/// The principal the HTTP clients (`job`, `status`, `cluster`) authenticate as.
struct ClientCredential {
    principal: String,
    secret: Vec<u8>,
}

static CREDENTIAL: std::sync::OnceLock<ClientCredential> = std::sync::OnceLock::new();

/// Makes every later request of this process's HTTP clients carry a bearer token of
/// `principal`, made from the secret in `secret_file` (docs/security.md, "HTTP API"). Exit
/// code 2 when the name or the file is bad.
pub fn use_credential(principal: &str, secret_file: &std::path::Path) -> Result<(), CliError> {
    let bad = |message: String| CliError { message, code: 2 };
    ringmaster_proto::security::check_principal(principal)
        .map_err(|e| bad(format!("--principal: {e}")))?;
    let secret = ringmaster_proto::security::read_secret_file(secret_file)
        .map_err(|e| bad(format!("--secret-file: {e}")))?;
    let _ = CREDENTIAL.set(ClientCredential {
        principal: principal.to_string(),
        secret,
    });
    Ok(())
}

/// The `Authorization` header value for a request now, when [`use_credential`] was called:
/// `Bearer` and a token valid for [`REQUEST_TOKEN_TTL`], so the secret never crosses the wire.
pub fn authorization() -> Option<String> {
    let credential = CREDENTIAL.get()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let token = crate::security::http_token(
        &credential.principal,
        &credential.secret,
        now + REQUEST_TOKEN_TTL.as_secs(),
    );
    Some(format!("Bearer {token}"))
}

/// A ureq middleware that adds [`authorization`] to every request.
pub(crate) fn add_authorization(
    mut request: ureq::http::Request<ureq::SendBody>,
    next: ureq::middleware::MiddlewareNext,
) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
    if let Some(value) = authorization() {
        if let Ok(value) = ureq::http::HeaderValue::from_str(&value) {
            request
                .headers_mut()
                .insert(ureq::http::header::AUTHORIZATION, value);
        }
    }
    next.handle(request)
}

/// Sends a request and returns the body of a 2xx answer; anything else is an error that
/// carries the master's own explanation. With several masters (`a:5050,b:5050`) they are
/// asked in turn and the leader is followed ([`crate::leader_http`]).
pub(crate) fn call(
    master: &str,
    method: &str,
    path: &str,
    body: Option<String>,
) -> Result<String, CliError> {
    call_with(&agent(), master, method, path, body)
}

/// [`call`] with this `agent` (e.g. a longer timeout). With `--tls-ca` the request goes
/// through an agent of [`agent_with`] with `agent`'s timeout, so it trusts the CA whoever
/// built `agent`.
pub(crate) fn call_with(
    agent: &ureq::Agent,
    master: &str,
    method: &str,
    path: &str,
    body: Option<String>,
) -> Result<String, CliError> {
    let with_tls;
    let agent = if crate::leader_http::tls_on() {
        with_tls = agent_with(agent.config().timeouts().global);
        &with_tls
    } else {
        agent
    };
    let answer = crate::leader_http::with_leader(master, |address| {
        let url = format!("{}{path}", base(address));
        let result = match (method, &body) {
            ("GET", _) => agent.get(&url).call(),
            ("DELETE", _) => agent.delete(&url).call(),
            (_, Some(body)) => agent
                .post(&url)
                .header("content-type", "application/json")
                .send(body.as_str()),
            (_, None) => agent.post(&url).send_empty(),
        };
        let mut response = match result {
            Ok(response) => response,
            Err(e) => {
                return Asked::Unreachable(format!(
                    "cannot reach the master at {url}: {e}{}\n(--master or RINGMASTER_MASTER: \
                     the master's --listen address, or a list of them, which serve HTTP unless \
                     run with --http none)",
                    crate::leader_http::unreachable_hint(&url, &e)
                ))
            }
        };
        let status = response.status();
        let text = match response.body_mut().read_to_string() {
            Ok(text) => text,
            Err(e) => return Asked::Unreachable(format!("reading the answer of {url}: {e}")),
        };
        if let Some((leader, message)) = crate::leader_http::not_leader(status.as_u16(), &text) {
            return Asked::NotLeader { leader, message };
        }
        Asked::Answer(if status.is_success() {
            Ok(text)
        } else {
            Err(failure(format!(
                "the master refused ({status}): {}",
                text.trim_end()
            )))
        })
    });
    answer.map_err(failure).and_then(|answer| answer)
}

/// Reads and checks a spec file (exit code 2 for what is wrong with it).
fn read_spec(file: &str) -> Result<JobSpec, CliError> {
    let bad = |message: String| CliError { message, code: 2 };
    let text = std::fs::read_to_string(file).map_err(|e| bad(format!("{file}: {e}")))?;
    parse_job_spec(&text, file).map_err(|e| bad(e.to_string()))
}

/// `job run FILE`: reads and checks the spec, creates or updates the job; with `wait`, a
/// batch job is followed until it is done (exit 0 iff every instance succeeded).
pub fn run(master: &str, file: &str, wait: bool) -> Result<(), CliError> {
    let spec = read_spec(file)?;
    let body = serde_json::to_string(&spec).map_err(|e| failure(e.to_string()))?;
    let answer = call(master, "POST", "/jobs", Some(body))?;
    let created = serde_json::from_str::<serde_json::Value>(&answer)
        .ok()
        .and_then(|v| v["created"].as_bool())
        .unwrap_or(false);
    println!(
        "job {} {} ({} × {}, {})",
        spec.name,
        if created { "created" } else { "updated" },
        spec.count,
        spec.task.resources,
        match spec.kind {
            JobKind::Service => "service",
            JobKind::Batch => "batch",
        }
    );
    if !wait {
        return Ok(());
    }
    if spec.kind == JobKind::Service {
        return Err(CliError {
            message: "--wait follows batch jobs; a service runs until `ringmaster job stop`".into(),
            code: 2,
        });
    }
    loop {
        let job = fetch(master, &spec.name)?;
        if job.done {
            print!("{}", render(std::slice::from_ref(&job)));
            return if job.succeeded {
                Ok(())
            } else {
                Err(failure(format!(
                    "job {}: not every instance succeeded",
                    spec.name
                )))
            };
        }
        std::thread::sleep(WAIT_POLL);
    }
}

/// A job as the API returns it, with what the CLI derives.
#[derive(Clone)]
pub struct JobView {
    pub job: serde_json::Value,
    pub done: bool,
    pub succeeded: bool,
}

/// A job as `GET /jobs` reports it (`done` and `succeeded` decided by the master).
fn view(job: serde_json::Value) -> JobView {
    JobView {
        done: job["done"].as_bool().unwrap_or(false),
        succeeded: job["succeeded"].as_bool().unwrap_or(false),
        job,
    }
}

fn fetch(master: &str, name: &str) -> Result<JobView, CliError> {
    let text = call(master, "GET", &format!("/jobs/{name}"), None)?;
    let job: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| failure(format!("not a job: {e}")))?;
    Ok(view(job))
}

/// `job status [NAME] [--json]`.
pub fn status(master: &str, name: Option<&str>, json: bool) -> Result<(), CliError> {
    let jobs: Vec<JobView> = match name {
        Some(name) => vec![fetch(master, name)?],
        None => {
            let text = call(master, "GET", "/jobs", None)?;
            let list: Vec<serde_json::Value> =
                serde_json::from_str(&text).map_err(|e| failure(format!("not a job list: {e}")))?;
            list.into_iter().map(view).collect()
        }
    };
    if json {
        let values: Vec<&serde_json::Value> = jobs.iter().map(|j| &j.job).collect();
        let out = match name {
            Some(_) => serde_json::to_string_pretty(values[0]),
            None => serde_json::to_string_pretty(&values),
        };
        println!("{}", out.map_err(|e| failure(e.to_string()))?);
    } else if jobs.is_empty() {
        println!("no jobs");
    } else {
        print!("{}", render(&jobs));
    }
    Ok(())
}

/// Tables: one line per job, then one per instance.
pub fn render(jobs: &[JobView]) -> String {
    let mut out = String::new();
    for view in jobs {
        let job = &view.job;
        let state = if !job["failed"].is_null() {
            format!("failed: {}", job["failed"].as_str().unwrap_or(""))
        } else if job["stopped"] == true {
            "stopped".into()
        } else if view.done {
            if view.succeeded {
                "succeeded"
            } else {
                "done, some failed"
            }
            .into()
        } else {
            "running".into()
        };
        // Only a job outside the default partition has one in its spec's JSON.
        let partition = job["spec"]["partition"]
            .as_str()
            .map(|p| format!("partition {p}  "))
            .unwrap_or_default();
        out.push_str(&format!(
            "job {}  {}  count {}  {}  {}{}\n",
            job["spec"]["name"].as_str().unwrap_or("?"),
            job["spec"]["type"].as_str().unwrap_or("?"),
            job["spec"]["count"],
            job["spec"]["task"]["resources"].as_str().unwrap_or(""),
            partition,
            state
        ));
        out.push_str(
            "  INSTANCE  STATE      AGENT                 HEALTH     RESTARTS  EXIT  TASK\n",
        );
        for i in job["instances"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  {:<8}  {:<9}  {:<20}  {:<9}  {:<8}  {:<4}  {}\n",
                i["index"].to_string(),
                i["state"].as_str().unwrap_or(""),
                i["agent"].as_str().unwrap_or("-"),
                i["health"].as_str().unwrap_or("–"),
                i["restarts"].to_string(),
                i["last_exit_code"]
                    .as_i64()
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
                i["task_id"].as_str().unwrap_or("-"),
            ));
        }
    }
    out
}

/// `job plan FILE`: where each instance would go now, or why it cannot be placed; nothing
/// is launched. Exit 0 iff every instance would be placed.
pub fn plan(master: &str, file: &str) -> Result<(), CliError> {
    let spec = read_spec(file)?;
    let body = serde_json::to_string(&spec).map_err(|e| failure(e.to_string()))?;
    let answer = call(master, "POST", "/jobs/plan", Some(body))?;
    let plan: Plan =
        serde_json::from_str(&answer).map_err(|e| failure(format!("not a plan: {e}")))?;
    print!("{}", render_plan(&spec, &plan));
    if plan.unplaced == 0 {
        Ok(())
    } else {
        Err(failure(format!(
            "job {}: {} of {} instances cannot be placed now",
            spec.name, plan.unplaced, spec.count
        )))
    }
}

fn render_plan(spec: &JobSpec, plan: &Plan) -> String {
    let mut out = format!(
        "job {}: {} × {} (nothing launched)\n  INSTANCE  AGENT\n",
        spec.name, spec.count, spec.task.resources
    );
    for (index, agent) in plan.placed.iter().enumerate() {
        out.push_str(&format!("  {index:<8}  {agent}\n"));
    }
    if let Some(health) = &spec.task.health {
        out.push_str(&format!("  health: {}\n", health.describe()));
    }
    if spec.partition != super::spec::DEFAULT_PARTITION {
        out.push_str(&format!("  partition: {}\n", spec.partition));
    }
    if !spec.constraints.is_empty() {
        let shown: Vec<String> = spec.constraints.iter().map(|c| c.to_string()).collect();
        out.push_str(&format!("  constraints: {}\n", shown.join(", ")));
    }
    if plan.unplaced > 0 {
        out.push_str(&format!(
            "  {} more cannot be placed: {}\n",
            plan.unplaced,
            plan.why.as_deref().unwrap_or("no agent fits")
        ));
    }
    out
}

/// `job stop NAME [--purge]`.
pub fn stop(master: &str, name: &str, purge: bool) -> Result<(), CliError> {
    let path = format!(
        "/jobs/{name}/stop{}",
        if purge { "?purge=true" } else { "" }
    );
    call(master, "POST", &path, None)?;
    println!(
        "job {name} stopping: its tasks get SIGTERM, then SIGKILL after the kill grace{}",
        if purge { "; then it is forgotten" } else { "" }
    );
    Ok(())
}

/// `job scale NAME COUNT`.
pub fn scale(master: &str, name: &str, count: u32) -> Result<(), CliError> {
    let body = serde_json::json!({ "count": count }).to_string();
    call(master, "POST", &format!("/jobs/{name}/scale"), Some(body))?;
    println!("job {name} scaled to {count}");
    Ok(())
}

// The engine's types are what the API serialises; keep the CLI's reading of them honest.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::engine::{Engine, InstanceState, Job};

    /// A one-request HTTP server on an ephemeral port: answers `status` with `body`, and
    /// hands back the request line it got.
    fn fake_http(status: &str, body: &str) -> (String, std::thread::JoinHandle<String>) {
        use std::io::{BufRead as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        let handle = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 2 {
                line.clear();
            }
            (&stream).write_all(answer.as_bytes()).unwrap();
            request_line.trim_end().to_string()
        });
        (addr, handle)
    }

    #[test]
    fn requests_skip_unreachable_masters_and_follow_the_leader() {
        let closed = {
            let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            gone.local_addr().unwrap().to_string()
        };
        let (leader, leader_got) = fake_http("200 OK", r#"{"jobs": []}"#);
        let (follower, follower_got) = fake_http(
            "503 Service Unavailable",
            &format!(r#"{{"error": "not the leader", "leader": "{leader}"}}"#),
        );
        // The leader is not even in the list: the follower names it.
        let body = call(&format!("{closed},{follower}"), "GET", "/jobs", None)
            .map_err(|e| e.message)
            .unwrap();
        assert_eq!(body, r#"{"jobs": []}"#);
        assert_eq!(follower_got.join().unwrap(), "GET /jobs HTTP/1.1");
        assert_eq!(leader_got.join().unwrap(), "GET /jobs HTTP/1.1");
    }

    #[test]
    fn an_ordinary_refusal_is_final_and_bad_lists_name_the_flag() {
        let (first, first_got) = fake_http(
            "503 Service Unavailable",
            r#"{"error": "no jobs framework"}"#,
        );
        let err = call(&format!("{first},127.0.0.1:1"), "GET", "/jobs", None)
            .err()
            .unwrap();
        assert!(err.message.contains("no jobs framework"), "{}", err.message);
        first_got.join().unwrap();
        let err = call("a:1,b", "GET", "/jobs", None).err().unwrap();
        assert_eq!(
            err.message,
            "--master `a:1,b`: entry `b`: expected HOST:PORT"
        );
    }

    #[test]
    fn the_cli_reads_what_the_api_writes() {
        let spec = parse_job_spec(
            "name: b\ntype: batch\ncount: 1\ntask:\n  command: true\n  resources: cpus:1\n",
            "b.yaml",
        )
        .unwrap();
        let mut engine = Engine::default();
        engine.put(spec);
        let job: Job = engine.job("b").unwrap().clone();
        let value = serde_json::to_value(job.report()).unwrap();
        let v = view(value);
        assert!(!v.done && !v.succeeded);
        assert_eq!(v.job["instances"][0]["state"], "pending");
        assert_eq!(
            serde_json::to_value(InstanceState::Succeeded).unwrap(),
            "succeeded"
        );
        let table = render(&[v]);
        assert!(
            table.contains("job b  batch  count 1  cpus:1  running"),
            "{table}"
        );
        assert!(table.contains("HEALTH"), "{table}");
        assert!(table.contains("  –  "), "unknown health is a dash: {table}");
    }

    #[test]
    fn status_shows_health_and_plan_shows_the_check() {
        let spec = parse_job_spec(
            "name: web\ntype: service\ntask:\n  command: x\n  resources: cpus:1\n  health:\n    command: test -e ok\n",
            "w.yaml",
        )
        .unwrap();
        let mut engine = Engine::default();
        engine.put(spec.clone());
        let big: ringmaster_core::resources::Resources = "cpus:10".parse().unwrap();
        engine.place(
            "default",
            &[crate::jobs::engine::OfferView {
                id: "o1",
                agent: "a1",
                resources: &big,
                hostname: "a1",
                attributes: &[],
            }],
            tokio::time::Instant::now(),
        );
        engine.set_health(
            "web.0.0-1",
            Some(crate::jobs::engine::InstanceHealth::Healthy),
        );
        let value = serde_json::to_value(engine.job("web").unwrap().clone().report()).unwrap();
        assert_eq!(value["instances"][0]["health"], "healthy");
        let table = render(&[view(value)]);
        assert!(table.contains(" healthy "), "{table}");
        let plan = Plan {
            placed: vec!["a1".into()],
            unplaced: 0,
            why: None,
        };
        let text = render_plan(&spec, &plan);
        assert!(
            text.contains("health: `test -e ok` every 10s, timeout 2s, unhealthy after 3 failures in a row, first check after 10s"),
            "{text}"
        );
    }

    #[test]
    fn plan_and_status_show_the_partition_and_the_constraints() {
        let spec = parse_job_spec(
            "name: web\ntype: service\ntask:\n  command: x\n  resources: cpus:1\npartition: gpu\n\
             constraints:\n  - {attribute: rack, value: r1}\n  - {operator: distinct_hosts}\n",
            "w.yaml",
        )
        .unwrap();
        let plan = Plan {
            placed: vec![],
            unplaced: 1,
            why: Some("no agent satisfies rack = r1".into()),
        };
        let text = render_plan(&spec, &plan);
        assert!(text.contains("  partition: gpu\n"), "{text}");
        assert!(
            text.contains("  constraints: rack = r1, distinct_hosts\n"),
            "{text}"
        );
        assert!(
            text.contains("1 more cannot be placed: no agent satisfies rack = r1"),
            "{text}"
        );
        let mut engine = Engine::default();
        engine.put(spec);
        let value = serde_json::to_value(engine.job("web").unwrap().clone().report()).unwrap();
        let table = render(&[view(value)]);
        assert!(table.contains("cpus:1  partition gpu  running"), "{table}");
    }
}
