//! FC-CLI-1 (issue 37): `orchestratord --model PATH --slots N --ctx N --threads N`, as
//! llama-server users expect: the first pool serves that file (named after it), with those
//! slots and that context, over the defaults; a real process with the second real model.

mod support;

use std::time::Duration;

use support::procs::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_flags_set_the_first_pool() {
    let gemma = std::fs::canonicalize(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../.cache/models/gemma-3-270m-q4_k_m.gguf"),
    )
    .expect("run ci/fetch-gemma.sh first");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let args: Vec<String> = [
        "--bind",
        &format!("127.0.0.1:{port}"),
        "--model",
        &gemma.display().to_string(),
        "--slots",
        "1",
        "--ctx",
        "512",
        "--threads",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let p = spawn_env("cli-model", &args, "", &[]);
    let client = reqwest::Client::new();
    let ready = eventually(Duration::from_secs(60), || async {
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    assert!(ready, "{}", p.log_text());
    let models = get_json(&format!("{base}/v1/models")).await;
    assert_eq!(models["data"][0]["id"], "gemma-3-270m-q4_k_m", "{models}");
    assert_eq!(models["data"][0]["max_model_len"], 512, "{models}");
    let pools = get_json(&format!("{base}/v1/pools")).await;
    assert_eq!(pools["pools"][0]["slots_total"], 1, "{pools}");
    let r = post_json(
        &format!("{base}/v1/completions"),
        &serde_json::json!({"model": "gemma-3-270m-q4_k_m", "prompt": "1, 2, 3, 4, 5,",
            "max_tokens": 8, "temperature": 0}),
    )
    .await;
    assert!(
        r["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(" 6, 7"),
        "{r}"
    );
    // a flag the config cannot take is refused at start, naming it, in one line — a
    // developer's RUST_BACKTRACE adds no stack to it (issue 49)
    let out = std::process::Command::new(orchestratord_binary())
        .args(["--slots", "0"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("slots"), "{err}");
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
