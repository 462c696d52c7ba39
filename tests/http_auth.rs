//! Issue 45: the master's HTTP API with `auth.required: true`, through the real `ringmaster
//! serve` binary: every write route refuses clients without credentials (401), with wrong or
//! expired ones (401) and without the operator role (403), and changes nothing; an operator
//! writes; `ringmaster token` makes a working bearer token; the CLIs authenticate with
//! `--principal/--secret-file` (or the environment).

mod processes;

use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Instant;

use processes::{start_master, wait_line, WAIT};

/// The HTTP address a master logs (`operator HTTP ... on http://ADDR/`).
fn http_address(logs: &mpsc::Receiver<String>) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let line = logs
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the master logs its HTTP address");
        if line.contains("operator HTTP") {
            let at = line.rfind("http=").expect("an http= field") + 5;
            return line[at..].split_whitespace().next().unwrap().to_string();
        }
    }
}

/// One request: (status, WWW-Authenticate header, body).
fn request(
    method: &str,
    url: &str,
    authorization: Option<&str>,
    body: Option<&str>,
) -> (u16, Option<String>, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(WAIT))
        .build()
        .into();
    let mut builder = ureq::http::Request::builder().method(method).uri(url);
    if let Some(value) = authorization {
        builder = builder.header("authorization", value);
    }
    let result = match body {
        Some(body) => agent.run(
            builder
                .header("content-type", "application/json")
                .body(body.to_string())
                .unwrap(),
        ),
        None => agent.run(builder.body(()).unwrap()),
    };
    let mut response = result.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let text = response.body_mut().read_to_string().unwrap();
    (response.status().as_u16(), challenge, text)
}

fn basic(principal: &str, secret: &str) -> String {
    let pair = format!("{principal}:{secret}");
    format!(
        "Basic {}",
        ringmaster::security::base64_encode(pair.as_bytes(), ringmaster::security::STANDARD, true)
    )
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

const SPEC: &str = "name: web\ntype: service\ncount: 1\ntask:\n  command: \"sleep 600\"\n  resources: \"cpus:0.1;mem:16\"\n";

struct Cluster {
    _dir: tempfile::TempDir,
    _master: processes::Proc,
    http: String,
    secrets: std::path::PathBuf,
}

fn start() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    for (name, secret) in [
        ("ops", "ops-secret"),
        ("eyes", "eyes-secret"),
        ("spark", "spark-secret"),
    ] {
        let file = dir.path().join(name);
        std::fs::write(&file, format!("{secret}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "auth:\n  required: true\n  principals:\n    \
         ops: { secret_file: ops, roles: [operator] }\n    \
         eyes: { secret_file: eyes, roles: [viewer] }\n    \
         spark: { secret_file: spark, roles: [framework], users: ['*'] }\n\
         http:\n  anonymous: [metrics]\n",
    )
    .unwrap();
    let (master, _addr, logs) = start_master(&config);
    let http = http_address(&logs);
    // The jobs framework starts after the HTTP server: `/jobs` answers once it subscribed.
    let mut seen = Vec::new();
    wait_line(&logs, &mut seen, "the jobs framework subscribed", |s| {
        s.iter().any(|l| l.contains("jobs framework subscribed"))
    });
    // Keep reading the log so the master never blocks on a full pipe.
    std::thread::spawn(move || for _ in logs {});
    Cluster {
        secrets: dir.path().to_path_buf(),
        _dir: dir,
        _master: master,
        http,
    }
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[test]
fn every_write_route_needs_an_operator_and_refusals_change_nothing() {
    let cluster = start();
    let url = format!("http://{}", cluster.http);
    let ops = basic("ops", "ops-secret");
    let eyes = basic("eyes", "eyes-secret");
    let spark = basic("spark", "spark-secret");
    let wrong = basic("ops", "not-the-secret");
    let expired = format!(
        "Bearer {}",
        ringmaster::security::http_token("ops", b"ops-secret", now() - 5)
    );

    // Open to everyone: /health always, /metrics by http.anonymous.
    assert_eq!(request("GET", &format!("{url}/health"), None, None).0, 200);
    assert_eq!(request("GET", &format!("{url}/metrics"), None, None).0, 200);
    // Reads need a principal: 401 with a Basic challenge and a JSON reason.
    let (status, challenge, body) = request("GET", &format!("{url}/state"), None, None);
    assert_eq!(status, 401, "{body}");
    assert_eq!(challenge.as_deref(), Some("Basic realm=\"ringmaster\""));
    let json: serde_json::Value = serde_json::from_str(&body).expect("a JSON refusal");
    assert!(json["error"]
        .as_str()
        .unwrap()
        .contains("authentication required"));
    let (status, _, page) = request("GET", &format!("{url}/"), None, None);
    assert_eq!(status, 401);
    assert!(
        page.contains("<html") || page.contains("<!doctype"),
        "{page}"
    );
    assert_eq!(
        request("GET", &format!("{url}/state"), Some(&eyes), None).0,
        200
    );
    assert_eq!(request("GET", &format!("{url}/"), Some(&eyes), None).0, 200);
    assert_eq!(
        request("GET", &format!("{url}/state"), Some(&spark), None).0,
        403
    );
    assert_eq!(
        request("GET", &format!("{url}/state"), Some(&wrong), None).0,
        401
    );

    let spec = ringmaster::jobs::spec::parse_job_spec(SPEC, "web.yaml").unwrap();
    let spec = serde_json::to_string(&spec).unwrap();
    let writes: [(&str, &str, Option<&str>); 5] = [
        ("POST", "/jobs", Some(spec.as_str())),
        ("POST", "/jobs/web/stop?purge=true", None),
        ("POST", "/jobs/web/scale", Some(r#"{"count": 3}"#)),
        (
            "POST",
            "/cluster/members",
            Some(r#"{"id": 4, "address": "127.0.0.1:9"}"#),
        ),
        ("DELETE", "/cluster/members/1", None),
    ];
    for (method, path, body) in writes {
        let at = format!("{url}{path}");
        let (status, challenge, text) = request(method, &at, None, body);
        assert_eq!(status, 401, "{method} {path} without credentials: {text}");
        assert!(challenge.is_some(), "{method} {path}");
        for (who, header) in [("wrong secret", &wrong), ("expired token", &expired)] {
            let (status, _, text) = request(method, &at, Some(header), body);
            assert_eq!(status, 401, "{method} {path} with a {who}: {text}");
        }
        for (who, header) in [("viewer", &eyes), ("framework", &spark)] {
            let (status, _, text) = request(method, &at, Some(header), body);
            assert_eq!(status, 403, "{method} {path} as {who}: {text}");
            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(
                json["error"].as_str().unwrap().contains("operator"),
                "{text}"
            );
        }
    }
    // Nothing changed: no job, and the operator sees that.
    let (status, _, jobs) = request("GET", &format!("{url}/jobs"), Some(&ops), None);
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&jobs).unwrap(),
        serde_json::json!([])
    );

    // The operator writes.
    let (status, _, text) = request("POST", &format!("{url}/jobs"), Some(&ops), Some(&spec));
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        request("GET", &format!("{url}/jobs/web"), Some(&eyes), None).0,
        200
    );
    // Logs are the operator's: a viewer may not read them.
    assert_eq!(
        request("GET", &format!("{url}/jobs/web/logs"), Some(&eyes), None).0,
        403
    );

    // `ringmaster token` makes a bearer token the master takes.
    let out = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .args([
            "token",
            "--principal",
            "ops",
            "--ttl",
            "10m",
            "--secret-file",
        ])
        .arg(cluster.secrets.join("ops"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(token.starts_with("v1.ops."), "{token}");
    let bearer = format!("Bearer {token}");
    let (status, _, text) = request(
        "POST",
        &format!("{url}/jobs/web/scale"),
        Some(&bearer),
        Some(r#"{"count": 2}"#),
    );
    assert_eq!(status, 200, "{text}");
    // A token of the viewer is held to the viewer's role.
    let viewer_token = format!(
        "Bearer {}",
        ringmaster::security::http_token("eyes", b"eyes-secret", now() + 60)
    );
    let (status, _, _) = request(
        "POST",
        &format!("{url}/jobs/web/stop"),
        Some(&viewer_token),
        None,
    );
    assert_eq!(status, 403);
    let (_, _, jobs) = request("GET", &format!("{url}/jobs/web"), Some(&bearer), None);
    let job: serde_json::Value = serde_json::from_str(&jobs).unwrap();
    assert_eq!(job["spec"]["count"], 2, "{job:#}");
    assert_eq!(job["stopped"], false, "{job:#}");

    // Every refusal was counted, by reason.
    let (_, _, text) = request("GET", &format!("{url}/metrics"), None, None);
    for reason in ["missing", "bad_credentials", "expired", "forbidden"] {
        let series = format!("ringmaster_http_auth_failures_total{{reason=\"{reason}\"}}");
        assert!(metric(&text, &series) >= 1.0, "{series}");
    }
}

/// Runs `ringmaster ARGS` with `env`: (exit code, stdout, stderr).
fn ringmaster(args: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringmaster"));
    command
        .args(args)
        .env_remove("RINGMASTER_PRINCIPAL")
        .env_remove("RINGMASTER_SECRET_FILE");
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_clis_authenticate_with_principal_and_secret_file() {
    let cluster = start();
    let spec_file = cluster.secrets.join("web.yaml");
    std::fs::write(&spec_file, SPEC).unwrap();
    let spec_file = spec_file.to_str().unwrap();
    let ops_file = cluster.secrets.join("ops");
    let eyes_file = cluster.secrets.join("eyes");
    let ops = ops_file.to_str().unwrap();
    let eyes = eyes_file.to_str().unwrap();
    let http = cluster.http.as_str();

    // Without credentials: refused, and the CLI says so.
    let (code, _, err) = ringmaster(&["job", "run", spec_file, "--master", http], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("401"), "{err}");
    let (code, _, err) = ringmaster(&["status", "--master", http], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("401") && err.contains("--principal"), "{err}");
    // A viewer may look but not run a job.
    let (code, _, err) = ringmaster(
        &[
            "job",
            "run",
            spec_file,
            "--master",
            http,
            "--principal",
            "eyes",
            "--secret-file",
            eyes,
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("403"), "{err}");
    // The operator runs it; flags or environment.
    let (code, out, err) = ringmaster(
        &[
            "job",
            "run",
            spec_file,
            "--master",
            http,
            "--principal",
            "ops",
            "--secret-file",
            ops,
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let env = [
        ("RINGMASTER_PRINCIPAL", Path::new("eyes")),
        ("RINGMASTER_SECRET_FILE", eyes_file.as_path()),
    ];
    let (code, out, err) = ringmaster(&["job", "status", "web", "--json", "--master", http], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"web\""), "{out}");
    let (code, out, err) = ringmaster(&["status", "--json", "--master", http], &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.trim_start().starts_with('{') || out.trim_start().starts_with('['),
        "{out}"
    );
    // `cluster members` gets through authentication to the handler (this master is single).
    let (code, _, err) = ringmaster(&["cluster", "members", "--master", http], &env);
    assert_ne!(code, 0);
    assert!(err.contains("not in a replication group"), "{err}");
    let (code, _, err) = ringmaster(&["cluster", "members", "--master", http], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("401"), "{err}");
    // A bad secret file is bad input (exit 2), naming the flag.
    let (code, _, err) = ringmaster(
        &[
            "job",
            "status",
            "--master",
            http,
            "--principal",
            "ops",
            "--secret-file",
            "/nonexistent/s",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--secret-file"), "{err}");
}
