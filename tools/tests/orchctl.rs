//! OPS-CTL-1..OPS-CTL-5: the real `orchctl` binary against a real server process on the real model —
//! drain --wait under load returns when drained (and exits 3 when the deadline cut tasks off),
//! reload --wait to a bad file exits 2 with the server's reason, the documented exit codes,
//! the key from a file or the environment (never printed), and the task commands.

// the server crate's test support: real server processes, the default model
#[path = "../../orchestratord/tests/support/mod.rs"]
mod support;

use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::default_model_path;
use support::procs::{scratch, server_env};

const DATA_KEY: &str = "k-ctl-data-5e4d3c2b1a09";
const ADMIN_KEY: &str = "k-ctl-admin-9f8e7d6c5b4a";

/// A server of one real-model pool `p1` (`slots` slots) whose model dirs include `dir`.
async fn server(dir: &std::path::Path, slots: usize) -> (support::procs::Proc, String) {
    let cfg = format!(
        "[models]\ndirs = [\"{}\"]\n[[pools]]\nid = \"p1\"\nmodel = \"{}\"\nslots = {slots}\nctx = 1024\nthreads = 1\n",
        dir.display(),
        default_model_path()
    );
    let keys = format!("t:data:{DATA_KEY},ops:admin:{ADMIN_KEY}");
    server_env(&cfg, &[("ORCHD_API_KEYS", &keys)]).await
}

/// Runs orchctl with `args` against `base`, the admin key in `ORCHD_API_KEY` (or `key`).
async fn ctl(base: &str, key: Option<&str>, args: &[&str]) -> Output {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchctl"));
    c.args(args)
        .env("ORCHD_URL", base)
        .env_remove("ORCHD_API_KEY")
        .kill_on_drop(true);
    if let Some(k) = key {
        c.env("ORCHD_API_KEY", k);
    }
    c.output().await.expect("orchctl runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What a `--json` command printed.
fn stdout_json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o.stdout)))
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// Submits a task of `max_tokens` over the task API with the data key; returns its id.
async fn submit(base: &str, max_tokens: u32) -> String {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/tasks"))
        .bearer_auth(DATA_KEY)
        .json(&json!({"prompt": "Count from one to five hundred:", "max_tokens": max_tokens}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    r.json::<Value>().await.unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn task_state(base: &str, id: &str) -> String {
    let v: Value = reqwest::Client::new()
        .get(format!("{base}/v1/tasks/{id}"))
        .bearer_auth(DATA_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["state"].as_str().unwrap_or("").to_string()
}

async fn wait_running(base: &str, ids: &[String]) {
    for _ in 0..200 {
        let mut all = true;
        for id in ids {
            all &= task_state(base, id).await == "running";
        }
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("tasks did not start");
}

/// OPS-CTL-1: `drain --wait` under load returns once the pool is drained, the running tasks having
/// finished by themselves (exit 0, line-oriented progress on a pipe); with a deadline shorter
/// than the tasks it exits 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_wait_returns_when_drained_and_says_when_the_deadline_cut_tasks() {
    let dir = scratch("ctl-drain");
    let (_p, base) = server(&dir, 2).await;
    let ids = [submit(&base, 48).await, submit(&base, 48).await];
    wait_running(&base, &ids).await;
    let t0 = Instant::now();
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["drain", "p1", "--deadline", "120s", "--wait"],
    )
    .await;
    let took = t0.elapsed();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(code(&out), 0, "{stdout}\n{stderr}");
    // it waited for the tasks: both ended by themselves before it returned
    for id in &ids {
        assert_eq!(task_state(&base, id).await, "completed", "after {took:?}");
    }
    assert!(
        stdout.contains("pool p1 (local): drained (takes no new work)"),
        "{stdout}"
    );
    // piped: plain lines, a line per change, no terminal escapes
    assert!(
        stderr.contains("pool p1: draining, 2 slot(s) busy"),
        "{stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
    assert!(stderr.lines().count() <= 4, "one line per change: {stderr}");

    // resume, load it again, drain with a deadline the tasks cannot meet
    assert_eq!(
        code(&ctl(&base, Some(ADMIN_KEY), &["resume", "p1"]).await),
        0
    );
    let ids = [submit(&base, 400).await, submit(&base, 400).await];
    wait_running(&base, &ids).await;
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["--json", "drain", "p1", "--deadline", "300ms", "--wait"],
    )
    .await;
    assert_eq!(code(&out), 3, "{}", text(&out.stderr));
    let err: Value = serde_json::from_str(text(&out.stderr).trim()).expect("a JSON error");
    assert_eq!(err["error"], "deadline");
    assert_eq!(err["exit_code"], 3);
    for id in &ids {
        assert_eq!(task_state(&base, id).await, "failed");
    }
    let out = ctl(&base, Some(ADMIN_KEY), &["--json", "health", "p1"]).await;
    let h: Value = stdout_json(&out);
    assert_eq!(h["metrics"]["drain_cut_off"], 2, "{h}");
}

/// OPS-CTL-2: `reload --wait` to a file that is not a loadable model exits 2 with the server's
/// reason, and the old model keeps serving; a good reload exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_wait_to_a_bad_file_exits_2_with_the_reason() {
    let dir = scratch("ctl-reload");
    let bad = dir.join("broken.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00 not really a model").unwrap();
    let (_p, base) = server(&dir, 1).await;
    let bad = bad.canonicalize().unwrap();
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["reload", "p1", bad.to_str().unwrap(), "--wait"],
    )
    .await;
    let stderr = text(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(stderr.contains("refused (409 CONFLICT)"), "{stderr}");
    assert!(
        stderr.contains("rolled back"),
        "the server's reason: {stderr}"
    );
    let out = ctl(&base, Some(ADMIN_KEY), &["--json", "health", "p1"]).await;
    let h: Value = stdout_json(&out);
    assert_eq!(h["state"], "ready");
    assert_eq!(h["model_ref"], default_model_path());
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["reload", "p1", &default_model_path(), "--wait"],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("pool p1 serves"),
        "{}",
        text(&out.stdout)
    );
}

/// OPS-CTL-3: exit codes — 4 unreachable, 2 unknown pool / missing key / data key on the control
/// plane, 64 bad command line; the key from `--api-key-file` works and is never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_and_the_key() {
    let dir = scratch("ctl-codes");
    let (_p, base) = server(&dir, 1).await;
    let port = support::procs::free_port();
    let out = ctl(
        &format!("http://127.0.0.1:{port}"),
        Some(ADMIN_KEY),
        &["pools"],
    )
    .await;
    assert_eq!(code(&out), 4, "{}", text(&out.stderr));
    let out = ctl(&base, Some(ADMIN_KEY), &["health", "nope"]).await;
    assert_eq!(code(&out), 2);
    assert!(
        text(&out.stderr).contains("404 NOT_FOUND"),
        "{}",
        text(&out.stderr)
    );
    let out = ctl(&base, None, &["pools"]).await;
    assert_eq!(code(&out), 2);
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));
    let out = ctl(&base, Some(DATA_KEY), &["drain", "p1"]).await;
    assert_eq!(code(&out), 2);
    assert!(text(&out.stderr).contains("403"), "{}", text(&out.stderr));
    let out = ctl(&base, Some(ADMIN_KEY), &["drain"]).await;
    assert_eq!(code(&out), 64);
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["drain", "p1", "--deadline", "soon"],
    )
    .await;
    assert_eq!(code(&out), 64);

    let key_file = dir.join("key");
    std::fs::write(&key_file, format!("{ADMIN_KEY}\n")).unwrap();
    let out = ctl(
        &base,
        None,
        &["--api-key-file", key_file.to_str().unwrap(), "pools"],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.starts_with("POOL"), "{table}");
    assert!(table.contains("p1") && table.contains("ready"), "{table}");
    for o in [&out.stdout, &out.stderr] {
        assert!(!text(o).contains(ADMIN_KEY));
    }
    // a wrong key's refusal does not echo it either
    let out = ctl(&base, Some("k-wrong-000111222333"), &["pools"]).await;
    assert_eq!(code(&out), 2);
    assert!(!text(&out.stderr).contains("k-wrong-000111222333"));
}

/// OPS-CTL-4: `tasks submit --follow` prints the generated text (the same the task's record
/// holds), `tasks show` and `tasks cancel` work, and `metrics` counts the tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_commands_and_the_metrics_summary() {
    let dir = scratch("ctl-tasks");
    let (_p, base) = server(&dir, 1).await;
    let out = ctl(
        &base,
        Some(DATA_KEY),
        &[
            "tasks",
            "submit",
            "--system",
            "You are a poet.",
            "--prompt",
            "Write a haiku about the sea.",
            "--max-tokens",
            "12",
            "--seed",
            "7",
            "--top-p",
            "0.9",
            "--follow",
        ],
    )
    .await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(code(&out), 0, "{stderr}");
    let id = stderr
        .lines()
        .find_map(|l| l.strip_prefix("task "))
        .expect("the task id on stderr")
        .trim()
        .to_string();
    assert!(stderr.contains("end: length, 12 tokens"), "{stderr}");
    let out = ctl(&base, Some(DATA_KEY), &["--json", "tasks", "show", &id]).await;
    let s: Value = stdout_json(&out);
    let from_record: String = s["record"]["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "token")
        .map(|e| e["data"]["t"].as_str().unwrap().to_string())
        .collect();
    assert!(!from_record.is_empty());
    assert_eq!(stdout.trim_end_matches('\n'), from_record);
    // FC-CTL-1: a chat by default, with the system message, and the sampling flags
    let params = &s["record"]["params"];
    assert_eq!(params["messages"][0]["role"], "system", "{params}");
    assert_eq!(params["messages"][1]["role"], "user", "{params}");
    assert!(params["prompt"].is_null(), "{params}");
    assert_eq!(params["top_p"].as_f64().map(|p| p as f32), Some(0.9));

    // a long task, cancelled from the command line, ends `cancelled` in the stream
    let out = ctl(
        &base,
        Some(DATA_KEY),
        &[
            "tasks",
            "submit",
            "--raw",
            "--prompt",
            "Count to 500:",
            "--max-tokens",
            "500",
            "--stop",
            "zebra",
            "--stop",
            "giraffe",
        ],
    )
    .await;
    let id = text(&out.stdout).trim().to_string();
    wait_running(&base, std::slice::from_ref(&id)).await;
    assert_eq!(
        code(&ctl(&base, Some(DATA_KEY), &["tasks", "cancel", &id]).await),
        0
    );
    let out = ctl(&base, Some(DATA_KEY), &["--json", "tasks", "stream", &id]).await;
    assert_eq!(code(&out), 0);
    let last: Value = serde_json::from_str(text(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "end");
    assert_eq!(last["data"]["finish_reason"], "cancelled");
    let out = ctl(&base, Some(DATA_KEY), &["--json", "tasks", "show", &id]).await;
    let params = stdout_json(&out)["record"]["params"].clone();
    assert!(
        params["messages"].is_null() && params["prompt"].is_string(),
        "--raw: {params}"
    );
    assert_eq!(params["stop"], json!(["zebra", "giraffe"]));
    // FC-CTL-2: cancelling it again says it had ended, exit 2
    let out = ctl(&base, Some(DATA_KEY), &["tasks", "cancel", &id]).await;
    assert_eq!(code(&out), 2);
    assert!(
        text(&out.stderr).contains("had already ended (cancelled): nothing to cancel"),
        "{}",
        text(&out.stderr)
    );

    let out = ctl(&base, Some(ADMIN_KEY), &["--json", "metrics"]).await;
    let m: Value = stdout_json(&out);
    assert_eq!(m["tasks_enqueued"], 2.0);
    assert_eq!(m["finished"]["length"], 1.0);
    assert_eq!(m["finished"]["cancelled"], 1.0);
    assert_eq!(m["slots"]["p1"]["total"], 1.0);
    assert!(m["ttft_seconds"]["p50"].as_f64().unwrap() > 0.0);
}

/// OPS-CTL-5 (`--all`, the Kubernetes preStop hook): every pool is drained at once; a pool
/// already drained is left out; the report names each pool's outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_all_drains_every_pool() {
    let model = default_model_path();
    let cfg = format!(
        "[[pools]]\nid = \"p1\"\nmodel = \"{model}\"\nslots = 1\nctx = 512\nthreads = 1\n\
         [[pools]]\nid = \"p2\"\nmodel = \"{model}\"\nslots = 1\nctx = 512\nthreads = 1\n"
    );
    let keys = format!("ops:admin:{ADMIN_KEY}");
    let (_p, base) = server_env(&cfg, &[("ORCHD_API_KEYS", &keys)]).await;
    for _ in 0..100 {
        let out = ctl(&base, Some(ADMIN_KEY), &["--json", "pools"]).await;
        let v: Value = stdout_json(&out);
        if v["pools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["state"] == "ready")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["--json", "drain", "--all", "--deadline", "10s", "--wait"],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let v: Value = stdout_json(&out);
    let outcomes: Vec<(String, String)> = v["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pool_id"].as_str().unwrap().into(),
                p["outcome"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![
            ("p1".into(), "drained".into()),
            ("p2".into(), "drained".into())
        ]
    );
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["--json", "drain", "--all", "--wait"],
    )
    .await;
    assert_eq!(code(&out), 0);
    let v: Value = stdout_json(&out);
    assert_eq!(v["pools"], json!([]));
    let ready = reqwest::get(format!("{base}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 503, "no pool takes work");
}

/// OPS-CTL-4: `engines add` loads a GGUF as an engine (a pool), `engines list` shows it,
/// `engines rm` drains and removes it; `workers` lists a connected remote worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_and_workers() {
    let model = default_model_path();
    let cfg = format!(
        "[workers]\nenabled = true\n[[pools]]\nid = \"p1\"\nmodel = \"{model}\"\nslots = 1\nctx = 512\nthreads = 1\n"
    );
    let keys = format!("ops:admin:{ADMIN_KEY}");
    let secret = "worker-secret-0123456789";
    let (_p, base) = server_env(
        &cfg,
        &[("ORCHD_API_KEYS", &keys), ("ORCHD_WORKER_SECRET", secret)],
    )
    .await;
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["engines", "add", "e2", &model, "--n-ctx", "512"],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("engine e2: loaded"),
        "{}",
        text(&out.stdout)
    );
    let out = ctl(&base, Some(ADMIN_KEY), &["engines", "list"]).await;
    let list = text(&out.stdout);
    assert!(
        list.lines()
            .any(|l| l.starts_with("e2 ") && l.contains("loaded")),
        "{list}"
    );
    let out = ctl(&base, Some(ADMIN_KEY), &["engines", "add", "e2", &model]).await;
    assert_eq!(code(&out), 2, "a duplicate id is refused");
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["engines", "rm", "e2", "--deadline", "5s"],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "engine e2: removed\n");
    let out = ctl(&base, Some(ADMIN_KEY), &["--json", "engines", "list"]).await;
    let v: Value = stdout_json(&out);
    assert!(v["engines"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["engine_id"] != "e2"));

    let mut w = support::fake_worker::connect(&base, secret).await.unwrap();
    w.register("gpu-box-7", &["llama3-8b"], 3).await;
    let out = ctl(&base, Some(ADMIN_KEY), &["workers"]).await;
    let table = text(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.contains("gpu-box-7"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("llama3-8b") && row.contains("0/3") && row.contains("serving"),
        "{row}"
    );
    // FC-CTL-3: ask it to report its models again, then drain it
    let id = row.split_whitespace().next().unwrap().to_string();
    let out = ctl(&base, Some(ADMIN_KEY), &["workers", "models-refresh", &id]).await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    match w.next(Duration::from_secs(5)).await {
        support::fake_worker::Next::Msg(contracts::worker::ServerToWorker::ModelsRefresh {
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["workers", "drain", &id, "--deadline", "1s"],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("draining"),
        "{}",
        text(&out.stdout)
    );
    let out = ctl(
        &base,
        Some(ADMIN_KEY),
        &["workers", "drain", "no-such-worker"],
    )
    .await;
    assert_eq!(code(&out), 2, "an unknown worker is refused");
}

/// ORCH-FAIR-4, ORCH-FAIR-5: `orchctl tenants` shows each tenant's weight, tasks, share of the
/// queue and quotas (from the config and the key file's options); data keys may not see it.
#[tokio::test]
async fn tenants_shows_weights_tasks_and_quotas() {
    let model = default_model_path();
    let cfg = format!(
        "[queue]\ncapacity = 8\n[queue.tenants.t]\nweight = 3\nmax_queued = 4\n[[pools]]\nid = \"p1\"\nmodel = \"{model}\"\nslots = 1\nctx = 512\nthreads = 1\n"
    );
    let keys = format!(
        "t:data:{DATA_KEY},ops:admin:{ADMIN_KEY} requests_per_minute=30 max_priority=batch"
    );
    let (_p, base) = server_env(&cfg, &[("ORCHD_API_KEYS", &keys)]).await;
    // t's tasks: one running, one queued
    let ids = [submit(&base, 200).await, submit(&base, 200).await];
    wait_running(&base, &ids[..1]).await;
    let out = ctl(&base, Some(ADMIN_KEY), &["tenants"]).await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.starts_with("fairness tenant, queue capacity 8"),
        "{table}"
    );
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    // TENANT WEIGHT QUEUED RUNNING SHARE SERVED QUOTAS...
    let t = row("t");
    assert_eq!(&t[..5], ["t", "3", "1", "1", "8.0"], "{table}");
    assert!(table.contains("4 queued"), "{table}");
    let ops = row("ops");
    assert_eq!(&ops[..4], ["ops", "1", "0", "0"], "{table}");
    assert!(
        table.contains("30 req/min, ≤ batch"),
        "the key file's options: {table}"
    );
    let out = ctl(&base, Some(ADMIN_KEY), &["--json", "tenants"]).await;
    let v = stdout_json(&out);
    assert_eq!(v["tenants"][0]["tenant"], "ops", "{v}");
    assert_eq!(v["tenants"][0]["requests_per_minute"], 30);
    let out = ctl(&base, Some(DATA_KEY), &["tenants"]).await;
    assert_eq!(code(&out), 2, "an admin route");
    for id in &ids {
        ctl(&base, Some(ADMIN_KEY), &["tasks", "cancel", id]).await;
    }
}

/// MOD-FOLDER-7: `orchctl pools` says when each pool unloads — `-` for a configured pool, the
/// time left for an idle on-demand one (`models.keep_alive_s`, then the last request's
/// `keep_alive`), `kept` when a request asked for it to stay — and `--json` carries the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_say_when_on_demand_models_unload() {
    let dir = scratch("ctl-on-demand");
    std::fs::create_dir_all(&dir).unwrap();
    let model = std::fs::canonicalize(default_model_path()).unwrap();
    std::os::unix::fs::symlink(&model, dir.join("od-smol.gguf")).unwrap();
    let (_p, base) = server(&dir, 1).await;
    let generate = |keep: Value| {
        let base = base.clone();
        async move {
            let r = reqwest::Client::new()
                .post(format!("{base}/api/generate"))
                .bearer_auth(DATA_KEY)
                .json(&json!({"model": "od-smol", "prompt": "Hi", "stream": false,
                              "options": {"num_predict": 2}, "keep_alive": keep}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        }
    };
    generate(json!("10m")).await;
    let out = ctl(&base, Some(ADMIN_KEY), &["pools"]).await;
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let row = |id: &str| {
        table
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("no {id} row: {table}"))
            .to_string()
    };
    assert!(table.lines().next().unwrap().contains("UNLOADS"), "{table}");
    assert!(row("p1 ").trim_end().ends_with(" -"), "{table}");
    // idle, ten minutes from the request's end: "in 10m" within its first second, then
    // "in 9m 5xs"
    let od_row = row("auto-od-smol");
    assert!(
        od_row.contains(" in 9m") || od_row.trim_end().ends_with(" in 10m"),
        "{table}"
    );
    let out = ctl(&base, Some(ADMIN_KEY), &["pools", "--json"]).await;
    let v = stdout_json(&out);
    let pools = v["pools"].as_array().unwrap();
    let od = pools
        .iter()
        .find(|p| p["pool_id"] == "auto-od-smol")
        .unwrap();
    assert_eq!(od["on_demand"]["model"], "od-smol");
    assert_eq!(od["on_demand"]["keep_alive_s"], 600);
    let left = od["on_demand"]["unloads_in_ms"].as_u64().unwrap();
    assert!((540_000..=600_000).contains(&left), "{left}");
    let p1 = pools.iter().find(|p| p["pool_id"] == "p1").unwrap();
    assert!(p1.get("on_demand").is_none(), "{p1}");
    // a negative keep_alive keeps it
    generate(json!(-1)).await;
    let out = ctl(&base, Some(ADMIN_KEY), &["pools"]).await;
    let table = text(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("auto-od-smol"))
        .unwrap();
    assert!(row.trim_end().ends_with("kept"), "{table}");
    let out = ctl(&base, Some(ADMIN_KEY), &["health", "auto-od-smol"]).await;
    assert!(
        text(&out.stdout).contains("on demand unloads kept"),
        "{}",
        text(&out.stdout)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// OPS-CTL-6 (issue 51): `orchctl embed` gives each text's vector (arguments and a file's
/// lines, `--dimensions`), `orchctl rerank` refuses a model without a classification head
/// with exit 2 and the server's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_and_rerank() {
    let dir = scratch("ctl-embed");
    std::fs::create_dir_all(&dir).unwrap();
    let (_p, base) = server(&dir, 2).await;
    let o = ctl(
        &base,
        Some(DATA_KEY),
        &["--json", "embed", "The sea is calm.", "Rates rose."],
    )
    .await;
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let v = stdout_json(&o);
    assert_eq!(v["data"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(
        v["data"][0]["embedding"].as_array().map(Vec::len),
        Some(576),
        "{v}"
    );
    let file = dir.join("lines.txt");
    std::fs::write(&file, "first line\n\nsecond line\nthird line\n").unwrap();
    let o = ctl(
        &base,
        Some(DATA_KEY),
        &[
            "embed",
            "--dimensions",
            "8",
            "--file",
            file.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.lines().filter(|l| l.contains(" 8 ")).count() == 3,
        "{out}"
    );
    let o = ctl(&base, Some(DATA_KEY), &["rerank", "--query", "q", "a", "b"]).await;
    assert_eq!(code(&o), 2, "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("classification head"),
        "{}",
        text(&o.stderr)
    );
}
