//! What the soak checks against the server: a task's record (one terminal event, nothing
//! after it, no token after a cancel returned) and the pools' busy slots.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Failure, Tally};

/// How long a task may take to reach its terminal event after its client is done with it
/// (a disconnected task API reader's task is cancelled after the grace period).
const SETTLE: Duration = Duration::from_secs(60);

/// Waits for task `id` to end and checks its record: exactly one terminal event, last; when
/// `tokens_at_cancel` is given, no token was added after the cancel returned. Records the
/// outcome; returns it (a finish reason or an error code).
pub(crate) async fn verify_record(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    tokens_at_cancel: Option<u64>,
    tally: &Tally,
) -> Option<String> {
    let until = Instant::now() + SETTLE;
    let status = loop {
        match get_json(client, &format!("{base}/v1/tasks/{id}")).await {
            Some(v)
                if ["completed", "cancelled", "failed"]
                    .contains(&v["state"].as_str().unwrap_or("")) =>
            {
                break v
            }
            Some(_) | None if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => {
                tally.fail(Failure::Lost, format!("task {id} did not end: {other:?}"));
                return None;
            }
        }
    };
    let record = &status["record"];
    let transcript = record["transcript"].as_array().cloned().unwrap_or_default();
    let terminals: Vec<usize> = transcript
        .iter()
        .enumerate()
        .filter(|(_, e)| e["event"] == "end" || e["event"] == "error")
        .map(|(i, _)| i)
        .collect();
    match terminals.as_slice() {
        [] => {
            tally.fail(
                Failure::Lost,
                format!("task {id} ended without a terminal event"),
            );
            return None;
        }
        [t] if *t + 1 == transcript.len() => {}
        _ => {
            tally.fail(
                Failure::DoubleTerminal,
                format!(
                    "task {id}: terminal events at {terminals:?} of {}",
                    transcript.len()
                ),
            );
            return None;
        }
    }
    let tokens_out = record["tokens_out"].as_u64().unwrap_or(0);
    if let Some(n) = tokens_at_cancel {
        if tokens_out > n {
            tally.fail(
                Failure::TokensAfterCancel,
                format!("task {id}: {n} tokens when the cancel returned, {tokens_out} at the end"),
            );
        }
    }
    let last = transcript.last().cloned().unwrap_or_default();
    let outcome = if last["event"] == "end" {
        last["data"]["finish_reason"]
            .as_str()
            .unwrap_or("?")
            .to_string()
    } else {
        last["data"]["code"].as_str().unwrap_or("?").to_string()
    };
    if outcome == "INTERNAL" {
        tally.fail(
            Failure::ServerError,
            format!("task {id} failed INTERNAL: {last}"),
        );
    }
    Some(outcome)
}

/// Tokens the task has now (for the check after a cancel).
pub(crate) async fn tokens_now(client: &reqwest::Client, base: &str, id: &str) -> Option<u64> {
    get_json(client, &format!("{base}/v1/tasks/{id}")).await?["record"]["tokens_out"].as_u64()
}

async fn get_json(client: &reqwest::Client, url: &str) -> Option<Value> {
    let r = client.get(url).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// Sum of `orchd_pool_slots_busy` over the pools (`None` when the scrape had none).
fn busy_slots(metrics: &str) -> Option<u64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with("orchd_pool_slots_busy{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() as u64)
}

/// The sum of the samples of `name` whose labels include `with` (any labels when empty) in a
/// `/metrics` text.
fn metric_sum(metrics: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    crate::orchctl::metrics_summary::parse(metrics)
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            with.iter()
                .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|s| s.value)
        .sum()
}

/// Tasks that ended without their record reaching the store: finished tasks minus task
/// records written, once the writer caught up (waits up to `limit` for them to agree).
pub(crate) async fn wait_records_stored(
    client: &reqwest::Client,
    base: &str,
    limit: Duration,
) -> u64 {
    let until = Instant::now() + limit;
    loop {
        let text = match client.get(format!("{base}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let finished = metric_sum(&text, contracts::metric_names::TASKS_FINISHED, &[]);
        let written = metric_sum(
            &text,
            contracts::metric_names::RECORDS_WRITTEN,
            &[(contracts::metric_names::L_KIND, "task")],
        );
        let missing = (finished - written).max(0.0) as u64;
        if missing == 0 || Instant::now() >= until {
            return missing;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (up to `limit`) until no pool holds a slot; returns what is still held (`u64::MAX`
/// when the server never answered with its pools' slots).
pub(crate) async fn wait_slots_free(client: &reqwest::Client, base: &str, limit: Duration) -> u64 {
    let until = Instant::now() + limit;
    loop {
        let text = match client.get(format!("{base}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let busy = busy_slots(&text).unwrap_or(u64::MAX);
        if busy == 0 || Instant::now() >= until {
            return busy;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
