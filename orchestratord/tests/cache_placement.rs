//! PLACE-1..5 on the real default model: two pools of the same model, four conversations at
//! once, three turns each (every turn resends the whole conversation, as chat clients do).
//! Each later turn lands on the pool whose engine holds its history (`cache`, or `affinity`
//! for the conversations that send a `prompt_cache_key`), that pool's engine reuses it (the
//! `end` event's `cached_tokens`), the record says why, and `/metrics` counts the reasons.
//! Then over a local pool and a remote worker (a real `orchestratord worker` process with the
//! model): the worker's turns stay on it by what its engine says it holds (PLACE-6).

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::procs::{eventually, get_json, worker, worker_config};
use support::*;

const TURNS: usize = 3;

/// A first message of ~150 tokens of its own (no prefix shared with the others).
fn opening(k: usize) -> String {
    let topics = ["rivers", "mountains", "harbours", "forests"];
    let mut s = format!(
        "Conversation number {k}. I am writing notes about {} and I will ask short questions. ",
        topics[k % topics.len()]
    );
    for i in 0..24 {
        s.push_str(&format!(
            "Note {i} of conversation {k} is about {}. ",
            topics[k % 4]
        ));
    }
    s.push_str("First question: what is the first thing to say?");
    s
}

struct Turn {
    pool: String,
    reason: String,
    held: u64,
    cached: u64,
}

/// One turn: `body` submitted, streamed to its end; where it ran and why, and the answer.
async fn turn(s: &TestServer, body: serde_json::Value, what: &str) -> (Turn, String) {
    let id = s.submit_ok(body).await;
    let events = s.stream_all(&id).await;
    let answer: String = events
        .iter()
        .filter(|e| e.event == "token")
        .filter_map(|e| e.data["t"].as_str())
        .collect();
    let end = events
        .iter()
        .find(|e| e.event == "end")
        .unwrap_or_else(|| panic!("{what}: {events:?}"));
    let record = s.record(&id).await;
    let placement = &record["placement"];
    let turn = Turn {
        pool: record["pool_id"].as_str().unwrap_or_default().to_string(),
        reason: placement["reason"].as_str().unwrap_or_default().to_string(),
        held: placement["held_tokens"].as_u64().unwrap_or(0),
        cached: end.data["cached_tokens"].as_u64().unwrap_or(0),
    };
    (turn, answer)
}

async fn converse(
    s: Arc<TestServer>,
    k: usize,
    key: Option<String>,
    model: Option<&'static str>,
    pause: Duration,
) -> Vec<Turn> {
    let mut messages = vec![json!({"role": "user", "content": opening(k)})];
    let mut turns = Vec::new();
    for t in 0..TURNS {
        let mut body = json!({"messages": messages, "max_tokens": 8, "temperature": 0});
        if let Some(key) = &key {
            body["prompt_cache_key"] = json!(key);
        }
        if let Some(model) = model {
            body["model"] = json!(model);
        }
        let (done, answer) = turn(&s, body, &format!("conversation {k} turn {t}")).await;
        turns.push(done);
        messages.push(json!({"role": "assistant", "content": answer}));
        messages.push(json!({"role": "user", "content": format!("And question {}?", t + 2)}));
        tokio::time::sleep(pause).await;
    }
    turns
}

/// PLACE-2, PLACE-3, PLACE-4, PLACE-5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_turn_lands_where_its_conversation_is_cached() {
    let mut cfg = config(vec![real_pool("a", 4, 1024), real_pool("b", 4, 1024)]);
    cfg.timeouts.idle_ms = 60_000;
    let s = Arc::new(start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await);
    // conversations 0 and 1 name themselves; 2 and 3 are told apart by their prefix alone
    let runs: Vec<_> = (0..4)
        .map(|k| {
            let key = (k < 2).then(|| format!("conversation-{k}"));
            tokio::spawn(converse(s.clone(), k, key, None, Duration::ZERO))
        })
        .collect();
    let mut firsts = Vec::new();
    for (k, run) in runs.into_iter().enumerate() {
        let turns = run.await.unwrap();
        let first = &turns[0];
        assert_eq!(
            first.reason, "load",
            "conversation {k}'s first turn: nothing cached"
        );
        firsts.push(first.pool.clone());
        let expected = if k < 2 { "affinity" } else { "cache" };
        for (t, turn) in turns.iter().enumerate().skip(1) {
            let line = format!(
                "conversation {k} turn {t}: pool {} ({}, held {}), first on {}",
                turn.pool, turn.reason, turn.held, first.pool
            );
            assert_eq!(turn.pool, first.pool, "{line}");
            assert_eq!(turn.reason, expected, "{line}");
            if k >= 2 {
                assert!(turn.held >= 128, "{line}: its opening is cached");
            }
            // the engine reused the history it held (its prompt, then each later prompt)
            assert!(turn.cached >= 128, "{line}: cached_tokens {}", turn.cached);
        }
    }
    assert!(
        firsts.iter().any(|p| p == "a") && firsts.iter().any(|p| p == "b"),
        "the first turns spread over both pools by load: {firsts:?}"
    );
    let m = s.metrics().await;
    let count = |reason: &str| -> f64 {
        ["a", "b"]
            .iter()
            .map(|p| {
                counter(
                    &m,
                    &format!("orchd_placement_total{{pool=\"{p}\",reason=\"{reason}\"}}"),
                )
            })
            .sum()
    };
    assert_eq!(count("load"), 4.0, "{m}");
    assert_eq!(count("affinity"), 4.0);
    assert_eq!(count("cache"), 4.0);

    // a key past 256 bytes is a typed 400 naming it, as an empty one is
    for key in [String::new(), "k".repeat(257)] {
        let r = s
            .submit(json!({"prompt": "Hi", "max_tokens": 1, "prompt_cache_key": key}))
            .await;
        assert_eq!(r.status(), 400);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(
            (v["code"].as_str(), v["field"].as_str()),
            (Some("INVALID_PARAMS"), Some("prompt_cache_key")),
            "{v}"
        );
    }
}

/// A server with one local pool of the real model (alias `smol`, `slots` slots) that workers
/// with `secret` join, their models beside its own, their load reported every 200 ms.
async fn server_for_workers(pool_id: &str, slots: usize, secret: &str) -> Arc<TestServer> {
    let mut local = real_pool(pool_id, slots, 1024);
    local.alias = Some("smol".into());
    let mut cfg = config(vec![local]);
    cfg.timeouts.idle_ms = 60_000;
    cfg.workers.secret = Some(secret.into());
    cfg.workers.heartbeat_interval_ms = 200;
    cfg.workers.join_local_models = true;
    Arc::new(start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await)
}

/// PLACE-6: a local pool and a remote worker (its own engine, which says what it holds over
/// the worker protocol): four conversations at once spread over both by load, and each later
/// turn goes back to the pool that has its history, where the engine reuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_follow_their_conversation_to_a_remote_worker() {
    const SECRET: &str = "placement-secret";
    // its own pool id: /metrics is one per process, the other test counts pools a and b
    let s = server_for_workers("local", 4, SECRET).await;
    let _w = worker(
        &s.base,
        SECRET,
        "remote",
        &worker_config(&default_model_path(), 4),
        &[],
    );
    let remote_ready = eventually(Duration::from_secs(90), || {
        let s = s.clone();
        async move {
            s.state.pools.all().iter().map(|p| p.snapshot()).any(|p| {
                p.id != "local" && p.slots_total == 4 && p.slots_free() == 4 && p.accepts_work
            })
        }
    })
    .await;
    assert!(remote_ready, "the worker's pool never came");
    let runs: Vec<_> = (0..4)
        .map(|k| {
            tokio::spawn(converse(
                s.clone(),
                k,
                None,
                Some("smol"),
                // a user's pause: a worker's load report (every 200 ms) counts a request
                // that just ended here until its next one, and a pool it fills is no
                // candidate (PLACE-2 places only on pools with room)
                Duration::from_millis(600),
            ))
        })
        .collect();
    let mut firsts = Vec::new();
    for (k, run) in runs.into_iter().enumerate() {
        let turns = run.await.unwrap();
        let first = &turns[0];
        firsts.push(first.pool.clone());
        for (t, turn) in turns.iter().enumerate().skip(1) {
            let line = format!(
                "conversation {k} turn {t}: pool {} ({}, held {}, cached {}), first on {}",
                turn.pool, turn.reason, turn.held, turn.cached, first.pool
            );
            assert_eq!(turn.pool, first.pool, "{line}");
            assert_eq!(turn.reason, "cache", "{line}");
            assert!(turn.held >= 128, "{line}: its opening was sent there");
            assert!(turn.cached >= 128, "{line}: the engine reused it");
        }
    }
    assert!(
        firsts.iter().any(|p| p == "local") && firsts.iter().any(|p| p != "local"),
        "the first turns spread over the local pool and the worker: {firsts:?}"
    );
}

/// PLACE-6: a worker running this server's engine says what its engine holds
/// (`held_prefixes` frames), and placement believes that over what it sent there. A
/// conversation sent to the worker, then pushed out of the worker's only row by another (no
/// prompt cache there), no longer counts as held there: its next turn is placed by load, its
/// own tokens held nowhere — where "what was sent" would still have claimed them — while the
/// conversation the worker does hold goes back to it and is reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_says_what_its_engine_holds() {
    const SECRET: &str = "held-secret";
    let s = server_for_workers("held-local", 1, SECRET).await;
    // one slot, no prompt cache: the worker's engine holds the last prompt it ran, nothing else
    let wcfg = worker_config(&default_model_path(), 1) + "prompt_cache_mib = 0\n";
    let _w = worker(&s.base, SECRET, "holder", &wcfg, &[]);
    let remote = || {
        s.state
            .pools
            .all()
            .iter()
            .map(|p| p.snapshot())
            .find(|p| p.id != "held-local")
    };
    let ready = eventually(Duration::from_secs(90), || {
        let r = remote();
        async move { r.is_some_and(|p| p.slots_free() == 1 && p.accepts_work) }
    })
    .await;
    assert!(ready, "the worker's pool never came");
    let wpool = remote().map(|p| p.id).unwrap_or_default();
    // the worker measures its pool's pace once loaded: until it reports nothing running, its
    // pool is busy to placement
    let idle = eventually(Duration::from_secs(60), || {
        let url = s.url("/v1/workers");
        async move {
            let v = get_json(&url).await;
            v["workers"][0]["current_load"].as_u64() == Some(0)
        }
    })
    .await;
    assert!(idle, "the worker never reported itself idle");
    let chat = |k: usize, history: &[serde_json::Value]| {
        let mut messages = vec![json!({"role": "user", "content": opening(k)})];
        messages.extend_from_slice(history);
        json!({"messages": messages, "max_tokens": 8, "temperature": 0, "model": "smol"})
    };
    let next = |answer: &str| {
        [
            json!({"role": "assistant", "content": answer}),
            json!({"role": "user", "content": "And the next question?"}),
        ]
    };
    // the local pool busy: conversation 0's first turn goes to the worker by load
    let busy = s
        .submit_ok(json!({"prompt": "Count from one to five hundred:", "max_tokens": 400, "pool_id": "held-local"}))
        .await;
    let local_full = eventually(Duration::from_secs(30), || {
        let full = s
            .state
            .pools
            .get("held-local")
            .map(|p| p.snapshot().slots_free() == 0);
        async move { full == Some(true) }
    })
    .await;
    assert!(local_full, "the local pool never took the long task");
    let (a1, a1_answer) = turn(&s, chat(0, &[]), "conversation 0 turn 0").await;
    assert_eq!(
        (a1.pool.as_str(), a1.reason.as_str()),
        (wpool.as_str(), "load")
    );
    s.cancel(&busy).await;
    // conversation 1 pinned to the worker: its prompt takes the worker's only row
    let mut pinned = chat(1, &[]);
    pinned["pool_id"] = json!(wpool);
    let (b1, b1_answer) = turn(&s, pinned, "conversation 1 turn 0").await;
    assert_eq!(b1.pool, wpool);
    // a user's pause: the worker's load report and what it holds reach the server
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (b2, b2_answer) = turn(&s, chat(1, &next(&b1_answer)), "conversation 1 turn 1").await;
    let line = format!(
        "conversation 1 turn 1: pool {} ({}, held {}, cached {})",
        b2.pool, b2.reason, b2.held, b2.cached
    );
    assert_eq!(
        (b2.pool.as_str(), b2.reason.as_str()),
        (wpool.as_str(), "cache"),
        "{line}"
    );
    assert!(b2.held >= 128 && b2.cached >= 128, "{line}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    // conversation 0 was sent to the worker, but the worker no longer holds it
    let (a2, _) = turn(&s, chat(0, &next(&a1_answer)), "conversation 0 turn 1").await;
    let line = format!(
        "conversation 0 turn 1: pool {} ({}, held {}, cached {}); the worker holds conversation 1 ({} chars answered)",
        a2.pool, a2.reason, a2.held, a2.cached, b2_answer.len()
    );
    // (the chat template's opening, shared by every conversation, may still be held there:
    // under the minimum match)
    assert_eq!(a2.reason, "load", "{line}");
    assert!(a2.held < 64, "{line}");
}

/// PLACE-8: over two replicas (real processes on a 3-node JetStream cluster, a 2-slot pool
/// of the real model each), every later turn of a conversation — admitted on either replica,
/// in turn — is taken by the replica whose pool holds its history (the others give it a head
/// start: 1 s here, where the test binary's other tests load the two cores and a JetStream
/// fetch can take a few hundred ms), and reuses it there. Without the head start the first
/// replica to look takes it: each turn a coin toss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_follow_their_conversation_across_replicas() {
    let nats = support::nats::NatsCluster::start(3).await;
    let urls = nats.urls();
    let cfg = format!(
        "[cluster]\nheartbeat_ms = 200\nhead_start_ms = 1000\n\n[[pools]]\nid = \"p\"\nmodel = \"{}\"\nalias = \"smollm2\"\nslots = 2\nctx = 1024\nthreads = 1\n",
        default_model_path()
    );
    let (mut procs, mut bases) = (Vec::new(), Vec::new());
    for name in ["r0", "r1"] {
        let env = [
            ("ORCHD_CLUSTER_NATS", urls.as_str()),
            ("ORCHD_REPLICA_ID", name),
            ("RUST_LOG", "info,orchestratord::cluster=debug"),
        ];
        let (p, base) = support::procs::server_env(&cfg, &env).await;
        procs.push(p);
        bases.push(base);
    }
    let logs = || {
        procs
            .iter()
            .enumerate()
            .map(|(i, p)| format!("--- r{i}\n{}", p.log_text()))
            .collect::<String>()
    };
    for base in &bases {
        assert!(
            support::procs::lists_pools(base, 2, Duration::from_secs(30)).await,
            "{base} does not list both replicas' pools:\n{}",
            logs()
        );
    }
    // one conversation: each turn admitted on the replica after the last one's, its history
    // resent; (replica it ran on, cached tokens) per turn
    let converse = |k: usize| {
        let bases = bases.clone();
        async move {
            let mut messages = vec![json!({"role": "user", "content": opening(k)})];
            let mut turns = Vec::new();
            for t in 0..TURNS {
                let base = &bases[(k + t) % 2];
                let body = json!({"messages": messages, "max_tokens": 8, "temperature": 0, "model": "smollm2"});
                let id = support::task_client::submit_ok(base, body).await;
                let events = support::task_client::read_stream(base, &id, None, |_| false).await;
                let end = events
                    .iter()
                    .find(|e| e.event == "end")
                    .unwrap_or_else(|| panic!("conversation {k} turn {t}: {events:?}"));
                let cached = end.data["cached_tokens"].as_u64().unwrap_or(0);
                // where it ran, as the running replica said (its record, once stored)
                let (mut replica, mut reason) = (String::new(), String::new());
                for _ in 0..100 {
                    let record: serde_json::Value =
                        reqwest::get(format!("{base}/v1/artifacts/{id}"))
                            .await
                            .unwrap()
                            .json()
                            .await
                            .unwrap_or_default();
                    if let Some(r) = record["replica"].as_str() {
                        replica = r.to_string();
                        reason = record["placement"]["reason"]
                            .as_str()
                            .unwrap_or_default()
                            .into();
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                turns.push((replica, cached, reason));
                messages.push(
                    json!({"role": "assistant", "content": support::task_client::text_of(&events)}),
                );
                messages
                    .push(json!({"role": "user", "content": format!("And question {}?", t + 2)}));
                // the user reads the answer; what the pool holds now reaches the other replica
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            turns
        }
    };
    // two conversations at a time: their replica has a slot for each
    let mut later = Vec::new();
    for pair in [[0, 1], [2, 3]] {
        let (a, b) = tokio::join!(converse(pair[0]), converse(pair[1]));
        for (k, turns) in pair.into_iter().zip([a, b]) {
            for (t, (replica, cached, reason)) in turns.iter().enumerate().skip(1) {
                later.push(format!(
                    "conversation {k} turn {t}: on {replica} ({reason}; turn {} on {}), cached {cached}",
                    t - 1,
                    turns[t - 1].0
                ));
                // the record says why, as the running replica decided it
                let ok = *replica == turns[t - 1].0 && *cached >= 128 && reason == "cache";
                if !ok {
                    panic!("{}\n{}", later.join("\n"), logs());
                }
            }
        }
    }
}
