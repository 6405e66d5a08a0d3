//! `orchctl tasks submit | stream | cancel | show`: the task API.

use std::io::Write;

use contracts::{
    AdmissionResponse, SseEnd, SseError, SseToken, TaskRequest, TaskState, TaskStatus,
};
use futures::StreamExt;
use serde_json::json;

use super::client::{Ctl, CALL_TIMEOUT};
use super::error::CtlError;
use super::{path_segment, Output};
use crate::sse_reader::SseReader;

/// Longest event of a task stream this tool accepts.
const MAX_FRAME: usize = 1 << 20;

pub async fn submit(ctl: &Ctl, req: &TaskRequest) -> Result<AdmissionResponse, CtlError> {
    let body = serde_json::to_value(req)
        .map_err(|e| CtlError::Failed(format!("cannot encode the task: {e}")))?;
    ctl.post("/v1/tasks", Some(&body), CALL_TIMEOUT).await
}

pub fn admitted(a: &AdmissionResponse) -> Output {
    Output {
        human: format!("{}\n", a.task_id),
        json: json!(a),
    }
}

/// Follows a task's events: the text to stdout as it comes (or one JSON object per event with
/// `json`), a summary line on stderr. Ok when the task ended with `end`; a task that ended with
/// `error` fails (exit 1) with its code.
pub async fn stream(
    ctl: &Ctl,
    id: &str,
    last_event_id: Option<u64>,
    json: bool,
) -> Result<(), CtlError> {
    let path = format!("/v1/tasks/{}/stream", path_segment(id));
    let resp = ctl.stream(&path, last_event_id).await?;
    let mut body = resp.bytes_stream();
    let mut reader = SseReader::new(MAX_FRAME);
    let mut out = std::io::stdout().lock();
    let broken =
        |e: &dyn std::fmt::Display| CtlError::Failed(format!("task {id}: stream broke: {e}"));
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| broken(&e))?;
        for f in reader.feed(&chunk).map_err(|e| broken(&e))? {
            if json {
                let data: serde_json::Value = serde_json::from_str(&f.data)
                    .unwrap_or(serde_json::Value::String(f.data.clone()));
                let line = json!({"id": f.id, "event": f.event, "data": data});
                let _ = writeln!(out, "{line}");
            }
            match f.event.as_str() {
                "token" if !json => {
                    if let Ok(t) = serde_json::from_str::<SseToken>(&f.data) {
                        let _ = write!(out, "{}", t.t);
                        let _ = out.flush();
                    }
                }
                "end" => {
                    let _ = out.flush();
                    if !json {
                        let _ = writeln!(out);
                        if let Ok(e) = serde_json::from_str::<SseEnd>(&f.data) {
                            eprintln!(
                                "end: {}, {} tokens, {} ms decoding",
                                e.finish_reason, e.tokens_out, e.decode_time_ms
                            );
                        }
                    }
                    return Ok(());
                }
                "error" => {
                    let _ = out.flush();
                    let e: SseError = serde_json::from_str(&f.data).map_err(|e| broken(&e))?;
                    return Err(CtlError::Failed(format!(
                        "task {id} ended with {}: {}{}",
                        e.code.as_str(),
                        e.message,
                        if e.retriable { " (retriable)" } else { "" }
                    )));
                }
                _ => {}
            }
        }
    }
    Err(CtlError::Failed(format!(
        "task {id}: the stream closed before the task's last event"
    )))
}

fn state_name(s: &TaskStatus) -> String {
    json!(s.state).as_str().unwrap_or("?").to_string()
}

fn ended(s: &TaskStatus) -> bool {
    !matches!(s.state, TaskState::Queued | TaskState::Running)
}

/// Cancels a queued or running task; one that had already ended says so (exit 2), as does
/// one that ended by itself before the cancel reached it.
pub async fn cancel(ctl: &Ctl, id: &str) -> Result<Output, CtlError> {
    let path = format!("/v1/tasks/{}", path_segment(id));
    let before: TaskStatus = ctl.get(&path).await?;
    if ended(&before) {
        return Err(CtlError::NothingToDo(format!(
            "task {id} had already ended ({}): nothing to cancel",
            state_name(&before)
        )));
    }
    ctl.post_empty(&format!("{path}/cancel")).await?;
    let after: TaskStatus = ctl.get(&path).await?;
    match after.state {
        TaskState::Cancelled => Ok(Output {
            human: format!("task {id}: cancelled\n"),
            json: json!({"task_id": id, "state": "cancelled"}),
        }),
        _ if ended(&after) => Err(CtlError::NothingToDo(format!(
            "task {id} ended ({}) before the cancel reached it",
            state_name(&after)
        ))),
        _ => Ok(Output {
            human: format!("task {id}: cancel requested\n"),
            json: json!({"task_id": id, "state": state_name(&after)}),
        }),
    }
}

pub async fn show(ctl: &Ctl, id: &str) -> Result<Output, CtlError> {
    let s: TaskStatus = ctl.get(&format!("/v1/tasks/{}", path_segment(id))).await?;
    let r = &s.record;
    let mut human = format!(
        "task {}: {}\n",
        s.task_id,
        json!(s.state).as_str().unwrap_or("?")
    );
    if let Some(p) = s.queue_position {
        human.push_str(&format!("  queue     position {p}\n"));
    }
    if let Some(pool) = &r.pool_id {
        human.push_str(&format!(
            "  pool      {pool} ({})\n",
            r.model_ref.as_deref().unwrap_or("?")
        ));
    }
    human.push_str(&format!(
        "  tokens    {} in, {} out of at most {}\n",
        r.prompt_tokens, r.tokens_out, r.max_tokens
    ));
    let ms = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{v} ms"));
    human.push_str(&format!(
        "  timings   queued {}, first token {}, total {}\n",
        ms(r.timings.queued_ms),
        ms(r.timings.ttft_ms),
        ms(r.timings.total_ms)
    ));
    if let Some(code) = s.error_code {
        human.push_str(&format!("  error     {}\n", code.as_str()));
    }
    Ok(Output {
        human,
        json: json!(s),
    })
}
