//! Runs one placed embedding task on its slot (issue 51): its inputs to the engine as one
//! job (the engine batches the jobs it holds together), the answer into the task's `end`
//! event — cut to the dimensions asked, renormalized — with the cancel, drain-deadline,
//! wall-clock and task-deadline checks a generation has. An engine that stops before it
//! answers fails the task, retriable.

use std::time::{Duration, Instant};

use contracts::ErrorCode;
use pool_manager::{EmbedJob, PortError, SlotLease};

use crate::lifecycle::state::SharedLifecycle;
use crate::lifecycle::task::Task;
use crate::metrics;

pub async fn run(state: &SharedLifecycle, task: &Task, lease: &mut SlotLease, placed: Instant) {
    let Some(spec) = task.spec.embed.clone() else {
        return;
    };
    let engine = lease.engine.clone();
    let desc = engine.descriptor();
    let counted = task
        .embed_ids
        .as_ref()
        .filter(|e| e.model_ref == desc.model_ref)
        .map(|e| e.ids.as_ref().clone());
    let n_inputs = spec.inputs.len();
    state.queue.fair().started(&task.owner, task.prompt_tokens);
    let Some(permit) = lease.take_permit() else {
        state.fail_task(
            task,
            ErrorCode::Internal,
            "the slot lease carried no slot",
            true,
            Some(1000),
        );
        return;
    };
    let job = EmbedJob {
        permit,
        inputs: spec.inputs.clone(),
        tokens: counted,
        pooling: spec.pooling,
        normalize: spec.normalize,
        cancel: task.cancel.clone(),
    };
    let reply = match engine.embed(job) {
        Ok(r) => r,
        Err(e) => {
            let (code, retriable) = match &e {
                PortError::InvalidInput(_) | PortError::Refused { .. } => {
                    (ErrorCode::InvalidParams, false)
                }
                _ => (ErrorCode::WorkerReset, true),
            };
            state.fail_task(task, code, e.to_string(), retriable, Some(1000));
            return;
        }
    };
    let wall = tokio::time::sleep_until(
        (placed + Duration::from_millis(state.cfg.timeouts.wall_ms)).into(),
    );
    let deadline = async {
        match task.deadline {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        _ = task.cancel.cancelled() => {}
        _ = lease.drain_deadline.cancelled() => {
            lease.pool().note_cut_by_drain();
            state.fail_task(task, ErrorCode::PoolUnready,
                "the pool was drained and its deadline passed", true, Some(1000));
        }
        _ = wall => {
            state.fail_task(task, ErrorCode::DecodeTimeout,
                format!("the task ran longer than {} ms", state.cfg.timeouts.wall_ms), true, None);
        }
        _ = deadline => {
            state.fail_task(task, ErrorCode::DeadlineUnmet,
                "the task's deadline passed while embedding", false, None);
        }
        answer = reply => match answer {
            Ok(Ok(mut vectors)) => {
                if let Some(d) = spec.dimensions {
                    cut(&mut vectors, d, spec.normalize);
                }
                metrics::embedded(lease.pool().id(), n_inputs, task.prompt_tokens);
                state.complete_embedded(task, vectors);
            }
            Ok(Err(PortError::InvalidInput(why))) => {
                state.fail_task(task, ErrorCode::InvalidParams, why, false, None);
            }
            Ok(Err(e)) => {
                state.fail_task(task, ErrorCode::Internal, format!("engine error: {e}"), true, Some(1000));
            }
            Err(_) => {
                state.fail_task(task, ErrorCode::WorkerReset,
                    "the engine stopped while embedding the task", true, Some(1000));
            }
        }
    }
}

/// Each vector cut to its first `d` dimensions (Matryoshka), back to unit length when the
/// vectors were normalized.
fn cut(vectors: &mut contracts::EmbedVectors, d: usize, unit: bool) {
    for v in vectors.iter_mut().flatten() {
        v.truncate(d);
        if unit {
            let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            if norm > 0.0 {
                v.iter_mut()
                    .for_each(|x| *x = (f64::from(*x) / norm) as f32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// EMB-API-3: `dimensions` keeps the first d of each vector, renormalized when the
    /// vectors are unit-length, as they came otherwise.
    #[test]
    fn dimensions_cut_each_vector_and_renormalize_it() {
        let mut v = vec![vec![vec![0.6, 0.0, 0.8], vec![3.0, 4.0, 5.0]]];
        cut(&mut v, 2, true);
        assert_eq!(v[0][0], vec![1.0, 0.0]);
        assert_eq!(v[0][1], vec![0.6, 0.8]);
        let mut raw = vec![vec![vec![3.0, 4.0, 5.0]]];
        cut(&mut raw, 2, false);
        assert_eq!(raw[0][0], vec![3.0, 4.0]);
    }
}
