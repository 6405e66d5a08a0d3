//! ADP-OAI-3: the official `openai` Python package drives the server with the real default
//! model (`ci/openai_sdk_check.py`): chat non-streamed and streamed, content as an array of
//! parts (an image part a 400 naming it), `models.retrieve` with the context length (ADP-OAI-5),
//! completions with an array prompt, stop sequences, seed reproducibility, and an overload
//! surfacing as RateLimitError.
//! `ci/test.sh` installs the package into `.cache/pydeps`.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_works_against_the_real_model() {
    let s = real_model_server(Some(2)).await;
    let stdout = run_sdk_script(
        "openai_sdk_check.py",
        &["--base-url".into(), s.url("/v1").into()],
    )
    .await;
    assert!(stdout.contains("all SDK checks passed"));
}
