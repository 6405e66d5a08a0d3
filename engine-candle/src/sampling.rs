//! Token sampling: greedy, temperature, top-k, top-p, min-p, penalties, seeded randomness.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use engine_port::SamplingParams;

/// Temperatures below this are greedy (vLLM's epsilon): `1/t` of a tinier one overflows f32
/// once it scales a logit, and the softmax turns to NaN.
pub const GREEDY_BELOW: f32 = 1e-5;

/// Tokens (prompt and generated) the repetition penalty looks back over.
pub const REPEAT_WINDOW: usize = 64;

/// Per-sequence sampler state.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Count of each generated token id (for presence/frequency penalties).
    counts: Vec<(u32, u32)>,
    /// Scratch buffer of (id, value) candidates, reused every step.
    scratch: Vec<(u32, f32)>,
    /// The softmax weights of the vocabulary, reused every step.
    weights: Vec<f32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            params,
            counts: Vec::new(),
            scratch: Vec::new(),
            weights: Vec::new(),
        }
    }

    fn apply_penalties(&self, logits: &mut [f32], recent: &[u32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let start = recent.len().saturating_sub(REPEAT_WINDOW);
            let mut seen: Vec<u32> = recent[start..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for id in seen {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for &(id, n) in &self.counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
    }

    /// Records a generated token for the presence/frequency penalties.
    pub fn observe(&mut self, id: u32) {
        match self.counts.iter_mut().find(|(t, _)| *t == id) {
            Some((_, n)) => *n += 1,
            None => self.counts.push((id, 1)),
        }
    }

    /// Picks the next token from `logits` (modified in place). `recent` is the sequence so far.
    pub fn sample(&mut self, logits: &mut [f32], recent: &[u32]) -> u32 {
        self.apply_penalties(logits, recent);
        let p = &self.params;
        if p.temperature < GREEDY_BELOW {
            return argmax(logits);
        }
        let inv_t = 1.0 / p.temperature;
        // the softmax weights exp(l/t − max) of the whole vocabulary in one vectorised pass
        // (a masked, non-finite logit weighs 0): a libm exp a token was most of a draw's cost
        // over Gemma's 262,144 tokens (ENG-SAMP-3)
        let w = &mut self.weights;
        w.clear();
        w.extend(logits.iter().map(|&l| {
            if l.is_finite() {
                l * inv_t
            } else {
                f32::NEG_INFINITY
            }
        }));
        let max = w.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        if !max.is_finite() {
            return argmax(logits);
        }
        exp_shifted(w, max);
        if p.top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0 {
            // the plain softmax: one draw along the weights
            let total: f32 = w.iter().sum();
            let mut r = self.rng.random::<f32>() * total;
            let mut last = 0;
            for (i, &x) in w.iter().enumerate() {
                if x > 0.0 {
                    last = i;
                    r -= x;
                    if r <= 0.0 {
                        return i as u32;
                    }
                }
            }
            return last as u32;
        }
        let total: f32 = w.iter().sum();
        // top-p alone: only the weights of the exponents the nucleus reaches are candidates
        let lowest = if p.top_k == 0 && p.min_p <= 0.0 && p.top_p < 1.0 {
            let mut sums = [0f32; 128];
            for &x in w.iter() {
                sums[bucket(x)] += x;
            }
            edge(&sums, p.top_p * total).map_or(0, |(e, _)| e)
        } else {
            0
        };
        // the candidates that weigh anything (under 1e-13 of the likeliest one's, the tail of
        // a 262,144-token vocabulary weighs less than 3e-8 of the whole together)
        let cand = &mut self.scratch;
        cand.clear();
        cand.extend(
            w.iter()
                .enumerate()
                .filter(|(_, &x)| x >= NEGLIGIBLE && bucket(x) >= lowest)
                .map(|(i, &x)| (i as u32, x)),
        );
        if cand.is_empty() {
            return argmax(logits);
        }
        let by_value_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_value_desc);
            cand.truncate(p.top_k);
        }
        // weights in whatever order the candidates are: nothing below needs the whole
        // vocabulary sorted (a sort of 49k candidates was ~3 ms a token, on the step's path)
        let sum: f32 = if p.top_k > 0 {
            cand.iter().map(|c| c.1).sum()
        } else {
            total
        };
        if p.min_p > 0.0 {
            // a floor relative to the likeliest token, whose weight is exp(0) = 1
            cand.retain(|c| c.1 >= p.min_p);
        }
        if p.top_p < 1.0 {
            nucleus(cand, p.top_p * sum, by_value_desc);
        }
        let total: f32 = cand.iter().map(|c| c.1).sum();
        let mut r = self.rng.random::<f32>() * total;
        for c in cand.iter() {
            r -= c.1;
            if r <= 0.0 {
                return c.0;
            }
        }
        cand[cand.len() - 1].0
    }
}

/// `w[i] = exp(w[i] − max)` with ggml's exp polynomial (`attention::v_expf`, within 4e-7 of
/// exp), vectorised where AVX2 and FMA are there (−∞ gives 0).
fn exp_shifted(w: &mut [f32], max: f32) {
    #[inline(always)]
    fn each(w: &mut [f32], max: f32) {
        for x in w.iter_mut() {
            *x = crate::attention::v_expf(*x - max);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn each_avx2(w: &mut [f32], max: f32) {
            each(w, max)
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA were detected.
            return unsafe { each_avx2(w, max) };
        }
    }
    each(w, max)
}

/// A weight's binary exponent (weights are in (0, 1]: 0..=127).
fn bucket(w: f32) -> usize {
    ((w.to_bits() >> 23) & 0xff).min(127) as usize
}

/// The exponent bucket in which the mass of the buckets from the top first reaches `mass`, and
/// the mass of those above it.
fn edge(sums: &[f32; 128], mass: f32) -> Option<(usize, f32)> {
    let mut acc = 0f32;
    for e in (0..128).rev() {
        if acc + sums[e] >= mass {
            return Some((e, acc));
        }
        acc += sums[e];
    }
    None
}

/// Candidates weighing less than this (relative to the likeliest token's 1) are left out of
/// top-k, top-p and min-p.
const NEGLIGIBLE: f32 = 1e-13;

/// Keeps the likeliest candidates whose weights first reach `mass` (ties: the lower id first),
/// in no particular order. One pass buckets the weights by their binary exponent; the buckets
/// above the one where the mass is reached are kept whole, and only that bucket is sorted —
/// a wide nucleus over a 262,144-token vocabulary no longer sorts tens of thousands.
fn nucleus(
    cand: &mut Vec<(u32, f32)>,
    mass: f32,
    by_value_desc: impl Fn(&(u32, f32), &(u32, f32)) -> std::cmp::Ordering + Copy,
) {
    let mut sums = [0f32; 128];
    for c in cand.iter() {
        sums[bucket(c.1)] += c.1;
    }
    // rounding left the mass a hair out of reach: every candidate stays
    let Some((edge, mut acc)) = edge(&sums, mass) else {
        return;
    };
    let mut border: Vec<(u32, f32)> = cand
        .iter()
        .copied()
        .filter(|c| bucket(c.1) == edge)
        .collect();
    border.sort_unstable_by(by_value_desc);
    let mut keep = border.len();
    for (i, c) in border.iter().enumerate() {
        acc += c.1;
        if acc >= mass {
            keep = i + 1;
            break;
        }
    }
    border.truncate(keep);
    cand.retain(|c| bucket(c.1) > edge);
    cand.extend(border);
}

/// The log-softmax of `logits` at `chosen`, and the `n` likeliest ids with theirs (most likely
/// first; ties: the lower id). Masked (non-finite) logits have probability 0 and are never
/// among the likeliest. Summed in f64: 49k terms in f32 lose the small ones.
pub fn log_probs(logits: &[f32], chosen: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
    let finite = || logits.iter().copied().filter(|l| l.is_finite());
    let max = finite().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = finite().map(|l| f64::from(l - max).exp()).sum();
    let lse = f64::from(max) + sum.ln();
    let lp = |l: f32| (f64::from(l) - lse) as f32;
    let chosen_lp = logits
        .get(chosen as usize)
        .map_or(f32::NEG_INFINITY, |&l| lp(l));
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let by_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let n = n.min(cand.len());
    if n > 0 && n < cand.len() {
        cand.select_nth_unstable_by(n - 1, by_desc);
    }
    cand.truncate(n);
    cand.sort_by(by_desc);
    (
        chosen_lp,
        cand.into_iter().map(|(i, l)| (i, lp(l))).collect(),
    )
}

/// Index of the largest logit; the lowest index wins a tie (0 when none is above −∞; a NaN
/// is never chosen). Two passes the compiler vectorises — the largest value in sixteen lanes,
/// then the first place that holds it — built for AVX2 where the CPU has it: one scalar
/// compare a logit was ~3 % of a step at eight sequences over Gemma's 262,144 tokens, on the
/// decode thread alone.
pub fn argmax(logits: &[f32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn argmax_avx2(logits: &[f32]) -> u32 {
            first_largest(logits)
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected.
            return unsafe { argmax_avx2(logits) };
        }
    }
    first_largest(logits)
}

#[inline(always)]
fn first_largest(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let (chunks, tail) = logits.as_chunks::<LANES>();
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            // a NaN compares false: never kept
            *m = if v > *m { v } else { *m };
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if max == f32::NEG_INFINITY {
        return 0;
    }
    // the first chunk holding it, then its place there
    let at = chunks
        .iter()
        .position(|c| c.iter().fold(false, |any, &v| any | (v == max)))
        .map_or(chunks.len() * LANES, |c| c * LANES);
    logits[at..]
        .iter()
        .position(|&v| v == max)
        .map_or(0, |i| (at + i) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Log-probabilities are the log-softmax of the logits (a reference in f64), the top ones
    /// most likely first, masked logits never among them.
    #[test]
    fn log_probs_are_the_log_softmax_of_the_logits() {
        let logits = [1.0f32, 3.0, f32::NEG_INFINITY, 2.0, 3.0];
        let norm: f64 = logits
            .iter()
            .filter(|l| l.is_finite())
            .map(|&l| f64::from(l).exp())
            .sum();
        let reference = |i: usize| (f64::from(logits[i]) - norm.ln()) as f32;
        let (chosen, top) = log_probs(&logits, 3, 3);
        assert!((chosen - reference(3)).abs() < 1e-6);
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 4, 3]);
        for (id, lp) in &top {
            assert!((lp - reference(*id as usize)).abs() < 1e-6);
        }
        let (_, all) = log_probs(&logits, 0, 20);
        assert_eq!(all.len(), 4, "the masked logit is left out");
        let total: f64 = all.iter().map(|t| f64::from(t.1).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(log_probs(&logits, 2, 0).0.is_infinite());
    }

    /// ENG-SAMP-2: temperatures between 0 and a small epsilon are greedy; 1e-39 once gave
    /// the lowest-ranked token (1/t overflowed and the softmax was NaN).
    #[test]
    fn tiny_temperatures_are_greedy() {
        let logits: Vec<f32> = (0..64)
            .map(|i| ((i * 37) % 64) as f32 * 0.5 - 10.0)
            .collect();
        let best = argmax(&logits);
        for t in [1e-39f32, f32::MIN_POSITIVE, 1e-30, 1e-8, 9e-6] {
            let mut s = Sampler::new(SamplingParams {
                temperature: t,
                seed: 3,
                ..Default::default()
            });
            for _ in 0..10 {
                assert_eq!(s.sample(&mut logits.clone(), &[]), best, "t = {t}");
            }
        }
    }

    /// ENG-SAMP-2: any valid parameter set over any finite logits picks an existing token
    /// (random sets from a fixed seed, extremes included); nothing NaN decides the pick.
    #[test]
    fn random_valid_parameters_always_pick_a_real_token() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let pick = |rng: &mut rand_chacha::ChaCha8Rng, edges: &[f32], lo: f32, hi: f32| {
            if rng.random_bool(0.3) {
                edges[rng.random_range(0..edges.len())]
            } else {
                rng.random_range(lo..=hi)
            }
        };
        for _ in 0..2000 {
            let p = SamplingParams {
                temperature: pick(&mut rng, &[0.0, 1e-39, 1e-6, 1e-5, 100.0], 0.0, 100.0),
                top_k: rng.random_range(0..80),
                top_p: pick(&mut rng, &[f32::MIN_POSITIVE, 1e-9, 1.0], 1e-6, 1.0),
                min_p: pick(&mut rng, &[0.0, 1.0], 0.0, 1.0),
                repetition_penalty: pick(&mut rng, &[1e-6, 1.0, 10.0], 0.01, 10.0),
                presence_penalty: pick(&mut rng, &[-2.0, 2.0], -2.0, 2.0),
                frequency_penalty: pick(&mut rng, &[-2.0, 2.0], -2.0, 2.0),
                seed: rng.random(),
                draft_tokens: None,
            };
            p.validate().expect("valid by construction");
            let n = rng.random_range(1..70);
            let scale = pick(&mut rng, &[1e-30, 1e30], -50.0, 50.0);
            let mut logits: Vec<f32> = (0..n)
                .map(|_| rng.random_range(-1.0f32..1.0) * scale)
                .collect();
            let recent: Vec<u32> = (0..rng.random_range(0..10))
                .map(|_| rng.random_range(0..n as u32))
                .collect();
            let mut s = Sampler::new(p.clone());
            let id = s.sample(&mut logits, &recent);
            assert!((id as usize) < n, "{p:?} picked {id} of {n}");
        }
    }

    /// Frequencies of `n` draws over `vocab` ids.
    fn draw(params: SamplingParams, logits: &[f32], n: usize) -> Vec<f64> {
        let mut s = Sampler::new(params);
        let mut seen = vec![0usize; logits.len()];
        for _ in 0..n {
            seen[s.sample(&mut logits.to_vec(), &[]) as usize] += 1;
        }
        seen.iter().map(|&c| c as f64 / n as f64).collect()
    }

    /// ENG-SAMP-3: without the vocabulary sorted, a draw still follows the softmax of the
    /// scaled logits over a vocabulary of thousands.
    #[test]
    fn draws_follow_the_softmax_over_a_large_vocabulary() {
        let vocab = 4096;
        // four likely tokens scattered among thousands of unlikely ones
        let mut logits = vec![-4.0f32; vocab];
        for (id, l) in [(3000usize, 3.0f32), (17, 2.5), (2048, 2.0), (999, 1.0)] {
            logits[id] = l;
        }
        let t = 0.8f32;
        let weights: Vec<f64> = logits.iter().map(|&l| ((l / t) as f64).exp()).collect();
        let z: f64 = weights.iter().sum();
        let freq = draw(
            SamplingParams {
                temperature: t,
                seed: 5,
                ..Default::default()
            },
            &logits,
            20_000,
        );
        for id in [3000usize, 17, 2048, 999] {
            let want = weights[id] / z;
            assert!(
                (freq[id] - want).abs() < 0.015,
                "id {id}: drawn {:.4}, softmax {want:.4}",
                freq[id]
            );
        }
        let rest: f64 = (0..vocab)
            .filter(|i| ![3000, 17, 2048, 999].contains(i))
            .map(|i| freq[i])
            .sum();
        let want_rest = 1.0
            - [3000usize, 17, 2048, 999]
                .iter()
                .map(|&i| weights[i] / z)
                .sum::<f64>();
        assert!(
            (rest - want_rest).abs() < 0.015,
            "tail drawn {rest:.4}, softmax {want_rest:.4}"
        );
    }

    /// Temperature 1 and nucleus `p`, seeded.
    fn top_p(p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_p: p,
            seed,
            ..Default::default()
        }
    }

    /// ENG-SAMP-3: the bucketed nucleus is the smallest prefix of the weights sorted
    /// descending (ties: the lower id) that reaches the mass.
    #[test]
    fn the_nucleus_is_the_sorted_prefix_reaching_the_mass() {
        let by = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for round in 0..200 {
            let n = 1 + round * 37 % 3000;
            let cand: Vec<(u32, f32)> = (0..n as u32)
                .map(|i| (i, (-rng.random::<f32>() * 30.0).exp()))
                .collect();
            let total: f32 = cand.iter().map(|c| c.1).sum();
            let mass = total * rng.random::<f32>();
            let mut sorted = cand.clone();
            sorted.sort_by(by);
            let mut acc = 0f32;
            let k = sorted
                .iter()
                .position(|c| {
                    acc += c.1;
                    acc >= mass
                })
                .map_or(sorted.len(), |i| i + 1);
            let mut want: Vec<u32> = sorted[..k].iter().map(|c| c.0).collect();
            let mut got = cand.clone();
            nucleus(&mut got, mass, by);
            let mut got: Vec<u32> = got.iter().map(|c| c.0).collect();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "round {round}: {n} candidates");
        }
    }

    /// ENG-SAMP-3: top-p keeps the likeliest tokens until their mass reaches p (ties: the
    /// lower id), also when the nucleus is large; what it keeps is drawn in proportion.
    #[test]
    fn top_p_keeps_the_nucleus_however_large() {
        // 1000 equally likely tokens: half the mass is the 500 lowest ids
        let flat = vec![0.0f32; 1000];
        let freq = draw(top_p(0.5, 9), &flat, 20_000);
        assert_eq!(
            freq[500..].iter().sum::<f64>(),
            0.0,
            "a token past the nucleus"
        );
        assert!(
            freq[400..500].iter().sum::<f64>() > 0.15,
            "the nucleus's far end is drawn"
        );
        // probabilities 0.5, 0.3, 0.15, 0.05: p = 0.8 keeps two, drawn 5:3
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let freq = draw(top_p(0.8, 4), &logits, 20_000);
        assert_eq!(freq[2] + freq[3], 0.0);
        assert!((freq[0] - 0.625).abs() < 0.015, "drawn {:.4}", freq[0]);
    }

    #[test]
    fn greedy_picks_the_largest_and_lowest_on_ties() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0], &[]), 1);
    }

    /// ENG-SAMP-4: the lane-wise argmax chooses as a scan from the first logit does — the
    /// first of the largest, never a NaN, 0 when nothing is above −∞ — whatever the length,
    /// ties, signed zeros and where the largest falls (a chunk, a lane, the tail).
    #[test]
    fn the_lane_wise_argmax_is_the_first_largest() {
        fn scan(l: &[f32]) -> u32 {
            let (mut best, mut best_v) = (0, f32::NEG_INFINITY);
            for (i, &v) in l.iter().enumerate() {
                if v > best_v {
                    (best, best_v) = (i, v);
                }
            }
            best as u32
        }
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let pool = [
            0.0,
            -0.0,
            1.0,
            2.0,
            2.0,
            -3.0,
            f32::NAN,
            f32::NEG_INFINITY,
            f32::INFINITY,
        ];
        for case in 0..4000 {
            let n = rng.random_range(0..200usize);
            let l: Vec<f32> = (0..n)
                .map(|_| match case % 3 {
                    0 => pool[rng.random_range(0..pool.len())],
                    1 => pool[rng.random_range(0..6)],
                    _ => (rng.random_range(0..8) as f32) * 0.5,
                })
                .collect();
            assert_eq!(argmax(&l), scan(&l), "{l:?}");
        }
        let mut big: Vec<f32> = (0..262_144).map(|i| ((i * 7919) % 1000) as f32).collect();
        big[200_003] = 1e6;
        big[262_143] = 1e6;
        assert_eq!(argmax(&big), 200_003);
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn same_seed_same_choices_different_seed_differs() {
        let params = SamplingParams {
            temperature: 1.0,
            seed: 7,
            ..Default::default()
        };
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |p: SamplingParams| {
            let mut s = Sampler::new(p);
            (0..40)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(params.clone()), run(params.clone()));
        assert_ne!(
            run(params.clone()),
            run(SamplingParams { seed: 8, ..params })
        );
    }

    #[test]
    fn top_k_one_is_greedy_even_when_hot() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            top_k: 1,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [1.0, 2.0, 1.9, 0.0], &[]), 1);
        }
    }

    #[test]
    fn min_p_cuts_unlikely_tokens() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            min_p: 0.5,
            seed: 3,
            ..Default::default()
        });
        for _ in 0..50 {
            let t = s.sample(&mut [10.0, 9.9, 0.0, 0.0, 0.0], &[]);
            assert!(t == 0 || t == 1, "picked {t}");
        }
    }

    #[test]
    fn penalties_steer_away_from_repeats() {
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 2.0,
            ..Default::default()
        });
        s.observe(0);
        assert_eq!(s.sample(&mut [1.0, 0.5], &[0]), 1);
        let mut r = Sampler::new(SamplingParams {
            repetition_penalty: 4.0,
            ..Default::default()
        });
        assert_eq!(r.sample(&mut [1.0, 0.5], &[0]), 1);
    }

    #[test]
    fn invalid_params_are_refused() {
        let p = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(p.validate().is_err());
        let p = SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        };
        assert!(p.validate().is_err());
    }
}
