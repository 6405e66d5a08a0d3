//! LLS-API-1..4 (issue 50): llama-server's native routes — `/completion` (whole and streamed),
//! `/props`, `/slots`, `/health` where configured — answered in llama-server's shapes, checked field by field against its
//! own responses to the same requests on the same model (recorded once from llama.cpp's
//! `llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf -c 2048 -np 2`, build b1-0c1e570, the
//! llama.cpp of llama-cpp-python 0.3.36: `tests/fixtures/llama_server/`). Every difference is
//! one this server declares (`adapters/llama_server/mod.rs`); a field that goes missing or
//! changes type fails. A real server process, the real model, real sockets; a full queue
//! answers 429 with `Retry-After` here as on every route.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use support::procs::*;

fn fixture(name: &str) -> String {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llama_server")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&fixture(name)).unwrap()
}

/// llama-server's sampler knobs and internals this engine does not have: absent from
/// `generation_settings` / `params` here.
const SAMPLERS_NOT_HERE: &[&str] = &[
    "dynatemp_range",
    "dynatemp_exponent",
    "top_n_sigma",
    "xtc_probability",
    "xtc_threshold",
    "typical_p",
    "repeat_last_n",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "adaptive_target",
    "adaptive_decay",
    "n_keep",
    "n_discard",
    "ignore_eos",
    "logit_bias",
    "min_keep",
    "grammar",
    "grammar_lazy",
    "grammar_triggers",
    "preserved_tokens",
    "chat_format",
    "reasoning_format",
    "reasoning_in_content",
    "generation_prompt",
    "samplers",
    "speculative.types",
    "timings_per_token",
    "post_sampling_probs",
    "backend_sampling",
    "lora",
];

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Where `ours` differs from `theirs` in shape: fields of theirs missing from ours
/// (`-path`) and fields of another JSON type (`~path`), the sampler knobs left out.
fn shape_diff(theirs: &Value, ours: &Value, path: &str, out: &mut BTreeSet<String>) {
    match (theirs, ours) {
        (Value::Object(t), Value::Object(o)) => {
            for (k, tv) in t {
                let p = format!("{path}.{k}");
                let in_settings = path.ends_with("generation_settings") || path.ends_with("params");
                match o.get(k) {
                    None if in_settings && SAMPLERS_NOT_HERE.contains(&k.as_str()) => {}
                    None => {
                        out.insert(format!("-{p}"));
                    }
                    Some(ov) => shape_diff(tv, ov, &p, out),
                }
            }
        }
        (Value::Array(t), Value::Array(o)) => {
            if let (Some(tv), Some(ov)) = (t.first(), o.first()) {
                shape_diff(tv, ov, &format!("{path}[]"), out);
            }
        }
        (t, o) if kind(t) != kind(o) => {
            out.insert(format!("~{path}"));
        }
        _ => {}
    }
}

fn differences(theirs: &Value, ours: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    shape_diff(theirs, ours, "", &mut out);
    out
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The `data:` lines of an SSE body, as JSON.
fn data_lines(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

async fn post(base: &str, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn llama_servers_routes_answer_in_its_shapes() {
    let model = support::default_model_path();
    let (_p, base) = server(&format!(
        "[http]\nhealth_shape = \"llama-server\"\n[queue]\ncapacity = 2\n[[pools]]\nid = \"default\"\nmodel = \"{model}\"\nslots = 2\nctx = 1024\nthreads = 2\n"
    ))
    .await;

    // /health (LLS-API-4), as configured: llama-server's body, not Kolosal's
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(
        health.json::<Value>().await.unwrap(),
        fixture_json("health.json")
    );
    let kolosal = get_json(&format!("{base}/status")).await;
    assert_eq!(kolosal["status"], "healthy", "{kolosal}");

    // /props
    let props: Value = reqwest::get(format!("{base}/props"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        differences(&fixture_json("props.json"), &props),
        set(&[
            "-.bos_token",
            "-.chat_template_caps",
            "-.cors_proxy_enabled",
            "-.eos_token",
            "-.is_sleeping",
            "-.media_marker",
            "-.ui",
            "-.ui_settings"
        ]),
        "{props}"
    );
    assert_eq!(props["total_slots"], 2);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 1024);
    assert_eq!(props["model_ftype"], "Q4_1");
    assert_eq!(props["model_path"], model);
    // the model's own template, as llama-server reads it
    assert_eq!(
        props["chat_template"],
        fixture_json("props.json")["chat_template"]
    );

    // /completion, greedy: llama-server's text, its token counts and its stop type
    let theirs = fixture_json("completion.json");
    let r = post(
        &base,
        "/completion",
        &json!({"prompt": "1, 2, 3, 4,", "n_predict": 6, "temperature": 0}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let ours: Value = r.json().await.unwrap();
    assert_eq!(
        differences(&theirs, &ours),
        set(&["-.id_slot", "-.tokens", "-.tokens_cached"]),
        "{ours}"
    );
    for f in [
        "content",
        "tokens_predicted",
        "tokens_evaluated",
        "stop_type",
        "stop",
    ] {
        assert_eq!(ours[f], theirs[f], "{f}: {ours}");
    }
    assert!(ours["timings"]["predicted_per_second"].as_f64().unwrap() > 0.0);

    // streamed: one line a token, then the whole answer's line
    let theirs = data_lines(&fixture("completion_stream.txt"));
    let r = post(
        &base,
        "/completion",
        &json!({"prompt": "1, 2, 3, 4,", "n_predict": 3, "temperature": 0, "stream": true}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let ours = data_lines(&r.text().await.unwrap());
    assert_eq!(ours.len(), theirs.len(), "{ours:?}");
    assert_eq!(
        differences(&theirs[0], &ours[0]),
        set(&["-.id_slot", "-.tokens"])
    );
    let (t_last, o_last) = (theirs.last().unwrap(), ours.last().unwrap());
    assert_eq!(
        differences(t_last, o_last),
        set(&["-.id_slot", "-.tokens", "-.tokens_cached"])
    );
    let text = |v: &[Value]| -> String { v.iter().filter_map(|l| l["content"].as_str()).collect() };
    assert_eq!(text(&ours), text(&theirs));
    assert_eq!(o_last["stop"], true);

    // n_probs: each token's log-probability and the likeliest
    let theirs = fixture_json("completion_n_probs.json");
    let ours: Value = post(
        &base,
        "/completion",
        &json!({"prompt": "1, 2, 3, 4,", "n_predict": 2, "temperature": 0, "n_probs": 2}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        differences(
            &theirs["completion_probabilities"],
            &ours["completion_probabilities"]
        ),
        set(&["-[].id", "-[].top_logprobs[].id"]),
        "{ours}"
    );
    assert_eq!(
        ours["completion_probabilities"][0]["top_logprobs"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );

    // /slots: idle, then one running a long completion
    let idle: Value = reqwest::get(format!("{base}/slots"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(idle.as_array().map(Vec::len), Some(2), "{idle}");
    assert_eq!(idle[0]["is_processing"], false);
    assert_eq!(idle[0]["n_ctx"], 1024);
    let long = tokio::spawn({
        let base = base.clone();
        async move {
            post(
                &base,
                "/completion",
                &json!({"prompt": "Once upon a time", "n_predict": 200, "temperature": 0}),
            )
            .await
            .status()
        }
    });
    let mut busy = Value::Null;
    for _ in 0..200 {
        let s: Value = reqwest::get(format!("{base}/slots"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if s[0]["is_processing"] == true {
            busy = s[0].clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        differences(&fixture_json("slot_busy.json"), &busy),
        // the task's id is this server's (a UUID string, not a counter); prompt progress is
        // the engine's; whether its client streams is the client's connection's
        set(&[
            "-.n_prompt_tokens_cache",
            "-.n_prompt_tokens_processed",
            "-.params.stream",
            "~.id_task"
        ]),
        "{busy}"
    );
    assert_eq!(busy["params"]["n_predict"], 200);
    assert_eq!(busy["n_prompt_tokens"], 4, "{busy}");
    assert_eq!(long.await.unwrap(), 200);

    // a bad request is a 400 naming the field; a GBNF grammar is refused saying why
    let r = post(&base, "/completion", &json!({"prompt": 5})).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "prompt", "{e}");
    let r = post(
        &base,
        "/completion",
        &json!({"prompt": "Yes or no?", "grammar": "root ::= \"yes\" | \"no\""}),
    )
    .await;
    assert_eq!(r.status(), 400);
    // a Lark grammar is followed
    let r: Value = post(
        &base,
        "/completion",
        &json!({"prompt": "Yes or no?", "n_predict": 4, "grammar": "start: \"yes\" | \"no\""}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert!(r["content"] == "yes" || r["content"] == "no", "{r}");

    // through admission like every route: a full queue says when to come back
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let base = base.clone();
            tokio::spawn(async move {
                let r = post(
                    &base,
                    "/completion",
                    &json!({"prompt": "Once upon a time", "n_predict": 64, "temperature": 0}),
                )
                .await;
                let retry = r.headers().get("retry-after").is_some();
                (r.status().as_u16(), retry)
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for b in burst {
        statuses.push(b.await.unwrap());
    }
    assert!(statuses.iter().any(|(s, _)| *s == 200), "{statuses:?}");
    assert!(
        statuses.iter().any(|(s, retry)| *s == 429 && *retry),
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|(s, _)| *s == 200 || *s == 429),
        "{statuses:?}"
    );
}

/// The busy slot of `/slots` as `key` sees it, while a completion of `owner_key` runs.
async fn busy_slot(base: &str, key: &str) -> Value {
    let c = reqwest::Client::new();
    for _ in 0..400 {
        let s: Value = c
            .get(format!("{base}/slots"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(busy) = s
            .as_array()
            .and_then(|a| a.iter().find(|x| x["is_processing"] == true))
        {
            return busy.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no busy slot seen by {key}");
}

/// LLS-API-2: `/slots` shows every tenant that a slot is busy, but a task's id only to its
/// own tenant and to admins (a task id opens its stream and its record to whoever holds it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slots_show_a_task_id_to_its_own_tenant_only() {
    let model = support::default_model_path();
    let (_p, base) = server(&format!(
        "[auth]\nkeys = [\"alice:data:ka-key\", \"bob:data:kb-key\", \"ops:admin:ops-key\"]\n[[pools]]\nid = \"default\"\nmodel = \"{model}\"\nslots = 2\nctx = 1024\nthreads = 2\n"
    ))
    .await;
    let long = tokio::spawn({
        let base = base.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{base}/completion"))
                .bearer_auth("ka-key")
                .json(&json!({"prompt": "Once upon a time", "n_predict": 300, "temperature": 0}))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    let mine = busy_slot(&base, "ka-key").await;
    assert!(mine["id_task"].is_string(), "{mine}");
    let admin = busy_slot(&base, "ops-key").await;
    assert_eq!(admin["id_task"], mine["id_task"], "{admin}");
    let other = busy_slot(&base, "kb-key").await;
    assert!(other.get("id_task").is_none(), "{other}");
    assert_eq!(other["params"]["n_predict"], 300, "{other}");
    assert_eq!(long.await.unwrap(), 200);
}

/// The text of each prompt's lines of a streamed several-prompt answer, by `index`, and how
/// many last lines (`stop: true`) came.
fn streamed_by_index(lines: &[Value]) -> (Vec<String>, usize) {
    let mut texts = vec![String::new(); 2];
    let mut ends = 0;
    for l in lines {
        let i = l["index"].as_u64().unwrap() as usize;
        texts[i].push_str(l["content"].as_str().unwrap());
        ends += usize::from(l["stop"] == true);
    }
    (texts, ends)
}

/// LLS-API-1: `/completion`'s prompt as token ids, ids mixed with text, and several prompts
/// (an array of answers by `index`, or one stream of both), as llama-server takes them;
/// checked against llama-server's own answer to the same ids (`completion_n_probs.json`:
/// `[16, 28, 216]`). OpenAI's `/v1/completions` takes ids too, through the same path.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prompts_of_token_ids_and_several_prompts_are_taken_as_llama_server_takes_them() {
    let model = support::default_model_path();
    let (_p, base) = server(&format!(
        "[[pools]]\nid = \"default\"\nmodel = \"{model}\"\nslots = 2\nctx = 1024\nthreads = 2\n"
    ))
    .await;
    // ids: llama-server's answer to the same ids, greedy
    let theirs = fixture_json("completion_n_probs.json");
    let r = post(
        &base,
        "/completion",
        &json!({"prompt": [16, 28, 216], "n_predict": 2, "temperature": 0, "n_probs": 2}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let ours: Value = r.json().await.unwrap();
    for f in [
        "content",
        "tokens_predicted",
        "tokens_evaluated",
        "stop_type",
    ] {
        assert_eq!(ours[f], theirs[f], "{f}: {ours}");
    }
    // the same likeliest tokens at each step, in the same order, their log-probabilities near
    // llama.cpp's (the kernels differ in rounding: 0.05 on the chosen tokens, 0.28 on the
    // second step's runner-up, measured)
    for step in 0..2 {
        let (t, o) = (
            &theirs["completion_probabilities"][step],
            &ours["completion_probabilities"][step],
        );
        for k in 0..2 {
            let (tt, ot) = (&t["top_logprobs"][k], &o["top_logprobs"][k]);
            assert_eq!(ot["token"], tt["token"], "step {step}: {ours}");
            let d = ot["logprob"].as_f64().unwrap() - tt["logprob"].as_f64().unwrap();
            assert!(d.abs() < 0.4, "step {step}, {k}: {d} ({ours})");
        }
    }
    // the prompt shown is the ids' text (the control token's left out)
    assert_eq!(ours["prompt"], ", ", "{ours}");

    // ids mixed with text: the text tokenized in its place
    let c = reqwest::Client::new();
    let tok: Value = c
        .post(format!("{base}/tokenize"))
        .json(&json!({"content": "1, 2, 3, 4,"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<u64> = tok["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(ids.len() >= 4, "{tok}");
    let text_answer: Value = post(
        &base,
        "/completion",
        &json!({"prompt": "1, 2, 3, 4,", "n_predict": 6, "temperature": 0}),
    )
    .await
    .json()
    .await
    .unwrap();
    let mut mixed = vec![json!(ids[0]), json!(ids[1])];
    mixed.push(json!(text_of_ids(&c, &base, &ids[2..]).await));
    let r: Value = post(
        &base,
        "/completion",
        &json!({"prompt": mixed, "n_predict": 6, "temperature": 0}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(r["content"], text_answer["content"], "{r}");
    assert_eq!(r["tokens_evaluated"], ids.len(), "{r}");
    let r: Value = post(
        &base,
        "/completion",
        &json!({"prompt": ids, "n_predict": 6, "temperature": 0}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(r["content"], text_answer["content"], "{r}");
    assert_eq!(r["prompt"], "1, 2, 3, 4,", "{r}");

    // several prompts: an array of answers by index, each as it is alone
    let both = json!(["1, 2, 3, 4,", [16, 28, 216]]);
    let r = post(
        &base,
        "/completion",
        &json!({"prompt": both, "n_predict": 2, "temperature": 0}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let answers: Value = r.json().await.unwrap();
    let answers = answers.as_array().unwrap();
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[0]["index"], 0);
    assert_eq!(answers[1]["index"], 1);
    let first_two: String = text_answer["content"]
        .as_str()
        .unwrap()
        .chars()
        .take(answers[0]["content"].as_str().unwrap().chars().count())
        .collect();
    assert_eq!(answers[0]["content"], first_two.as_str());
    assert_eq!(answers[0]["tokens_predicted"], 2);
    assert_eq!(answers[1]["content"], theirs["content"]);
    assert_eq!(
        differences(&theirs, &answers[1]),
        set(&[
            "-.completion_probabilities",
            "-.id_slot",
            "-.tokens",
            "-.tokens_cached"
        ]),
    );
    // streamed: both prompts' lines, each its last line
    let r = post(
        &base,
        "/completion",
        &json!({"prompt": both, "n_predict": 2, "temperature": 0, "stream": true}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let lines = data_lines(&r.text().await.unwrap());
    let (texts, ends) = streamed_by_index(&lines);
    assert_eq!(ends, 2, "{lines:?}");
    assert_eq!(texts[0], answers[0]["content"].as_str().unwrap());
    assert_eq!(texts[1], answers[1]["content"].as_str().unwrap());

    // what is not of the vocabulary or not a prompt is a 400 naming it
    for (prompt, param) in [
        (json!([16, 99_999_999]), "prompt"),
        (json!([16, -1]), "prompt[1]"),
        (json!(["a", {}]), "prompt[1]"),
    ] {
        let r = post(&base, "/completion", &json!({"prompt": prompt})).await;
        assert_eq!(r.status(), 400, "{prompt}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["param"], param, "{e}");
    }

    // OpenAI's completions take ids (one prompt, or several as arrays of ids)
    let r: Value = post(
        &base,
        "/v1/completions",
        &json!({"prompt": [ids.clone(), [16, 28, 216]], "max_tokens": 2, "temperature": 0}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(r["choices"][0]["text"], answers[0]["content"], "{r}");
    assert_eq!(r["choices"][1]["text"], theirs["content"], "{r}");
    assert_eq!(
        r["usage"]["prompt_tokens"],
        ids.len() + 3,
        "exact counts: {r}"
    );
    let r = post(
        &base,
        "/v1/completions",
        &json!({"prompt": [16, 28, 216], "echo": true}),
    )
    .await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "echo", "{e}");
}

/// The text of `ids` as `/detokenize` gives it.
async fn text_of_ids(c: &reqwest::Client, base: &str, ids: &[u64]) -> String {
    let v: Value = c
        .post(format!("{base}/detokenize"))
        .json(&json!({ "tokens": ids }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["content"].as_str().unwrap().to_string()
}
