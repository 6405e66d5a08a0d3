//! ADP-OLL-1..3: the official `ollama` Python client drives Ollama's native API on the real
//! default model (`ci/ollama_client_check.py`): list, ps and show (the file's digest, the GGUF's
//! details and chat template), chat and generate streamed and not (the same greedy text as the
//! OpenAI route, counts and durations that add up), stop, seed, raw prompts, the "load"
//! request, errors in Ollama's shape naming the field, and an overload raised as a 429.
//! `ci/test.sh` installs the client into `.cache/pydeps`.

mod support;

use std::sync::Arc;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_ollama_client_works_against_the_real_model() {
    let mut cfg = config(vec![real_pool("default", 2, 2048)]);
    cfg.queue.capacity = 2;
    cfg.admission.max_queue_wait_ms = 600_000;
    cfg.timeouts.idle_ms = 60_000;
    let s = start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await;
    let stdout = run_sdk_script(
        "ollama_client_check.py",
        &[
            "--host".into(),
            s.url("").into(),
            "--model-file".into(),
            default_model_path().into(),
        ],
    )
    .await;
    assert!(stdout.contains("all ollama client checks passed"));
}
