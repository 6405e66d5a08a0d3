//! ADP-ANT-1..3: the official `anthropic` Python SDK drives the Messages API on the real
//! default model (`ci/anthropic_sdk_check.py`): create and stream (the event sequence, the
//! same greedy text as the OpenAI route), count_tokens equal to the input tokens charged,
//! stop sequences, end_turn, system and content blocks, prefill, `max_tokens: 0`, errors as
//! the SDK's exception classes naming the field, and an overload raised as RateLimitError
//! with `retry-after`. `ci/test.sh` installs the SDK into `.cache/pydeps`.

mod support;

use std::sync::Arc;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_sdk_works_against_the_real_model() {
    let mut cfg = config(vec![real_pool("default", 2, 2048)]);
    cfg.queue.capacity = 2;
    cfg.admission.max_queue_wait_ms = 600_000;
    cfg.timeouts.idle_ms = 60_000;
    let s = start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await;
    let stdout = run_sdk_script(
        "anthropic_sdk_check.py",
        &["--base-url".into(), s.url("").into()],
    )
    .await;
    assert!(stdout.contains("all anthropic SDK checks passed"));
}
