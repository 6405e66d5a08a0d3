//! How many prompt tokens a pass takes while other sequences decode.
//!
//! Every such pass delays each running stream's next token by its whole duration, and every
//! pass has a fixed part (the weights stream through once, the decode tokens go with it), so
//! a long prompt arriving beside streams wants chunks as large as the streams can bear. A
//! pass's cost per prompt token grows with the prompt's history (each query attends to every
//! position before it), so no fixed count fits the whole prompt: a count small enough for its
//! last chunks wastes passes on its first ones. The budget is therefore a time: the next
//! chunk is sized from the last pass so that the pass takes about `target`, never fewer than
//! `floor` tokens (progress however slow the machine) and growing at most twofold a pass
//! (one fast pass does not make the next one long).

use std::time::Duration;

use crate::model::PREFILL_CHUNK;

pub(crate) struct StepBudget {
    /// Prompt tokens a pass takes at least.
    floor: usize,
    /// How long a pass beside decoding sequences should take; zero: always `floor` tokens.
    target: Duration,
    /// Prompt tokens the next such pass takes.
    next: usize,
}

impl StepBudget {
    pub fn new(floor: usize, target: Duration) -> Self {
        let floor = floor.clamp(1, PREFILL_CHUNK);
        Self {
            floor,
            target,
            next: floor,
        }
    }

    /// Prompt tokens the next pass beside decoding sequences may take (shared by the prompts
    /// going through).
    pub fn tokens(&self) -> usize {
        self.next
    }

    /// A pass beside decoding sequences took `prompt_tokens` prompt tokens and `took`: the
    /// next one is sized to take about the target.
    pub fn observe(&mut self, prompt_tokens: usize, took: Duration) {
        if self.target.is_zero() || prompt_tokens == 0 {
            return;
        }
        let fit = prompt_tokens as f64 * self.target.as_secs_f64() / took.as_secs_f64().max(1e-6);
        let grown = (prompt_tokens * 2).max(self.floor);
        self.next = (fit as usize).clamp(self.floor, grown).min(PREFILL_CHUNK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// ENG-CHUNK-3: a pass that took half the target doubles the next chunk; one that took
    /// twice the target halves it, never below the floor.
    #[test]
    fn the_next_chunk_is_sized_to_the_target() {
        let mut b = StepBudget::new(16, ms(100));
        assert_eq!(b.tokens(), 16);
        b.observe(16, ms(50));
        assert_eq!(b.tokens(), 32);
        b.observe(32, ms(80));
        assert_eq!(b.tokens(), 40);
        b.observe(40, ms(200));
        assert_eq!(b.tokens(), 20);
        b.observe(20, ms(400));
        assert_eq!(b.tokens(), 16, "never below the floor");
    }

    /// ENG-CHUNK-3: growth is at most twofold a pass and at most a whole prefill chunk.
    #[test]
    fn growth_is_bounded() {
        let mut b = StepBudget::new(16, ms(100));
        b.observe(16, ms(1));
        assert_eq!(b.tokens(), 32);
        for _ in 0..10 {
            let n = b.tokens();
            b.observe(n, ms(1));
        }
        assert_eq!(b.tokens(), PREFILL_CHUNK);
        // a short last chunk that went fast does not shrink the budget below twice itself
        b.observe(3, ms(1));
        assert_eq!(b.tokens(), 16);
    }

    /// ENG-CHUNK-3: with no target the chunk is always the floor; passes without prompt
    /// tokens change nothing.
    #[test]
    fn no_target_means_fixed_chunks() {
        let mut b = StepBudget::new(16, Duration::ZERO);
        b.observe(16, ms(1));
        assert_eq!(b.tokens(), 16);
        let mut b = StepBudget::new(16, ms(100));
        b.observe(0, ms(1));
        assert_eq!(b.tokens(), 16);
    }
}
