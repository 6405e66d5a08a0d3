//! ADP-OAI-3: the official `openai` Python package drives the server with the real default
//! model (`ci/openai_sdk_check.py`): chat non-streamed and streamed, content as an array of
//! parts (an image part a 400 naming it), `models.retrieve` with the context length (ADP-OAI-5),
//! completions with an array prompt, stop sequences, seed reproducibility, and an overload
//! surfacing as RateLimitError.
//! `ci/test.sh` installs the package into `.cache/pydeps`.

mod support;

use std::sync::Arc;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_works_against_the_real_model() {
    let mut cfg = config(vec![real_pool("default", 2, 2048)]);
    cfg.queue.capacity = 2;
    // the overload check is about the queue's capacity: two 1000-token streams ahead may
    // take longer than the default longest queue wait on a slow machine, and the deadline
    // refusal would come before the capacity one
    cfg.admission.max_queue_wait_ms = 600_000;
    cfg.timeouts.idle_ms = 60_000;
    let s = start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await;
    let stdout = run_sdk_script(
        "openai_sdk_check.py",
        &["--base-url".into(), s.url("/v1").into()],
    )
    .await;
    assert!(stdout.contains("all SDK checks passed"));
}
