//! SEC-*: API keys and scopes on every route (enumerated from the OpenAPI document, so a new
//! route cannot be missed), each adapter's error shape, tenant isolation, the failed-attempt
//! limit, request hygiene (415, foreign origins, CORS), allowed model paths, reloads that
//! outlive their client — over real sockets, with the scripted engine.

mod support;

use std::sync::Arc;
use std::time::Duration;

use orchestratord::config::Config;
use pool_manager::{Engine, EngineFactory, PoolSpec, PortError};
use serde_json::{json, Value};
use support::*;

const ALICE: &str = "alice-data-key-0123456789";
const BOB: &str = "bob-data-key-0123456789abc";
const OPS: &str = "ops-admin-key-0123456789ab";

fn keyed(mut cfg: Config) -> Config {
    cfg.auth.keys = vec![
        format!("alice:data:{ALICE}"),
        format!("bob:data:{BOB}"),
        format!("ops:admin:{OPS}"),
    ];
    cfg
}

async fn keyed_server() -> TestServer {
    let mut cfg = keyed(config(vec![pool("p1", 2)]));
    // the route walk fails on purpose, many times a minute
    cfg.auth.max_failures_per_minute = 10_000;
    start(cfg, Duration::from_millis(5)).await
}

fn req(
    s: &TestServer,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> reqwest::RequestBuilder {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut r = s.client.request(m, s.url(path));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    if let Some(b) = body {
        r = r.json(b);
    }
    r
}

/// The JSON body of a GET with `key`.
async fn get_as(s: &TestServer, path: &str, key: &str) -> Value {
    let r = req(s, "GET", path, Some(key), None).send().await.unwrap();
    r.json().await.unwrap()
}

/// The error code of either body shape.
fn code_of(v: &Value) -> String {
    v["error"]["code"]
        .as_str()
        .or(v["code"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Every operation of the served OpenAPI document, with its path parameters filled in.
async fn operations(s: &TestServer) -> Vec<(String, String, bool, bool)> {
    let doc: Value = s.get_json("/openapi.json").await;
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "delete", "put"] {
            let Some(op) = item.get(method) else { continue };
            let secured = op.get("security").is_some();
            let admin = op["responses"]["403"]["description"]
                .as_str()
                .is_some_and(|d| d.contains("needs admin"));
            let concrete = path
                .split('/')
                .map(|seg| if seg.starts_with('{') { "x" } else { seg })
                .collect::<Vec<_>>()
                .join("/");
            out.push((method.to_uppercase(), concrete, secured, admin));
        }
    }
    out
}

/// SEC-AUTH-1, SEC-AUTH-2: every route but health, readiness, metrics and the API document
/// answers 401 (with `WWW-Authenticate: Bearer`) without a key or with a wrong one, in its
/// adapter's shape; data keys get 403 on admin routes; the document declares all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_the_right_key() {
    let s = keyed_server().await;
    let ops = operations(&s).await;
    assert!(ops.len() >= 20, "{ops:?}");
    let body = json!({});
    let mut checked_admin = 0;
    for (method, path, secured, admin) in &ops {
        let open =
            ["/health", "/v1/health", "/status", "/livez", "/readyz"].contains(&path.as_str());
        assert_eq!(*secured, !open, "{method} {path}: declared security");
        let b = (method != "GET" && method != "DELETE").then_some(&body);
        let r = req(&s, method, path, None, b).send().await.unwrap();
        if open {
            assert_ne!(r.status(), 401, "{method} {path}");
            continue;
        }
        assert_eq!(r.status(), 401, "{method} {path} without a key");
        let challenge = r.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(challenge.starts_with("Bearer"), "{challenge}");
        let openai_shaped = path.starts_with("/v1/chat")
            || path.starts_with("/v1/completions")
            || path == "/v1/responses"
            || path.starts_with("/v1/models")
            || path == "/tokenize"
            || path == "/detokenize"
            || [
                "/completion",
                "/props",
                "/slots",
                "/v1/embeddings",
                "/embeddings",
                "/embedding",
                "/rerank",
                "/v1/rerank",
                "/reranking",
                "/v1/reranking",
            ]
            .contains(&path.as_str())
            || path.starts_with("/chat/")
            || path.starts_with("/engines");
        let v: Value = r.json().await.unwrap();
        if path.starts_with("/v1/messages") {
            // Anthropic's shape
            assert_eq!(v["type"], "error", "{path}: {v}");
            assert_eq!(v["error"]["type"], "authentication_error", "{path}: {v}");
        } else if path.starts_with("/api/") {
            // Ollama's shape: the message as a string
            assert!(
                v["error"].as_str().unwrap().contains("API key"),
                "{path}: {v}"
            );
        } else if openai_shaped {
            assert_eq!(v["error"]["code"], "UNAUTHORIZED", "{path}: {v}");
        } else {
            assert_eq!(v["code"], "UNAUTHORIZED", "{path}: {v}");
        }
        let r = req(&s, method, path, Some("not-a-key"), b)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{method} {path} with a wrong key");
        assert!(r.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .contains("invalid_token"));
        let r = req(&s, method, path, Some(ALICE), b).send().await.unwrap();
        if *admin {
            checked_admin += 1;
            assert_eq!(r.status(), 403, "{method} {path} with a data key");
            let v: Value = r.json().await.unwrap();
            if path.starts_with("/api/") {
                // Ollama's shape: a message, no code
                assert!(
                    v["error"].as_str().is_some_and(|e| e.contains("admin key")),
                    "{path}: {v}"
                );
            } else {
                assert_eq!(code_of(&v), "FORBIDDEN", "{path}: {v}");
            }
            let r = req(&s, method, path, Some(OPS), b).send().await.unwrap();
            assert!(
                r.status() != 401 && r.status() != 403,
                "{method} {path} with an admin key: {}",
                r.status()
            );
        } else {
            assert!(
                r.status() != 401 && r.status() != 403,
                "{method} {path} with a data key: {}",
                r.status()
            );
        }
    }
    assert!(checked_admin >= 8, "admin routes checked: {checked_admin}");
    // the same key in x-api-key; metrics and health without one; unknown routes 401 first
    let r = s
        .client
        .get(s.url("/v1/models"))
        .header("x-api-key", ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for open in ["/metrics", "/health", "/openapi.json"] {
        let r = s.client.get(s.url(open)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{open}");
    }
    let r = s.client.get(s.url("/no/such/route")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // prompt-cache series would tell a tenant what others sent: admin keys only (SEC-TEN-1)
    for (key, shown) in [(None, false), (Some(ALICE), false), (Some(OPS), true)] {
        let text = req(&s, "GET", "/metrics", key, None)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(text.contains("orchd_tasks_enqueued_total"));
        assert_eq!(text.contains("orchd_pool_prompt_"), shown, "{key:?}");
    }
    let doc: Value = s.get_json("/openapi.json").await;
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
}

/// SEC-TEN-1: a task, its stream, cancel, status and artifact, and a session, are visible
/// only to the tenant that made them (404 for others, as if they did not exist); the same
/// client-chosen ids are separate per tenant; admin keys see all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_see_only_their_own_tasks() {
    let s = keyed_server().await;
    let submit = |key: &'static str, text: &'static str| {
        req(
            &s,
            "POST",
            "/v1/tasks",
            Some(key),
            Some(
                &json!({"task_id": "job-1", "prompt": text, "max_tokens": 40, "session_id": "s1"}),
            ),
        )
        .send()
    };
    let r = submit(ALICE, "alice's secret prompt").await.unwrap();
    assert_eq!(r.status(), 202);
    for path in [
        "/v1/tasks/job-1",
        "/v1/tasks/job-1/stream",
        "/v1/artifacts/job-1",
        "/v1/sessions/s1",
    ] {
        let r = req(&s, "GET", path, Some(BOB), None).send().await.unwrap();
        assert_eq!(r.status(), 404, "bob reads {path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], "NOT_FOUND");
        let r = req(&s, "GET", path, Some(OPS), None).send().await.unwrap();
        assert_eq!(r.status(), 200, "admin reads {path}");
        if path == "/v1/tasks/job-1/stream" {
            drop(r);
        }
    }
    let r = req(&s, "POST", "/v1/tasks/job-1/cancel", Some(BOB), None)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "bob cannot cancel alice's task");
    // bob's own job-1 and s1 are his, not alice's
    let r = submit(BOB, "bob's prompt").await.unwrap();
    assert_eq!(r.status(), 202);
    let r = req(&s, "GET", "/v1/tasks/job-1/stream", Some(ALICE), None)
        .send()
        .await
        .unwrap();
    let ev = read_events(r).await;
    assert_eq!(
        ev.last().unwrap().0.event,
        "end",
        "alice's task ran to its end"
    );
    let a = get_as(&s, "/v1/artifacts/job-1", ALICE).await;
    let b = get_as(&s, "/v1/artifacts/job-1", BOB).await;
    assert_ne!(
        a["correlation_id"], b["correlation_id"],
        "two tasks: {a} {b}"
    );
    let sa = get_as(&s, "/v1/sessions/s1", ALICE).await;
    assert_eq!(
        sa["turns"], 1,
        "bob's task did not count in alice's session: {sa}"
    );
}

/// SEC-AUTH-3: failed attempts are counted by reason; a client repeating a wrong key past the
/// limit is answered 429 `AUTH_RATE_LIMITED` with a Retry-After — but valid keys from the same
/// address are never refused (issue 32: 25 wrong keys from one address made the right data
/// key and the admin key 429 too), and missing keys and data keys on admin routes count
/// against nobody. Behind a trusted proxy the forwarded client is who failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_are_counted_and_limited() {
    let mut cfg = keyed(config(vec![pool("p1", 1)]));
    cfg.auth.max_failures_per_minute = 3;
    cfg.http.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    let s = start(cfg, Duration::from_millis(1)).await;
    let get = |key: Option<&'static str>, path: &'static str, client: &'static str| {
        let r = req(&s, "GET", path, key, None).header("x-forwarded-for", client);
        async move { r.send().await.unwrap() }
    };
    for _ in 0..25 {
        let r = get(Some("wrong-key-from-a"), "/v1/models", "192.0.2.1").await;
        assert!(r.status() == 401 || r.status() == 429);
    }
    let r = get(Some("wrong-key-from-a"), "/v1/models", "192.0.2.1").await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "AUTH_RATE_LIMITED");
    // the same client's valid keys, data and admin, are served
    assert_eq!(
        get(Some(ALICE), "/v1/models", "192.0.2.1").await.status(),
        200
    );
    assert_eq!(get(Some(OPS), "/v1/pools", "192.0.2.1").await.status(), 200);
    // another client behind the same proxy is not limited by the first one's failures
    let r = get(Some("wrong-key-from-a"), "/v1/models", "192.0.2.2").await;
    assert_eq!(r.status(), 401);
    // neither a missing key nor a data key on an admin route counts as a failed guess
    for _ in 0..10 {
        assert_eq!(get(None, "/v1/models", "192.0.2.3").await.status(), 401);
        assert_eq!(get(Some(BOB), "/v1/pools", "192.0.2.3").await.status(), 403);
    }
    assert_eq!(
        get(Some(BOB), "/v1/models", "192.0.2.3").await.status(),
        200
    );
    let m = s.metrics().await;
    assert!(counter(&m, "orchd_auth_failures_total{reason=\"invalid\"}") >= 3.0);
    assert!(counter(&m, "orchd_auth_failures_total{reason=\"rate_limited\"}") >= 1.0);
    assert!(counter(&m, "orchd_auth_failures_total{reason=\"missing\"}") >= 10.0);
    assert!(!m.contains(ALICE));
}

/// SEC-WEB-1: a body not sent as JSON is 415 (a web page's "simple" text/plain POST never
/// runs), a write from a foreign Origin is 403, and CORS answers only configured origins —
/// with auth off on loopback, where these are the only guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_cannot_drive_the_server() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.http.cors_allowed_origins = vec!["https://ui.example".into()];
    let s = start(cfg, Duration::from_millis(1)).await;
    let r = s
        .client
        .post(s.url("/v1/pools/p1/drain"))
        .header("content-type", "text/plain")
        .body(r#"{"deadline_ms":0}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "UNSUPPORTED_MEDIA_TYPE");
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .body(r#"{"messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415, "no content type");
    // issue 49: Ollama's routes take JSON however it is declared (its documented `curl -d`
    // sends it form-encoded); a page's form still carries its Origin
    let ollama = json!({"model": "scripted-model", "stream": false,
                        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    for ct in [
        None,
        Some("application/x-www-form-urlencoded"),
        Some("text/plain"),
    ] {
        let mut r = s.client.post(s.url("/api/chat")).body(ollama.clone());
        if let Some(ct) = ct {
            r = r.header("content-type", ct);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 200, "{ct:?}");
    }
    let r = s
        .client
        .post(s.url("/api/chat"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", "https://evil.example")
        .body(ollama)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a page's form");
    let r = s
        .client
        .post(s.url("/v1/pools/p1/resume"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // FC-CON-1: the server's own page (the console) writes from its own origin; a name that
    // only points here (DNS rebinding: Origin and Host both the attacker's name) does not,
    // while auth is off
    let own = s.base.clone();
    let r = s
        .client
        .post(s.url("/v1/tasks"))
        .header("origin", own)
        .json(&json!({"prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "the console's own origin");
    let port = s.base.rsplit(':').next().unwrap().to_string();
    let r = s
        .client
        .post(s.url("/v1/pools/p1/resume"))
        .header("host", format!("rebind.example:{port}"))
        .header("origin", format!("http://rebind.example:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a rebound name is foreign");
    // an allowed origin: preflight answered, the write goes through
    let r = s
        .client
        .request(reqwest::Method::OPTIONS, s.url("/v1/tasks"))
        .header("origin", "https://ui.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type,x-correlation-id",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://ui.example"
    );
    let allowed = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(allowed.contains("authorization") && allowed.contains("x-correlation-id"));
    let r = s
        .client
        .post(s.url("/v1/tasks"))
        .header("origin", "https://ui.example")
        .json(&json!({"prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let r = s
        .client
        .request(reqwest::Method::OPTIONS, s.url("/v1/tasks"))
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));
}

/// SEC-BIND-1: without keys a non-loopback bind is refused, with a message that says what to
/// do; keys or the explicit insecure switch allow it.
#[test]
fn exposing_the_server_without_keys_is_refused() {
    let factory = || -> Arc<dyn EngineFactory> {
        Arc::new(ScriptedFactory {
            delay: Duration::ZERO,
            ctx: 256,
        })
    };
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.bind = "0.0.0.0:0".into();
    let err = orchestratord::server::build_state(cfg.clone(), factory())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("ORCHD_API_KEYS") && err.contains("--insecure-no-auth"),
        "{err}"
    );
    let mut insecure = cfg.clone();
    insecure.auth.insecure_no_auth = true;
    assert!(orchestratord::server::build_state(insecure, factory()).is_ok());
    assert!(orchestratord::server::build_state(keyed(cfg), factory()).is_ok());
}

/// SEC-MODEL-1: `POST /engines` loads only regular GGUF files inside the model directories;
/// `..`, a symlink out, a FIFO and a missing file get the same answer, a path outside the
/// folders (`/etc/passwd`) is told the allowed folders (FC-PATH-1), and an engine id may not
/// shadow a served model's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_load_only_allowed_model_files() {
    let s = start(config(vec![pool("p1", 1)]), Duration::from_millis(1)).await;
    let dir = procs_scratch("models");
    let outside = std::env::temp_dir()
        .parent()
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| "/".into());
    let link = dir.join("link.gguf");
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    let fifo = dir.join("fifo.gguf");
    let _ = std::process::Command::new("mkfifo").arg(&fifo).status();
    let mut bad = vec![
        format!("{}/../../etc/passwd", dir.display()),
        link.display().to_string(),
        dir.join("absent.gguf").display().to_string(),
    ];
    if fifo.exists() {
        bad.push(fifo.display().to_string());
    }
    for path in bad {
        let r = s
            .post("/engines", &json!({"engine_id": "e", "model_path": path}))
            .await;
        assert_eq!(r.status(), 403, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "FORBIDDEN", "{path}");
        assert_eq!(
            v["error"]["message"], "model_path: not an allowed model path",
            "{path}"
        );
    }
    // FC-PATH-1: outside the folders as written, the answer names them and the config key
    for path in [
        "/etc/passwd".to_string(),
        "/root/.ssh/id_rsa".to_string(),
        outside.join("x.gguf").display().to_string(),
    ] {
        let r = s
            .post("/engines", &json!({"engine_id": "e", "model_path": path}))
            .await;
        assert_eq!(r.status(), 403, "{path}");
        let v: Value = r.json().await.unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("model_path: not in a model folder: the allowed folders are ")
                && message.contains(&std::env::temp_dir().display().to_string())
                && message.ends_with("models.dirs in the config adds one"),
            "{path}: {message}"
        );
    }
    let text = dir.join("text.gguf");
    std::fs::write(&text, "not a model").unwrap();
    let v: Value = s
        .post("/engines", &json!({"engine_id": "e", "model_path": text}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["error"]["message"], "model_path: not a GGUF model");
    let ok = fake_gguf("allowed");
    let r = s
        .post(
            "/engines",
            &json!({"engine_id": "scripted-model", "model_path": ok}),
        )
        .await;
    assert_eq!(r.status(), 409, "shadows the pools' alias");
    let r = s
        .post("/engines", &json!({"engine_id": "e2", "model_path": ok}))
        .await;
    assert_eq!(r.status(), 201);
    let _ = std::fs::remove_dir_all(dir);
}

/// SEC-MODEL-1 (issue 49): one check for every way a file becomes a model — a link in the
/// model folder to a file outside every model folder is not listed and not loaded, and no
/// answer to a data key carries a path or a file's content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_out_of_the_model_folder_are_no_models() {
    let outside = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("orchd-outside-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outside);
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("x.gguf"), b"GGUF\x03\x00\x00\x00rest").unwrap();
    let folder = procs_scratch("folder");
    std::os::unix::fs::symlink(outside.join("x.gguf"), folder.join("outlink.gguf")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", folder.join("evil.gguf")).unwrap();
    std::fs::write(folder.join("inside.gguf"), b"GGUF\x03\x00\x00\x00rest").unwrap();
    let mut cfg = keyed(config(vec![pool("p1", 1)]));
    cfg.models.dirs = vec![folder.display().to_string()];
    cfg.models.on_demand = true;
    let s = start(cfg, Duration::from_millis(1)).await;
    let listed = get_as(&s, "/v1/models", ALICE).await;
    let names: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(
        !names.contains(&"outlink") && !names.contains(&"evil"),
        "{listed}"
    );
    for model in ["outlink", "evil", "inside"] {
        let body = json!({"model": model, "max_tokens": 4,
                          "messages": [{"role": "user", "content": "hi"}]});
        let r = req(&s, "POST", "/v1/chat/completions", Some(ALICE), Some(&body))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert!(status == 404 || status == 400, "{model}: {status} {body}");
        if model != "inside" {
            assert_eq!(status, 404, "{model}: {body}");
        }
        for leak in [
            folder.display().to_string(),
            outside.display().to_string(),
            "/etc".to_string(),
            "magic".to_string(),
            "root:".to_string(),
        ] {
            assert!(!body.contains(&leak), "{model}: {leak} in {body}");
        }
    }
    let _ = std::fs::remove_dir_all(folder);
    let _ = std::fs::remove_dir_all(outside);
}

/// SEC-HOST-1 (issue 49): without keys every caller is the local admin, so a `Host` that a web
/// page's DNS could point here (any name but loopback ones, the machine's own and
/// `http.allowed_hosts`) is refused on every route — reads included; IP literals, `localhost`
/// and allowed names are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_servers_answer_only_to_local_names() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.http.allowed_hosts = vec!["orchd.example".into()];
    let s = start(cfg, Duration::from_millis(1)).await;
    let port = s.base.rsplit(':').next().unwrap().to_string();
    let with_host = |path: &str, host: &str| {
        s.client
            .get(s.url(path))
            .header("host", host.to_string())
            .send()
    };
    for path in [
        "/v1/pools",
        "/v1/artifacts?limit=2",
        "/v1/tasks/x",
        "/metrics",
        "/v1/models",
        "/readyz",
    ] {
        for host in [
            format!("evil.example:{port}"),
            "evil.example".into(),
            format!("127.0.0.1.nip.io:{port}"),
        ] {
            let r = with_host(path, &host).await.unwrap();
            assert_eq!(r.status(), 403, "{path} {host}");
            let body = r.text().await.unwrap();
            assert!(body.contains("allowed_hosts"), "{path}: {body}");
        }
        for host in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
            "orchd.example".to_string(),
            format!("ORCHD.example:{port}"),
        ] {
            let r = with_host(path, &host).await.unwrap();
            assert_ne!(r.status(), 403, "{path} {host}");
        }
    }
    // a write too
    let r = s
        .client
        .post(s.url("/v1/tasks"))
        .header("host", "evil.example")
        .json(&json!({"prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
}

/// SEC-MET-1 (issue 49): with keys, `/metrics` (open to scrapes by default) names no tenant
/// and says nothing of what each was served, unless the scrape carries an admin key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_name_tenants_to_admins_only() {
    let s = keyed_server().await;
    let r = req(
        &s,
        "POST",
        "/v1/tasks",
        Some(ALICE),
        Some(&json!({"prompt": "hi", "max_tokens": 2})),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 202);
    let scrape = |key: Option<&'static str>| {
        let mut r = s.client.get(s.url("/metrics"));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        async move { r.send().await.unwrap().text().await.unwrap() }
    };
    for key in [None, Some(ALICE)] {
        let text = scrape(key).await;
        assert!(text.contains("orchd_tasks_enqueued_total"), "{text}");
        assert!(!text.contains("orchd_tenant_"), "{key:?}: {text}");
        assert!(!text.contains("alice") && !text.contains("bob"), "{key:?}");
    }
    let text = scrape(Some(OPS)).await;
    assert!(text.contains("orchd_tenant_tokens_total"), "{text}");
    assert!(text.contains("tenant=\"alice\""), "{text}");
}

fn procs_scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("orchd-sec-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Loads like the scripted factory, after a pause (a big model).
struct SlowFactory(ScriptedFactory, Duration);

impl EngineFactory for SlowFactory {
    fn load(&self, spec: &PoolSpec, model_ref: &str) -> Result<Arc<dyn Engine>, PortError> {
        std::thread::sleep(self.1);
        self.0.load(spec, model_ref)
    }
}

/// SEC-JOB-1: a reload whose client goes away at once still finishes (the job belongs to the
/// server): the pool serves the new model and takes the next drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_outlives_its_client() {
    let factory = SlowFactory(
        ScriptedFactory {
            delay: Duration::from_millis(1),
            ctx: 256,
        },
        Duration::from_millis(600),
    );
    let s = start_with(config(vec![pool("p1", 1)]), Arc::new(factory)).await;
    let v2 = fake_gguf("reload-v2");
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let r = quick
        .post(s.url("/v1/pools/p1/reload"))
        .json(&json!({"new_model_ref": v2}))
        .send()
        .await;
    assert!(r.is_err(), "the client gave up before the load ended");
    let done = support::procs::eventually(Duration::from_secs(10), || async {
        let h: Value = s.get_json("/v1/pools/p1/health").await;
        h["state"] == "ready" && h["model_ref"] == v2.display().to_string()
    })
    .await;
    assert!(done, "the reload finished without its client");
    let r = s
        .post("/v1/pools/p1/drain", &json!({"deadline_ms": 100}))
        .await;
    assert_eq!(r.status(), 202, "not stuck in reloading");
}
