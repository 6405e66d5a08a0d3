//! The admitting replica runs the task itself when it can (CLU-PATH-1): right after the stream
//! took the task, a replica with a free slot in a pool that takes from its queue (and no head
//! start given to another pool) takes the queue's next task of its class at once, without
//! waiting for a nudge, as any taker would. When that is the task it just admitted, the task
//! starts on that slot while its `started` goes on the relay (no queue look, no history read,
//! no consumer to follow it), and the admitted task — what its clients read — gets each event
//! from this replica's run once the relay has it (the same events with the same ids a replica
//! following it on the relay would get, so a client resuming elsewhere misses nothing). The
//! queue's order is kept: when another task was first, that one is started here and the
//! admitted task waits its turn in the queue. Everything else is the taker's path: the
//! task stays in the stream until it ends (the bound counts it), progress is acknowledged,
//! and a replica that dies loses the task to the next taker after `ack_wait`.

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

/// How long a task kept to run here waits for its announcement (which follows its admission
/// at once) before it is given up: its admission was dropped.
const UNCLAIMED_FOR: std::time::Duration = std::time::Duration::from_secs(10);

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

    /// What a take from queue `q` for `pool` (on the slot `claim` holds) brought right after
    /// `task` went in: true when it was `task`, kept on a slot of `pool` for
    /// [`Self::start_here`]; anything else is started as the take loop starts it (or handed
    /// back).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_pulled(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        task: &Arc<Task>,
        handoff: &Handoff,
        pool: &str,
        q: &PoolQueue,
        pulled: Result<Take, ClusterError>,
        claim: SlotClaim,
    ) -> bool {
        let taken = match pulled {
            Ok(Take::Task(t)) if t.task_id == task.id => *t,
            other => {
                tracing::debug!(task_id = %task.id, pulled = ?other.as_ref().map(Take::what), "cluster: the take brought another task than the one admitted");
                self.start_pulled(state, pool, q, task.priority, other, claim)
                    .await;
                return false;
            }
        };
        // built as any taker builds it, from what went into the queue
        let run = match relayed_task::build(state, handoff, Purpose::Run { pool }).await {
            Ok(run) => run,
            Err(_) => {
                // the take loop builds it again and says why on the relay
                let _ = self.give_back(taken).await;
                return false;
            }
        };
        run.mark_run_for_cluster();
        let placed = place_giving_way(state, pool, &run).await;
        // the slot is leased now, or gone to another task: the claim has done its part
        drop(claim);
        let lease = match placed {
            Placement::Leased(lease) => lease,
            // the slot went to another task meanwhile: it waits in the queue
            Placement::Wait | Placement::Unavailable(..) => {
                tracing::debug!(task_id = %task.id, "cluster: the free slot went to another task; the admitted one waits in the queue");
                let _ = self.give_back(taken).await;
                return false;
            }
        };
        let here = Here {
            pool: pool.to_string(),
            handoff: handoff.clone(),
            run,
            lease,
            taken,
        };
        // each entry holds a slot: never more than this replica's slots, and never for long —
        // an admission dropped before its announcement (its client gone) gives both back
        self.here().insert(task.id.clone(), here);
        let (path, id) = (self.clone(), task.id.clone());
        tokio::spawn(async move {
            tokio::time::sleep(UNCLAIMED_FOR).await;
            let left = path.here().remove(&id);
            if let Some(h) = left {
                tracing::info!(task_id = %id, "cluster: an admission dropped before its start; its slot and place freed");
                let _ = path.let_go(h.taken).await;
            }
        });
        true
    }

    /// Starts what a pull from queue `q` (of `class`) for `pool` (on the slot `claim` holds)
    /// brought, as the take loop would: another task than the one admitted, or one taken too
    /// often.
    pub(super) async fn start_pulled(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        pool: &str,
        q: &PoolQueue,
        class: contracts::Priority,
        pulled: Result<Take, ClusterError>,
        claim: SlotClaim,
    ) {
        match pulled {
            Ok(Take::Task(t)) => {
                let (path, state, pool) = (self.clone(), state.clone(), pool.to_string());
                tokio::spawn(async move { path.start(&state, &pool, *t, Some(claim)).await });
            }
            Ok(Take::Exhausted { task_id, runs }) => {
                self.cluster.say_freed(q.name(), class).await;
                let path = self.clone();
                tokio::spawn(async move { path.exhausted(&task_id, runs).await });
            }
            Ok(Take::Empty) | Err(_) => {}
        }
    }

    /// Starts `task`, kept by [`Self::run_pulled`], on its slot while its `started` (the
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
            lease,
            taken,
        } = here;
        // its record is kept as a followed task's: on this replica and for the others
        task.mark_relayed();
        let started_run = self.launch(state, &pool, &handoff, run.clone(), lease, taken);
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
