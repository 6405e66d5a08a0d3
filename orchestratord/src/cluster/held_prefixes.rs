//! What every replica's pools hold (PLACE-8): each replica publishes, per local pool whose
//! engine says what it holds, the block hashes of its cached prefixes (`engine_port::prefix`)
//! on core NATS `orchd.held.<replica>` — what was added and evicted since the last message,
//! every [`PUBLISH_EVERY`] while it changes, and the whole set every [`FULL_EVERY`] — and
//! follows the others'. Fire and forget: no message is on a request's path, and one lost is
//! found by the next message's sequence number (the pool counts for nothing until its next
//! whole set). A reader that finds such a gap, or hears a pool first by its changes (it joined
//! after that pool's whole set went out), asks that replica for its whole set on
//! `orchd.held-want` (at most every [`ASK_EVERY`] a pool), and a replica that starts following
//! asks every replica; a replica answers at its next look, at most every [`ANSWER_EVERY`], so
//! nobody waits out [`FULL_EVERY`] for what the others hold. The index is bounded: [`MAX_REPLICAS`] replicas, [`MAX_POOLS`] pools each,
//! [`MAX_INDEX_BLOCKS`] blocks in all; a pool silent for [`STALE_AFTER`] counts for nothing.
//!
//! Admission reads it to give the replica holding a task's prefix a head start on taking it
//! (`head_start.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::subject_token::subject_token;
use super::ClusterError;
use crate::held_changes::{decode, encode, Followed, Publisher};
use crate::lifecycle::state::Lifecycle;

/// How often a replica looks whether its pools' prefixes changed.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(50);
/// How often each pool's whole set goes out (a reader that missed a message recovers).
pub const FULL_EVERY: Duration = Duration::from_secs(5);
/// A reader asks a replica for one pool's whole set at most this often.
pub const ASK_EVERY: Duration = Duration::from_millis(500);
/// A replica sends whole sets on request at most this often.
pub const ANSWER_EVERY: Duration = Duration::from_millis(200);
/// Where readers ask for whole sets: the payload names the replica asked, or is empty for all.
const WANT_SUBJECT: &str = "orchd.held-want";
/// A pool not heard from for this long counts for nothing.
pub const STALE_AFTER: Duration = Duration::from_secs(15);
/// Other replicas indexed at most.
const MAX_REPLICAS: usize = 256;
/// Pools of one replica indexed at most.
const MAX_POOLS: usize = 64;
/// Block hashes indexed at most, every replica's together (8 bytes and a set's overhead each).
pub const MAX_INDEX_BLOCKS: usize = 1 << 20;
/// One message: a pool's changes since its previous message, or (`full`) its whole set, or
/// (`gone`) the pool's end.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct HeldUpdate {
    replica: String,
    pool: String,
    /// The model the pool serves (its alias: the queue it takes from).
    model: String,
    /// One more than the pool's previous message.
    seq: u64,
    #[serde(default)]
    full: bool,
    #[serde(default)]
    gone: bool,
    /// Block hashes as little-endian `u64`s, base64.
    #[serde(default)]
    added: String,
    #[serde(default)]
    evicted: String,
}

/// Another replica's pool, as its messages say.
struct PeerPool {
    model: String,
    followed: Followed,
    heard: Instant,
    /// When this reader last asked for the pool's whole set.
    asked: Option<Instant>,
}

/// The other replicas' pools and what they hold.
pub struct HeldIndex {
    replica: String,
    peers: Mutex<HashMap<String, HashMap<String, PeerPool>>>,
}

impl HeldIndex {
    pub fn new(replica: &str) -> Self {
        Self {
            replica: replica.to_string(),
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// For every other replica with a pool serving `model` that holds part of `chain` (a
    /// task's prefix blocks), the longest prefix one of its pools holds: (replica, pool,
    /// tokens).
    pub fn holders(&self, model: &str, chain: &[u64]) -> Vec<(String, String, usize)> {
        if chain.is_empty() {
            return Vec::new();
        }
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (replica, pools) in peers.iter() {
            let best = pools
                .iter()
                .filter(|(_, p)| p.model == model && p.heard.elapsed() < STALE_AFTER)
                .filter_map(|(id, p)| Some((id, p.followed.held()?.held_tokens(chain))))
                .filter(|&(_, held)| held > 0)
                .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)));
            if let Some((pool, held)) = best {
                out.push((replica.clone(), pool.clone(), held));
            }
        }
        out
    }

    /// Block hashes indexed now, every replica's together.
    pub fn blocks(&self) -> usize {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers
            .values()
            .flat_map(|pools| pools.values())
            .map(|p| p.followed.blocks())
            .sum()
    }

    /// Takes one message in; says the replica to ask for its whole set when the message left
    /// its pool incomplete (and it was not asked lately).
    fn take(&self, u: HeldUpdate) -> Option<String> {
        if u.replica == self.replica {
            return None;
        }
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if u.gone {
            if let Some(pools) = peers.get_mut(&u.replica) {
                pools.remove(&u.pool);
                if pools.is_empty() {
                    peers.remove(&u.replica);
                }
            }
            return None;
        }
        let (Some(added), Some(evicted)) = (decode(&u.added), decode(&u.evicted)) else {
            tracing::debug!(replica = %u.replica, pool = %u.pool, "cluster: unreadable held prefixes");
            return None;
        };
        // room left in the index for this pool: the bound counts every other pool's blocks
        let others: usize = peers
            .iter()
            .flat_map(|(r, pools)| pools.iter().map(move |(id, p)| (r, id, p)))
            .filter(|(r, id, _)| **r != u.replica || **id != u.pool)
            .map(|(_, _, p)| p.followed.blocks())
            .sum();
        let room = MAX_INDEX_BLOCKS.saturating_sub(others);
        if !peers.contains_key(&u.replica) && peers.len() >= MAX_REPLICAS {
            return None;
        }
        let pools = peers.entry(u.replica.clone()).or_default();
        if !pools.contains_key(&u.pool) && pools.len() >= MAX_POOLS {
            return None;
        }
        let now = Instant::now();
        let pool = pools.entry(u.pool.clone()).or_insert_with(|| PeerPool {
            model: u.model.clone(),
            followed: Followed::default(),
            heard: now,
            asked: None,
        });
        let complete = pool.followed.take(u.seq, u.full, &added, &evicted, room);
        pool.model = u.model;
        pool.heard = now;
        if complete || pool.asked.is_some_and(|at| at.elapsed() < ASK_EVERY) {
            return None;
        }
        pool.asked = Some(now);
        Some(u.replica)
    }
}

/// This replica's side: the messages that say what its pools hold now, given what
/// `publisher` said before; `whole`: every pool's whole set now (a reader asked).
fn updates(
    replica: &str,
    state: &Lifecycle,
    publisher: &mut Publisher,
    whole: bool,
) -> Vec<HeldUpdate> {
    let mut now = Vec::new();
    let mut models = HashMap::new();
    for pool in state.pools.all() {
        let Some(held) = pool.engine().and_then(|e| e.cached_prefixes()) else {
            continue;
        };
        let id = pool.id().to_string();
        models.insert(id.clone(), pool.spec().model_alias.clone());
        now.push((id, held));
    }
    publisher
        .changes(now, whole, FULL_EVERY)
        .into_iter()
        .map(|c| HeldUpdate {
            replica: replica.to_string(),
            model: models.get(&c.key).cloned().unwrap_or_default(),
            pool: c.key,
            seq: c.seq,
            full: c.full,
            gone: c.gone,
            added: encode(&c.added),
            evicted: encode(&c.evicted),
        })
        .collect()
}

fn subject(replica: &str) -> String {
    format!("orchd.held.{}", subject_token(replica))
}

impl super::Cluster {
    /// What this replica's pools hold, put out until `stop` (see the module's text).
    pub async fn publish_held(
        &self,
        state: Arc<Lifecycle>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut publisher = Publisher::default();
        let mut tick = tokio::time::interval(PUBLISH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let subject = subject(self.replica());
        // readers asking for whole sets; without it, whole sets go out every FULL_EVERY only
        let mut asks = match self.client.subscribe(WANT_SUBJECT).await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cluster: asks for held prefixes not followed");
                None
            }
        };
        let (mut wanted, mut answered) = (false, None::<Instant>);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
                ask = async { asks.as_mut()?.next().await }, if asks.is_some() => {
                    match ask {
                        Some(m) => wanted |= m.payload.is_empty() || m.payload == self.replica().as_bytes(),
                        None => asks = None,
                    }
                    continue;
                }
            }
            let whole = wanted && answered.is_none_or(|at| at.elapsed() >= ANSWER_EVERY);
            if whole {
                (wanted, answered) = (false, Some(Instant::now()));
            }
            for u in updates(self.replica(), &state, &mut publisher, whole) {
                let Ok(payload) = serde_json::to_vec(&u) else {
                    continue;
                };
                if let Err(e) = self.client.publish(subject.clone(), payload.into()).await {
                    tracing::debug!(error = %e, "cluster: held prefixes not sent");
                }
            }
        }
    }

    /// Asks `replica` (every replica: `None`) for its pools' whole sets.
    async fn ask_whole(&self, replica: Option<&str>) {
        let payload = replica.unwrap_or_default().as_bytes().to_vec();
        if let Err(e) = self.client.publish(WANT_SUBJECT, payload.into()).await {
            tracing::debug!(error = %e, "cluster: ask for held prefixes not sent");
        }
    }

    /// Follows the other replicas' messages into `self.held()` until `stop`.
    pub async fn follow_held(
        &self,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), ClusterError> {
        let mut sub = self
            .client
            .subscribe("orchd.held.*")
            .await
            .map_err(ClusterError::jetstream)?;
        // the whole sets that went out before this replica listened
        self.ask_whole(None).await;
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                m = sub.next() => m,
            };
            let Some(msg) = msg else {
                return Ok(());
            };
            match serde_json::from_slice::<HeldUpdate>(&msg.payload) {
                Ok(u) => {
                    if let Some(replica) = self.held().take(u) {
                        self.ask_whole(Some(&replica)).await;
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cluster: unreadable held prefixes"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(seq: u64, full: bool, added: &[u64], evicted: &[u64]) -> HeldUpdate {
        HeldUpdate {
            replica: "r2".into(),
            pool: "p".into(),
            model: "m".into(),
            seq,
            full,
            gone: false,
            added: encode(added),
            evicted: encode(evicted),
        }
    }

    const B: usize = pool_manager::PREFIX_BLOCK_TOKENS;

    /// PLACE-8: a peer's whole set, then its changes, count; a missed message makes the pool
    /// count for nothing until its next whole set, which the reader asks for (not again
    /// within `ASK_EVERY`); a pool's end removes it; the replica's own messages are not
    /// indexed.
    #[test]
    fn changes_apply_in_order_and_a_gap_waits_for_the_next_whole_set() {
        let ix = HeldIndex::new("r1");
        ix.take(update(1, true, &[1, 2], &[]));
        assert_eq!(
            ix.holders("m", &[1, 2, 3]),
            vec![("r2".into(), "p".into(), 2 * B)]
        );
        assert!(ix.holders("other-model", &[1, 2]).is_empty());
        ix.take(update(2, false, &[3], &[2]));
        assert_eq!(ix.holders("m", &[1, 2, 3])[0].2, B);
        assert_eq!(ix.holders("m", &[1, 3])[0].2, 2 * B);
        // seq 3 lost: 4 does not count, nor anything until a whole set, which it asks for
        assert_eq!(ix.take(update(4, false, &[5], &[])), Some("r2".into()));
        assert!(ix.holders("m", &[1, 3]).is_empty());
        // asked lately: not again for the next change
        assert_eq!(ix.take(update(5, false, &[6], &[])), None);
        assert_eq!(ix.take(update(5, true, &[7], &[])), None);
        assert_eq!(ix.holders("m", &[7])[0].2, B);
        assert!(ix.holders("m", &[1]).is_empty());
        // a pool first heard by its changes (its whole set went out before this reader
        // listened): asked for at once
        let mut joined = update(8, false, &[11], &[]);
        joined.pool = "q".into();
        assert_eq!(ix.take(joined), Some("r2".into()));
        let mut own = update(1, true, &[9], &[]);
        own.replica = "r1".into();
        ix.take(own);
        assert!(ix.holders("m", &[9]).is_empty());
        let mut gone = update(6, false, &[], &[]);
        gone.gone = true;
        ix.take(gone);
        assert_eq!(ix.blocks(), 0);
    }

    /// PLACE-8: the index never holds more than its bound, however much peers send.
    #[test]
    fn the_index_is_bounded() {
        let ix = HeldIndex::new("r1");
        let many: Vec<u64> = (0..(MAX_INDEX_BLOCKS as u64 + 10)).collect();
        for (i, chunk) in many
            .chunks(crate::held_changes::HASHES_PER_MESSAGE * 4)
            .enumerate()
        {
            let mut u = update(1, true, chunk, &[]);
            u.pool = format!("p{i}");
            ix.take(u);
        }
        assert!(ix.blocks() <= MAX_INDEX_BLOCKS, "{}", ix.blocks());
    }
}
