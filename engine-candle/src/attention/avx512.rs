//! The transposed prompt path (`transposed.rs`) in AVX-512: a 16-lane value is one register,
//! every operation the one the portable code does, in the same order, so the bits are the same
//! (the tests compare every path). With 32 registers, four queries share each load of a key
//! block while their scores are summed, and each load of a value row while their `p·V` is —
//! the AVX2 code, with its 16 registers, reads the keys and values again for every query.

use std::arch::x86_64::*;

use super::transposed::{hidden_before, Block, Transposed};
use super::LANES;

/// Queries whose probabilities are kept together (as in `avx2.rs`).
const TILE: usize = 8;
/// Queries that share each load of keys and values.
const GROUP: usize = 4;

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load(a: &[f32; LANES]) -> __m512 {
    _mm512_loadu_ps(a.as_ptr())
}

/// `reduce16`: halves, quarters, then `(0+2) + (1+3)`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn reduce(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    let t3 = _mm256_add_ps(hi, lo); // t3[j] = a[j+8] + a[j]
    let t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    let hi = _mm_movehl_ps(t6, t6);
    let pairs = _mm_add_ps(t6, hi);
    _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)))
}

/// See `transposed::queries`: the same per-query arithmetic, a tile of queries at a time.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn queries(b: &Block<'_>, out: &mut [f32]) {
    let hd = b.dims.head_dim;
    // one block more than the keys have (see `avx2.rs`)
    let blocks = b.keys.blocks() + 1;
    let mut probs = vec![[0f32; LANES]; TILE * blocks];
    let mut acc: Vec<__m512> = Vec::new();
    let scale = _mm512_set1_ps(b.dims.scale);
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    for t0 in (0..b.count).step_by(TILE) {
        let n = TILE.min(b.count - t0);
        // query i of the tile sees positions 0..totals[i]
        let mut totals = [0usize; TILE];
        for (i, total) in totals.iter_mut().enumerate().take(n) {
            *total = b.start + b.first + t0 + i + 1;
        }
        let own = |i: usize| totals[i].div_ceil(LANES);
        let most = own(n - 1);
        // positions before a local layer's window: −∞; the blocks before the tile's first
        // query's window are left out (every query of the tile weighs them zero)
        let hidden: [usize; TILE] = std::array::from_fn(|i| hidden_before(b.dims, totals[i]));
        let lo = hidden[0] / LANES;
        let q = |i: usize| {
            let ti = b.first + t0 + i;
            &b.q[ti * hd..(ti + 1) * hd]
        };
        // scores, block by block of keys for all the tile's queries, four at a time (a short
        // group repeats its last query; the repeats are not kept)
        let mut max = [ninf; TILE];
        for c in lo..most {
            for g0 in (0..n).step_by(GROUP) {
                let g = GROUP.min(n - g0);
                let s = score_blocks(std::array::from_fn(|j| q(g0 + j.min(g - 1))), b.keys, c);
                for (j, s) in s.iter().enumerate().take(g) {
                    let i = g0 + j;
                    let left = totals[i].saturating_sub(c * LANES);
                    if left == 0 {
                        continue;
                    }
                    let mut s = _mm512_mul_ps(*s, scale);
                    if left < LANES {
                        // positions past the query's own: −∞ (their probability is 0)
                        s = _mm512_mask_blend_ps(((1u32 << left) - 1) as __mmask16, ninf, s);
                    }
                    let unseen = hidden[i].saturating_sub(c * LANES).min(LANES);
                    if unseen > 0 {
                        // positions before its window: −∞ too
                        s = _mm512_mask_blend_ps(((1u32 << unseen) - 1) as __mmask16, s, ninf);
                    }
                    max[i] = _mm512_max_ps(max[i], s);
                    _mm512_storeu_ps(probs[i * blocks + c].as_mut_ptr(), s);
                }
            }
        }
        for (i, max) in max.iter().enumerate().take(n) {
            let mut m = [0f32; LANES];
            _mm512_storeu_ps(m.as_mut_ptr(), *max);
            // the maximum is exact whatever the order
            let m = m.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            softmax(&mut probs[i * blocks + lo..i * blocks + own(i)], m);
        }
        // p·V, four outputs for four queries at a time, a span of positions at a time (see
        // `avx2.rs`); the group's common positions together, then each query's own rest: every
        // accumulator still adds its positions in order
        let groups = hd / 4;
        acc.clear();
        acc.resize(n * groups * 4, _mm512_setzero_ps());
        for c0 in (lo..most).step_by(PV_SPAN_BLOCKS) {
            let c1 = most.min(c0 + PV_SPAN_BLOCKS);
            for g in 0..groups {
                for g0 in (0..n).step_by(GROUP) {
                    let members = g0..(g0 + GROUP).min(n);
                    let common = members.clone().map(|i| own(i).min(c1)).min().unwrap_or(c0);
                    let mut from = c0;
                    if members.len() == GROUP && common > c0 {
                        let p: [&[[f32; LANES]]; GROUP] = std::array::from_fn(|j| {
                            let i = g0 + j;
                            &probs[i * blocks + c0..i * blocks + common]
                        });
                        weighted_sums(p, b.vals, 4 * g, c0, &mut acc, |j| {
                            ((g0 + j) * groups + g) * 4
                        });
                        from = common;
                    }
                    for i in members {
                        let end = own(i).min(c1);
                        if end <= from {
                            continue;
                        }
                        let p = &probs[i * blocks + from..i * blocks + end];
                        let a = &mut acc[(i * groups + g) * 4..(i * groups + g + 1) * 4];
                        weighted_sum4(p, b.vals, 4 * g, from, a);
                    }
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

/// Blocks of 16 positions per span of the `p·V` loop (as in `avx2.rs`).
const PV_SPAN_BLOCKS: usize = 16;

/// The 16 scores of block `c` before scaling for four queries (see `transposed::scores`):
/// each element of the keys is loaded once for the four.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn score_blocks(q: [&[f32]; GROUP], keys: &Transposed, c: usize) -> [__m512; GROUP] {
    let hd = q[0].len();
    let lane = |l: usize| -> [__m512; GROUP] {
        let z = _mm512_setzero_ps();
        let mut acc = [[z; 4]; GROUP];
        for b in (0..hd).step_by(64) {
            for j in 0..4 {
                let dd = b + 16 * j + l;
                let k = load(keys.block(dd, c));
                for (a, q) in acc.iter_mut().zip(&q) {
                    a[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[dd]), k, a[j]);
                }
            }
        }
        acc.map(|a| _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3])))
    };
    let t6 = |j: usize| -> [__m512; GROUP] {
        let (a, b) = (lane(j), lane(j + 4));
        let (c, e) = (lane(j + 8), lane(j + 12));
        std::array::from_fn(|i| _mm512_add_ps(_mm512_add_ps(e[i], b[i]), _mm512_add_ps(c[i], a[i])))
    };
    let (u0, u2) = (t6(0), t6(2));
    let (u1, u3) = (t6(1), t6(3));
    std::array::from_fn(|i| _mm512_add_ps(_mm512_add_ps(u0[i], u2[i]), _mm512_add_ps(u1[i], u3[i])))
}

/// `exp(x − max)` per lane, the sum of each block's `reduce16` in f64, then the scaling.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn softmax(p: &mut [[f32; LANES]], max: f32) {
    let max = _mm512_set1_ps(max);
    let mut sum = 0f64;
    for chunk in p.iter_mut() {
        let e = expf(_mm512_sub_ps(load(chunk), max));
        _mm512_storeu_ps(chunk.as_mut_ptr(), e);
        sum += reduce(e) as f64;
    }
    let inv = _mm512_set1_ps((1.0 / sum) as f32);
    for chunk in p.iter_mut() {
        _mm512_storeu_ps(chunk.as_mut_ptr(), _mm512_mul_ps(load(chunk), inv));
    }
}

/// ggml's `ggml_v_expf` for AVX-512 (`super::v_expf` on 16 lanes): `scalef` scales by 2ⁿ
/// with one rounding.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn expf(x: __m512) -> __m512 {
    let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
    let r = c(0x4b40_0000);
    let z = _mm512_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmadd_ps(n, c(0x3f31_7200), x));
    let big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0), _CMP_GT_OQ);
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
    );
    let res = _mm512_scalef_ps(j, n);
    let zero = _mm512_setzero_ps();
    let alt = _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask(n, zero, _CMP_LE_OQ),
        _mm512_set1_ps(f32::INFINITY),
        zero,
    );
    _mm512_mask_blend_ps(big, res, alt)
}

/// tinyBLAS's `p·V` for outputs `d0..d0 + 4` (see `transposed::weighted_sum`) of four
/// queries over the same positions (blocks `c0..c0 + p[i].len()`), onto their accumulators
/// `acc[at(i)..at(i) + 4]`: each value row is loaded once for the four.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn weighted_sums(
    p: [&[[f32; LANES]]; GROUP],
    vals: &Transposed,
    d0: usize,
    c0: usize,
    acc: &mut [__m512],
    at: impl Fn(usize) -> usize,
) {
    let mut a: [[__m512; 4]; GROUP] =
        std::array::from_fn(|i| std::array::from_fn(|dd| acc[at(i) + dd]));
    for c in 0..p[0].len() {
        let v: [__m512; 4] = std::array::from_fn(|dd| load(vals.block(d0 + dd, c0 + c)));
        for (a, p) in a.iter_mut().zip(&p) {
            let pv = load(&p[c]);
            for (a, v) in a.iter_mut().zip(&v) {
                *a = _mm512_fmadd_ps(*v, pv, *a);
            }
        }
    }
    for (i, a) in a.iter().enumerate() {
        acc[at(i)..at(i) + 4].copy_from_slice(a);
    }
}

/// `weighted_sums` for one query.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn weighted_sum4(
    p: &[[f32; LANES]],
    vals: &Transposed,
    d0: usize,
    c0: usize,
    acc: &mut [__m512],
) {
    let mut a = [acc[0], acc[1], acc[2], acc[3]];
    for (c, pc) in p.iter().enumerate() {
        let pv = load(pc);
        for (dd, a) in a.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(load(vals.block(d0 + dd, c0 + c)), pv, *a);
        }
    }
    acc.copy_from_slice(&a);
}
