//! `orchctl workers [list | drain ID | models-refresh ID]`: the remote GPU workers.

use contracts::worker::{WorkerInfo, WorkerList};
use serde_json::json;

use super::client::{Ctl, CALL_TIMEOUT};
use super::error::CtlError;
use super::{path_segment, table, Output, WorkersCmd};

fn state(w: &WorkerInfo) -> &'static str {
    if w.draining {
        "draining"
    } else {
        "serving"
    }
}

async fn list(ctl: &Ctl) -> Result<Output, CtlError> {
    let list: WorkerList = ctl.get("/v1/workers").await?;
    let rows: Vec<Vec<String>> = list
        .workers
        .iter()
        .map(|w| {
            vec![
                w.worker_id.clone(),
                w.worker_name.clone(),
                w.models.join(","),
                format!("{}/{}", w.in_flight, w.max_concurrent),
                state(w).to_string(),
            ]
        })
        .collect();
    Ok(Output {
        human: table::render(&["WORKER", "NAME", "MODELS", "BUSY", "STATE"], &rows),
        json: json!(list),
    })
}

pub async fn run(ctl: &Ctl, cmd: Option<&WorkersCmd>) -> Result<Output, CtlError> {
    match cmd {
        None | Some(WorkersCmd::List) => list(ctl).await,
        Some(WorkersCmd::Drain { id, deadline }) => {
            let body =
                json!({"deadline_ms": u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX)});
            let w: WorkerInfo = ctl
                .post(
                    &format!("/v1/workers/{}/drain", path_segment(id)),
                    Some(&body),
                    CALL_TIMEOUT,
                )
                .await?;
            Ok(Output {
                human: format!(
                    "worker {} ({}): {}, {} request(s) in flight\n",
                    w.worker_id,
                    w.worker_name,
                    state(&w),
                    w.in_flight
                ),
                json: json!(w),
            })
        }
        Some(WorkersCmd::ModelsRefresh { id }) => {
            let w: WorkerInfo = ctl
                .post(
                    &format!("/v1/workers/{}/models_refresh", path_segment(id)),
                    None,
                    CALL_TIMEOUT,
                )
                .await?;
            Ok(Output {
                human: format!(
                    "worker {} ({}): asked to report its models again\n",
                    w.worker_id, w.worker_name
                ),
                json: json!(w),
            })
        }
    }
}
