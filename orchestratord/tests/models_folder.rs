//! MOD-FOLDER-1..4 (issue 35): the model folder (`models.dirs`) with the real models — SmolLM2
//! and Gemma 3 in one folder, a memory budget that holds one of them: both listed before either
//! is loaded (`/v1/models`, Ollama's `/api/tags`), requests that alternate each answered by their model while the other is
//! unloaded, a burst for an unloaded model loading it once, idle models unloaded after
//! `keep_alive_s`, a file removed while listed, and a model that cannot load failing once
//! (no retry loop); before a load, `/v1/models` says the context a load serves.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use orchestratord::config::Config;
use serde_json::json;
use support::procs::eventually;
use support::*;

/// A folder of its own with `models` (name → file) in it: hard links (the folder is on the
/// build's file system), a copy where that fails — a symbolic link out of the folder is no
/// model (SEC-MODEL-1).
fn folder(tag: &str, models: &[(&str, PathBuf)]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("orchd-folder-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, file) in models {
        let to = dir.join(format!("{name}.gguf"));
        if std::fs::hard_link(file, &to).is_err() {
            std::fs::copy(file, &to).unwrap();
        }
    }
    dir
}

fn gemma_path() -> PathBuf {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/gemma-3-270m-q4_k_m.gguf");
    assert!(p.exists(), "run ci/fetch-gemma.sh first ({})", p.display());
    std::fs::canonicalize(p).unwrap()
}

fn folder_config(dir: &std::path::Path, budget_mib: u64, keep_alive_s: u64) -> Config {
    let mut cfg = config(vec![]);
    cfg.models.dirs = vec![dir.display().to_string()];
    cfg.models.on_demand = true;
    cfg.models.memory_budget_mib = budget_mib;
    cfg.models.kv_cache_mib = 64;
    cfg.models.keep_alive_s = keep_alive_s;
    cfg.timeouts.idle_ms = 60_000;
    cfg
}

async fn chat(s: &TestServer, model: &str, text: &str) -> reqwest::Response {
    s.post(
        "/v1/chat/completions",
        &json!({"model": model, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": text}]}),
    )
    .await
}

/// The value of `name`'s series whose labels include every one of `labels` (0 when none).
fn series(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn pool_ids(s: &TestServer) -> Vec<String> {
    s.get_json("/v1/pools").await["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pool_id"].as_str().unwrap().to_string())
        .collect()
}

/// MOD-FOLDER-1, -2: listed loaded or not; alternate requests each answered, the budget
/// holding one; a burst loads once; a file removed while listed is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_of_two_models_under_a_budget_that_holds_one() {
    let smol = std::fs::canonicalize(default_model_path()).unwrap();
    let dir = folder("two", &[("fm-smol", smol), ("fm-gemma", gemma_path())]);
    // SmolLM2 (94 MiB) + Gemma 3 (241 MiB), each with a 64 MiB KV budget: one fits in 400
    let s = start_with(
        folder_config(&dir, 400, 0),
        Arc::new(pool_manager::candle::CandleFactory),
    )
    .await;
    let listed = s.get_json("/v1/models").await;
    let find = |v: &serde_json::Value, id: &str| {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .cloned()
    };
    let g = find(&listed, "fm-gemma").unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(
        (
            &g["loaded"],
            &g["architecture"],
            &g["quantization"],
            &g["size_bytes"]
        ),
        (
            &json!(false),
            &json!("gemma3"),
            &json!("Q4_K_M"),
            &json!(253113024)
        ),
        "{g}"
    );
    let m = find(&listed, "fm-smol").unwrap();
    assert_eq!(
        (&m["architecture"], &m["quantization"]),
        (&json!("llama"), &json!("Q4_1"))
    );
    // issue 49: before a load, the context a load serves — the 64 MiB KV budget holds less
    // than the trained 8,192 — and `created` is when the file last changed
    let served_before = m["max_model_len"].as_u64().unwrap();
    assert!((256..8192).contains(&served_before), "{m}");
    let mtime = std::fs::metadata(dir.join("fm-smol.gguf"))
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(m["created"], json!(mtime), "{m}");
    assert!(
        pool_ids(&s).await.is_empty(),
        "nothing loaded before it is asked for"
    );
    // Ollama's listing names them too
    let tags = s.get_json("/api/tags").await;
    let t = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "fm-gemma")
        .cloned();
    let t = t.unwrap_or_else(|| panic!("{tags}"));
    assert_eq!(
        (
            &t["details"]["family"],
            &t["details"]["quantization_level"],
            &t["size"]
        ),
        (&json!("gemma3"), &json!("Q4_K_M"), &json!(253113024))
    );

    // alternate: each answers with its own model; the other is unloaded to fit the budget
    let gemma_raw = |r: serde_json::Value| {
        r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for round in 0..2 {
        let r = chat(&s, "fm-smol", "What is the capital of France?").await;
        assert_eq!(r.status(), 200, "round {round}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["model"], "fm-smol");
        assert!(!gemma_raw(v.clone()).is_empty(), "{v}");
        assert!(
            v["usage"]["prompt_tokens"].as_u64().unwrap() > 20,
            "counted by the engine: {v}"
        );
        assert_eq!(pool_ids(&s).await, vec!["auto-fm-smol"]);
        let loaded = find(&s.get_json("/v1/models").await, "fm-smol").unwrap();
        assert_eq!(
            (
                &loaded["loaded"],
                &loaded["max_model_len"],
                &loaded["created"]
            ),
            (&json!(true), &json!(served_before), &json!(mtime)),
            "{loaded}"
        );
        let r = s
            .post(
                "/v1/completions",
                &json!({"model": "fm-gemma", "prompt": "1, 2, 3, 4, 5,",
                "max_tokens": 8, "temperature": 0}),
            )
            .await;
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = r.json().await.unwrap();
        // Gemma 3's own greedy continuation (llama.cpp's too, ENG-ARCH-1)
        assert!(
            v["choices"][0]["text"]
                .as_str()
                .unwrap()
                .starts_with(" 6, 7, 8"),
            "{v}"
        );
        assert_eq!(pool_ids(&s).await, vec!["auto-fm-gemma"]);
    }
    let m = s.metrics().await;
    assert_eq!(
        series(&m, "orchd_model_loads_total", &["\"fm-smol\"", "\"ok\""]),
        2.0,
        "{m}"
    );
    assert!(
        series(
            &m,
            "orchd_model_unloads_total",
            &["\"fm-smol\"", "\"budget\""]
        ) >= 2.0
    );

    // a burst for the unloaded model: every request answered, the model loaded once
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let (c, url) = (s.client.clone(), s.url("/v1/chat/completions"));
            tokio::spawn(async move {
                c.post(url)
                    .json(&json!({"model": "fm-smol", "max_tokens": 4,
                        "messages": [{"role": "user", "content": format!("Count to {i}.")}]}))
                    .send()
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap(), 200);
    }
    let m = s.metrics().await;
    assert_eq!(
        series(&m, "orchd_model_loads_total", &["\"fm-smol\"", "\"ok\""]),
        3.0,
        "one load for the burst"
    );

    // a file removed while listed: no longer listed, and asked for it is a 404
    std::fs::remove_file(dir.join("fm-gemma.gguf")).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(find(&s.get_json("/v1/models").await, "fm-gemma").is_none());
    let r = chat(&s, "fm-gemma", "Hi").await;
    assert_eq!(r.status(), 404);
    let _ = std::fs::remove_dir_all(dir);
}

/// MOD-FOLDER-3: an on-demand model idle for `keep_alive_s` is unloaded; asked again by a
/// client whose deadline is shorter than the predicted load, it is a 503 with the wait; then it
/// loads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_models_unload_after_keep_alive() {
    let smol = std::fs::canonicalize(default_model_path()).unwrap();
    let dir = folder("idle", &[("ka-smol", smol)]);
    let s = start_with(
        folder_config(&dir, 0, 1),
        Arc::new(pool_manager::candle::CandleFactory),
    )
    .await;
    assert_eq!(chat(&s, "ka-smol", "Hi").await.status(), 200);
    assert_eq!(pool_ids(&s).await, vec!["auto-ka-smol"]);
    let gone = eventually(Duration::from_secs(5), || async {
        pool_ids(&s).await.is_empty()
    })
    .await;
    assert!(gone, "still loaded: {:?}", pool_ids(&s).await);
    let m = s.metrics().await;
    assert_eq!(
        series(
            &m,
            "orchd_model_unloads_total",
            &["\"ka-smol\"", "\"idle\""]
        ),
        1.0
    );
    assert_eq!(
        chat(&s, "ka-smol", "Hi").await.status(),
        200,
        "loaded again"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// MOD-FOLDER-4: a model of the folder the engine cannot load (an architecture it does not
/// have) fails its waiting request, and the next request gets the reason at once — a 400
/// naming `model` — with no second load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_cannot_load_fails_once() {
    let mut bytes = std::fs::read(default_model_path()).unwrap();
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap();
    let value = at + bytes[at..].windows(5).position(|w| w == b"llama").unwrap();
    bytes[value..value + 5].copy_from_slice(b"gemmo");
    let dir = folder("bad", &[]);
    std::fs::write(dir.join("bad-arch.gguf"), bytes).unwrap();
    let s = start_with(
        folder_config(&dir, 0, 0),
        Arc::new(pool_manager::candle::CandleFactory),
    )
    .await;
    let first = chat(&s, "bad-arch", "Hi").await;
    let status = first.status();
    let body = first.text().await.unwrap();
    assert!(!status.is_success(), "{status} {body}");
    let r = chat(&s, "bad-arch", "Hi").await;
    let status = r.status();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status, 400, "{v} (first: {body})");
    assert_eq!(v["error"]["param"], "model", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("architecture \"gemmo\""),
        "{v}"
    );
    let m = s.metrics().await;
    assert_eq!(
        series(
            &m,
            "orchd_model_loads_total",
            &["\"bad-arch\"", "\"failed\""]
        ),
        1.0,
        "{m}"
    );
    assert!(pool_ids(&s).await.is_empty());
    let _ = std::fs::remove_dir_all(dir);
}

/// MOD-FOLDER-4 (issue 49): a file cut short (a download that stopped) is refused from its
/// header — a 400 naming `model` that says so, without a path — before anything is unloaded
/// to make room for it: the idle model that fills the budget stays loaded and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_file_unloads_nothing() {
    let smol = std::fs::canonicalize(default_model_path()).unwrap();
    let dir = folder("cut", &[("cut-smol", smol.clone())]);
    let bytes = std::fs::read(&smol).unwrap();
    std::fs::write(dir.join("cut-half.gguf"), &bytes[..bytes.len() / 2]).unwrap();
    // SmolLM2 (94 MiB) with a 64 MiB KV budget: one fits in 200, not two
    let s = start_with(
        folder_config(&dir, 200, 0),
        Arc::new(pool_manager::candle::CandleFactory),
    )
    .await;
    assert_eq!(chat(&s, "cut-smol", "Hi").await.status(), 200);
    let r = chat(&s, "cut-half", "Hi").await;
    let status = r.status();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "model", "{v}");
    let said = v["error"]["message"].as_str().unwrap();
    assert!(said.contains("truncated") && !said.contains('/'), "{v}");
    assert_eq!(pool_ids(&s).await, vec!["auto-cut-smol"]);
    assert_eq!(chat(&s, "cut-smol", "Hi").await.status(), 200);
    let _ = std::fs::remove_dir_all(dir);
}

/// MOD-FOLDER-5: an operator's drain of an on-demand pool: while it loads, a 409 that says
/// so (the request waiting for it is answered once it loads); once it serves, the drain
/// unloads it, and the next request loads the model again and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_unloads_an_on_demand_model_and_the_next_request_loads_it_again() {
    let dir = folder("drain", &[("dr-gemma", gemma_path())]);
    let s = start_with(
        folder_config(&dir, 0, 0),
        Arc::new(pool_manager::candle::CandleFactory),
    )
    .await;
    let (c, url) = (s.client.clone(), s.url("/v1/completions"));
    let waiting = tokio::spawn(async move {
        c.post(url)
            .json(&json!({"model": "dr-gemma", "prompt": "1, 2, 3,", "max_tokens": 4}))
            .send()
            .await
            .unwrap()
            .status()
    });
    let loading = eventually(Duration::from_secs(5), || async {
        pool_ids(&s).await == vec!["auto-dr-gemma"]
    })
    .await;
    assert!(loading);
    let body = json!({"deadline_ms": 1000});
    let drain = || s.post("/v1/pools/auto-dr-gemma/drain", &body);
    let r = drain().await;
    if r.status() == 409 {
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(v["message"].as_str().unwrap().contains("loading"), "{v}");
    }
    assert_eq!(waiting.await.unwrap(), 200, "answered once loaded");
    // serving now: the drain unloads it
    let r = drain().await;
    assert!(
        r.status().is_success() || r.status() == 409,
        "{}",
        r.status()
    );
    let gone = eventually(Duration::from_secs(10), || async {
        pool_ids(&s).await.is_empty()
    })
    .await;
    assert!(gone, "still there: {:?}", pool_ids(&s).await);
    let r = s
        .post(
            "/v1/completions",
            &json!({"model": "dr-gemma", "prompt": "1, 2, 3, 4, 5,", "max_tokens": 4, "temperature": 0}),
        )
        .await;
    assert_eq!(r.status(), 200, "loaded again");
    let m = s.metrics().await;
    assert_eq!(
        series(
            &m,
            "orchd_model_unloads_total",
            &["\"dr-gemma\"", "\"drained\""]
        ),
        1.0,
        "{m}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Whether every on-demand pool is gone within `secs`.
async fn unloaded(s: &TestServer, secs: u64) -> bool {
    eventually(Duration::from_secs(secs), || async {
        pool_ids(s).await.is_empty()
    })
    .await
}

/// POSTs to Ollama's `/api/generate` and returns the status and the JSON answer.
async fn generate(s: &TestServer, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = s.post("/api/generate", &body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// MOD-FOLDER-6: a request's `keep_alive` (Ollama's) decides how long its model stays loaded
/// once idle, over `models.keep_alive_s`: `0` unloads it when idle, a duration after that long,
/// a negative value keeps it; a request with no prompt and `keep_alive: 0` is Ollama's unload
/// call; an unreadable value is a 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_keep_alive_decides_when_its_model_unloads() {
    let smol = std::fs::canonicalize(default_model_path()).unwrap();
    let dir = folder("keepalive", &[("kr-smol", smol)]);
    // the config would keep an idle model five minutes
    let s = start_with(
        folder_config(&dir, 0, 300),
        Arc::new(pool_manager::candle::CandleFactory),
    )
    .await;
    let ask = |keep: serde_json::Value| {
        json!({"model": "kr-smol", "prompt": "Hi", "stream": false,
               "options": {"num_predict": 2}, "keep_alive": keep})
    };
    let (status, _) = generate(&s, ask(json!(0))).await;
    assert_eq!(status, 200);
    assert!(
        unloaded(&s, 5).await,
        "keep_alive 0: {:?}",
        pool_ids(&s).await
    );

    let (status, _) = generate(&s, ask(json!("1s"))).await;
    assert_eq!(status, 200);
    assert_eq!(pool_ids(&s).await, vec!["auto-kr-smol"]);
    assert!(
        unloaded(&s, 6).await,
        "keep_alive 1s: {:?}",
        pool_ids(&s).await
    );

    let (status, _) = generate(&s, ask(json!(-1))).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        pool_ids(&s).await,
        vec!["auto-kr-smol"],
        "keep_alive -1 stays"
    );
    let ps = s.get_json("/api/ps").await;
    assert!(ps["models"][0].get("expires_at").is_none(), "-1: {ps}");
    // issue 49: `/api/ps` says when a model loaded on demand unloads if unused
    let (status, _) = generate(&s, ask(json!("5m"))).await;
    assert_eq!(status, 200);
    let ps = s.get_json("/api/ps").await;
    let at = ps["models"][0]["expires_at"]
        .as_str()
        .unwrap_or_else(|| panic!("{ps}"));
    let left = humantime::parse_rfc3339(at)
        .unwrap()
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(
        (Duration::from_secs(240)..=Duration::from_secs(300)).contains(&left),
        "{ps}"
    );

    // Ollama's unload call: no prompt, keep_alive 0
    let (status, v) = generate(
        &s,
        json!({"model": "kr-smol", "keep_alive": 0, "stream": false}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["done_reason"], "unload", "{v}");
    assert!(
        unloaded(&s, 5).await,
        "the unload call: {:?}",
        pool_ids(&s).await
    );

    let (status, v) = generate(&s, ask(json!("soon"))).await;
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("keep_alive"), "{v}");
    let _ = std::fs::remove_dir_all(dir);
}

/// MOD-FOLDER-6, EMB-API-2: Ollama's `/api/embed` and `/api/embeddings` follow `keep_alive`
/// as its generate does, for an embedding model of the folder (all-MiniLM-L6-v2): `0` unloads
/// it once idle, `-1` keeps it, a duration after that long; a call with no input is Ollama's
/// load or unload call (no vectors), 404 for a model no pool serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_requests_keep_alive_decides_when_its_model_unloads() {
    let minilm = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models/all-MiniLM-L6-v2.F16.gguf");
    assert!(minilm.exists(), "run ci/minilm_gguf.py first");
    let dir = folder(
        "embedkeep",
        &[("ke-minilm", std::fs::canonicalize(minilm).unwrap())],
    );
    // the config would keep an idle model five minutes
    let s = start_with(
        folder_config(&dir, 0, 300),
        Arc::new(pool_manager::candle::CandleFactory),
    )
    .await;
    let post = |path: &'static str, body: serde_json::Value| {
        let s = &s;
        async move {
            let r = s.post(path, &body).await;
            let status = r.status().as_u16();
            (
                status,
                r.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };
    let embed = |keep: serde_json::Value| json!({"model": "ke-minilm", "input": ["Why is the sky blue?"], "keep_alive": keep});

    let (status, v) = post("/api/embed", embed(json!(0))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["embeddings"][0].as_array().map(Vec::len),
        Some(384),
        "{v}"
    );
    assert!(
        unloaded(&s, 5).await,
        "keep_alive 0: {:?}",
        pool_ids(&s).await
    );

    let (status, v) = post("/api/embed", embed(json!(-1))).await;
    assert_eq!(status, 200, "{v}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        pool_ids(&s).await,
        vec!["auto-ke-minilm"],
        "keep_alive -1 stays"
    );

    // Ollama's unload call: no input, keep_alive 0
    let (status, v) = post(
        "/api/embed",
        json!({"model": "ke-minilm", "input": [], "keep_alive": 0}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["embeddings"], json!([]), "{v}");
    assert!(
        unloaded(&s, 5).await,
        "the unload call: {:?}",
        pool_ids(&s).await
    );
    let (status, v) = post("/api/embed", json!({"model": "ke-minilm"})).await;
    assert_eq!(status, 404, "no pool serves it now: {v}");

    // the older route
    let (status, v) = post(
        "/api/embeddings",
        json!({"model": "ke-minilm", "prompt": "Why is grass green?", "keep_alive": "1s"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["embedding"].as_array().map(Vec::len), Some(384), "{v}");
    assert_eq!(pool_ids(&s).await, vec!["auto-ke-minilm"]);
    assert!(
        unloaded(&s, 6).await,
        "keep_alive 1s: {:?}",
        pool_ids(&s).await
    );

    let (status, v) = post("/api/embed", embed(json!("soon"))).await;
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("keep_alive"), "{v}");
    let _ = std::fs::remove_dir_all(dir);
}

/// MOD-FOLDER-8: a configured pool counts in the memory budget and is pinned: Gemma 3 alone
/// fits the budget but not beside the configured SmolLM2 pool, so a request for it is a 400
/// saying what the configured pools hold, and the configured pool goes on answering; with
/// room for both, Gemma loads beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_pools_count_in_the_budget_and_stay() {
    let dir = folder("pinned", &[("pin-gemma", gemma_path())]);
    let start = |budget_mib: u64| {
        let mut cfg = folder_config(&dir, budget_mib, 300);
        cfg.pools = vec![orchestratord::config::PoolConfig {
            alias: Some("pinned-smol".into()),
            slots: 1,
            ctx: 512,
            ..orchestratord::config::PoolConfig::new("p1", &default_model_path())
        }];
        start_with(cfg, Arc::new(pool_manager::candle::CandleFactory))
    };
    // Gemma's estimate: 241 MiB of file + 64 MiB of KV cache = 305 MiB < 340 MiB
    let s = start(340).await;
    let r = chat(&s, "pin-gemma", "Hi").await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.contains("configured pools"), "{v}");
    assert_eq!(v["error"]["param"], "model", "{v}");
    assert_eq!(pool_ids(&s).await, vec!["p1"]);
    assert_eq!(chat(&s, "pinned-smol", "Hi").await.status(), 200);
    // issue 49 (Ollama's habits on a configured pool): its unload call says it stays loaded
    // (`load` and a notice), `/api/ps` gives it no expiry, `/api/show` says tools work, and
    // a `num_ctx` over the 512 served is the 512 served, as Ollama clamps
    let r = s
        .post(
            "/api/generate",
            &json!({"model": "pinned-smol", "keep_alive": 0, "stream": false}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let notice = r.headers().get("x-orchd-notice").cloned();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["done_reason"], "load", "{v}");
    assert!(notice.is_some_and(|n| n.to_str().unwrap().contains("stays loaded")));
    assert_eq!(pool_ids(&s).await, vec!["p1"]);
    let ps = s.get_json("/api/ps").await;
    assert_eq!(ps["models"][0]["name"], "pinned-smol", "{ps}");
    assert!(ps["models"][0].get("expires_at").is_none(), "{ps}");
    let show: serde_json::Value = s
        .post("/api/show", &json!({"model": "pinned-smol"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        show["capabilities"],
        json!(["completion", "tools"]),
        "{show}"
    );
    let (status, v) = generate(
        &s,
        json!({"model": "pinned-smol", "prompt": "Hi", "stream": false,
               "options": {"num_predict": 2, "num_ctx": 100000}}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    drop(s);
    let s = start(1024).await;
    assert_eq!(chat(&s, "pin-gemma", "Hi").await.status(), 200);
    let mut ids = pool_ids(&s).await;
    ids.sort();
    assert_eq!(ids, vec!["auto-pin-gemma", "p1"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// MOD-FOLDER-2 (issue 49): ten concurrent first requests for a model that needs another
/// evicted all wait for the one load (before: 1-3 of them were 503 `POOL_UNAVAILABLE`, "busy
/// hold …", as each made room for a copy of its own), back and forth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_wait_for_the_one_load() {
    let smol = std::fs::canonicalize(default_model_path()).unwrap();
    let dir = folder("burst", &[("burst-a", smol.clone()), ("burst-b", smol)]);
    // SmolLM2 (94 MiB) with a 64 MiB KV budget: one fits in 200, not two
    let s = Arc::new(
        start_with(
            folder_config(&dir, 200, 0),
            Arc::new(pool_manager::candle::CandleFactory),
        )
        .await,
    );
    assert_eq!(chat(&s, "burst-a", "Hi").await.status(), 200);
    for model in ["burst-b", "burst-a", "burst-b"] {
        let answers = futures::future::join_all((0..10).map(|i| {
            let s = s.clone();
            async move {
                let r = chat(&s, model, &format!("Say {i}.")).await;
                (r.status().as_u16(), r.text().await.unwrap_or_default())
            }
        }))
        .await;
        let refused: Vec<_> = answers.iter().filter(|(st, _)| *st != 200).collect();
        assert!(refused.is_empty(), "{model}: {refused:?}");
        assert_eq!(pool_ids(&s).await, vec![format!("auto-{model}")]);
    }
    let _ = std::fs::remove_dir_all(dir);
}
