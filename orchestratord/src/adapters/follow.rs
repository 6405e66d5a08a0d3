//! Following a task's events from the start, for adapters that re-encode them.

use std::sync::Arc;

use futures::Stream;

use crate::task::{Task, TaskEvent};

/// The task's events from the first one, then live, ending after the terminal event.
pub fn events(task: Arc<Task>) -> impl Stream<Item = TaskEvent> {
    let changes = task.subscribe();
    futures::stream::unfold(
        (
            task,
            changes,
            0usize,
            std::collections::VecDeque::new(),
            false,
        ),
        |(task, mut changes, mut cursor, mut pending, mut done)| async move {
            loop {
                if let Some(ev) = pending.pop_front() {
                    return Some((ev, (task, changes, cursor, pending, done)));
                }
                if done {
                    return None;
                }
                {
                    let g = task.lock();
                    pending.extend(g.events[cursor..].iter().cloned());
                    cursor = g.events.len();
                    done = g.is_terminal();
                }
                if pending.is_empty() && !done && changes.changed().await.is_err() {
                    return None;
                }
            }
        },
    )
}
