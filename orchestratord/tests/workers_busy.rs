//! Remote workers that did not start a request (WRK-PLACE-2): a worker shared with other
//! servers answers `busy`, a worker shutting down answers `draining`. Both are requeues, not
//! failures; in their own test binary because they read the process-wide requeue counter.

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
