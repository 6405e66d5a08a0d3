//! ORCH-CPU-1: the compute threads (the process's compute pool and the engine's decode
//! thread) run `compute_nice` steps below the threads that accept, admit and stream, as `top
//! -H` or `ps -L -o nice` shows an operator; 0 (the default) leaves them at the process's
//! priority. ISO-1: the request-work threads (`orchd-prep-N`: tokenizing, templates, grammar
//! compiles) run `admission.request_work_nice` (10) steps below. The real default model loads
//! and streams either way.

mod support;

use std::collections::BTreeMap;

use support::procs::server;
use support::*;

/// Nice values of the process's threads, by thread name (`/proc/PID/task/*/stat`).
fn thread_nices(pid: i32) -> BTreeMap<String, Vec<i32>> {
    let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("stat")),
        ) else {
            continue; // the thread ended while we read
        };
        // after the name in parentheses: state is field 3, nice field 19
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let nice: i32 = fields[19 - 3].parse().unwrap();
        out.entry(comm.trim().to_string()).or_default().push(nice);
    }
    out
}

/// This (test) process's nice value, which the server inherits.
fn own_nice() -> i32 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    stat.rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(19 - 3)
        .unwrap()
        .parse()
        .unwrap()
}

async fn server_with(compute_nice: u8) -> (procs::Proc, String) {
    server(&format!(
        "compute_nice = {compute_nice}\n[[pools]]\nid = \"default\"\nmodel = \"{}\"\nalias = \"smol\"\nslots = 2\nctx = 1024\nthreads = 2\n",
        default_model_path()
    ))
    .await
}

async fn streams_a_reply(base: &str) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(
            &serde_json::json!({"model": "smol", "max_tokens": 8, "stream": true,
            "messages": [{"role": "user", "content": "Say hello."}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("\"finish_reason\":\"length\"")
            || body.contains("\"finish_reason\":\"stop\""),
        "{body}"
    );
}

/// ORCH-CPU-1, ISO-1: `compute_nice` lowers the compute threads; at 0 (the default) they keep
/// the process's priority and only the request-work threads go below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compute_threads_run_below_the_request_threads() {
    let base_nice = own_nice();
    let lowered = (base_nice + 7).min(19);
    let (p, base) = server_with(7).await;
    streams_a_reply(&base).await;
    let nices = thread_nices(p.pid());
    let of = |name: &str| nices.get(name).cloned().unwrap_or_default();
    let pool: Vec<i32> = nices
        .iter()
        .filter(|(n, _)| n.starts_with("candle-bp-"))
        .flat_map(|(_, v)| v.clone())
        .collect();
    assert_eq!(
        pool,
        vec![lowered],
        "one pool worker beside the decode thread: {nices:?}"
    );
    // the decode thread computes on the pool's one-thread rayon pool; the thread that started
    // it only waits
    assert!(of("candle-decode").contains(&lowered), "{nices:?}");
    let runtime = of("tokio-rt-worker");
    assert!(
        !runtime.is_empty() && runtime.iter().all(|&n| n == base_nice),
        "{nices:?}"
    );
    assert!(
        of("orchestratord").iter().all(|&n| n == base_nice),
        "{nices:?}"
    );
    drop(p);

    let (p, base) = server_with(0).await;
    streams_a_reply(&base).await;
    let nices = thread_nices(p.pid());
    let prep = (base_nice + 10).min(19);
    assert!(
        nices
            .iter()
            .filter(|(n, _)| !n.starts_with("orchd-prep-"))
            .flat_map(|(_, v)| v)
            .all(|&n| n == base_nice),
        "0 leaves the compute at the process's priority: {nices:?}"
    );
    // ISO-1: the work requests bring before admission (tokenizing, grammars) runs below it
    let prepping: Vec<i32> = nices
        .iter()
        .filter(|(n, _)| n.starts_with("orchd-prep-"))
        .flat_map(|(_, v)| v.clone())
        .collect();
    assert!(
        !prepping.is_empty() && prepping.iter().all(|&n| n == prep),
        "{nices:?}"
    );
}
