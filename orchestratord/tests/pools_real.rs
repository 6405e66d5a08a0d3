//! Pools with the real default model (two pools): drain under load, reload without failed
//! requests, reload rollback, and an engine failure that restarts one pool while the other
//! keeps serving. Requirement ids in `.specs/pool-manager.md`.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pool_manager::{
    candle::CandleFactory, Engine, EngineDescriptor, EngineFactory, EngineJob, PoolSpec, PortError,
    PromptInput, SeqEvent, SlotPermit,
};
use serde_json::json;
use support::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn real_pools() -> orchestratord::config::Config {
    let mk = |id: &str| {
        let mut p = pool(id, 2);
        p.model = default_model_path();
        p.alias = Some("smollm2".into());
        p.ctx = 512;
        p.threads = 1;
        p
    };
    let mut cfg = config(vec![mk("p1"), mk("p2")]);
    cfg.timeouts.idle_ms = 30_000;
    // these tests are about drain and reload: tasks queued behind 200-token tasks must be
    // admitted however slow the shared CI cores run them (one thread a pool, the binary's
    // tests in parallel: predicted waits of 33–53 s were refused under the default 30 s)
    cfg.admission.max_queue_wait_ms = 0;
    cfg
}

fn task(max_tokens: u32) -> serde_json::Value {
    json!({"prompt": "Count from one to one thousand: one, two,", "max_tokens": max_tokens, "model": "smollm2"})
}

async fn health(s: &TestServer, id: &str) -> serde_json::Value {
    s.get_json(&format!("/v1/pools/{id}/health")).await
}

/// POOL-DRAIN-1, OC-CTRL-2002: drain under load with a short deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_under_load_moves_work_to_the_other_pool() {
    let s = real_pools_server().await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(s.submit_ok(task(200)).await);
    }
    let pinned_queued = s
        .submit_ok(json!({"prompt": "Hello", "max_tokens": 8, "pool_id": "p1"}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = s
        .client
        .post(s.url("/v1/pools/p1/drain"))
        .json(&json!({"deadline_ms": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let h: serde_json::Value = r.json().await.unwrap();
    assert_eq!(h["ready"], false, "readiness flips at once");
    assert!(h["state"] == "draining" || h["state"] == "drained");
    // new pinned work is refused, unpinned work goes to p2
    let r = s.submit(json!({"prompt": "Hi", "pool_id": "p1"})).await;
    assert_eq!(r.status(), 503);
    let after: Vec<String> = futures::future::join_all((0..3).map(|_| s.submit_ok(task(8)))).await;
    for id in &after {
        let ev = s.stream_all(id).await;
        assert_well_formed(&ev);
        assert_eq!(
            s.record(id).await["pool_id"],
            "p2",
            "no task admitted to the draining pool"
        );
    }
    let mut finished = 0;
    let mut ended_at_deadline = 0;
    for id in ids.iter().chain(std::iter::once(&pinned_queued)) {
        let ev = s.stream_all(id).await;
        assert_well_formed(&ev);
        let last = ev.last().unwrap();
        if last.event == "end" {
            finished += 1;
        } else {
            assert_eq!(last.data["code"], "POOL_UNREADY", "{last:?}");
            assert_eq!(last.data["retriable"], true);
            ended_at_deadline += 1;
        }
    }
    assert_eq!(finished + ended_at_deadline, 5);
    assert!(
        ended_at_deadline >= 1,
        "long tasks on p1 were ended at the deadline"
    );
    for _ in 0..100 {
        if health(&s, "p1").await["state"] == "drained" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let h = health(&s, "p1").await;
    assert_eq!(h["state"], "drained");
    assert_eq!(h["metrics"]["slots_busy"], 0);
    // and it comes back
    let r = s
        .client
        .post(s.url("/v1/pools/p1/resume"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = s
        .submit_ok(json!({"prompt": "Hi", "max_tokens": 2, "pool_id": "p1"}))
        .await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
}

async fn real_pools_server() -> TestServer {
    start_with(real_pools(), Arc::new(CandleFactory)).await
}

/// POOL-RELOAD-1, OC-CTRL-2003: reload under load switches with zero failed requests; a
/// missing or corrupt file answers 409 and the old model keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_switches_without_failures_and_rolls_back_bad_models() {
    let s = Arc::new(real_pools_server().await);
    let load = {
        let s = s.clone();
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for i in 0..10 {
                let id = s
                    .submit_ok(json!({"prompt": format!("Tell me a fact about the number {i}."), "max_tokens": 16, "pool_id": "p1"}))
                    .await;
                let ev = s.stream_all(&id).await;
                assert_well_formed(&ev);
                outcomes.push(ev.last().unwrap().event.clone());
            }
            outcomes
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let copy = std::env::temp_dir().join(format!("orchd-reload-{}.gguf", std::process::id()));
    std::fs::copy(default_model_path(), &copy).unwrap();
    let copy = std::fs::canonicalize(copy).unwrap();
    let r = s
        .client
        .post(s.url("/v1/pools/p1/reload"))
        .json(&json!({"new_model_ref": copy.display().to_string()}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let outcomes = load.await.unwrap();
    assert!(
        outcomes.iter().all(|e| e == "end"),
        "failed requests during reload: {outcomes:?}"
    );
    assert_eq!(
        health(&s, "p1").await["model_ref"],
        copy.display().to_string()
    );
    // a file outside the model folders: refused before the pool is touched, naming the
    // folders (SEC-MODEL-1, FC-PATH-1)
    let r = s
        .client
        .post(s.url("/v1/pools/p1/reload"))
        .json(&json!({"new_model_ref": "/no/such/model.gguf"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "FORBIDDEN");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.starts_with("new_model_ref: not in a model folder: the allowed folders are "),
        "{message}"
    );
    // corrupt file
    let bad = std::env::temp_dir().join(format!("orchd-bad-{}.gguf", std::process::id()));
    std::fs::write(&bad, b"GGUF this is not a model").unwrap();
    let bad = std::fs::canonicalize(bad).unwrap();
    let r = s
        .client
        .post(s.url("/v1/pools/p1/reload"))
        .json(&json!({"new_model_ref": bad.display().to_string()}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let h = health(&s, "p1").await;
    assert_eq!(
        h["model_ref"],
        copy.display().to_string(),
        "old model still serving"
    );
    assert_eq!(h["ready"], true);
    assert_eq!(h["metrics"]["reloads_failed"], 1);
    let m = s.metrics().await;
    assert_eq!(
        counter(
            &m,
            "orchd_pool_reloads_total{pool=\"p1\",outcome=\"rolled_back\"}"
        ),
        1.0
    );
    assert_eq!(
        counter(&m, "orchd_pool_reloads_total{pool=\"p1\",outcome=\"ok\"}"),
        1.0
    );
    let id = s
        .submit_ok(json!({"prompt": "Hi", "max_tokens": 3, "pool_id": "p1"}))
        .await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
    let _ = std::fs::remove_file(copy);
    let _ = std::fs::remove_file(bad);
}

const VICTIM_TOKENS: usize = 300;

/// The real candle engine behind a switch that makes it die mid-task: with `die_after`, the
/// engine dies once it has streamed that many tokens of a task (a point in the task the test
/// names, however fast the machine runs it; a timer lost the race to a task that ended first).
struct Killable {
    inner: Arc<dyn Engine>,
    dead: Arc<AtomicBool>,
    kill: CancellationToken,
    die_after: Option<usize>,
}

impl Engine for Killable {
    fn descriptor(&self) -> EngineDescriptor {
        self.inner.descriptor()
    }
    fn tokenize(&self, p: &PromptInput, continuation: &str) -> Result<Option<Vec<u32>>, PortError> {
        self.inner.tokenize(p, continuation)
    }
    fn start(&self, job: EngineJob) -> Result<mpsc::Receiver<SeqEvent>, PortError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(PortError::Dead("killed".into()));
        }
        // the victim is the task of 300 tokens, not the pool's short pace measurement at load
        let die_after = self.die_after.filter(|_| job.max_tokens == VICTIM_TOKENS);
        let mut rx = self.inner.start(job)?;
        let (tx, out) = mpsc::channel(pool_manager::EVENT_CHANNEL_CAPACITY);
        let kill = self.kill.clone();
        let dead = self.dead.clone();
        tokio::spawn(async move {
            let mut tokens = 0;
            loop {
                tokio::select! {
                    _ = kill.cancelled() => break,
                    ev = rx.recv() => match ev {
                        Some(ev) => {
                            let is_token = matches!(ev, SeqEvent::Token { .. });
                            if tx.send(ev).await.is_err() { break }
                            tokens += usize::from(is_token);
                            if die_after == Some(tokens) {
                                dead.store(true, Ordering::SeqCst);
                                kill.cancel();
                                break;
                            }
                        }
                        None => break,
                    }
                }
            }
        });
        Ok(out)
    }
    fn is_alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst) && self.inner.is_alive()
    }
    fn try_acquire(&self) -> Option<SlotPermit> {
        self.inner.try_acquire()
    }
    fn slots_in_use(&self) -> usize {
        self.inner.slots_in_use()
    }
}

struct KillableFactory {
    dead_p1: Arc<AtomicBool>,
}

impl EngineFactory for KillableFactory {
    fn load(&self, spec: &PoolSpec, model_ref: &str) -> Result<Arc<dyn Engine>, PortError> {
        let inner = CandleFactory.load(spec, model_ref)?;
        if spec.id != "p1" {
            return Ok(inner);
        }
        // the first p1 dies three tokens into its first task; a restarted p1 is healthy
        let (dead, die_after) = if self.dead_p1.load(Ordering::SeqCst) {
            (Arc::new(AtomicBool::new(false)), None)
        } else {
            (self.dead_p1.clone(), Some(3))
        };
        Ok(Arc::new(Killable {
            inner,
            dead,
            kill: CancellationToken::new(),
            die_after,
        }))
    }
}

/// ORCH-ENG-1, POOL-LOAD-1: an engine that dies mid-task ends its tasks with a retriable
/// WORKER_RESET, its pool restarts, and the other pool serves meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_failure_restarts_the_pool_and_the_other_keeps_serving() {
    let dead = Arc::new(AtomicBool::new(false));
    let s = start_with(
        real_pools(),
        Arc::new(KillableFactory {
            dead_p1: dead.clone(),
        }),
    )
    .await;
    let victim = s
        .submit_ok(json!({"prompt": "Count to one hundred:", "max_tokens": VICTIM_TOKENS, "pool_id": "p1"}))
        .await;
    let ev = s.stream_all(&victim).await;
    assert!(dead.load(Ordering::SeqCst), "the engine died mid-task");
    let tokens = ev.iter().filter(|e| e.event == "token").count();
    assert!((1..=3).contains(&tokens), "{ev:?}");
    assert_well_formed(&ev);
    let last = ev.last().unwrap();
    assert_eq!(last.data["code"], "WORKER_RESET", "{last:?}");
    assert_eq!(last.data["retriable"], true);
    // the other pool serves while p1 restarts
    let id = s
        .submit_ok(json!({"prompt": "Hi", "max_tokens": 4, "model": "smollm2"}))
        .await;
    assert_well_formed(&s.stream_all(&id).await);
    assert_eq!(s.record(&id).await["pool_id"], "p2");
    // p1 comes back by itself
    let mut state = String::new();
    for _ in 0..200 {
        let h = health(&s, "p1").await;
        state = h["state"].as_str().unwrap().to_string();
        if state == "ready" && h["metrics"]["restarts"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, "ready", "{}", health(&s, "p1").await);
}

/// POOL-LOAD-2 on the real engine: a GGUF of an architecture the engine does not have (the
/// default model with its `general.architecture` changed to `gemma`) fails once, with the
/// architecture named in health, and is not retried on a timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_architecture_is_named_and_not_retried() {
    let mut bytes = std::fs::read(default_model_path()).unwrap();
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap();
    let value = at + bytes[at..].windows(5).position(|w| w == b"llama").unwrap();
    bytes[value..value + 5].copy_from_slice(b"gemma");
    let file = std::env::temp_dir().join(format!("orchd-gemma-{}.gguf", std::process::id()));
    std::fs::write(&file, bytes).unwrap();
    let mut p = pool("g1", 1);
    p.model = file.display().to_string();
    p.ctx = 512;
    let s = start_with(config(vec![p]), Arc::new(CandleFactory)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let h = s.get_json("/v1/pools/g1/health").await;
    assert_eq!(h["state"], "unready", "{h}");
    assert_eq!(h["metrics"]["consecutive_failures"], 3, "one attempt: {h}");
    let why = h["last_error"].as_str().unwrap_or_default();
    assert!(why.contains("architecture \"gemma\""), "{h}");
    assert!(why.contains("not retried until"), "{h}");
    let _ = std::fs::remove_file(file);
}
