//! `orchctl tenants`: how the queue shares out — each tenant's weight, tasks queued and
//! running, its share of the queue, the service it received and its quotas.

use contracts::TenantList;
use serde_json::json;

use super::client::Ctl;
use super::error::CtlError;
use super::{table, Output};

fn quotas(t: &contracts::TenantStatus) -> String {
    let mut q = Vec::new();
    if let Some(n) = t.max_concurrent {
        q.push(format!("{n} at once"));
    }
    if let Some(n) = t.max_queued {
        q.push(format!("{n} queued"));
    }
    if let Some(n) = t.requests_per_minute {
        q.push(format!("{n} req/min"));
    }
    if let Some(n) = t.tokens_per_minute {
        q.push(format!("{n} tok/min"));
    }
    if let Some(p) = t.max_priority {
        q.push(format!("≤ {}", p.as_str()));
    }
    if q.is_empty() {
        "-".into()
    } else {
        q.join(", ")
    }
}

pub async fn list(ctl: &Ctl) -> Result<Output, CtlError> {
    let list: TenantList = ctl.get("/v1/tenants").await?;
    let rows: Vec<Vec<String>> = list
        .tenants
        .iter()
        .map(|t| {
            vec![
                t.tenant.clone(),
                format!("{}", t.weight),
                t.queued.to_string(),
                t.running.to_string(),
                format!("{:.1}", t.queue_share),
                format!("{:.0}", t.weighted_tokens_served),
                quotas(t),
            ]
        })
        .collect();
    let mut human = format!(
        "fairness {}, queue capacity {}\n",
        list.fairness, list.queue_capacity
    );
    human.push_str(&table::render(
        &[
            "TENANT", "WEIGHT", "QUEUED", "RUNNING", "SHARE", "SERVED", "QUOTAS",
        ],
        &rows,
    ));
    Ok(Output {
        human,
        json: json!(list),
    })
}
