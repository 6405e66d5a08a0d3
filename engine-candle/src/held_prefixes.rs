//! What the decode thread publishes of the prefixes it holds (engine-port's
//! [`CachedPrefixes`]): computed again after a step that changed what a row or the prompt
//! cache holds, read by placement from any thread through [`Shared`](crate::scheduler).
//! A running or prefilling row holds its prompt so far (a new sequence copies it), a free row
//! the prompt it kept, the prompt cache its entries.

use std::sync::{Arc, Mutex};

use engine_port::CachedPrefixes;

/// Tells when what the rows and the prompt cache hold has changed.
#[derive(Default)]
pub(crate) struct Publisher {
    /// (row, tokens it holds) of every row at the last publication, and the prompt cache's
    /// generation then.
    seen: Option<(Vec<(usize, usize)>, u64)>,
}

impl Publisher {
    /// Whether `rows` and `generation` differ from the last publication; remembers them.
    pub fn changed(&mut self, rows: Vec<(usize, usize)>, generation: u64) -> bool {
        let now = (rows, generation);
        if self.seen.as_ref() == Some(&now) {
            return false;
        }
        self.seen = Some(now);
        true
    }
}

/// The last publication, shared with the engine's readers.
#[derive(Default)]
pub(crate) struct Held(Mutex<Arc<CachedPrefixes>>);

impl Held {
    pub fn set(&self, held: CachedPrefixes) {
        if let Ok(mut g) = self.0.lock() {
            *g = Arc::new(held);
        }
    }

    pub fn get(&self) -> Arc<CachedPrefixes> {
        match self.0.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_change_of_a_row_or_of_the_prompt_cache_publishes() {
        let mut p = Publisher::default();
        assert!(p.changed(vec![(0, 0), (1, 0)], 0));
        assert!(!p.changed(vec![(0, 0), (1, 0)], 0));
        assert!(p.changed(vec![(0, 32), (1, 0)], 0));
        assert!(p.changed(vec![(0, 32), (1, 0)], 1));
        assert!(!p.changed(vec![(0, 32), (1, 0)], 1));
    }
}
