//! CLU-Q-1..3, CLU-EV-1 (issue 38): the cluster's queue and event relay on a real 3-node NATS JetStream cluster on
//! loopback (`nats-server` 2.15.1, `ci/install-nats.sh`), driven through the library as three
//! replicas would drive it, each connected to a different node. Not yet behind
//! `POST /v1/tasks` and the SSE routes (the replicas' HTTP path comes next): these prove the
//! substrate's promises that path will rest on — the bound holds whatever the number of
//! admitting replicas, a task whose taker stops goes to another, no acknowledged admission is
//! lost when the stream's leader is killed, and a task's events are followed from any replica
//! and resumed after an event id, each once.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use contracts::Priority;
use orchestratord::cluster::task_queue::{AdmitError, PoolQueue, Take};
use orchestratord::cluster::Cluster;
use orchestratord::config::ClusterConfig;
use support::nats::NatsCluster;

/// A replica's connection through node `node` only.
async fn replica(nats: &NatsCluster, node: usize, name: &str) -> Cluster {
    let cfg = ClusterConfig {
        nats_urls: vec![format!("nats://127.0.0.1:{}", nats.client_ports[node])],
        replica_id: name.into(),
        connect_timeout_ms: 20_000,
        ..Default::default()
    };
    Cluster::connect(&cfg).await.expect("joins the cluster")
}

/// The pool's queue through `c` (retried while the cluster elects a new stream leader).
async fn queue(c: &Cluster, bound: i64, ack_wait_ms: u64) -> PoolQueue {
    let mut tries = 0;
    loop {
        match c
            .queue(Duration::from_millis(ack_wait_ms))
            .pool("p.1", bound)
            .await
        {
            Ok(q) => return q,
            Err(e) if tries < 10 => {
                tries += 1;
                eprintln!("opening the queue: {e}; again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("cannot open the pool's queue: {e}"),
        }
    }
}

/// CLU-Q-1: 60 admissions at once through three replicas on three nodes into a queue bound to
/// 8: exactly 8 are admitted, every other is told the queue is full; a place freed takes one
/// more; a retried admission of the same task is not counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_holds_whatever_the_replicas_admitting() {
    let nats = NatsCluster::start(3).await;
    let replicas = [
        replica(&nats, 0, "a").await,
        replica(&nats, 1, "b").await,
        replica(&nats, 2, "c").await,
    ];
    let mut queues = Vec::new();
    for r in &replicas {
        queues.push(queue(r, 8, 5_000).await);
    }
    let mut burst = tokio::task::JoinSet::new();
    let queues = std::sync::Arc::new(queues);
    for i in 0..60 {
        let queues = queues.clone();
        burst.spawn(async move {
            let q = &queues[i % 3];
            let r = q
                .admit(Priority::Interactive, &format!("t{i}"), Bytes::from("{}"))
                .await;
            (i, r)
        });
    }
    let (mut admitted, mut full) = (0, 0);
    while let Some(r) = burst.join_next().await {
        match r.unwrap() {
            // (a retry inside `admit` may come back as the duplicate of its own first send)
            (_, Ok(_)) => admitted += 1,
            (_, Err(AdmitError::Full { bound, .. })) => {
                assert_eq!(bound, 8);
                full += 1;
            }
            (i, Err(e)) => panic!("admission {i}: {e}"),
        }
    }
    assert_eq!((admitted, full), (8, 52));
    assert_eq!(queues[0].depth(Priority::Interactive).await.unwrap(), 8);
    assert_eq!(queues[2].depth(Priority::Batch).await.unwrap(), 0);
    // the other class has its own bound
    queues[1]
        .admit(Priority::Batch, "b0", Bytes::from("{}"))
        .await
        .unwrap();

    // a task ends on replica b: its place is free for one more, and only one
    let Take::Task(t) = queues[1]
        .take(Priority::Interactive, Duration::from_secs(2))
        .await
        .unwrap()
    else {
        panic!("a queued task to take");
    };
    assert_eq!(t.delivered, 1);
    t.done().await.unwrap();
    let mut depth = 8;
    for _ in 0..40 {
        depth = queues[0].depth(Priority::Interactive).await.unwrap();
        if depth == 7 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(depth, 7);
    let again = queues[2]
        .admit(Priority::Interactive, "late", Bytes::from("{}"))
        .await
        .unwrap();
    // the same task admitted again (a retry after a lost answer): the same place, not a new one
    let retry = queues[0]
        .admit(Priority::Interactive, "late", Bytes::from("{}"))
        .await
        .unwrap();
    assert!(
        retry.duplicate && retry.sequence == again.sequence,
        "{retry:?} vs {again:?}"
    );
    assert!(matches!(
        queues[1]
            .admit(Priority::Interactive, "over", Bytes::from("{}"))
            .await,
        Err(AdmitError::Full { .. })
    ));
}

/// CLU-Q-2: a task taken by a replica that stops answering goes to another after `ack_wait`
/// (delivered twice); progress acknowledgements keep it with a working taker; once its runs
/// stopped `cluster.max_deliveries` times (3 by default) it is terminated and handed back as
/// exhausted, its place freed — the times it was given back untried are not runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_taker_stops_goes_to_another() {
    let nats = NatsCluster::start(3).await;
    let a = replica(&nats, 0, "a").await;
    let qa = queue(&a, 4, 1_000).await;
    qa.admit(Priority::Interactive, "t1", Bytes::from("job"))
        .await
        .unwrap();
    {
        // replica x takes it and dies (its connection gone, no ack)
        let x = replica(&nats, 1, "x").await;
        let qx = queue(&x, 4, 1_000).await;
        let Take::Task(t) = qx
            .take(Priority::Interactive, Duration::from_secs(2))
            .await
            .unwrap()
        else {
            panic!("x takes the task");
        };
        assert_eq!((t.task_id.as_str(), t.delivered), ("t1", 1));
        std::mem::forget(t);
    }
    // nothing to take while its ack_wait runs; then replica b gets it, second delivery
    let b = replica(&nats, 2, "b").await;
    let qb = queue(&b, 4, 1_000).await;
    let taken = loop {
        match qb
            .take(Priority::Interactive, Duration::from_millis(500))
            .await
            .unwrap()
        {
            Take::Task(t) => break t,
            Take::Empty => continue,
            Take::Exhausted { .. } => panic!("exhausted too early"),
        }
    };
    assert_eq!((taken.task_id.as_str(), taken.delivered), ("t1", 2));
    assert_eq!(&taken.payload[..], b"job");
    // b works on it for three ack_waits, confirming progress: nobody else gets it
    for _ in 0..6 {
        taken.progress().await.unwrap();
        assert!(matches!(
            qa.take(Priority::Interactive, Duration::from_millis(500))
                .await
                .unwrap(),
            Take::Empty
        ));
    }
    // b's run stops too (handed back): two runs stopped. Three replicas then take it and
    // give it back untried (no slot for it after all): not runs, whatever JetStream counts
    taken.hand_back().await.unwrap();
    let mut deliveries = vec![2];
    let exhausted = loop {
        match qa
            .take(Priority::Interactive, Duration::from_secs(2))
            .await
            .unwrap()
        {
            Take::Task(t) => {
                deliveries.push(t.delivered);
                if t.delivered < 6 {
                    t.give_back().await.unwrap();
                } else {
                    // the third run, which stops as well
                    t.hand_back().await.unwrap();
                }
            }
            Take::Exhausted { task_id, runs } => break (task_id, runs),
            Take::Empty => panic!("the task vanished after deliveries {deliveries:?}"),
        }
    };
    // the seventh delivery, after three runs that stopped, is the end of it
    assert_eq!(deliveries, vec![2, 3, 4, 5, 6]);
    let max = i64::from(ClusterConfig::default().max_deliveries);
    assert_eq!(exhausted, ("t1".to_string(), max));
    // its place is free (the stream applies the acknowledgement through its own log)
    let mut depth = 1;
    for _ in 0..40 {
        depth = qa.depth(Priority::Interactive).await.unwrap();
        if depth == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(depth, 0);
}

/// CLU-Q-3: `kill -9` of the NATS node leading the pool's stream in the middle of a burst of
/// admissions: every admission that was acknowledged is still in the queue afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_admission_is_lost_when_the_stream_leader_dies() {
    let mut nats = NatsCluster::start(3).await;
    let first = replica(&nats, 0, "probe").await;
    let mut probe = queue(&first, 10_000, 5_000).await;
    let leader = probe.leader().await.unwrap().expect("a leader");
    let dead: usize = leader.trim_start_matches('n').parse().unwrap();
    let survivor = (dead + 1) % 3;
    drop(probe);
    drop(first);
    // the admitting replica talks to a node that survives
    let a = replica(&nats, survivor, "a").await;
    let qa = queue(&a, 10_000, 5_000).await;
    // each task is sent until it is acknowledged, as a client retries (the same id: a
    // publish stored whose answer was lost comes back as a duplicate, not a second task)
    let mut acked = BTreeSet::new();
    let mut retried = 0;
    for i in 0..300 {
        if i == 100 {
            nats.kill(dead);
        }
        let id = format!("t{i}");
        let started = std::time::Instant::now();
        loop {
            match tokio::time::timeout(
                Duration::from_secs(5),
                qa.admit(Priority::Interactive, &id, Bytes::from("{}")),
            )
            .await
            {
                Ok(Ok(_)) => break,
                Ok(Err(AdmitError::Full { .. })) => panic!("no bound was reached"),
                _ if started.elapsed() < Duration::from_secs(30) => {
                    retried += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => panic!("task {id} never admitted: {:?}", other.map(|r| r.err())),
            }
        }
        acked.insert(id);
    }
    eprintln!("admission attempts retried while the stream's leader changed: {retried}");
    // every acknowledged one is there (taken once each by another replica)
    let b = replica(
        &nats,
        (survivor + 1) % 3 + if (survivor + 1) % 3 == dead { 1 } else { 0 },
        "b",
    );
    let b = b.await;
    let qb = queue(&b, 10_000, 5_000).await;
    let mut seen = BTreeSet::new();
    loop {
        match qb
            .take(Priority::Interactive, Duration::from_secs(1))
            .await
            .unwrap()
        {
            Take::Task(t) => {
                seen.insert(t.task_id.clone());
                t.done().await.unwrap();
            }
            Take::Empty => break,
            Take::Exhausted { .. } => panic!("no task was delivered that often"),
        }
    }
    let lost: Vec<&String> = acked.difference(&seen).collect();
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
    // and none twice: the queue held exactly the 300 tasks
    assert_eq!(seen.len(), 300);
}

/// CLU-EV-1: a task's events published through one replica (each sent until acknowledged,
/// through the `kill -9` of the NATS node leading the events stream) are followed from another
/// replica; that follower goes away after 80 events and a third replica resumes after the last
/// id it saw (`Last-Event-ID`): every event comes once, in order, none of another task's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_events_are_followed_from_any_replica_and_resumed_after_an_id() {
    use futures::StreamExt;
    use orchestratord::cluster::event_relay::{EventRelay, RelayLimits};
    let limits = RelayLimits {
        keep: Duration::from_secs(300),
        per_task: 10_000,
        bytes: 64 << 20,
    };
    let mut nats = NatsCluster::start(3).await;
    let probe = replica(&nats, 0, "probe").await;
    let leader = probe
        .events(limits)
        .await
        .unwrap()
        .leader()
        .await
        .unwrap()
        .expect("a leader");
    drop(probe);
    let dead: usize = leader.trim_start_matches('n').parse().unwrap();
    let (s1, s2) = ((dead + 1) % 3, (dead + 2) % 3);
    let a = replica(&nats, s1, "a").await;
    let ra: EventRelay = relay(&a, limits).await;
    let publisher = tokio::spawn(async move {
        for i in 0..200u64 {
            for (task, payload) in [("t1", format!("e{i}")), ("t2", format!("other{i}"))] {
                let started = std::time::Instant::now();
                while ra
                    .publish(task, i, bytes::Bytes::from(payload.clone()))
                    .await
                    .is_err()
                {
                    assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "event {i} never stored"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let b = replica(&nats, s2, "b").await;
    let rb = relay(&b, limits).await;
    let mut got: Vec<(u64, String)> = Vec::new();
    {
        let mut events = Box::pin(rb.follow("t1", 0).await.unwrap());
        while got.len() < 80 {
            got.push(next_event(&mut events).await);
            if got.len() == 40 {
                nats.kill(dead);
            }
        }
    }
    drop(rb);
    drop(b);
    // the follower is gone; a third replica resumes after the last id it saw
    let c = replica(&nats, s1, "c").await;
    let rc = relay(&c, limits).await;
    let last = got.last().unwrap().0;
    let mut events = Box::pin(rc.follow("t1", last).await.unwrap());
    while got.len() < 200 {
        got.push(next_event(&mut events).await);
    }
    publisher.await.unwrap();
    let texts: Vec<&str> = got.iter().map(|(_, t)| t.as_str()).collect();
    let want: Vec<String> = (0..200).map(|i| format!("e{i}")).collect();
    assert_eq!(texts, want, "every event once, in order");
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "ids grow");
    // nothing more for t1 (no duplicate after the last)
    assert!(
        tokio::time::timeout(Duration::from_millis(500), events.next())
            .await
            .is_err()
    );
}

/// The event relay through `c` (retried while the cluster elects a new stream leader).
async fn relay(
    c: &Cluster,
    limits: orchestratord::cluster::event_relay::RelayLimits,
) -> orchestratord::cluster::event_relay::EventRelay {
    for _ in 0..20 {
        match c.events(limits).await {
            Ok(r) => return r,
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    panic!("the event relay did not open")
}

/// A follower's next event, `(id, text)`, within 30 s.
async fn next_event(
    events: &mut (impl futures::Stream<
        Item = Result<
            orchestratord::cluster::event_relay::Relayed,
            orchestratord::cluster::ClusterError,
        >,
    > + Unpin),
) -> (u64, String) {
    use futures::StreamExt;
    let e = tokio::time::timeout(Duration::from_secs(30), events.next())
        .await
        .expect("an event within 30 s")
        .expect("the follow goes on")
        .expect("an event, not an error");
    (e.id, String::from_utf8(e.payload.to_vec()).unwrap())
}
