//! ADP-OLL-1..3: the official `ollama` Python client drives Ollama's native API on the real
//! default model (`ci/ollama_client_check.py`): list, ps and show (the file's digest, the GGUF's
//! details and chat template), chat and generate streamed and not (the same greedy text as the
//! OpenAI route, counts and durations that add up), stop, seed, raw prompts, the "load"
//! request, log-probabilities (ADP-LP-3), tools (ADP-TOOL-2: a call, its result sent back,
//! streamed = whole), errors in Ollama's shape naming the field, and an overload raised as a
//! 429.
//! `ci/test.sh` installs the client into `.cache/pydeps`.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_ollama_client_works_against_the_real_model() {
    let s = real_model_server(Some(2)).await;
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
