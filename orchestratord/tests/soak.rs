//! The reliability suite's CI version: half a minute of the soak (`orchd_tools::soak`; the
//! long runs are `orchd-soak --minutes 30`) on the real engine, every adapter, with cancels,
//! disconnects, resumes, late subscribers, session budgets, drains, resumes and reloads.
//! Nothing may be lost, doubled, streamed after a cancel, answered 5xx, or left holding a slot.
//! `ORCHD_SOAK_SECS` changes the length.

mod support;

use std::sync::Arc;
use std::time::Duration;

use orchd_tools::soak;
use orchestratord::config::Config;
use orchestratord::process_stats;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_on_the_real_engine_loses_nothing() {
    let secs: u64 = std::env::var("ORCHD_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let model = default_model_path();
    let scratch = std::env::temp_dir().join(format!("orchd-soak-test-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let cfg = Config::from_toml(&soak::server_toml(&model, &scratch, "127.0.0.1:0")).unwrap();
    let s = start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await;
    let hyperswarm = s.background.hyperswarm.as_ref().map(|h| h.listen);
    assert!(hyperswarm.is_some(), "the Hyperswarm host runs");
    let spec = soak::spec_for(
        s.base.clone(),
        &model,
        hyperswarm,
        Duration::from_secs(secs),
        8,
    );
    let report = soak::run(spec, process_stats::resident_bytes).await;
    let _ = std::fs::remove_dir_all(&scratch);
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    assert!(report.clean(), "{report:#?}");
    assert!(report.tasks as u64 >= secs, "tasks ran: {}", report.tasks);
    for adapter in [
        "task-api",
        "openai-chat",
        "openai-chat-stream",
        "openai-completions",
        "seed-chat",
        "hyperswarm",
    ] {
        assert!(
            report.by_adapter.get(adapter).copied().unwrap_or(0) > 0,
            "{adapter} exercised"
        );
    }
    for (what, n) in [
        ("cancels", report.cancels),
        ("disconnects", report.disconnects),
        ("resumes", report.resumes),
        ("late subscribers", report.late_subscribers),
        ("drains", report.drains),
        ("reloads", report.reloads),
    ] {
        assert!(n > 0, "{what} exercised");
    }
}
