//! Speculative decoding without a draft model: prompt lookup (n-gram) drafts.
//!
//! Text that repeats what came before (a rewrite, an extraction, code edited in place) is
//! predictable from the sequence itself: the tokens that followed the last earlier occurrence
//! of the sequence's last few tokens are a good guess at what comes next (llama.cpp's
//! `ngram` speculation, vLLM's prompt lookup). The guesses go through the model with the
//! sequence's next token in one pass, the model's own choice at every position is sampled as
//! it would be one token at a time, and the guesses are kept while they equal it: the output
//! is the one plain decoding gives (greedy: the same tokens; sampled: the same distribution,
//! since a guess is kept exactly when the sampled token is the guess).
//!
//! Every guess costs the pass a position whether it is kept or not (on the 2-core CPU a guess
//! costs about half a one-token pass: the matmuls are bound by compute beyond one row), so
//! a guess pays only where it is likely to be kept. Each sequence learns, per guess position,
//! how often a guess there was kept once the ones before it were, and guesses only as far as
//! the chance of keeping every guess so far stays at what a guess costs in that pass (the
//! caller's `chance_needed`, from `pass_cost.rs`: higher the more tokens the pass has). A sequence whose guesses are mostly wrong gains
//! nothing: below [`MIN_ACCEPTANCE`] of its guessed tokens kept (after [`JUDGED_AFTER`]
//! guessed), it stops guessing.

/// The longest and shortest suffix looked up, longest first.
const MAX_NGRAM: usize = 4;
const MIN_NGRAM: usize = 3;
/// How far back the lookup searches (tokens): bounds its cost per step.
const SEARCH_WINDOW: usize = 8192;
/// Guessed tokens a sequence's acceptance is judged over before it may switch itself off.
pub(crate) const JUDGED_AFTER: usize = 32;
/// Passes that checked a first guess before its record alone decides whether to guess.
const LEARNED_AFTER: u32 = 4;
/// The share of guessed tokens kept below which a sequence stops guessing.
pub(crate) const MIN_ACCEPTANCE: f64 = 0.3;
pub use engine_port::MAX_DRAFT_TOKENS;

/// One sequence's guessing: how many tokens a pass, and how well it went.
#[derive(Debug)]
pub(crate) struct NgramDraft {
    max_tokens: usize,
    drafted: usize,
    accepted: usize,
    /// Per guess position: passes that checked a guess there (the ones before it kept)...
    reached: [u32; MAX_DRAFT_TOKENS],
    /// ...and kept it.
    kept_at: [u32; MAX_DRAFT_TOKENS],
}

impl NgramDraft {
    /// Guesses of up to `max_tokens` a pass (at most [`MAX_DRAFT_TOKENS`]); `None` for 0.
    pub fn new(max_tokens: usize) -> Option<Self> {
        (max_tokens > 0).then(|| Self {
            max_tokens: max_tokens.min(MAX_DRAFT_TOKENS),
            drafted: 0,
            accepted: 0,
            reached: [0; MAX_DRAFT_TOKENS],
            kept_at: [0; MAX_DRAFT_TOKENS],
        })
    }

    /// Whether the guesses so far were kept often enough to go on guessing.
    pub fn worth_it(&self) -> bool {
        self.drafted < JUDGED_AFTER || self.accepted as f64 >= MIN_ACCEPTANCE * self.drafted as f64
    }

    /// The tokens that followed the most recent earlier occurrence of `history`'s longest
    /// suffix of [`MIN_NGRAM`]..=[`MAX_NGRAM`] tokens, at most `room` and the pass's limit;
    /// empty when nothing repeats (or guessing stopped paying).
    pub fn propose(&self, history: &[u32], room: usize, chance_needed: f64) -> Vec<u32> {
        let room = room.min(self.likely_kept(chance_needed));
        if room == 0 || !self.worth_it() {
            return Vec::new();
        }
        let from = history.len().saturating_sub(SEARCH_WINDOW);
        let window = &history[from..];
        for n in (MIN_NGRAM..=MAX_NGRAM).rev() {
            if window.len() <= n {
                continue;
            }
            let suffix = &window[window.len() - n..];
            // latest start first; the occurrence must end before the suffix itself starts
            // to have a continuation, and the continuation must be inside the history
            let last_start = window.len() - n - 1;
            for start in (0..=last_start).rev() {
                if &window[start..start + n] == suffix {
                    let follow = start + n;
                    let end = (follow + room).min(window.len());
                    return window[follow..end].to_vec();
                }
            }
        }
        Vec::new()
    }

    /// How many guesses in a row are likely enough to be kept — the chance that a guess and
    /// every one before it are kept, by each position's record (one kept guess counted in
    /// advance: a fresh sequence guesses as far as it may) at least `needed` — at least one
    /// until its first position has [`LEARNED_AFTER`] passes of record, to learn.
    fn likely_kept(&self, needed: f64) -> usize {
        let mut chance = 1.0;
        let mut n = 0;
        while n < self.max_tokens {
            chance *= f64::from(self.kept_at[n] + 1) / f64::from(self.reached[n] + 1);
            if chance < needed {
                break;
            }
            n += 1;
        }
        if self.reached[0] < LEARNED_AFTER {
            n.max(1)
        } else {
            n
        }
    }

    /// Tokens guessed so far.
    pub fn guessed(&self) -> usize {
        self.drafted
    }

    /// Guessed tokens kept so far.
    pub fn kept(&self) -> usize {
        self.accepted
    }

    /// A pass fed `n` guesses.
    pub fn fed(&mut self, n: usize) {
        self.drafted += n;
    }

    /// One of them was kept.
    pub fn kept_one(&mut self) {
        self.accepted = (self.accepted + 1).min(self.drafted);
    }

    /// A pass's outcome for the positions' records: `drafted` guesses fed, the first
    /// `accepted` of them kept.
    pub fn learn(&mut self, drafted: usize, accepted: usize) {
        let drafted = drafted.min(MAX_DRAFT_TOKENS);
        if drafted == 0 {
            return;
        }
        // checked: every position up to the first lost guess (or the last one)
        for j in 0..=accepted.min(drafted - 1) {
            self.reached[j] += 1;
        }
        for j in 0..accepted.min(drafted) {
            self.kept_at[j] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_continuation_of_the_latest_longest_match_is_proposed() {
        let d = NgramDraft::new(3).unwrap();
        // "1 2 3 4" appears, later "9 2 3" then "... 2 3" again: the 3-gram "x 2 3" decides
        let h = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3];
        // suffix [1,2,3] (3-gram; the 4-gram [8,1,2,3] has no earlier match) occurred at 0
        assert_eq!(d.propose(&h, 10, 0.5), vec![4, 5, 9]);
        // the room caps it
        assert_eq!(d.propose(&h, 2, 0.5), vec![4, 5]);
        assert!(d.propose(&h, 0, 0.5).is_empty());
    }

    #[test]
    fn the_most_recent_occurrence_wins_and_nothing_repeats_gives_nothing() {
        let d = NgramDraft::new(4).unwrap();
        let h = [5, 6, 7, 1, 5, 6, 7, 2, 5, 6, 7];
        assert_eq!(d.propose(&h, 4, 0.5), vec![2, 5, 6, 7]);
        // two tokens repeating are not enough to guess from
        assert!(d.propose(&[5, 6, 1, 5, 6], 4, 0.5).is_empty());
        assert!(d.propose(&[1, 2, 3, 4, 5], 4, 0.5).is_empty());
        // a continuation never reaches past the history's end
        assert_eq!(d.propose(&[7, 7, 7, 7], 4, 0.5), vec![7]);
    }

    #[test]
    fn a_sequence_whose_guesses_fail_stops_guessing() {
        let mut d = NgramDraft::new(4).unwrap();
        let h = [1, 2, 3, 4, 1, 2, 3];
        assert!(!d.propose(&h, 4, 0.5).is_empty());
        d.fed(JUDGED_AFTER - 1);
        assert!(d.worth_it(), "judged only after enough guesses");
        d.fed(1);
        assert!(!d.worth_it());
        assert!(d.propose(&h, 4, 0.5).is_empty());
        let mut good = NgramDraft::new(4).unwrap();
        good.fed(40);
        for _ in 0..13 {
            good.kept_one();
        }
        assert!(good.worth_it(), "13 of 40 is above 30 %");
        assert!(NgramDraft::new(0).is_none());
        assert_eq!(NgramDraft::new(99).unwrap().max_tokens, MAX_DRAFT_TOKENS);
    }

    #[test]
    fn a_sequence_guesses_only_as_far_as_its_guesses_are_kept() {
        let h: Vec<u32> = [1, 2, 3, 4, 5, 6, 7, 8, 9].repeat(3);
        let mut d = NgramDraft::new(6).unwrap();
        assert_eq!(
            d.propose(&h, 16, 0.5).len(),
            6,
            "no record yet: as far as allowed"
        );
        // the first two guesses kept, the third lost, twice over
        for _ in 0..2 {
            d.fed(6);
            d.kept_one();
            d.kept_one();
            d.learn(6, 2);
        }
        assert_eq!(
            d.likely_kept(0.5),
            2,
            "position 2 was lost both times it was reached"
        );
        assert_eq!(d.propose(&h, 16, 0.5).len(), 2);
        // at least one guess while guessing pays, to go on learning
        let mut bad = NgramDraft::new(6).unwrap();
        for _ in 0..LEARNED_AFTER - 1 {
            bad.learn(6, 0);
        }
        assert_eq!(bad.likely_kept(0.5), 1, "still learning");
        for _ in 0..2 {
            bad.learn(6, 0);
        }
        assert_eq!(
            bad.likely_kept(0.5),
            0,
            "learned: its first guesses are lost"
        );
        assert_eq!(
            d.likely_kept(0.3),
            6,
            "a cheap pass guesses on past the position lost one time in three"
        );
    }
}
