//! The admitting replica runs the task itself when it can (CLU-PATH-1): with a slot free here
//! in a pool that takes from its queue (and no head start given to another pool), the task's
//! run starts on that slot while its admission goes to the queue's stream (CLU-PATH-2: the
//! prefill does not wait for the stream's round trips), and right after the stream took it
//! this replica takes the queue's next task of its class, without waiting for a nudge, as any
//! taker would. When that is the task it just admitted, the early run is its run: its
//! `started` goes on the relay (no queue look, no history read, no consumer to follow it),
//! and the admitted task — what its clients read — gets each event from this replica's run
//! once the relay has it (the same events with the same ids a replica following it on the
//! relay would get, so a client resuming elsewhere misses nothing). Anything else — the
//! stream refused it, it was there already, another task was first in the queue — withdraws
//! the early run (no event of it goes anywhere; its slot is back within a pass) and the queue's
//! order is kept: the task first in line is started here on that slot, the admitted task waits
//! its turn. Everything else is the taker's path: the task stays in the stream until it ends
//! (the bound counts it), progress is acknowledged, and a replica that dies loses the task to
//! the next taker after `ack_wait`.

use std::sync::Arc;

use super::head_start::Preference;
use super::slot_claims::SlotClaim;
use super::taker::place_giving_way;
use super::taker::Run;
use super::task_path::{Here, QueueKey, TaskPath};
use super::task_queue::{PoolQueue, Take};
use super::ClusterError;
use crate::lifecycle::handoff::Handoff;
use crate::lifecycle::placement::Placement;
use crate::lifecycle::relayed_task::{self, Purpose};
use crate::lifecycle::state::Lifecycle;
use crate::lifecycle::task::Task;

use super::early_run::Early;

/// How long a task kept to run here waits for its announcement (which follows its admission
/// at once) before it is given up: its admission was dropped.
const UNCLAIMED_FOR: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a task pulled in place of the one admitted waits for the slot the admitted
/// task's early run gives back (its engine stops it between two passes).
const WITHDRAWN_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);
/// How often it looks.
const WITHDRAWN_POLL: std::time::Duration = std::time::Duration::from_millis(5);

impl TaskPath {
    /// The pool of this replica that takes from `key`'s queue with the most free slots no
    /// other take here claimed, when one has such a slot and `prefer` names no other pool:
    /// with that slot claimed for the take.
    pub(super) fn free_pool_here(
        &self,
        state: &Lifecycle,
        key: &QueueKey,
        prefer: Option<&Preference>,
    ) -> Option<(String, SlotClaim)> {
        let me = self.cluster.replica();
        let (free, pool) = state
            .pools
            .all()
            .into_iter()
            .filter(|p| key.taken_by(p.id(), &p.spec().model_alias) && p.accepts_work())
            .filter(|p| prefer.is_none_or(|w| w.replica == me && w.pool == p.id()))
            .map(|p| (p.snapshot().slots_free(), p))
            .filter(|(free, p)| self.slot_claims.unclaimed(p.id(), *free) > 0)
            .max_by_key(|(free, p)| self.slot_claims.unclaimed(p.id(), *free))?;
        let claim = self.slot_claims.claim(pool.id(), free)?;
        Some((pool.id().to_string(), claim))
    }

    /// Starts the task of `handoff` on a slot of `pool` (the one `claim` holds) before its
    /// admission is answered (CLU-PATH-2): its prefill runs while the queue's stream takes
    /// it and while this replica takes it from the queue, so those round trips are not
    /// waited for before its first token. `None` when this pool cannot run it (the take loop
    /// says why when it takes it) or its slot went to another task.
    pub(super) async fn start_early(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        task: &Task,
        handoff: &Handoff,
        pool: String,
        claim: SlotClaim,
    ) -> Option<Early> {
        // built as any taker builds it, from what goes into the queue (its prompt's ids as
        // the admission counted them)
        let purpose = Purpose::Run {
            pool: &pool,
            counted: task.prompt_ids.as_ref(),
        };
        let run = relayed_task::build(state, handoff, purpose).await.ok()?;
        run.mark_run_for_cluster();
        let placed = place_giving_way(state, &pool, &run).await;
        // the slot is leased now, or gone to another task: the claim has done its part
        drop(claim);
        let Placement::Leased(lease) = placed else {
            tracing::debug!(task_id = %handoff.task_id, "cluster: the free slot went to another task; the admitted one waits in the queue");
            return None;
        };
        let from = self.start_engine(state, &pool, &run, lease);
        Some(Early { pool, run, from })
    }

    /// What a take from queue `q` brought right after `task` went in, its run started early
    /// (`early`): true when it was `task`, kept for [`Self::start_here`]; anything else is
    /// started as the take loop starts it (or handed back), and the early run withdrawn.
    pub(super) async fn keep_pulled(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        task: &Arc<Task>,
        handoff: &Handoff,
        q: &PoolQueue,
        pulled: Result<Take, ClusterError>,
        early: Early,
    ) -> bool {
        let taken = match pulled {
            Ok(Take::Task(t)) if t.task_id == task.id => *t,
            other => {
                tracing::debug!(task_id = %task.id, pulled = ?other.as_ref().map(Take::what), "cluster: the take brought another task than the one admitted");
                self.early_misses
                    .missed(q.name(), tokio::time::Instant::now());
                state.withdraw_run(&early.run);
                self.start_pulled(state, &early.pool, q, task.priority, other)
                    .await;
                return false;
            }
        };
        let here = Here {
            pool: early.pool,
            handoff: handoff.clone(),
            run: early.run,
            from: early.from,
            taken,
        };
        // each entry holds a slot: never more than this replica's slots, and never for long —
        // an admission dropped before its announcement (its client gone) gives both back
        self.here().insert(task.id.clone(), here);
        let (path, id, state) = (self.clone(), task.id.clone(), state.clone());
        tokio::spawn(async move {
            tokio::time::sleep(UNCLAIMED_FOR).await;
            let left = path.here().remove(&id);
            if let Some(h) = left {
                tracing::info!(task_id = %id, "cluster: an admission dropped before its start; its slot and place freed");
                state.withdraw_run(&h.run);
                let _ = path.let_go(h.taken).await;
            }
        });
        true
    }

    /// What a take from queue `q` for `pool` brought right after `task` went in, when no
    /// early run of it was started (`later` holds the slot claimed for it) or its slot went
    /// to another task: `task` is started now and kept for [`Self::start_here`] (true), or
    /// whatever came is started as the take loop starts it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start_taken(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        task: &Arc<Task>,
        handoff: &Handoff,
        q: &PoolQueue,
        pool: &str,
        pulled: Result<Take, ClusterError>,
        later: Option<(String, SlotClaim)>,
    ) -> bool {
        let own = matches!(&pulled, Ok(Take::Task(t)) if t.task_id == task.id);
        if let (true, Some((pool, claim))) = (own, later) {
            if let Some(early) = self.start_early(state, task, handoff, pool, claim).await {
                return self
                    .keep_pulled(state, task, handoff, q, pulled, early)
                    .await;
            }
        }
        self.start_pulled(state, pool, q, task.priority, pulled)
            .await;
        false
    }

    /// Starts what a pull from queue `q` (of `class`) for `pool` brought where no early run
    /// of the task just admitted takes it, as the take loop would: a task (on a slot free now,
    /// or the one the admitted task's withdrawn early run gives back within a pass), or one
    /// taken too often.
    pub(super) async fn start_pulled(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        pool: &str,
        q: &PoolQueue,
        class: contracts::Priority,
        pulled: Result<Take, ClusterError>,
    ) {
        match pulled {
            Ok(Take::Task(t)) => {
                // left to another pool for a moment (PLACE-8): back to the queue for it
                let left_to = serde_json::from_slice::<Handoff>(&t.payload)
                    .ok()
                    .and_then(|h| h.head_start)
                    .filter(|p| super::head_start::left_elsewhere(p, self.cluster.replica(), pool));
                if let Some(p) = left_to {
                    tracing::debug!(task_id = %t.task_id, replica = %p.replica, pool = %p.pool, "cluster: a task taken by an admission here is left to another pool; given back");
                    let queue = t.queue.clone();
                    let _ = t.give_back().await;
                    self.cluster.nudge(&queue, Some(&p)).await;
                    return;
                }
                let (path, state, pool) = (self.clone(), state.clone(), pool.to_string());
                tokio::spawn(async move {
                    let claim = path.claim_when_free(&state, &pool).await;
                    path.start(&state, &pool, *t, claim).await
                });
            }
            Ok(Take::Exhausted { task_id, runs }) => {
                self.cluster.say_freed(q.name(), class).await;
                let path = self.clone();
                tokio::spawn(async move { path.exhausted(&task_id, runs).await });
            }
            Ok(Take::Empty) | Err(_) => {}
        }
    }

    /// A claim on a free slot of `pool` as soon as one is, waiting at most
    /// [`WITHDRAWN_WITHIN`]: `None` past it (the task pulled for it is given back).
    async fn claim_when_free(&self, state: &Lifecycle, pool: &str) -> Option<SlotClaim> {
        let until = tokio::time::Instant::now() + WITHDRAWN_WITHIN;
        loop {
            let free = state
                .pools
                .get(pool)
                .map_or(0, |p| p.snapshot().slots_free());
            if let Some(claim) = self.slot_claims.claim(pool, free) {
                return Some(claim);
            }
            if tokio::time::Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(WITHDRAWN_POLL).await;
        }
    }

    /// Starts `task`, kept by [`Self::keep_pulled`], on its slot while its `started` (the
    /// wire event `started`, with the handoff) goes on the relay; its events go to `task`
    /// from the run here. An error when the relay did not take the `started`: the run is
    /// stopped and the task out of its queue (the admission is refused).
    pub(super) async fn start_here(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        task: &Arc<Task>,
        started: bytes::Bytes,
    ) -> Option<Result<(), super::ClusterError>> {
        let here = self.here().remove(&task.id)?;
        // in its own task: an admission dropped half way (its client gone) cannot leave the
        // run started and its events nowhere
        let (path, state, task) = (self.clone(), state.clone(), task.clone());
        let started =
            tokio::spawn(async move { path.announce_here(&state, &task, started, here).await });
        Some(started.await.unwrap_or_else(|e| {
            Err(super::ClusterError::JetStream(format!(
                "the task's start stopped: {e}"
            )))
        }))
    }

    async fn announce_here(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        task: &Arc<Task>,
        started: bytes::Bytes,
        here: Here,
    ) -> Result<(), super::ClusterError> {
        let Here {
            pool,
            handoff,
            run,
            from,
            taken,
        } = here;
        // its record is kept as a followed task's: on this replica and for the others
        task.mark_relayed();
        let started_run = self.register(state, &pool, &handoff, run.clone(), taken, Some(from));
        let id = match self.publish_started(&task.id, started).await {
            Ok(id) => id,
            Err(e) => {
                self.running().remove(&run.id);
                state.cancel_task(&run, crate::metrics::CancelReason::Client);
                let _ = self.let_go(started_run.taken).await;
                return Err(e);
            }
        };
        tracing::debug!(task_id = %task.id, started_id = id, "task announced, runs here");
        let run = Run {
            n: 1,
            last: id,
            follower: Some(task.clone()),
            ..started_run
        };
        let (path, state) = (self.clone(), state.clone());
        tokio::spawn(async move { path.relay_run(state, run).await });
        Ok(())
    }
}
