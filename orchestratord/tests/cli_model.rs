//! FC-CLI-1 (issue 37): `orchestratord --model PATH --slots N --ctx N --threads N`, as
//! llama-server users expect: the first pool serves that file (named after it), with those
//! slots and that context, over the defaults; a real process with the second real model.
//! LLS-CLI-1..3, LLS-TMPL-1..2 (issue 50): llama-server's own command line starts a server
//! with the meaning llama-server gives it — `-c` divided among `-np` slots, `--port`,
//! `--alias`, `--chat-template NAME` / `--chat-template-file FILE` changing the rendered
//! prompt, `--no-webui`, flags with no meaning here said in the log; unknown template names,
//! bad `-hf` names and cache types refused at start saying why (`-hf` pulling: model_pull.rs).

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

/// The text a chat renders to on the server at `base` (its ids tokenized, then read back).
async fn rendered(base: &str, model: &str) -> String {
    let t = post_json(
        &format!("{base}/tokenize"),
        &serde_json::json!({"model": model, "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"}]}),
    )
    .await;
    let d = post_json(
        &format!("{base}/detokenize"),
        &serde_json::json!({"model": model, "tokens": t["tokens"]}),
    )
    .await;
    d["content"].as_str().unwrap_or_default().to_string()
}

/// Starts the server with `args` (and an empty config); its base URL once its pools loaded.
async fn start(tag: &str, args: &[&str]) -> (Proc, String) {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut all: Vec<String> = vec!["--port".into(), port.to_string()];
    all.extend(args.iter().map(|s| s.to_string()));
    let p = spawn_env(tag, &all, "", &[]);
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
    (p, base)
}

/// LLS-CLI-1..3, LLS-TMPL-1..2: llama-server's flags, as its users type them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_servers_flags_mean_what_they_mean_there() {
    let model = support::default_model_path();
    let (p, base) = start(
        "llama-flags",
        &[
            "--host",
            "127.0.0.1",
            "-m",
            &model,
            "-c",
            "2048",
            "-np",
            "2",
            "-t",
            "1",
            "--alias",
            "smol-ls",
            "--chat-template",
            "llama3",
            "--jinja",
            "--no-webui",
            "-ngl",
            "99",
            "-fa",
            "-cb",
            "-ctk",
            "f16",
        ],
    )
    .await;
    let models = get_json(&format!("{base}/v1/models")).await;
    assert_eq!(models["data"][0]["id"], "smol-ls", "{models}");
    assert_eq!(models["data"][0]["max_model_len"], 1024, "{models}");
    let pools = get_json(&format!("{base}/v1/pools")).await;
    assert_eq!(pools["pools"][0]["slots_total"], 2, "{pools}");
    // llama3's turns, not the model's own ChatML
    let text = rendered(&base, "smol-ls").await;
    assert!(
        text.contains("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
            && text.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"),
        "{text:?}"
    );
    let r = post_json(
        &format!("{base}/v1/chat/completions"),
        &serde_json::json!({"model": "smol-ls", "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert!(r["choices"][0]["message"]["content"].is_string(), "{r}");
    // no console page
    let page = reqwest::get(format!("{base}/")).await.unwrap();
    assert_eq!(page.status(), 404);
    // LLS-API-4: started as llama-server is, /health answers as llama-server's does
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(
        health.json::<serde_json::Value>().await.unwrap(),
        serde_json::json!({"status": "ok"})
    );
    let log = p.log_text();
    for said in [
        "-c 2048 over 2 slots: 1024 tokens of context per slot",
        "-ngl 99: a pool runs whole on its device",
        "-fa on: the engine picks its attention kernel",
        "-cb: continuous batching is always on",
        "--jinja: chat templates are always rendered as Jinja",
    ] {
        assert!(log.contains(said), "{said} not in {log}");
    }
    drop(p);

    // a template from a file
    let dir = std::env::temp_dir().join(format!("orchd-tmpl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("qa.jinja");
    std::fs::write(
        &file,
        "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}",
    )
    .unwrap();
    let (p, base) = start(
        "llama-flags-file",
        &[
            "-m",
            &model,
            "--ctx",
            "512",
            "--slots",
            "1",
            "-t",
            "1",
            "--chat-template-file",
            &file.display().to_string(),
        ],
    )
    .await;
    let text = rendered(&base, "SmolLM2-135M-Instruct.Q4_1").await;
    assert!(
        text.ends_with("SYSTEM: Be brief.\nUSER: Hi\nASSISTANT:"),
        "{text:?}"
    );
    drop(p);

    // refused at start, saying why, before any model loads
    for (args, says) in [
        (
            vec!["--chat-template", "chatmll"],
            "neither a built-in template (chatml, ",
        ),
        (
            vec!["-hf", "ggml-org/gemma-3-270m-GGUF", "-m", "x.gguf"],
            "give one",
        ),
        (vec!["-hf", "ggml-org/../etc"], "letters, digits"),
        (vec!["-ctk", "q8_0"], "f32 or f16"),
    ] {
        let out = std::process::Command::new(orchestratord_binary())
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
