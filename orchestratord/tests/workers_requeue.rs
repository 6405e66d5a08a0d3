//! Requeues to remote workers, in their own test binary because they read the process-wide
//! requeue counter (one test at a time): a worker lost mid-stream (WRK-REQ-1/2), and workers
//! that did not start a request (WRK-PLACE-2): a worker shared with other servers answers
//! `busy`, a worker shutting down answers `draining`. Those are requeues, not failures.

mod support;

use std::time::Duration;

use contracts::worker::{ServerToWorker, WorkerToServer};
use serde_json::json;
use support::fake_worker::{connect, FakeWorker, Next};
use support::{config, start, TestServer};

const SECRET: &str = "test-secret";

/// The requeue counter is one per process: one test at a time reads it.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn server() -> TestServer {
    let mut c = config(vec![]);
    c.workers.secret = Some(SECRET.into());
    start(c, Duration::from_millis(5)).await
}

async fn worker(s: &TestServer, name: &str, max: u32) -> FakeWorker {
    let mut w = connect(&s.base, SECRET).await.expect("accepted");
    w.register(name, &["m"], max).await;
    w
}

fn spawn_chat(s: &TestServer) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let body = json!({"model": "m", "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello"}]});
    tokio::spawn(
        s.client
            .post(s.url("/v1/chat/completions"))
            .json(&body)
            .send(),
    )
}

async fn refuse(w: &mut FakeWorker, request_id: String, code: &str) {
    w.send(&WorkerToServer::Error {
        request_id: Some(request_id),
        code: code.into(),
        message: "the worker takes no more requests now".into(),
    })
    .await;
}

async fn answer_of(call: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>) -> String {
    let r = call.await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn requeued(s: &TestServer) -> f64 {
    support::counter(&s.metrics().await, "orchd_tasks_requeued_total")
}

/// WRK-PLACE-2: a worker whose slots hold other servers' work answers `busy`: the task is not
/// failed but waits, the worker gets nothing more until it reports room, then runs it; the
/// client sees one whole answer and one requeue is counted.
#[tokio::test]
async fn a_busy_worker_gets_the_task_again_once_it_reports_room() {
    let _one = SERIAL.lock().await;
    let s = server().await;
    let before = requeued(&s).await;
    let mut w = worker(&s, "shared", 2).await;
    let call = spawn_chat(&s);
    let (rid, ..) = w.request().await;
    refuse(&mut w, rid, "busy").await;
    assert!(
        matches!(w.next(Duration::from_millis(500)).await, Next::Quiet),
        "a worker that said busy got a request before reporting room"
    );
    w.send(&WorkerToServer::Pong {
        current_load: 1,
        timestamp_unix_ms: None,
    })
    .await;
    let (rid, ..) = w.request().await;
    w.answer(&rid, &["at", " last"]).await;
    assert_eq!(answer_of(call).await, "at last");
    assert_eq!(requeued(&s).await - before, 1.0);
}

/// WRK-PLACE-2: a worker answering `draining` gets no new request: the task runs on the other
/// worker, and the draining one is closed (nothing of ours runs there).
#[tokio::test]
async fn a_draining_worker_hands_the_task_to_another_and_is_closed() {
    let _one = SERIAL.lock().await;
    let s = server().await;
    let before = requeued(&s).await;
    let mut leaving = worker(&s, "leaving", 2).await;
    let call = spawn_chat(&s);
    let (rid, ..) = leaving.request().await;
    let mut staying = worker(&s, "staying", 2).await;
    refuse(&mut leaving, rid, "draining").await;
    let (rid, ..) = staying.request().await;
    staying.answer(&rid, &["elsewhere"]).await;
    assert_eq!(answer_of(call).await, "elsewhere");
    match leaving.next(Duration::from_secs(5)).await {
        Next::Closed(_) | Next::Msg(ServerToWorker::GracefulShutdown { .. }) => {}
        other => panic!("the draining worker was not let go: {other:?}"),
    }
    assert_eq!(requeued(&s).await - before, 1.0);
}

/// WRK-REQ-1, WRK-REQ-2: a worker lost after streaming tokens: the task goes back to the queue
/// and the next worker continues after the text already sent (final assistant turn with
/// `continue_final_message`, fewer max_tokens); the client sees every token once, in order.
#[tokio::test]
async fn lost_worker_continues_on_the_next_without_duplicate_or_gap() {
    let _one = SERIAL.lock().await;
    let s = server().await;
    let before = requeued(&s).await;
    let mut a = worker(&s, "a", 1).await;
    let id = s
        .submit_ok(json!({"model": "m", "max_tokens": 10,
            "messages": [{"role": "user", "content": "Say hello world"}]}))
        .await;
    let (rid, ..) = a.request().await;
    for p in ["Hello", " wor"] {
        let chunk = json!({"choices": [{"index": 0, "delta": {"content": p}}]});
        a.send(&WorkerToServer::ResponseChunk {
            request_id: rid.clone(),
            chunk: format!("data: {chunk}\n\n"),
        })
        .await;
    }
    // both tokens reached the task before the crash
    let mut seen = 0;
    for _ in 0..100 {
        seen = s.get_json(&format!("/v1/tasks/{id}")).await["record"]["tokens_out"]
            .as_u64()
            .unwrap_or(0);
        if seen == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen, 2);
    a.crash();
    let mut b = worker(&s, "b", 1).await;
    let (rid, _, body, _) = b.request().await;
    let msgs = body["messages"].as_array().unwrap();
    assert_eq!(msgs.last().unwrap()["role"], "assistant");
    assert_eq!(msgs.last().unwrap()["content"], "Hello wor");
    assert_eq!(body["continue_final_message"], true);
    assert_eq!(body["max_tokens"], 8);
    b.answer(&rid, &["ld", "!"]).await;
    let ev = s.stream_all(&id).await;
    support::assert_well_formed(&ev);
    let text: String = ev
        .iter()
        .filter(|e| e.event == "token")
        .map(|e| e.data["t"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Hello world!");
    assert_eq!(ev.last().unwrap().event, "end");
    assert_eq!(ev.last().unwrap().data["tokens_out"], 4);
    assert_eq!(requeued(&s).await - before, 1.0);
}
