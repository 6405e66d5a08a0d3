//! The transposed prompt path (`transposed.rs`) in AVX2 + FMA intrinsics: 16 lanes are two
//! 8-lane registers, every operation the one the portable code does, in the same order, so
//! the bits are the same (the tests compare all three paths). The compiler does not
//! vectorise the portable loops reliably: their accumulators went through the stack.

use std::arch::x86_64::*;

use super::transposed::{hidden_before, Block, Transposed};
use super::LANES;

/// Two registers: lanes 0..8 and 8..16.
#[derive(Clone, Copy)]
struct V16(__m256, __m256);

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load(a: &[f32; LANES]) -> V16 {
    V16(
        _mm256_loadu_ps(a.as_ptr()),
        _mm256_loadu_ps(a.as_ptr().add(8)),
    )
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn store(v: V16, a: &mut [f32; LANES]) {
    _mm256_storeu_ps(a.as_mut_ptr(), v.0);
    _mm256_storeu_ps(a.as_mut_ptr().add(8), v.1);
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn add(a: V16, b: V16) -> V16 {
    V16(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1))
}

/// `x·y + acc` with one rounding, per lane.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn fma(x: V16, y: V16, acc: V16) -> V16 {
    V16(
        _mm256_fmadd_ps(x.0, y.0, acc.0),
        _mm256_fmadd_ps(x.1, y.1, acc.1),
    )
}

/// `reduce16` of one 16-lane value: halves, quarters, then `(0+2) + (1+3)`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn reduce(v: V16) -> f32 {
    let t3 = _mm256_add_ps(v.1, v.0); // t3[j] = a[j+8] + a[j]
    let t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3)); // t3[j+4] + t3[j]
    let hi = _mm_movehl_ps(t6, t6); // t6[2], t6[3]
    let pairs = _mm_add_ps(t6, hi); // t6[0] + t6[2], t6[1] + t6[3]
    _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)))
}

/// Queries attended together: each block of keys and each row of values is read once
/// from memory for all of them (one query alone streams the head's keys and values from
/// beyond the core's cache at long lengths).
const TILE: usize = 8;

/// See `transposed::queries`: the same per-query arithmetic, a tile of queries at a time.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn queries(b: &Block<'_>, out: &mut [f32]) {
    let hd = b.dims.head_dim;
    // one block more than the keys have: the queries' rows of probabilities do not fall
    // into one cache set at lengths of a power of two
    let blocks = b.keys.blocks() + 1;
    let mut probs = vec![[0f32; LANES]; TILE * blocks];
    let mut acc: Vec<V16> = Vec::new();
    let scale = _mm256_set1_ps(b.dims.scale);
    for t0 in (0..b.count).step_by(TILE) {
        let n = TILE.min(b.count - t0);
        // query i of the tile sees positions 0..totals[i]
        let mut totals = [0usize; TILE];
        for (i, total) in totals.iter_mut().enumerate().take(n) {
            *total = b.start + b.first + t0 + i + 1;
        }
        let most = totals[n - 1].div_ceil(LANES);
        // positions before a local layer's window: −∞; the blocks before the tile's first
        // query's window are left out (every query of the tile weighs them zero)
        let hidden: [usize; TILE] = std::array::from_fn(|i| hidden_before(b.dims, totals[i]));
        let lo = hidden[0] / LANES;
        let q = |i: usize| {
            let ti = b.first + t0 + i;
            &b.q[ti * hd..(ti + 1) * hd]
        };
        // scores, block by block of keys for all the tile's queries
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut max = [V16(ninf, ninf); TILE];
        for c in lo..most {
            for i in 0..n {
                let left = totals[i].saturating_sub(c * LANES);
                if left == 0 {
                    continue;
                }
                let s = score_block(q(i), b.keys, c);
                let mut s = V16(_mm256_mul_ps(s.0, scale), _mm256_mul_ps(s.1, scale));
                let unseen = hidden[i].saturating_sub(c * LANES).min(LANES);
                if left < LANES || unseen > 0 {
                    // positions past the query's own or before its window: −∞ (their
                    // probability is 0)
                    let mut a = [0f32; LANES];
                    store(s, &mut a);
                    for x in &mut a[left.min(LANES)..] {
                        *x = f32::NEG_INFINITY;
                    }
                    for x in &mut a[..unseen] {
                        *x = f32::NEG_INFINITY;
                    }
                    s = load(&a);
                }
                max[i] = V16(_mm256_max_ps(max[i].0, s.0), _mm256_max_ps(max[i].1, s.1));
                store(s, &mut probs[i * blocks + c]);
            }
        }
        for i in 0..n {
            let mut m = [0f32; LANES];
            store(max[i], &mut m);
            // the maximum is exact whatever the order
            let m = m.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let own = totals[i].div_ceil(LANES);
            softmax(&mut probs[i * blocks + lo..i * blocks + own], m);
        }
        // p·V, four outputs at a time for all the tile's queries, a span of positions at a
        // time: the span's values and the tile's probabilities stay in L1 while they are
        // reused (over the whole history they spill to L2, and p·V became bound by its
        // bandwidth at long lengths); the accumulators wait in memory between spans, which
        // leaves every sum in its order
        let groups = hd / 4;
        let z = _mm256_setzero_ps();
        acc.clear();
        acc.resize(n * groups * 4, V16(z, z));
        for c0 in (lo..most).step_by(PV_SPAN_BLOCKS) {
            let c1 = most.min(c0 + PV_SPAN_BLOCKS);
            for g in 0..groups {
                for i in 0..n {
                    let own = totals[i].div_ceil(LANES).min(c1);
                    if own <= c0 {
                        continue;
                    }
                    let p = &probs[i * blocks + c0..i * blocks + own];
                    let a = &mut acc[(i * groups + g) * 4..(i * groups + g + 1) * 4];
                    weighted_sum4(p, b.vals, 4 * g, c0, a);
                }
            }
        }
        for i in 0..n {
            for (o, a) in out[(t0 + i) * hd..(t0 + i + 1) * hd]
                .iter_mut()
                .zip(&acc[i * groups * 4..(i + 1) * groups * 4])
            {
                *o = reduce(*a);
            }
        }
    }
}

/// Blocks of 16 positions per span of the `p·V` loop (the span's four value rows and eight
/// queries' probabilities: 16 KiB).
const PV_SPAN_BLOCKS: usize = 16;

/// The 16 scores of block `c` before scaling (see `transposed::scores`).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn score_block(q: &[f32], keys: &Transposed, c: usize) -> V16 {
    let lane = |l: usize| -> V16 {
        let z = _mm256_setzero_ps();
        let mut acc = [V16(z, z); 4];
        for b in (0..q.len()).step_by(64) {
            for (j, a) in acc.iter_mut().enumerate() {
                let dd = b + 16 * j + l;
                let x = _mm256_set1_ps(q[dd]);
                *a = fma(V16(x, x), load(keys.block(dd, c)), *a);
            }
        }
        add(add(acc[0], acc[2]), add(acc[1], acc[3]))
    };
    let t6 = |j: usize| -> V16 {
        let (a, b) = (lane(j), lane(j + 4));
        let (c, e) = (lane(j + 8), lane(j + 12));
        add(add(e, b), add(c, a))
    };
    let (u0, u2) = (t6(0), t6(2));
    let (u1, u3) = (t6(1), t6(3));
    add(add(u0, u2), add(u1, u3))
}

/// `exp(x − max)` per lane, the sum of each block's `reduce16` in f64, then the scaling.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn softmax(p: &mut [[f32; LANES]], max: f32) {
    let max = _mm256_set1_ps(max);
    let mut sum = 0f64;
    for chunk in p.iter_mut() {
        let x = load(chunk);
        let e = V16(expf(_mm256_sub_ps(x.0, max)), expf(_mm256_sub_ps(x.1, max)));
        store(e, chunk);
        sum += reduce(e) as f64;
    }
    let inv = _mm256_set1_ps((1.0 / sum) as f32);
    for chunk in p.iter_mut() {
        let x = load(chunk);
        store(V16(_mm256_mul_ps(x.0, inv), _mm256_mul_ps(x.1, inv)), chunk);
    }
}

/// `super::v_expf` on 8 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn expf(x: __m256) -> __m256 {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    // fnmadd(n, a, y) = y − n·a with one rounding, as (−n).mul_add(a, y)
    let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
    );
    // j·2ⁿ rounded once: in f64, four lanes at a time
    let ni = _mm256_cvttps_epi32(n);
    let scale4 = |ni: __m128i, j: __m128| -> __m128 {
        let e = _mm256_slli_epi64(
            _mm256_add_epi64(_mm256_cvtepi32_epi64(ni), _mm256_set1_epi64x(1023)),
            52,
        );
        _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(j), _mm256_castsi256_pd(e)))
    };
    let lo = scale4(_mm256_castsi256_si128(ni), _mm256_castps256_ps128(j));
    let hi = scale4(_mm256_extracti128_si256(ni, 1), _mm256_extractf128_ps(j, 1));
    let scaled = _mm256_set_m128(hi, lo);
    // |n| > 192: 0 below, ∞ above
    let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let big = _mm256_cmp_ps(abs, _mm256_set1_ps(192.0), _CMP_GT_OQ);
    let positive = _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_GT_OQ);
    let saturated = _mm256_and_ps(positive, _mm256_set1_ps(f32::INFINITY));
    _mm256_blendv_ps(scaled, saturated, big)
}

/// tinyBLAS's `p·V` for outputs `d0..d0 + 4` (see `transposed::weighted_sum`), over the
/// positions of blocks `c0..c0 + p.len()`, onto the running accumulators `acc`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn weighted_sum4(
    p: &[[f32; LANES]],
    vals: &Transposed,
    d0: usize,
    c0: usize,
    acc: &mut [V16],
) {
    let mut a = [acc[0], acc[1], acc[2], acc[3]];
    for (c, pc) in p.iter().enumerate() {
        let pv = load(pc);
        for (dd, a) in a.iter_mut().enumerate() {
            *a = fma(load(vals.block(d0 + dd, c0 + c)), pv, *a);
        }
    }
    acc.copy_from_slice(&a);
}
