//! ORCH-ADM-DL-5: the overload scenario, short: 16 clients at once, each the official `openai`
//! SDK with a 3 s timeout and its default retries, streaming chat from the real default model
//! on 2 slots (`ci/overload_bench.py --quick`). Counts, not timings: no client times out, nor
//! any attempt before a retry; every client either completes or is refused with advice it
//! followed until its retries ran out; when the clients are gone nothing is left running or
//! queued.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_clients_in_a_burst_complete_or_are_refused_and_none_times_out() {
    let mut p = pool("default", 2);
    p.model = default_model_path();
    p.alias = Some("bench".into());
    p.ctx = 2048;
    let mut cfg = config(vec![p]);
    cfg.timeouts.idle_ms = 60_000;
    let s = start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await;
    let out_file = std::env::temp_dir().join(format!("orchd-overload-{}.json", std::process::id()));
    let args: Vec<std::ffi::OsString> = vec![
        "--quick".into(),
        "--timeout".into(),
        "3".into(),
        "--base-url".into(),
        s.base.clone().into(),
        "--json".into(),
        out_file.clone().into(),
    ];
    run_sdk_script("overload_bench.py", &args).await;
    let rows: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out_file);
    let r = &rows[0];
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert_eq!(n("clients"), 16);
    assert_eq!(n("timeouts"), 0, "no client waits past its timeout: {r}");
    assert_eq!(
        n("completed_after_a_timeout"),
        0,
        "no attempt waits past the client's timeout before a retry either: {r}"
    );
    assert_eq!(r["other"], serde_json::json!({}), "{r}");
    assert_eq!(n("completed") + n("refused"), 16, "{r}");
    assert!(n("completed") >= 2, "{r}");
    assert!(n("tokens_delivered") >= n("completed"), "{r}");
    // the clients are gone: nothing runs or waits for them
    let mut waited = 0;
    while !(s.state.running.is_empty() && s.state.queue.is_empty()) && waited < 50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
    }
    assert!(s.state.running.is_empty() && s.state.queue.is_empty());
}
