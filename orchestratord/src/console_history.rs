//! The console's last minutes (FC-CON-2): every [`EVERY`] the server notes the tokens it has
//! streamed and the times to first token so far (`metrics::totals`), and keeps the last
//! [`KEPT`] notes, so the console's charts show the last five minutes from the moment it opens
//! (they started empty on every load: issue 49). `routes/console/history.rs` serves them
//! (`GET /console/history`, with the `/metrics` access).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// How often a note is taken.
pub const EVERY: Duration = Duration::from_secs(2);
/// Notes kept: five minutes, and one before them for the first step.
const KEPT: usize = 151;

#[derive(Debug, Clone, Copy)]
struct Note {
    at_unix_ms: u64,
    tokens: u64,
    ttft_micros: u64,
    ttft_count: u64,
}

/// The notes, oldest first.
#[derive(Debug, Default)]
pub struct History {
    notes: Mutex<VecDeque<Note>>,
}

impl History {
    /// Takes a note now.
    pub fn note(&self) {
        let so_far = crate::metrics::totals();
        let n = Note {
            at_unix_ms: crate::lifecycle::handoff::unix_ms(),
            tokens: so_far.tokens_out,
            ttft_micros: so_far.ttft_micros,
            ttft_count: so_far.ttft_count,
        };
        let mut notes = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        if notes.len() == KEPT {
            notes.pop_front();
        }
        notes.push_back(n);
    }

    /// Takes a note every [`EVERY`] until the server stops.
    pub fn spawn(self: Arc<Self>, shutdown: CancellationToken) {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(EVERY);
            loop {
                tokio::select! {
                    _ = every.tick() => self.note(),
                    _ = shutdown.cancelled() => return,
                }
            }
        });
    }

    /// Each step between two notes: when it ended, tokens a second, and the mean time to
    /// first token of the tasks whose first token came in it.
    pub fn steps(&self) -> Vec<Step> {
        let notes = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        notes
            .iter()
            .zip(notes.iter().skip(1))
            .map(|(a, b)| {
                let secs = (b.at_unix_ms.saturating_sub(a.at_unix_ms)).max(1) as f64 / 1000.0;
                let firsts = b.ttft_count.saturating_sub(a.ttft_count);
                Step {
                    at_unix_ms: b.at_unix_ms,
                    tokens_per_s: b.tokens.saturating_sub(a.tokens) as f64 / secs,
                    ttft_ms: (firsts > 0).then(|| {
                        b.ttft_micros.saturating_sub(a.ttft_micros) as f64 / firsts as f64 / 1000.0
                    }),
                }
            })
            .collect()
    }
}

/// One step of the console's charts.
#[derive(Debug, Serialize)]
pub struct Step {
    pub at_unix_ms: u64,
    pub tokens_per_s: f64,
    /// Absent when no first token came in the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_the_differences_between_notes_and_the_notes_are_bounded() {
        let h = History::default();
        let mut notes = h.notes.lock().unwrap();
        for i in 0..(KEPT as u64 + 10) {
            if notes.len() == KEPT {
                notes.pop_front();
            }
            notes.push_back(Note {
                at_unix_ms: i * 2000,
                tokens: i * 40,
                ttft_micros: i * 3 * 150_000,
                ttft_count: i * 3,
            });
        }
        drop(notes);
        let steps = h.steps();
        assert_eq!(steps.len(), KEPT - 1);
        assert_eq!(steps[0].tokens_per_s, 20.0);
        assert_eq!(steps[0].ttft_ms, Some(150.0));
    }
}
