//! SEC-LOG-1, SEC-BIND-1, SEC-SHUT-1: the real binary on loopback with the real model — keys
//! never reach its log, a public bind without keys is refused before listening, shutdown
//! ends within the grace period plus a margin even with a reader that never reads, and a
//! second interrupt exits at once.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::default_model_path;
use support::procs::{server_env, spawn_env};

const DATA_KEY: &str = "k-data-7f3a9c1e5b2d4680aa";
const ADMIN_KEY: &str = "k-admin-0d9e8c7b6a5f4e3d21";
const WRONG_KEY: &str = "k-wrong-1122334455667788";

fn model_config(extra: &str) -> String {
    format!(
        "{extra}\n[[pools]]\nid = \"p1\"\nmodel = \"{}\"\nslots = 2\nctx = 1024\nthreads = 1\n",
        default_model_path()
    )
}

/// SEC-LOG-1: requests with good, wrong and admin keys, at debug log level: no key, in any
/// form, reaches the log or `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_never_reach_the_log() {
    let keys = format!("alice:data:{DATA_KEY},ops:admin:{ADMIN_KEY}");
    let (p, base) = server_env(
        &model_config(""),
        &[("ORCHD_API_KEYS", &keys), ("RUST_LOG", "debug")],
    )
    .await;
    let c = reqwest::Client::new();
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    let drain = json!({"deadline_ms": 0});
    // (path, body, header, key, expected status)
    let calls = [
        (
            "/v1/chat/completions",
            Some(&chat),
            "authorization",
            DATA_KEY,
            200,
        ),
        (
            "/v1/chat/completions",
            Some(&chat),
            "authorization",
            WRONG_KEY,
            401,
        ),
        (
            "/v1/pools/p1/drain",
            Some(&drain),
            "x-api-key",
            DATA_KEY,
            403,
        ),
        ("/v1/pools", None, "authorization", ADMIN_KEY, 200),
    ];
    for (path, body, header, key, expected) in calls {
        let value = if header == "authorization" {
            format!("Bearer {key}")
        } else {
            key.to_string()
        };
        let r = match body {
            Some(b) => c.post(format!("{base}{path}")).json(b),
            None => c.get(format!("{base}{path}")),
        };
        let r = r.header(header, value).send().await.unwrap();
        assert_eq!(r.status(), expected, "{path}");
    }
    let metrics = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    p.signal("-TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = p.log_text();
    assert!(log.contains("listening"), "the log was written: {log}");
    for k in [DATA_KEY, ADMIN_KEY, WRONG_KEY] {
        assert!(!log.contains(k), "a key is in the log");
        assert!(!metrics.contains(k), "a key is in /metrics");
        // nor a telling part of one
        assert!(!log.contains(&k[2..14]), "part of a key is in the log");
    }
}

/// SEC-BIND-1: the binary asked to listen on every address with no key exits at once,
/// saying why and what to do, and never listens.
#[test]
fn a_public_bind_without_keys_does_not_start() {
    let port = support::procs::free_port();
    let mut p = spawn_env(
        "public-bind",
        &["--bind".into(), format!("0.0.0.0:{port}")],
        &model_config(""),
        &[],
    );
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = p.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "still running: {}", p.log_text());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let log = p.log_text();
    assert!(
        log.contains("refusing to listen") && log.contains("--insecure-no-auth"),
        "{log}"
    );
    assert!(!log.contains("listening"), "{log}");
}

fn start_long_task(base: &str) -> String {
    // a count goes on and on: the task is still running seconds later
    let body = json!({"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 900,
                      "task_id": "long"});
    let out = std::process::Command::new("curl")
        .args(["-s", "-X", "POST", &format!("{base}/v1/tasks")])
        .args([
            "-H",
            "content-type: application/json",
            "-d",
            &body.to_string(),
        ])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v["task_id"].as_str().unwrap_or("long").to_string()
}

/// SEC-SHUT-1: with a stream reader that never reads, shutdown still ends within the grace
/// period plus the margin; and a second interrupt ends a long grace period at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_bounded_and_a_second_interrupt_is_immediate() {
    use tokio::io::AsyncWriteExt;
    // grace 500 ms: a reader that never reads does not hold the process
    let (mut p, base) = server_env(&model_config("shutdown_grace_ms = 500"), &[]).await;
    let id = start_long_task(&base);
    let addr = base.trim_start_matches("http://").to_string();
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    idle.write_all(
        format!("GET /v1/tasks/{id}/stream HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    p.signal("-INT");
    let exited = wait_exit(&mut p, Duration::from_secs(8));
    let took = t0.elapsed();
    assert!(exited.is_some(), "still running {took:?} after SIGINT");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    drop(idle);
    // grace 60 s: the first interrupt waits for the task, the second exits now
    let (mut p, base) = server_env(&model_config("shutdown_grace_ms = 60000"), &[]).await;
    start_long_task(&base);
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.signal("-INT");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "the first interrupt waits"
    );
    let t0 = Instant::now();
    p.signal("-INT");
    let status = wait_exit(&mut p, Duration::from_secs(5)).expect("exited");
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(status.code(), Some(130));
    let log = p.log_text();
    assert!(log.contains("second interrupt"), "{log}");
}

fn wait_exit(p: &mut support::procs::Proc, limit: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Some(s) = p.child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}
