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
//!
//! With fixed chunks (no step time) the count is in tokens up to `ATTENTION_TAKES_OVER`
//! positions of history; beyond it a token counts `position / ATTENTION_TAKES_OVER` of the
//! budget, its attention growing with the history, and the chunks shrink as the prompt goes
//! on. A pass's time then stops growing with the prompt's length: the streams beside a
//! 4,000-token prompt wait no longer per pass than beside a 2,000-token one.

use std::time::Duration;

use crate::model::PREFILL_CHUNK;

/// Positions of history beyond which a prompt token's share of a pass grows with it: past
/// this the chunk shrinks in proportion, so a pass stays about as long as at this point
/// however long the prompt. With the default model on the 2-core AVX-512 reference machine a
/// 16-token pass beside a stream takes ~28 ms at the start of a prompt, ~37 ms at 768
/// positions and ~45 ms at 1,300 (the attention's share grows with the history, and faster
/// once a layer's keys and values outgrow the core's cache). The stream's longest gap beside
/// a 1,318-token / a 2,048-token prompt, two paired runs of three rounds each (medians of
/// the rounds' longest): 2,048 here: 67 / 75–80 ms; 1,024: 60–64 / 55–72 ms; 768: 52–55 /
/// 54–55 ms, the prompt answered +58–63 % / +81–86 % over an idle pool against +51 % / +47–53 %.
pub(crate) const ATTENTION_TAKES_OVER: usize = 768;

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

    /// Prompt tokens this pass takes of each prompt going through, in arrival order, from
    /// `(position, tokens left)`: beside decoding sequences (`streams`) the budget is
    /// `tokens`, each token weighing `weight(position)`, else a whole chunk of the first; at
    /// most `PREFILL_CHUNK` of one prompt; the first always makes progress. Stops at the
    /// first prompt that gets nothing.
    pub fn chunks(
        &self,
        streams: bool,
        prompts: impl Iterator<Item = (usize, usize)>,
    ) -> Vec<usize> {
        let mut budget = if streams {
            self.tokens() as f64
        } else {
            PREFILL_CHUNK as f64
        };
        let mut out = Vec::new();
        for (position, left) in prompts {
            let w = if streams { self.weight(position) } else { 1.0 };
            let fit = (budget / w) as usize;
            let n = left
                .min(if out.is_empty() { fit.max(1) } else { fit })
                .min(PREFILL_CHUNK);
            if n == 0 {
                break;
            }
            out.push(n);
            budget -= n as f64 * w;
        }
        out
    }

    /// The share of a pass's budget (`tokens`) one prompt token at `position` takes: one up
    /// to `ATTENTION_TAKES_OVER` positions of history, then in proportion to the history —
    /// with fixed chunks only (a step time measures what the pass cost instead).
    pub fn weight(&self, position: usize) -> f64 {
        if !self.target.is_zero() {
            return 1.0;
        }
        position.max(ATTENTION_TAKES_OVER) as f64 / ATTENTION_TAKES_OVER as f64
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

    /// ENG-CHUNK-5: with fixed chunks a token past `ATTENTION_TAKES_OVER` positions counts in
    /// proportion to its history; with a step time every token counts one.
    #[test]
    fn long_histories_take_more_of_a_fixed_budget() {
        let fixed = StepBudget::new(24, Duration::ZERO);
        assert_eq!(fixed.weight(0), 1.0);
        assert_eq!(fixed.weight(ATTENTION_TAKES_OVER), 1.0);
        assert_eq!(fixed.weight(2 * ATTENTION_TAKES_OVER), 2.0);
        assert_eq!(fixed.weight(4 * ATTENTION_TAKES_OVER), 4.0);
        let timed = StepBudget::new(24, ms(100));
        assert_eq!(timed.weight(4 * ATTENTION_TAKES_OVER), 1.0);
    }

    /// ENG-CHUNK-5: a pass's chunks beside streams: the budget shared in arrival order, a
    /// long history's tokens weighing more, the first prompt never starved; an idle pass takes
    /// a whole chunk of the first prompt.
    #[test]
    fn the_budget_is_shared_by_weight() {
        let b = StepBudget::new(16, Duration::ZERO);
        let far = 2 * ATTENTION_TAKES_OVER;
        // short histories: tokens
        assert_eq!(b.chunks(true, [(0, 10), (0, 100)].into_iter()), vec![10, 6]);
        // at twice the history a token weighs two: 8 tokens use the budget up
        assert_eq!(b.chunks(true, [(far, 100), (0, 100)].into_iter()), vec![8]);
        // however long the history, the first prompt makes progress
        assert_eq!(
            b.chunks(true, [(64 * ATTENTION_TAKES_OVER, 100)].into_iter()),
            vec![1]
        );
        // no stream waits: a whole chunk, whatever the history
        assert_eq!(
            b.chunks(false, [(far, 1000), (0, 100)].into_iter()),
            vec![PREFILL_CHUNK]
        );
        assert_eq!(
            b.chunks(false, [(far, 100), (0, 1000)].into_iter()),
            vec![100, 156]
        );
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
