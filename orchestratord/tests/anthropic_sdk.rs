//! ADP-ANT-1..3: the official `anthropic` Python SDK drives the Messages API on the real
//! default model (`ci/anthropic_sdk_check.py`): create and stream (the event sequence, the
//! same greedy text as the OpenAI route), count_tokens equal to the input tokens charged,
//! stop sequences, end_turn, system and content blocks, prefill, `max_tokens: 0`, errors as
//! the SDK's exception classes naming the field, and an overload raised as RateLimitError
//! with `retry-after`. ADP-TOOL-3: tool use through the same SDK
//! (`ci/anthropic_tools_check.py`): a two-turn round trip (`tool_use` blocks whose input
//! validates against the tool's `input_schema`, `stop_reason: tool_use`, the `tool_result`
//! sent back), named choice, `disable_parallel_tool_use`, `none`, the stream helper assembling
//! the call from `input_json_delta`s, count_tokens counting the tools, refusals naming their
//! field. `ci/test.sh` installs the SDK into `.cache/pydeps`.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_sdk_works_against_the_real_model() {
    let s = real_model_server(Some(2)).await;
    let stdout = run_sdk_script(
        "anthropic_sdk_check.py",
        &["--base-url".into(), s.url("").into()],
    )
    .await;
    assert!(stdout.contains("all anthropic SDK checks passed"));
    let stdout = run_sdk_script(
        "anthropic_tools_check.py",
        &["--base-url".into(), s.url("").into()],
    )
    .await;
    assert!(
        stdout.contains("all anthropic tools checks passed"),
        "{stdout}"
    );
}
