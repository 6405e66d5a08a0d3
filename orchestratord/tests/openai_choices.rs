//! ADP-LP-1..2, ADP-OAI-6: log-probabilities and `n` choices through the official `openai` SDK
//! on the real default model (`ci/openai_choices_check.py`): chat and completions, streamed and not, with `top_logprobs`;
//! greedy tokens are their step's likeliest, alternatives sorted, mass at most 1, the tokens
//! spell the answer, streamed and whole answers agree; `n` choices sharing the prompt's
//! prefill, reproducible with a seed, streamed by index; and the refusals. The values against
//! llama.cpp's logits: `engine-candle/tests/logprobs.rs` (ENG-LP-1).

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_reads_log_probabilities_and_n_choices() {
    let s = real_model_server(None).await;
    let stdout = run_sdk_script(
        "openai_choices_check.py",
        &["--base-url".into(), s.url("").into()],
    )
    .await;
    assert!(stdout.contains("all logprobs and n checks passed"));
}
