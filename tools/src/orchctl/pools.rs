//! `orchctl pools | health | drain | resume | reload`: the control plane.

use std::time::{Duration, Instant};

use contracts::{PoolHealth, PoolList, ReloadResponse};
use serde_json::json;

use super::client::{Ctl, CALL_TIMEOUT};
use super::error::CtlError;
use super::progress::Progress;
use super::{path_segment, table, Output};

/// How often a `--wait` asks the server again.
pub const POLL: Duration = Duration::from_millis(200);
/// How long past its deadline a drain may still show busy slots before `--wait` gives up (the
/// server ends them at the deadline; this covers their last event and a slow answer).
const DRAIN_GRACE: Duration = Duration::from_secs(30);

fn health_path(id: &str) -> String {
    format!("/v1/pools/{}/health", path_segment(id))
}

/// The file name of a model path (the table's column; the full path is in `health`).
fn short_model(m: &str) -> &str {
    m.rsplit(['/', '\\']).next().unwrap_or(m)
}

pub async fn list(ctl: &Ctl) -> Result<Output, CtlError> {
    let list: PoolList = ctl.get("/v1/pools").await?;
    // a cluster's replicas list each other's pools: which replica, in a first column
    let cluster = list.pools.iter().any(|p| p.replica.is_some());
    let rows: Vec<Vec<String>> = list
        .pools
        .iter()
        .map(|p| {
            let replica = cluster.then(|| p.replica.clone().unwrap_or_else(|| "-".into()));
            replica
                .into_iter()
                .chain([
                    p.pool_id.clone(),
                    p.kind.clone(),
                    short_model(&p.model_ref).to_string(),
                    p.state.clone(),
                    format!("{}/{}", p.metrics.slots_busy, p.slots_total),
                    p.queue_depth.to_string(),
                    unloads(p),
                ])
                .collect()
        })
        .collect();
    let columns = ["POOL", "KIND", "MODEL", "STATE", "BUSY", "QUEUE", "UNLOADS"];
    let headers: Vec<&str> = cluster
        .then_some("REPLICA")
        .into_iter()
        .chain(columns)
        .collect();
    Ok(Output {
        human: table::render(&headers, &rows),
        json: json!(list),
    })
}

/// When a pool unloads: `-` for a configured pool (it stays); an on-demand pool's time left
/// while idle, `when idle` / `in use` otherwise, or `kept` with no keep-alive.
fn unloads(p: &PoolHealth) -> String {
    let Some(o) = &p.on_demand else {
        return "-".into();
    };
    match (o.keep_alive_s, o.unloads_in_ms) {
        (None, _) => "kept".into(),
        (Some(_), Some(ms)) => format!(
            "in {}",
            humantime::format_duration(Duration::from_secs(ms.div_ceil(1000)))
        ),
        (Some(0), None) => "when idle".into(),
        (Some(s), None) => format!(
            "{} after idle",
            humantime::format_duration(Duration::from_secs(s))
        ),
    }
}

fn describe(h: &PoolHealth) -> String {
    let m = &h.metrics;
    let mut s = format!(
        "pool {} ({}): {}{}\n",
        h.pool_id,
        h.kind,
        h.state,
        if h.ready { "" } else { " (takes no new work)" }
    );
    s.push_str(&format!(
        "  model     {} ({} {})\n",
        h.model_ref, h.engine, h.engine_version
    ));
    s.push_str(&format!(
        "  slots     {} busy of {}\n  queue     {}\n",
        m.slots_busy, h.slots_total, h.queue_depth
    ));
    s.push_str(&format!(
        "  tasks     {} started, {} finished\n",
        m.tasks_started, m.tasks_finished
    ));
    s.push_str(&format!(
        "  reloads   {} ok, {} rolled back; {} restarts; load {} ms\n",
        m.reloads_ok, m.reloads_failed, m.restarts, m.model_load_ms
    ));
    if let Some(ms) = m.deadline_remaining_ms {
        s.push_str(&format!("  deadline  {:.1} s left\n", ms as f64 / 1000.0));
    }
    if m.drain_cut_off > 0 {
        s.push_str(&format!(
            "  cut off   {} task(s) ended by the drain deadline\n",
            m.drain_cut_off
        ));
    }
    if m.circuit_open {
        s.push_str(&format!(
            "  circuit   open after {} failed loads\n",
            m.consecutive_failures
        ));
    }
    if h.on_demand.is_some() {
        s.push_str(&format!("  on demand unloads {}\n", unloads(h)));
    }
    if let Some(e) = &h.last_error {
        s.push_str(&format!("  error     {e}\n"));
    }
    s
}

fn health_output(h: &PoolHealth) -> Output {
    Output {
        human: describe(h),
        json: json!(h),
    }
}

pub async fn health(ctl: &Ctl, id: &str) -> Result<Output, CtlError> {
    let h: PoolHealth = ctl.get(&health_path(id)).await?;
    Ok(health_output(&h))
}

pub async fn resume(ctl: &Ctl, id: &str) -> Result<Output, CtlError> {
    let path = format!("/v1/pools/{}/resume", path_segment(id));
    let h: PoolHealth = ctl.post(&path, None, CALL_TIMEOUT).await?;
    Ok(health_output(&h))
}

/// Drains; with `wait`, until the pool is drained. Exit 3 (deadline) when the server had to
/// end tasks still running at the deadline (its `drain_cut_off` count says so).
pub async fn drain(
    ctl: &Ctl,
    id: &str,
    deadline: Duration,
    wait: bool,
    json: bool,
) -> Result<Output, CtlError> {
    let path = format!("/v1/pools/{}/drain", path_segment(id));
    let deadline_ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
    let mut h: PoolHealth = ctl
        .post(
            &path,
            Some(&json!({ "deadline_ms": deadline_ms })),
            CALL_TIMEOUT,
        )
        .await?;
    if !wait {
        return Ok(health_output(&h));
    }
    let left = h.metrics.deadline_remaining_ms.unwrap_or(deadline_ms);
    let deadline_at = Instant::now() + Duration::from_millis(left);
    let mut progress = Progress::new(json);
    while h.state == "draining" {
        let busy = h.metrics.slots_busy;
        if Instant::now() > deadline_at + DRAIN_GRACE {
            progress.finish();
            return Err(CtlError::Deadline(format!(
                "pool {id} still has {busy} busy slot(s) {} s after its drain deadline",
                DRAIN_GRACE.as_secs()
            )));
        }
        let left = deadline_at.saturating_duration_since(Instant::now());
        progress.update(
            &format!("pool {id}: draining, {busy} slot(s) busy"),
            &format!(", {:.1} s to the deadline", left.as_secs_f64()),
        );
        tokio::time::sleep(POLL).await;
        h = ctl.get(&health_path(id)).await?;
    }
    progress.finish();
    if h.state != "drained" {
        return Err(CtlError::Failed(format!(
            "pool {id} stopped draining: it is {} now (resumed or reloaded meanwhile)",
            h.state
        )));
    }
    let cut = h.metrics.drain_cut_off;
    if cut > 0 {
        return Err(CtlError::Deadline(format!(
            "pool {id} is drained, but {cut} task(s) were still running at its deadline and were ended with a retriable error"
        )));
    }
    Ok(health_output(&h))
}

/// Drains every pool not yet drained, all at once. Returns the per-pool report and the error
/// the exit code comes from: the first hard failure, else a deadline that cut tasks off. A
/// pool whose state refuses a drain (409: loading, reloading, unready) is reported skipped.
pub async fn drain_all(
    ctl: &Ctl,
    deadline: Duration,
    wait: bool,
) -> Result<(Output, Option<CtlError>), CtlError> {
    let list: PoolList = ctl.get("/v1/pools").await?;
    let targets: Vec<&PoolHealth> = list.pools.iter().filter(|p| p.state != "drained").collect();
    let results = futures::future::join_all(
        targets
            .iter()
            .map(|p| drain(ctl, &p.pool_id, deadline, wait, true)),
    )
    .await;
    let (mut rows, mut report, mut hard, mut cut) = (Vec::new(), Vec::new(), None, None);
    for (p, r) in targets.iter().zip(results) {
        let outcome = match r {
            Ok(out) => out.json["state"].as_str().unwrap_or("?").to_string(),
            Err(CtlError::Refused {
                status: 409,
                message,
                ..
            }) => format!("skipped: {message}"),
            Err(e @ CtlError::Deadline(_)) => {
                let text = format!("cut off: {e}");
                cut.get_or_insert(e);
                text
            }
            Err(e) => {
                let text = format!("failed: {e}");
                hard.get_or_insert(e);
                text
            }
        };
        rows.push(vec![p.pool_id.clone(), outcome.clone()]);
        report.push(json!({"pool_id": p.pool_id, "outcome": outcome}));
    }
    let out = Output {
        human: table::render(&["POOL", "OUTCOME"], &rows),
        json: json!({ "pools": report }),
    };
    Ok((out, hard.or(cut)))
}

/// Reloads. The server answers when the new model serves (or was rolled back); without
/// `wait` this returns once the pool shows `reloading` (the server goes on by itself).
pub async fn reload(
    ctl: &Ctl,
    id: &str,
    model: &str,
    wait: bool,
    json: bool,
    timeout: Duration,
) -> Result<Output, CtlError> {
    let path = format!("/v1/pools/{}/reload", path_segment(id));
    let body = json!({ "new_model_ref": model });
    let call = ctl.post::<ReloadResponse>(&path, Some(&body), timeout);
    tokio::pin!(call);
    let started = Instant::now();
    let mut progress = Progress::new(json);
    let mut tick = tokio::time::interval(POLL);
    loop {
        tokio::select! {
            r = &mut call => {
                progress.finish();
                let r = r?;
                return Ok(Output {
                    human: format!("pool {} serves {} (loaded and self-tested in {} ms)\n", r.pool_id, r.model_ref, r.load_ms),
                    json: json!(r),
                });
            }
            _ = tick.tick() => {
                let Ok(h) = ctl.get::<PoolHealth>(&health_path(id)).await else { continue };
                if !wait && h.state == "reloading" {
                    progress.finish();
                    return Ok(Output {
                        human: format!("pool {id}: reload started; `orchctl health {id}` shows when it serves\n"),
                        json: json!({"pool_id": id, "state": h.state, "model_ref": model}),
                    });
                }
                progress.update(
                    &format!("pool {id}: {}", h.state),
                    &format!(", {:.1} s", started.elapsed().as_secs_f64()),
                );
            }
        }
    }
}
