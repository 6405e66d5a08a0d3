//! Activations quantized for the integer matmul kernels exactly as ggml does: Q8_1 blocks of
//! 32 for the 32-element weight formats (`quantize_row_q8_1`), Q8_K blocks of 256 for the
//! K-quants (`quantize_row_q8_K_ref`). The AVX2 versions compute the same bits (the tests
//! compare them on awkward blocks: ties for the largest magnitude, halves, zeros, tiny
//! values), and a prompt's rows are split among the compute pool's workers: quantizing on the
//! decode thread alone left the other cores spinning for a tenth of a long prompt pass.

use half::f16;

use crate::cpu_parallel::par_chunks_mut;

pub(crate) const QK: usize = 32;
/// Elements per K-quant super-block (and per Q8_K activation block).
pub(crate) const QK_K: usize = 256;
/// 1.5 · 2^23: adding and subtracting it rounds an f32 to the nearest integer, ties to even.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// One Q8_1 block of activations.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct BlockQ81 {
    pub qs: [i8; 32],
    /// Scale, rounded to f16 as ggml stores it.
    pub d: f32,
    /// `d · Σ qs`, rounded to f16 (Q8_1 only; Q8_0 ignores it).
    pub s: f32,
    /// `Σ qs`, exact.
    pub isum: i32,
}

/// Quantizes 32 activations like ggml's `quantize_row_q8_1`.
pub(crate) fn quantize_q8_1(x: &[f32]) -> BlockQ81 {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(x) {
        // round half to even without a libm call: exact for |x| < 2^22 (here |x| <= 127)
        let x = v * id;
        let r = ((x + ROUND_MAGIC) - ROUND_MAGIC) as i32;
        *q = r as i8;
        sum += r;
    }
    BlockQ81 {
        qs,
        d: f16::from_f32(d).to_f32(),
        s: f16::from_f32(d * sum as f32).to_f32(),
        isum: sum,
    }
}

/// One Q8_K block of activations (ggml's `block_q8_K`), what K-quant weights multiply.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct BlockQ8K {
    pub qs: [i8; QK_K],
    /// `Σ qs` over each 16 elements.
    pub bsums: [i16; 16],
    /// Scale, an f32 (not rounded to f16).
    pub d: f32,
}

/// Quantizes 256 activations like ggml's `quantize_row_q8_K_ref` (the path x86 takes): the
/// element of largest magnitude becomes ∓127, the rest round half to even.
pub(crate) fn quantize_q8_k(x: &[f32]) -> BlockQ8K {
    let mut b = BlockQ8K {
        qs: [0; QK_K],
        bsums: [0; 16],
        d: 0.0,
    };
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            (amax, max) = (v.abs(), v);
        }
    }
    if amax == 0.0 {
        return b;
    }
    let iscale = -127.0 / max;
    for (q, v) in b.qs.iter_mut().zip(x) {
        let r = ((iscale * v + ROUND_MAGIC) - ROUND_MAGIC) as i32;
        *q = r.min(127) as i8;
    }
    for (s, c) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = c.iter().map(|&q| q as i16).sum();
    }
    b.d = 1.0 / iscale;
    b
}

/// An activation block: its length and how a slice of that length is quantized.
pub(crate) trait ActBlock: Copy + Send + Sync {
    const LEN: usize;
    /// A placeholder the quantized blocks overwrite.
    const EMPTY: Self;
    fn quantize(x: &[f32]) -> Self;
}

impl ActBlock for BlockQ81 {
    const LEN: usize = QK;
    const EMPTY: Self = BlockQ81 {
        qs: [0; QK],
        d: 0.0,
        s: 0.0,
        isum: 0,
    };
    fn quantize(x: &[f32]) -> Self {
        #[cfg(target_arch = "x86_64")]
        if avx2() {
            // SAFETY: AVX2 was detected.
            return unsafe { avx2_impl::q8_1(x) };
        }
        quantize_q8_1(x)
    }
}

impl ActBlock for BlockQ8K {
    const LEN: usize = QK_K;
    const EMPTY: Self = BlockQ8K {
        qs: [0; QK_K],
        bsums: [0; 16],
        d: 0.0,
    };
    fn quantize(x: &[f32]) -> Self {
        #[cfg(target_arch = "x86_64")]
        if avx2() {
            // SAFETY: AVX2 was detected.
            return unsafe { avx2_impl::q8_k(x) };
        }
        quantize_q8_k(x)
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// Elements one worker quantizes at least (fewer stay on the calling thread: a decode step's
/// few rows cost less than handing them out).
const PER_JOB: usize = 8 << 10;

/// `x` (whole blocks) quantized block after block, the blocks split among the workers.
pub(crate) fn quantize_rows<B: ActBlock>(x: &[f32]) -> Vec<B> {
    let mut out = vec![B::EMPTY; x.len() / B::LEN];
    let per = (PER_JOB / B::LEN).max(1);
    par_chunks_mut(&mut out, per, |c, dst| {
        let x = &x[c * per * B::LEN..];
        for (b, x) in dst.iter_mut().zip(x.chunks_exact(B::LEN)) {
            *b = B::quantize(x);
        }
    });
    out
}

#[cfg(target_arch = "x86_64")]
mod avx2_impl {
    use std::arch::x86_64::*;

    use super::*;

    /// The largest magnitude of `x` (a multiple of 8 long); NaNs are passed over as the
    /// scalar loops pass them over (`maxps` returns its second operand when one is NaN).
    #[target_feature(enable = "avx2")]
    unsafe fn amax(x: &[f32]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for c in x.chunks_exact(8) {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(c.as_ptr())), m);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        lanes.iter().fold(0f32, |a, &b| a.max(b))
    }

    /// 32 elements times `scale`, rounded half to even (the magic-number rounding of the
    /// scalar code: the same for these magnitudes), capped at 127, as i8 in order; and
    /// their sum.
    #[target_feature(enable = "avx2")]
    unsafe fn round32(x: &[f32], scale: f32, out: &mut [i8]) -> i32 {
        let s = _mm256_set1_ps(scale);
        let cap = _mm256_set1_epi32(127);
        let q = |o: usize| {
            let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(o)), s);
            let r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm256_min_epi32(_mm256_cvtps_epi32(r), cap)
        };
        let (a, b, c, d) = (q(0), q(8), q(16), q(24));
        let sum = _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d));
        // packing interleaves the 128-bit halves: the 32-bit groups come out as
        // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7, put back in order by the permutation
        let packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
        let ordered =
            _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(out.as_mut_ptr().cast(), ordered);
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum);
        lanes.iter().sum()
    }

    /// `quantize_q8_1`, vectorized.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q8_1(x: &[f32]) -> BlockQ81 {
        let amax = amax(&x[..QK]);
        if !amax.is_finite() {
            // an infinite activation: the scalar code's conversions of NaN define the block
            return quantize_q8_1(x);
        }
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut qs = [0i8; QK];
        let sum = round32(x, id, &mut qs);
        BlockQ81 {
            qs,
            d: f16::from_f32(d).to_f32(),
            s: f16::from_f32(d * sum as f32).to_f32(),
            isum: sum,
        }
    }

    /// `quantize_q8_k`, vectorized.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q8_k(x: &[f32]) -> BlockQ8K {
        let x = &x[..QK_K];
        let amax = amax(x);
        if amax == 0.0 || !amax.is_finite() {
            return quantize_q8_k(x);
        }
        // the first element of largest magnitude, as the scalar loop keeps it (strict `>`)
        let Some(max) = x.iter().copied().find(|v| v.abs() == amax) else {
            return quantize_q8_k(x);
        };
        let iscale = -127.0 / max;
        let mut b = BlockQ8K::EMPTY;
        for (x, qs) in x.chunks_exact(32).zip(b.qs.chunks_exact_mut(32)) {
            round32(x, iscale, qs);
        }
        for (s, c) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = c.iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks that stress the rounding: halves (ties), a largest magnitude met twice with
    /// both signs, zeros, subnormals, scales far apart.
    fn awkward(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        let scale = [1e-30f32, 1e-3, 0.5, 3.0, 1e4][seed as usize % 5];
        let mut x: Vec<f32> = (0..len)
            .map(|_| match next() % 8 {
                0 => 0.0,
                1 => (next() % 255) as f32 / 2.0 - 63.5,
                2 => f32::from_bits(next() % 0x007f_ffff),
                _ => (next() as f32 / u32::MAX as f32 - 0.5) * scale,
            })
            .collect();
        if seed.is_multiple_of(3) {
            // the largest magnitude twice, negative first
            let m = x.iter().fold(0f32, |a, v| a.max(v.abs())) * 2.0 + 1.0;
            x[len / 3] = -m;
            x[len / 2] = m;
        }
        x
    }

    #[test]
    fn vectorized_blocks_are_the_scalar_ones() {
        for seed in 0..200 {
            let x = awkward(QK_K, seed);
            let (a, b) = (BlockQ8K::quantize(&x), quantize_q8_k(&x));
            assert_eq!(
                (a.qs, a.bsums, a.d.to_bits()),
                (b.qs, b.bsums, b.d.to_bits()),
                "{seed}"
            );
            for x in x.chunks_exact(QK) {
                let (a, b) = (BlockQ81::quantize(x), quantize_q8_1(x));
                assert_eq!(
                    (a.qs, a.d.to_bits(), a.s.to_bits(), a.isum),
                    (b.qs, b.d.to_bits(), b.s.to_bits(), b.isum),
                    "{seed}"
                );
            }
        }
        for x in [[0f32; QK_K], [f32::INFINITY; QK_K]] {
            let (a, b) = (BlockQ8K::quantize(&x), quantize_q8_k(&x));
            assert_eq!((a.qs, a.d.to_bits()), (b.qs, b.d.to_bits()));
        }
    }

    #[test]
    fn rows_split_among_workers_give_every_block_in_order() {
        // a decode step's row (one job) and a prompt's rows (many)
        for rows in [1usize, 3, 70] {
            let x: Vec<f32> = (0..rows as u32)
                .flat_map(|r| awkward(2 * QK_K, r))
                .collect();
            let k: Vec<BlockQ8K> = quantize_rows(&x);
            let q: Vec<BlockQ81> = quantize_rows(&x);
            assert_eq!(k.len(), x.len() / QK_K);
            assert_eq!(q.len(), x.len() / QK);
            for (b, x) in k.iter().zip(x.chunks_exact(QK_K)) {
                assert_eq!(b.qs, quantize_q8_k(x).qs);
            }
            for (b, x) in q.iter().zip(x.chunks_exact(QK)) {
                assert_eq!(
                    (b.qs, b.d.to_bits()),
                    (quantize_q8_1(x).qs, quantize_q8_1(x).d.to_bits())
                );
            }
        }
    }

    #[test]
    fn magic_rounding_is_round_half_to_even() {
        for x in [
            -127.0f32, -2.5, -1.5, -0.5, -0.49, 0.0, 0.5, 1.5, 2.5, 3.49, 126.5, 127.0,
        ] {
            assert_eq!((x + ROUND_MAGIC) - ROUND_MAGIC, x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn q8_k_blocks_are_ggmls() {
        // the element of largest magnitude is positive here: it becomes -127 with d < 0
        let x: Vec<f32> = (0..QK_K).map(|i| (i as f32 * 0.37).sin() * 2.0).collect();
        let b = quantize_q8_k(&x);
        let (at, max) =
            x.iter().enumerate().fold(
                (0, 0f32),
                |(i, m), (j, v)| if v.abs() > m.abs() { (j, *v) } else { (i, m) },
            );
        assert_eq!(b.qs[at], -127);
        assert_eq!(b.d, 1.0 / (-127.0 / max));
        for (i, (q, v)) in b.qs.iter().zip(&x).enumerate() {
            assert!((*q as f32 * b.d - v).abs() <= b.d.abs() / 2.0 + 1e-6, "{i}");
        }
        for (j, s) in b.bsums.iter().enumerate() {
            let want: i16 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
            assert_eq!(*s, want);
        }
        let zero = quantize_q8_k(&[0.0; QK_K]);
        assert_eq!((zero.d, zero.qs, zero.bsums), (0.0, [0; QK_K], [0; 16]));
    }
}
