//! Admissions under way in a cluster. There, admitting a task awaits the cluster (its queue,
//! then its relay) after the task is known here, so two things must hold that one box gets
//! for free: an admission runs to its end even if its client goes away mid-way (else a task
//! known here but never queued would answer the client's retry 202 and never run), and a
//! retry of the same task id while the first attempt is still under way waits for that
//! attempt's outcome instead of taking its half-done task for an admitted one.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

/// The admissions under way, by owner and client task id (at most one per id; as many as
/// requests are under way, which the HTTP layer bounds).
#[derive(Default)]
pub struct InFlight {
    under_way: Mutex<HashMap<(String, String), watch::Receiver<bool>>>,
}

/// The right to run the admission of one task id; its end (drop) lets those waiting on it go.
pub struct Running<'a> {
    of: &'a InFlight,
    key: (String, String),
    done: watch::Sender<bool>,
}

impl InFlight {
    /// Starts the admission of `owner`'s `task_id`, or, when one is under way, what to wait on.
    pub fn begin(&self, owner: &str, task_id: &str) -> Result<Running<'_>, watch::Receiver<bool>> {
        let key = (owner.to_string(), task_id.to_string());
        let mut under_way = self.under_way.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rx) = under_way.get(&key) {
            return Err(rx.clone());
        }
        let (done, rx) = watch::channel(false);
        under_way.insert(key.clone(), rx);
        Ok(Running {
            of: self,
            key,
            done,
        })
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.of
            .under_way
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
        let _ = self.done.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_admission_of_an_id_waits_for_the_first() {
        let f = InFlight::default();
        let first = f.begin("t", "job-1").expect("nothing under way");
        let Err(mut wait) = f.begin("t", "job-1") else {
            panic!("the same id admitted twice at once");
        };
        // another tenant's id, or another id, is not held up
        assert!(f.begin("u", "job-1").is_ok());
        assert!(f.begin("t", "job-2").is_ok());
        drop(first);
        wait.wait_for(|done| *done).await.expect("the first ended");
        assert!(f.begin("t", "job-1").is_ok(), "free again after the first");
    }
}
