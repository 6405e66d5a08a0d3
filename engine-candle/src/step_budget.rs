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
//!
//! With fixed chunks a ceiling bounds what the prompt tokens add to a pass: the cost of a token of
//! budget weight one is learned from the passes beside streams (their time over that of the
//! recent passes that decoded alone), and a pass takes no more budget than fits the ceiling,
//! at least one token. A fixed count tuned on one model is too much for a larger one (16
//! tokens of Gemma 3 270M add ~50 ms to a pass on the 2-core machine, of SmolLM2 135M ~25).

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
    /// Prompt tokens a pass takes at least (but for the prompt-time ceiling).
    floor: usize,
    /// How long a pass beside decoding sequences should take; zero: always `floor` tokens.
    target: Duration,
    /// Prompt tokens the next such pass takes.
    next: usize,
    /// With fixed chunks, the most time (s) a pass beside decoding sequences may spend on
    /// prompt tokens, over what the decoding tokens alone take; zero: no ceiling (a step
    /// time sizes the whole pass instead).
    ceiling: f64,
    /// What a pass of the decoding tokens alone takes (s): the recent decode-only passes.
    decode_alone: Option<f64>,
    /// What one prompt token of budget weight one costs a pass beside decoding sequences
    /// (s): the recent such passes, their time over `decode_alone` by the weight they took.
    per_token: Option<f64>,
    /// The budget weight the last pass's chunks took (`chunks` beside streams).
    spent: f64,
}

/// How much a new observation moves the decode-alone time and the prompt token's cost.
const DECODE_ALONE_WEIGHT: f64 = 0.2;
const PER_TOKEN_WEIGHT: f64 = 0.3;

impl StepBudget {
    pub fn new(floor: usize, target: Duration, ceiling: Duration) -> Self {
        let floor = floor.clamp(1, PREFILL_CHUNK);
        Self {
            floor,
            target,
            next: floor,
            ceiling: if target.is_zero() {
                ceiling.as_secs_f64()
            } else {
                0.0
            },
            decode_alone: None,
            per_token: None,
            spent: 0.0,
        }
    }

    /// Prompt tokens the next pass beside decoding sequences may take (shared by the prompts
    /// going through).
    pub fn tokens(&self) -> usize {
        match self.per_token {
            // the ceiling: as many as fit the prompt's time, at least one
            Some(c) if self.ceiling > 0.0 => self.next.min(((self.ceiling / c) as usize).max(1)),
            _ => self.next,
        }
    }

    /// Prompt tokens this pass takes of each prompt going through, in arrival order, from
    /// `(position, tokens left)`: beside decoding sequences (`streams`) the budget is
    /// `tokens`, each token weighing `weight(position)`, else a whole chunk of the first; at
    /// most `PREFILL_CHUNK` of one prompt; the first always makes progress. Stops at the
    /// first prompt that gets nothing.
    pub fn chunks(
        &mut self,
        streams: bool,
        prompts: impl Iterator<Item = (usize, usize)>,
    ) -> Vec<usize> {
        let mut budget = if streams {
            self.tokens() as f64
        } else {
            PREFILL_CHUNK as f64
        };
        let mut out = Vec::new();
        let mut spent = 0.0;
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
            spent += n as f64 * w;
        }
        self.spent = if streams { spent } else { 0.0 };
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

    /// A pass beside decoding sequences took `prompt_tokens` prompt tokens (those of the
    /// last `chunks`) and `took`: the next one is sized to take about the target, and its
    /// prompt tokens to fit the ceiling.
    pub fn observe(&mut self, prompt_tokens: usize, took: Duration) {
        let took = took.as_secs_f64();
        if prompt_tokens == 0 {
            self.decode_alone = Some(ewma(self.decode_alone, took, DECODE_ALONE_WEIGHT));
            return;
        }
        if self.spent > 0.0 {
            // what the prompt tokens added to the pass (at least a tenth of it: the decode
            // alone is an estimate, and noise must not make prompt tokens look free)
            let added = (took - self.decode_alone.unwrap_or(0.0)).max(took / 10.0);
            self.per_token = Some(ewma(self.per_token, added / self.spent, PER_TOKEN_WEIGHT));
        }
        if self.target.is_zero() {
            return;
        }
        let fit = prompt_tokens as f64 * self.target.as_secs_f64() / took.max(1e-6);
        let grown = (prompt_tokens * 2).max(self.floor);
        self.next = (fit as usize).clamp(self.floor, grown).min(PREFILL_CHUNK);
    }
}

fn ewma(old: Option<f64>, new: f64, weight: f64) -> f64 {
    match old {
        Some(o) => o + weight * (new - o),
        None => new,
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
        let mut b = StepBudget::new(16, ms(100), Duration::ZERO);
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
        let fixed = StepBudget::new(24, Duration::ZERO, Duration::ZERO);
        assert_eq!(fixed.weight(0), 1.0);
        assert_eq!(fixed.weight(ATTENTION_TAKES_OVER), 1.0);
        assert_eq!(fixed.weight(2 * ATTENTION_TAKES_OVER), 2.0);
        assert_eq!(fixed.weight(4 * ATTENTION_TAKES_OVER), 4.0);
        let timed = StepBudget::new(24, ms(100), Duration::ZERO);
        assert_eq!(timed.weight(4 * ATTENTION_TAKES_OVER), 1.0);
    }

    /// ENG-CHUNK-5: a pass's chunks beside streams: the budget shared in arrival order, a
    /// long history's tokens weighing more, the first prompt never starved; an idle pass takes
    /// a whole chunk of the first prompt.
    #[test]
    fn the_budget_is_shared_by_weight() {
        let mut b = StepBudget::new(16, Duration::ZERO, Duration::ZERO);
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

    /// ENG-CHUNK-6: with fixed chunks, prompt tokens that add more than the ceiling to a pass
    /// beside streams (over the passes that decoded alone) shrink the next chunks to fit it,
    /// at least one token; cheap ones leave the fixed count; a step time has no ceiling.
    #[test]
    fn the_prompts_share_of_a_pass_has_a_ceiling() {
        let mut b = StepBudget::new(16, Duration::ZERO, ms(25));
        // nothing learned yet: the fixed count
        assert_eq!(b.tokens(), 16);
        b.observe(0, ms(10));
        // 16 tokens added 50 ms over the 10 of decoding alone: ~3 ms a token, 8 fit 25 ms
        assert_eq!(b.chunks(true, [(0, 1000)].into_iter()), vec![16]);
        b.observe(16, ms(60));
        assert_eq!(b.tokens(), 8);
        // the cost is learned gradually: one cheap pass does not restore the whole count
        assert_eq!(b.chunks(true, [(0, 1000)].into_iter()), vec![8]);
        b.observe(8, ms(14));
        let after_one = b.tokens();
        assert!((9..16).contains(&after_one), "{after_one}");
        for _ in 0..20 {
            let n = b.chunks(true, [(0, 1000)].into_iter())[0];
            b.observe(n, ms(10 + n as u64));
        }
        assert_eq!(b.tokens(), 16, "cheap prompt tokens: the fixed count");
        // however costly a token, a pass takes one
        for _ in 0..20 {
            let n = b.chunks(true, [(0, 1000)].into_iter())[0];
            b.observe(n, ms(10 + 200 * n as u64));
        }
        assert_eq!(b.tokens(), 1);
        // long histories weigh more: the ceiling counts the budget's weight, not the tokens
        let mut w = StepBudget::new(16, Duration::ZERO, ms(25));
        w.observe(0, ms(10));
        assert_eq!(
            w.chunks(true, [(2 * ATTENTION_TAKES_OVER, 1000)].into_iter()),
            vec![8]
        );
        w.observe(8, ms(60));
        assert_eq!(
            w.tokens(),
            8,
            "8 tokens of weight 2 took 50 ms: 16 units, ~3 ms each"
        );
        // a step time sizes the whole pass: no ceiling
        let mut t = StepBudget::new(16, ms(100), ms(25));
        t.observe(0, ms(10));
        t.chunks(true, [(0, 1000)].into_iter());
        t.observe(16, ms(60));
        assert_eq!(t.tokens(), 26);
    }

    /// ENG-CHUNK-3: growth is at most twofold a pass and at most a whole prefill chunk.
    #[test]
    fn growth_is_bounded() {
        let mut b = StepBudget::new(16, ms(100), Duration::ZERO);
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
        let mut b = StepBudget::new(16, Duration::ZERO, Duration::ZERO);
        b.observe(16, ms(1));
        assert_eq!(b.tokens(), 16);
        let mut b = StepBudget::new(16, ms(100), Duration::ZERO);
        b.observe(0, ms(1));
        assert_eq!(b.tokens(), 16);
    }
}
