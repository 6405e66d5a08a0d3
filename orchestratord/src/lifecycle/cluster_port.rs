//! What the lifecycle asks of the cluster, when the replica is one (`cluster.nats_urls`).
//! `cluster/` implements it and sits above the lifecycle (it runs tasks through the runner and
//! placement), so the lifecycle names only this trait, never the cluster's types; the
//! implementation reaches the lifecycle's state through a weak reference given at start.

use std::sync::Arc;
use std::time::Duration;

use contracts::{Priority, TaskRecord};
use futures::future::BoxFuture;

use crate::error::ApiError;
use crate::lifecycle::handoff::Handoff;
use crate::lifecycle::task::Task;

/// Where the cluster's queue put a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterPlace {
    /// Tasks of its class ahead of it waiting for a slot, on every replica.
    pub position: usize,
    /// Its predicted wait for a slot of any replica's pool (`None`: no pool's pace measured).
    pub predicted_start_ms: Option<u64>,
}

/// Why the cluster did not take a task.
#[derive(Debug)]
pub enum ClusterRefusal {
    /// Its queue holds the bound (queued and running); `retry_after_ms`: when the first of the
    /// cluster's slots is predicted to free up.
    Full { retry_after_ms: Option<u64> },
    /// The cluster's line is too long for the task's limits: predicted to start after
    /// `predicted_start_ms`, where `allowed_ms` was the longest wait; not queued.
    Late {
        predicted_start_ms: u64,
        allowed_ms: u64,
    },
    /// The cluster did not answer.
    Unavailable(String),
}

pub trait ClusterPort: Send + Sync {
    /// Sets the cluster's gauges (its tasks, its live replicas) for a scrape of `/metrics`.
    fn publish_gauges(&self) -> BoxFuture<'_, ()>;

    /// Whether a pool of another replica takes tasks pinned to `pin`, or else of `model`.
    fn serves_elsewhere(&self, pin: Option<&str>, model: &str) -> bool;

    /// Whether a pool of another replica that takes tasks pinned to `pin`, or else of
    /// `model`, confirmed its pace on a real task.
    fn pace_confirmed_elsewhere(&self, pin: Option<&str>, model: &str) -> bool;

    /// Whether the queue of tasks pinned to `pin`, or else of `model`, is known full for
    /// `class` (its stream refused an admission there a moment ago and no task left since):
    /// then when a place is predicted to free up (ms; `None`: no pool's pace measured yet).
    fn known_full(&self, pin: Option<&str>, model: &str, class: Priority) -> Option<Option<u64>>;

    /// Puts `task` (built from `handoff`) in its queue: its place among the tasks waiting and
    /// its predicted start over every replica's pools — unless that start comes after
    /// `wait_allowed` (its limits' longest wait for a slot), when it is taken out again.
    fn admit<'a>(
        &'a self,
        task: &'a Arc<Task>,
        handoff: Handoff,
        wait_allowed: Option<Duration>,
    ) -> BoxFuture<'a, Result<ClusterPlace, ClusterRefusal>>;

    /// Puts `task`'s `started` (with `handoff`) on the relay and follows its later events.
    fn announce<'a>(
        &'a self,
        task: &'a Arc<Task>,
        handoff: Handoff,
    ) -> BoxFuture<'a, Result<(), String>>;

    /// The task `id` another replica admitted, followed here from now on, when `tenant` may
    /// see it; `None` when the cluster has no such task (for them).
    fn adopt<'a>(
        &'a self,
        tenant: &'a str,
        sees_all: bool,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Arc<Task>>, ApiError>>;

    /// Stores the record of a task this replica followed, for every replica to read.
    fn record_ended(&self, tenant: &str, record: TaskRecord);

    /// The record of task `id` as a replica that followed it stored it.
    fn stored_record<'a>(
        &'a self,
        tenant: &'a str,
        any_tenant: bool,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, String>>;
}
