//! ADP-TOOL-1: tool calling on `/v1/chat/completions` through the official `openai` SDK on the
//! real default model (`ci/openai_tools_check.py`): a two-turn round trip (a required call whose
//! arguments validate against the function's schema, its result sent back as a `tool` message,
//! the next answer), a named choice, `parallel_tool_calls: false`, `none`, streamed
//! `tool_calls` deltas adding up to the whole answer's call, and the refusals naming their
//! field. ADP-TOOL-4: the same on `/v1/responses` (`function_call` items, the call and its
//! `function_call_output` sent back as input items, the streamed argument events). The
//! answer's shape and its streaming scanner: `src/adapters/tool_calls/`.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_calls_tools_in_a_round_trip() {
    let s = real_model_server(None).await;
    let stdout = run_sdk_script(
        "openai_tools_check.py",
        &["--base-url".into(), s.url("").into()],
    )
    .await;
    assert!(stdout.contains("all tools checks passed"), "{stdout}");
}
