//! EMB-TASK-1, EMB-API-1..5 (issue 51): embeddings and rerank through a real server process on the real
//! encoder (all-MiniLM-L6-v2 from `ci/minilm_gguf.py`) and the tiny reranker: the official
//! `openai` and `ollama` clients and a Cohere-shaped rerank (`ci/embeddings_client_check.py`);
//! an embedding request is a task like any other — a full queue answers 429 with
//! `Retry-After`, the client leaving cancels it and frees its slot at once, the inputs of
//! concurrent requests share the engine's passes — and a model is asked only what it does.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::procs::*;

fn model(name: &str) -> String {
    let p = support::repo_root().join(".cache/models").join(name);
    assert!(p.exists(), "{} missing: run ci/minilm_gguf.py", p.display());
    p.display().to_string()
}

fn config(queue: usize) -> String {
    format!(
        "[queue]\ncapacity = {queue}\n[admission]\nmax_queue_wait_ms = 0\n\
         [[pools]]\nid = \"minilm\"\nmodel = \"{}\"\nalias = \"minilm\"\nslots = 2\nthreads = 2\n\
         [[pools]]\nid = \"reranker\"\nmodel = \"{}\"\nalias = \"reranker\"\nslots = 2\nthreads = 2\n\
         [[pools]]\nid = \"default\"\nmodel = \"{}\"\nslots = 1\nctx = 512\nthreads = 2\n",
        model("all-MiniLM-L6-v2.Q8_0.gguf"),
        model("tiny-bert-reranker.gguf"),
        support::default_model_path(),
    )
}

async fn post(base: &str, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    support::counter(&text, name)
}

/// `n` inputs of about `words` tokens each.
fn inputs(n: usize, words: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            (0..words)
                .map(|w| ["tide", "harbour", "gull", "reef", "mist"][(w * 7 + i) % 5])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embeddings_and_rerank_work_with_the_official_clients_as_tasks() {
    let (_p, base) = server(&config(64)).await;
    let stdout = support::run_sdk_script(
        "embeddings_client_check.py",
        &["--host".into(), base.clone().into()],
    )
    .await;
    assert!(stdout.contains("all embedding client checks passed"));

    // a model is asked only what it does
    let r = post(
        &base,
        "/v1/chat/completions",
        &json!({"model": "minilm", "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "model", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("embedding model"),
        "{e}"
    );

    // the task API: embed, its end event carrying the vectors; the record keeps none
    let r = post(
        &base,
        "/v1/tasks",
        &json!({"model": "minilm", "embed": {"input": ["a b c"]}}),
    )
    .await;
    assert_eq!(r.status(), 202);
    let id = r.json::<Value>().await.unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_string();
    let sse = reqwest::get(format!("{base}/v1/tasks/{id}/stream"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let end: Value = sse
        .split("\n\n")
        .find(|f| f.contains("event: end"))
        .and_then(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .unwrap_or_else(|| panic!("no end: {sse}"));
    assert_eq!(
        end["embeddings"][0][0].as_array().map(Vec::len),
        Some(384),
        "{end}"
    );
    let rec: Value = reqwest::get(format!("{base}/v1/tasks/{id}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        rec["record"]["terminal"].get("embeddings").is_none(),
        "{rec}"
    );
    assert!(
        rec["record"]["params"]
            .to_string()
            .contains("[redacted 5 chars]"),
        "{rec}"
    );
    assert_eq!(rec["record"]["prompt_tokens"], 5, "{rec}");
    let r = post(
        &base,
        "/v1/tasks",
        &json!({"model": "minilm", "embed": {"input": ["x"]}, "max_tokens": 3}),
    )
    .await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["field"], "max_tokens");

    // a decoder embeds too (llama-server's --embedding: mean over its last hidden states),
    // beside a stream it decodes
    let stream = tokio::spawn({
        let base = base.clone();
        async move {
            post(
                &base,
                "/v1/completions",
                &json!({"model": "SmolLM2-135M-Instruct.Q4_1",
                "prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}),
            )
            .await
            .json::<Value>()
            .await
            .unwrap()
        }
    });
    let r = post(
        &base,
        "/v1/embeddings",
        &json!({"model": "SmolLM2-135M-Instruct.Q4_1", "input": ["The sea is calm.", "Rates rose."]}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["data"][1]["embedding"].as_array().map(Vec::len),
        Some(576),
        "{v}"
    );
    let story = stream.await.unwrap();
    assert_eq!(story["choices"][0]["finish_reason"], "length", "{story}");
    assert_eq!(story["usage"]["completion_tokens"], 48, "{story}");

    // the inputs of concurrent requests share passes
    let (inputs_before, passes_before) = (
        metric(&base, "orchd_embedding_pass_inputs_total{pool=\"minilm\"}").await,
        metric(&base, "orchd_embedding_passes_total{pool=\"minilm\"}").await,
    );
    let texts = inputs(16, 200);
    let all: Vec<_> = texts
        .into_iter()
        .map(|t| {
            let base = base.clone();
            tokio::spawn(async move {
                post(
                    &base,
                    "/v1/embeddings",
                    &json!({"model": "minilm", "input": t}),
                )
                .await
                .status()
            })
        })
        .collect();
    for a in all {
        assert_eq!(a.await.unwrap(), 200);
    }
    // the metrics' upkeep refreshes the engine's counts
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let inputs_run =
        metric(&base, "orchd_embedding_pass_inputs_total{pool=\"minilm\"}").await - inputs_before;
    let passes =
        metric(&base, "orchd_embedding_passes_total{pool=\"minilm\"}").await - passes_before;
    assert_eq!(inputs_run, 16.0);
    assert!(passes < 16.0, "16 concurrent requests took {passes} passes");

    // the client leaving cancels the task and frees its slot at once
    let disconnects = metric(&base, "orchd_tasks_cancelled_total{reason=\"disconnect\"}").await;
    let long = inputs(48, 400);
    let health = || async {
        reqwest::get(format!("{base}/v1/pools/minilm/health"))
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    let request = reqwest::Client::new()
        .post(format!("{base}/v1/embeddings"))
        .json(&json!({"model": "minilm", "input": long}))
        .send();
    // the client leaves once its task runs (its slot taken), whatever the machine's pace
    let running = async {
        loop {
            let h = health().await;
            if h["slots_free"] != h["slots_total"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::select! {
        r = request => panic!("the long request ended before its client left: {r:?}"),
        _ = running => {}
    }
    let started = Instant::now();
    let mut freed = None;
    for _ in 0..100 {
        let h = health().await;
        if h["slots_free"] == h["slots_total"] {
            freed = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let freed = freed.expect("the slot was never freed");
    // a pass is at most 1024 tokens: the cancel waits for one at most
    assert!(
        freed < Duration::from_secs(4),
        "freed {freed:?} after the client left"
    );
    assert_eq!(
        metric(&base, "orchd_tasks_cancelled_total{reason=\"disconnect\"}").await - disconnects,
        1.0
    );
}

/// EMB-API-5: a full queue answers embedding requests 429 with `Retry-After`, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_refuses_embeddings_with_retry_after() {
    let (_p, base) = server(&config(1)).await;
    let burst: Vec<_> = (0..10)
        .map(|_| {
            let base = base.clone();
            tokio::spawn(async move {
                let r = post(
                    &base,
                    "/v1/embeddings",
                    &json!({"model": "minilm", "input": inputs(16, 300)}),
                )
                .await;
                (
                    r.status().as_u16(),
                    r.headers().get("retry-after").is_some(),
                )
            })
        })
        .collect();
    let mut seen = Vec::new();
    for b in burst {
        seen.push(b.await.unwrap());
    }
    assert!(seen.iter().any(|(s, _)| *s == 200), "{seen:?}");
    assert!(seen.iter().any(|(s, r)| *s == 429 && *r), "{seen:?}");
    assert!(seen.iter().all(|(s, _)| *s == 200 || *s == 429), "{seen:?}");
}
