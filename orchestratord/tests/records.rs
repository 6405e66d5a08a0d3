//! OPS-REC-1..OPS-REC-5: task records and artifacts that outlive the process — restarts (a
//! graceful one and a `kill -9`) of a real server on the real model keep every record and
//! artifact; content-addressed ids, tags, lineage, listing by tag and session, pages; tenants
//! see only their own; retention bounds the bytes; a full writer drops records, never tasks.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::procs::{scratch, server_env, Proc};
use support::{config, counter, default_model_path, pool, start};

const KEY: &str = "k-records-data-0a1b2c3d4e";
const OTHER: &str = "k-records-other-9f8e7d6c5b";

fn keys() -> String {
    format!("acme:data:{KEY},globex:data:{OTHER}")
}

/// A real-model server process whose records live in `db`.
async fn real_server(db: &std::path::Path) -> (Proc, String) {
    let cfg = format!(
        "[[pools]]\nid = \"p1\"\nmodel = \"{}\"\nslots = 2\nctx = 512\nthreads = 1\n",
        default_model_path()
    );
    let db = db.display().to_string();
    let keys = keys();
    let (p, base) = server_env(
        &cfg,
        &[("ORCHD_RECORDS_PATH", &db), ("ORCHD_API_KEYS", &keys)],
    )
    .await;
    let c = reqwest::Client::new();
    let until = Instant::now() + Duration::from_secs(60);
    while c
        .get(format!("{base}/readyz"))
        .send()
        .await
        .map(|r| r.status() != 200)
        .unwrap_or(true)
    {
        assert!(Instant::now() < until, "not ready: {}", p.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (p, base)
}

async fn call(
    method: reqwest::Method,
    url: String,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = reqwest::Client::new().request(method, url).bearer_auth(key);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn get(base: &str, path: &str, key: &str) -> (u16, Value) {
    call(reqwest::Method::GET, format!("{base}{path}"), key, None).await
}

async fn post(base: &str, path: &str, key: &str, body: Value) -> (u16, Value) {
    call(
        reqwest::Method::POST,
        format!("{base}{path}"),
        key,
        Some(body),
    )
    .await
}

/// Submits a task and waits for its end; returns its id.
async fn run_task(base: &str, body: Value) -> String {
    let (s, v) = post(base, "/v1/tasks", KEY, body).await;
    assert_eq!(s, 202, "{v}");
    let id = v["task_id"].as_str().unwrap().to_string();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, st) = get(base, &format!("/v1/tasks/{id}"), KEY).await;
        if st["state"] == "completed" {
            return id;
        }
        assert!(Instant::now() < until, "task did not complete: {st}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for a process that was asked to stop.
async fn wait_exit(p: &mut Proc) {
    let until = Instant::now() + Duration::from_secs(30);
    while p.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "did not exit: {}", p.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ids(list: &Value) -> Vec<String> {
    list["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect()
}

/// OPS-REC-1: what a server ran and stored is read back by the next process on the same
/// database — after a graceful stop (SIGTERM) and after `kill -9` once the batch was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_and_artifacts_survive_restarts() {
    let db = scratch("records-restart").join("records.sqlite3");
    let (mut first, base) = real_server(&db).await;
    let task = run_task(
        &base,
        json!({"prompt": "Name three colours:", "max_tokens": 8, "seed": 7, "session_id": "s-rec"}),
    )
    .await;
    let (_, chat) = post(
        &base,
        "/v1/chat/completions",
        KEY,
        json!({"model": "p1", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    )
    .await;
    let chat_task = chat["id"]
        .as_str()
        .unwrap()
        .strip_prefix("chatcmpl-")
        .unwrap()
        .to_string();
    let (_, record_before) = get(&base, &format!("/v1/artifacts/{task}"), KEY).await;
    assert_eq!(record_before["tokens_out"], 8, "{record_before}");
    let plan_body = json!({"kind": "plan", "content": {"steps": ["read", "write"], "goal": "x"},
        "tags": ["project:alpha"], "session_id": "s-rec", "task_id": task});
    let (s, plan) = post(&base, "/v1/artifacts", KEY, plan_body.clone()).await;
    assert_eq!(s, 201, "{plan}");
    let plan_id = plan["id"].as_str().unwrap().to_string();
    let (s, summary) = post(
        &base,
        "/v1/artifacts",
        KEY,
        json!({"kind": "summary", "content": "two steps", "parents": [plan_id], "tags": ["project:alpha"], "session_id": "s-rec"}),
    )
    .await;
    assert_eq!(s, 201, "{summary}");
    first.signal("-TERM");
    wait_exit(&mut first).await;

    let (mut second, base) = real_server(&db).await;
    let (s, status) = get(&base, &format!("/v1/tasks/{task}"), KEY).await;
    assert_eq!(s, 200, "{status}");
    assert_eq!(status["state"], "completed");
    assert_eq!(
        status["record"], record_before,
        "the stored record is the record"
    );
    let (s, chat_record) = get(&base, &format!("/v1/artifacts/{chat_task}"), KEY).await;
    assert_eq!(s, 200, "{chat_record}");
    assert_eq!(chat_record["tokens_out"], 4);
    let (s, got) = get(&base, &format!("/v1/artifacts/{plan_id}"), KEY).await;
    assert_eq!(s, 200);
    assert_eq!(got["content"], plan_body["content"]);
    assert_eq!(got["task_id"], task.as_str());
    // the same plan again (keys reordered): the same id, and its tags now include the new one
    let (s, again) = post(
        &base,
        "/v1/artifacts",
        KEY,
        json!({"content": {"goal": "x", "steps": ["read", "write"]}, "kind": "plan", "tags": ["reviewed"]}),
    )
    .await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["id"], plan_id.as_str());
    assert_eq!(again["tags"], json!(["project:alpha", "reviewed"]));
    let later = run_task(
        &base,
        json!({"prompt": "Say yes:", "max_tokens": 3, "session_id": "s-rec"}),
    )
    .await;
    // longer than the writer's batch window, then no goodbye at all
    tokio::time::sleep(Duration::from_millis(500)).await;
    second.signal("-KILL");
    wait_exit(&mut second).await;

    let (_third, base) = real_server(&db).await;
    let (s, status) = get(&base, &format!("/v1/tasks/{later}"), KEY).await;
    assert_eq!(s, 200, "written before the kill: {status}");
    assert_eq!(status["record"]["tokens_out"], 3);
    let (_, by_session) = get(&base, "/v1/artifacts?session_id=s-rec", KEY).await;
    let listed = ids(&by_session);
    let summary_id = summary["id"].as_str().unwrap().to_string();
    for want in [&later, &summary_id, &plan_id, &task] {
        assert!(listed.contains(want), "{want} in {listed:?}");
    }
    assert!(!listed.contains(&chat_task), "the chat had no session");
    let (_, by_tag) = get(&base, "/v1/artifacts?tag=reviewed", KEY).await;
    assert_eq!(ids(&by_tag), std::slice::from_ref(&plan_id));
    let (_, summary_now) = get(&base, &format!("/v1/artifacts/{summary_id}"), KEY).await;
    assert_eq!(summary_now["parents"], json!([plan_id]), "lineage");
    let (_, records) = get(&base, "/v1/artifacts?kind=task_record", KEY).await;
    assert_eq!(
        records["artifacts"].as_array().unwrap().len(),
        3,
        "{records}"
    );
}

/// OPS-REC-2, OPS-REC-3: content addresses, typed refusals, pages, and tenants.
#[tokio::test]
async fn artifacts_are_addressed_checked_paged_and_private() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.auth.keys = vec![format!("acme:data:{KEY}"), format!("globex:data:{OTHER}")];
    cfg.records.max_artifact_bytes = 1024;
    let s = start(cfg, Duration::from_millis(1)).await;
    let base = s.base.as_str();
    let (st, a) = post(
        base,
        "/v1/artifacts",
        KEY,
        json!({"kind": "trace", "content": [1, 2]}),
    )
    .await;
    assert_eq!(st, 201);
    let id = a["id"].as_str().unwrap();
    // the id is the SHA-256 of the canonical JSON of kind, content and parents
    let canonical = r#"{"content":[1,2],"kind":"trace","parents":[]}"#;
    use sha2::Digest;
    let want = format!("sha256:{}", hex::encode(sha2::Sha256::digest(canonical)));
    assert_eq!(id, want);
    assert_eq!(a["bytes"], 5);

    for (body, status, field) in [
        (json!({"kind": "Plan!", "content": 1}), 400, "kind"),
        (json!({"kind": "task_record", "content": 1}), 400, "kind"),
        (
            json!({"kind": "plan", "content": 1, "tags": ["a b"]}),
            400,
            "tags",
        ),
        (
            json!({"kind": "plan", "content": 1, "parents": ["t-1"]}),
            400,
            "parents",
        ),
        (
            json!({"kind": "plan", "content": 1, "parents": [format!("sha256:{}", "0".repeat(64))]}),
            400,
            "parents",
        ),
        (
            json!({"kind": "plan", "content": "x".repeat(2000)}),
            413,
            "content",
        ),
        (
            json!({"kind": "plan", "content": 1, "colour": "red"}),
            400,
            "colour",
        ),
    ] {
        let (st, e) = post(base, "/v1/artifacts", KEY, body.clone()).await;
        assert_eq!(st, status, "{body} -> {e}");
        assert_eq!(e["field"], field, "{body} -> {e}");
    }
    for q in ["limit=0", "limit=501", "before=nope", "colour=red"] {
        let (st, e) = get(base, &format!("/v1/artifacts?{q}"), KEY).await;
        assert_eq!(st, 400, "{q} -> {e}");
        assert_eq!(e["code"], "INVALID_PARAMS");
    }

    // pages of 2 walk all 6, newest first, each once
    let mut posted = vec![id.to_string()];
    for i in 0..5 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let (_, a) = post(
            base,
            "/v1/artifacts",
            KEY,
            json!({"kind": "note", "content": i, "tags": ["page"]}),
        )
        .await;
        posted.push(a["id"].as_str().unwrap().to_string());
    }
    let mut walked = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("/v1/artifacts?limit=2&before={}", urlencode(c)),
            None => "/v1/artifacts?limit=2".to_string(),
        };
        let (st, page) = get(base, &q, KEY).await;
        assert_eq!(st, 200, "{page}");
        walked.extend(ids(&page));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    posted.reverse();
    assert_eq!(walked, posted);
    let (_, tagged) = get(base, "/v1/artifacts?tag=page&limit=500", KEY).await;
    assert_eq!(ids(&tagged).len(), 5);

    // another tenant neither reads nor lists them, and its own copy is its own
    let (st, _) = get(base, &format!("/v1/artifacts/{id}"), OTHER).await;
    assert_eq!(st, 404);
    let (_, theirs) = get(base, "/v1/artifacts", OTHER).await;
    assert!(ids(&theirs).is_empty(), "{theirs}");
    let (st, _) = post(
        base,
        "/v1/artifacts",
        OTHER,
        json!({"kind": "plan", "content": 1, "parents": [id]}),
    )
    .await;
    assert_eq!(st, 400, "a parent of another tenant is unknown");
    let (st, copy) = post(
        base,
        "/v1/artifacts",
        OTHER,
        json!({"kind": "trace", "content": [1, 2]}),
    )
    .await;
    assert_eq!((st, copy["id"].as_str()), (201, Some(id)));
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// OPS-REC-4: the stored bytes stay under `records.max_bytes`; the oldest go first.
#[tokio::test]
async fn retention_keeps_the_store_under_its_bytes() {
    let dir = scratch("records-retention");
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.records.path = dir.join("r.sqlite3").display().to_string();
    cfg.records.max_bytes = 8 * 1024;
    cfg.records.max_artifact_bytes = 1024;
    let s = start(cfg, Duration::from_millis(1)).await;
    let mut posted = Vec::new();
    for i in 0..40 {
        // ~1000 bytes each: 40 kB posted into an 8 kB store
        let r = s
            .post(
                "/v1/artifacts",
                &json!({"kind": "note", "content": format!("{i:04}{}", "x".repeat(990))}),
            )
            .await;
        assert_eq!(r.status(), 201);
        let a: Value = r.json().await.unwrap();
        posted.push(a["id"].as_str().unwrap().to_string());
    }
    let stored: u64 = s.state.records.total_bytes();
    assert!(stored <= 8 * 1024, "stored {stored} bytes");
    let status = |id: &str| {
        let url = s.url(&format!("/v1/artifacts/{id}"));
        let c = s.client.clone();
        async move { c.get(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status(&posted[0]).await, 404, "the oldest went first");
    assert_eq!(status(&posted[39]).await, 200, "the newest stays");
    let m = s.metrics().await;
    assert!(
        counter(&m, "orchd_records_pruned_total{reason=\"bytes\"}") >= 30.0,
        "{m}"
    );
}

/// OPS-REC-5: a task's end never waits for the store. Another process holds the database's
/// write lock (an operator's backup, say): the writer is stuck, its queue fills, and every task
/// still completes while the lock is held; the records that did not fit are counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_store_drops_records_not_tasks() {
    let db = scratch("records-stuck").join("r.sqlite3");
    let mut cfg = config(vec![pool("p1", 8)]);
    cfg.records.path = db.display().to_string();
    cfg.records.queue_capacity = 2;
    cfg.records.batch_ms = 1;
    let s = start(cfg, Duration::from_millis(1)).await;
    let holder = rusqlite::Connection::open(&db).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let mut ids = Vec::new();
    for i in 0..16 {
        ids.push(
            s.submit_ok(json!({"prompt": format!("p{i}"), "max_tokens": 2}))
                .await,
        );
    }
    for id in &ids {
        let ev = s.stream_all(id).await;
        assert_eq!(ev.last().unwrap().event, "end", "{id}: {ev:?}");
    }
    let m = s.metrics().await;
    let dropped = counter(&m, "orchd_records_dropped_total");
    holder.execute_batch("COMMIT").unwrap();
    assert!(dropped >= 1.0, "{m}");
    // the store works again once the lock is gone
    let r = s
        .post(
            "/v1/artifacts",
            &json!({"kind": "note", "content": "after"}),
        )
        .await;
    assert_eq!(r.status(), 201);
}

/// OPS-REC-6: the database file deleted under the running server is noticed, not written
/// into the void (issue 32: artifact posts still answered 201 and the write counter rose,
/// with nothing stored and nothing logged): artifact posts are 503 `RECORDS_UNAVAILABLE`,
/// task records are counted as dropped, and tasks still complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_store_file_refuses_artifacts_and_keeps_serving() {
    let db = scratch("records-deleted").join("r.sqlite3");
    let mut cfg = config(vec![pool("p1", 2)]);
    cfg.records.path = db.display().to_string();
    cfg.records.batch_ms = 1;
    let s = start(cfg, Duration::from_millis(1)).await;
    let r = s
        .post(
            "/v1/artifacts",
            &json!({"kind": "note", "content": "before"}),
        )
        .await;
    assert_eq!(r.status(), 201);
    std::fs::remove_file(&db).unwrap();
    let before = counter(&s.metrics().await, "orchd_records_dropped_total");
    let r = s
        .post(
            "/v1/artifacts",
            &json!({"kind": "note", "content": "after"}),
        )
        .await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "RECORDS_UNAVAILABLE", "{v}");
    assert!(v["message"].as_str().unwrap().contains("gone"), "{v}");
    let id = s.submit_ok(json!({"prompt": "x", "max_tokens": 2})).await;
    let ev = s.stream_all(&id).await;
    assert_eq!(ev.last().unwrap().event, "end", "{ev:?}");
    let dropped = support::procs::eventually(Duration::from_secs(5), || async {
        counter(&s.metrics().await, "orchd_records_dropped_total") > before
    })
    .await;
    assert!(dropped, "the task's record was not counted as dropped");
}

/// OPS-REC-2: the served schema states the checks the artifact handlers make (issue 32 item
/// 10: `limit=0` was refused by a bound the schema did not state; `content: [null, null]` was
/// stored though the schema said `object`, and then failed its own response schema): what the
/// schema bounds the server refuses, what it allows the server takes and answers in shape.
#[tokio::test]
async fn the_artifact_schema_states_what_the_handlers_check() {
    let s = start(config(vec![pool("p1", 1)]), Duration::from_millis(1)).await;
    let doc = s.get_json("/openapi.json").await;
    let list = &doc["paths"]["/v1/artifacts"]["get"]["parameters"];
    let param = |name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["schema"]
            .clone()
    };
    assert_eq!(param("limit")["minimum"], 1);
    assert_eq!(param("limit")["maximum"], 500);
    assert!(param("before")["pattern"].is_string());
    let req = &doc["components"]["schemas"]["ArtifactRequest"];
    assert_eq!(req["properties"]["kind"]["pattern"], "^[a-z0-9_.-]{1,32}$");
    assert_eq!(req["not"]["properties"]["kind"]["const"], "task_record");
    assert!(
        req["properties"]["content"].get("type").is_none(),
        "content is any JSON value: {}",
        req["properties"]["content"]
    );
    let status = |path: String| {
        let (c, url) = (s.client.clone(), s.url(&path));
        async move { c.get(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status("/v1/artifacts?limit=1".into()).await, 200);
    assert_eq!(status("/v1/artifacts?limit=500".into()).await, 200);
    assert_eq!(status("/v1/artifacts?limit=0".into()).await, 400);
    assert_eq!(status("/v1/artifacts?limit=501".into()).await, 400);
    assert_eq!(status("/v1/artifacts?before=".into()).await, 400);
    // any JSON value is stored and read back as it was posted
    for content in [json!([null, null]), json!("a diff"), json!(7)] {
        let r = s
            .post(
                "/v1/artifacts",
                &json!({"kind": "note", "content": content}),
            )
            .await;
        assert_eq!(r.status(), 201);
        let id = r.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(
            s.get_json(&format!("/v1/artifacts/{id}")).await["content"],
            content
        );
    }
    let r = s
        .post(
            "/v1/artifacts",
            &json!({"kind": "task_record", "content": 1}),
        )
        .await;
    assert_eq!(r.status(), 400);
}
