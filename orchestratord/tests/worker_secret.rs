//! FC-WRK-1 (issue 37): a worker reads its secret from a file (`--secret-file` or
//! `ORCHD_WORKER_SECRET_FILE`), like API keys; a secret the server refuses is said once in
//! words, then the worker backs off instead of hammering the server. Real server and worker
//! processes over loopback WebSockets.

mod support;

use std::time::Duration;

use support::procs::{eventually, scratch, server, spawn_env};

const SECRET: &str = "the-right-worker-secret-0123";

fn worker_args(base: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "worker",
        "--server",
        base,
        "--name",
        "filed",
        "--backend-url",
        "http://127.0.0.1:9",
        "--models",
        "m1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

async fn auth_failures(base: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    support::counter(&text, "orchd_worker_auth_failures_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_comes_from_a_file_and_a_refusal_is_said_once() {
    let (_s, base) = server(&format!("pools = []\n[workers]\nsecret = \"{SECRET}\"\n")).await;
    let dir = scratch("worker-secret");
    let wrong = dir.join("wrong.txt");
    std::fs::write(&wrong, "\n  not-the-secret-at-all  \n").unwrap();
    let w = spawn_env(
        "worker-wrong",
        &worker_args(&base, &["--secret-file", &wrong.display().to_string()]),
        "",
        &[],
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            w.log_text()
                .contains("the server refused the worker secret")
        })
        .await,
        "{}",
        w.log_text()
    );
    // then it backs off: no second try, nor a second line, in the next seconds
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = w.log_text();
    assert_eq!(
        log.matches("the server refused the worker secret").count(),
        1,
        "{log}"
    );
    assert_eq!(auth_failures(&base).await, 1.0);
    drop(w);

    let right = dir.join("right.txt");
    std::fs::write(&right, format!("{SECRET}\n")).unwrap();
    let w = spawn_env(
        "worker-right",
        &worker_args(&base, &[]),
        "",
        &[("ORCHD_WORKER_SECRET_FILE", &right.display().to_string())],
    );
    let registered = eventually(Duration::from_secs(20), || async {
        let v: serde_json::Value = reqwest::get(format!("{base}/v1/workers"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["workers"]
            .as_array()
            .is_some_and(|a| a.iter().any(|w| w["worker_name"] == "filed"))
    })
    .await;
    assert!(registered, "{}", w.log_text());
}
