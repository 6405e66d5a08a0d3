//! `GET /v1/tenants`: how the queue shares out among tenants.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One tenant's standing: its weight, its tasks, the service it received and its quotas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantStatus {
    pub tenant: String,
    pub weight: f64,
    pub queued: u32,
    pub running: u32,
    /// The queue places it is entitled to now: the capacity times its weight over the weights
    /// of the tenants waiting, itself included (under `fifo`: the capacity).
    pub queue_share: f64,
    /// Tokens served (prompt read and generated) divided by its weight, the count the fair
    /// order compares; lifted when it becomes busy again after idling.
    pub weighted_tokens_served: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_priority: Option<crate::Priority>,
}

/// `GET /v1/tenants`: configured tenants, those with keys, those served so far (idle ones
/// too) and those with tasks queued or running.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"fairness": "tenant", "queue_capacity": 64, "tenants": [{"tenant": "alice", "weight": 3.0, "queued": 2, "running": 1, "queue_share": 48.0, "weighted_tokens_served": 1520.5, "requests_per_minute": 60}]}))]
pub struct TenantList {
    /// `tenant` (fair share) or `fifo`.
    pub fairness: String,
    pub queue_capacity: u32,
    pub tenants: Vec<TenantStatus>,
}
