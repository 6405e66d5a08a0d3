//! A CPU matmul for Q6_K weights (the feed-forward outputs of a Q4_K_M file, most of a Q6_K
//! one) with ggml's arithmetic (`ggml_vec_dot_q6_K_q8_K` on AVX2, bit-identical): activations
//! quantized to Q8_K blocks; per 256-element super-block the exact integer sum
//! `Σ_i sc_i · Σ (q_w − 32)·q_a` over its sixteen 16-element groups in eight i32 lanes, the
//! −32 taken off through the activation block's group sums, scaled once per super-block.
//!
//! The six-bit values are unpacked to one byte each at load (256 bytes a super-block where
//! the file holds 210), so a kernel step is one load where candle's and ggml's spend about
//! ten instructions reassembling 32 values from their low and high bits; each weight row
//! meets four activation rows at once (`kquant_rows.rs`).

use candle_core::quantized::GgmlDType;
use half::f16;

#[cfg(target_arch = "x86_64")]
use crate::cpu_quant::hsum8;
use crate::cpu_quant::{hsum8_portable, BlockQ8K, QK_K};
#[cfg(target_arch = "x86_64")]
use crate::kquant_rows::scaled_sum;
use crate::kquant_rows::{KMatrix, SuperBlock};

/// A `[n, k]` Q6_K weight matrix.
pub(crate) type Q6KMatrix = KMatrix<Q6KBlock>;

/// One Q6_K super-block, unpacked.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Q6KBlock {
    /// Element `e`'s value plus 32 (0..63), in element order.
    q: [u8; QK_K],
    /// The scale of elements `16i..16i + 16`.
    scales: [i8; 16],
    d: f32,
}

impl SuperBlock for Q6KBlock {
    const DTYPE: GgmlDType = GgmlDType::Q6K;
    /// 128 bytes of low 4 bits, 64 of high 2 bits, 16 signed 8-bit group scales, d (f16).
    const STORED: usize = 210;

    fn unpack(c: &[u8]) -> Self {
        unpack(c)
    }

    fn dot_portable(w: &[Self], a: &[BlockQ8K]) -> f32 {
        dot_portable(w, a)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn dots_simd<const R: usize, const VNNI: bool>(
        w: &[Self],
        a: [&[BlockQ8K]; R],
    ) -> [f32; R] {
        dots_simd::<R, VNNI>(w, a)
    }
}

/// ggml's layout (`dequantize_row_q6_K`): per 128 elements, 64 bytes of low nibbles and 32
/// bytes whose bit pairs are the high bits of four 32-element runs.
fn unpack(c: &[u8]) -> Q6KBlock {
    let (ql, qh, sc) = (&c[..128], &c[128..192], &c[192..208]);
    let mut s = Q6KBlock {
        q: [0; QK_K],
        scales: [0; 16],
        d: f16::from_le_bytes([c[208], c[209]]).to_f32(),
    };
    for (o, &v) in s.scales.iter_mut().zip(sc) {
        *o = v as i8;
    }
    for half in 0..2 {
        let (ql, qh, q) = (&ql[64 * half..], &qh[32 * half..], &mut s.q[128 * half..]);
        for l in 0..32 {
            q[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            q[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    s
}

/// The arithmetic of the AVX2 path, lane by lane: lane `l` of 32-element run `c` holds
/// elements `32c + 4l..32c + 4l + 4`, whose group is `2c + l / 4`.
fn dot_portable(w: &[Q6KBlock], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    for (s, y) in w.iter().zip(a) {
        let d = y.d * s.d;
        let mut sumi = [0i32; 8];
        for c in 0..8 {
            for (l, lane) in sumi.iter_mut().enumerate() {
                let sc = s.scales[2 * c + l / 4] as i32;
                for e in 32 * c + 4 * l..32 * c + 4 * l + 4 {
                    *lane += sc * s.q[e] as i32 * y.qs[e] as i32;
                }
            }
        }
        for (l, lane) in sumi.iter_mut().enumerate() {
            let off = y.bsums[2 * l] as i32 * s.scales[2 * l] as i32
                + y.bsums[2 * l + 1] as i32 * s.scales[2 * l + 1] as i32;
            *lane -= off << 5;
        }
        for (lane, si) in acc.iter_mut().zip(sumi) {
            *lane = d.mul_add(si as f32, *lane);
        }
    }
    hsum8_portable(acc)
}

/// `_mm_shuffle_epi8` patterns taking group scales `2c` and `2c + 1`, eight bytes each.
#[cfg(target_arch = "x86_64")]
const SCALE_PAIRS: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut c = 0;
    while c < 8 {
        let mut i = 0;
        while i < 16 {
            t[c][i] = (2 * c + i / 8) as u8;
            i += 1;
        }
        c += 1;
    }
    t
};

/// One weight row against `R` activation rows, each super-block's scales expanded once.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots_simd<const R: usize, const VNNI: bool>(
    w: &[Q6KBlock],
    a: [&[BlockQ8K]; R],
) -> [f32; R] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, s) in w.iter().enumerate() {
        let scales = _mm_loadu_si128(s.scales.as_ptr() as *const __m128i);
        let scales16 = _mm256_cvtepi8_epi16(scales);
        let mut sc = [_mm256_setzero_si256(); 8];
        for (v, pattern) in sc.iter_mut().zip(&SCALE_PAIRS) {
            let p = _mm_loadu_si128(pattern.as_ptr() as *const __m128i);
            *v = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, p));
        }
        for r in 0..R {
            let y = &a[r][b];
            let chunk = |c: usize| {
                let qw = _mm256_loadu_si256(s.q.as_ptr().add(32 * c) as *const __m256i);
                (qw, sc[c])
            };
            let mut sumi = scaled_sum::<VNNI>(chunk, y.qs.as_ptr());
            let bsums = _mm256_load_si256(y.bsums.as_ptr() as *const __m256i);
            let off = _mm256_slli_epi32(_mm256_madd_epi16(bsums, scales16), 5);
            sumi = _mm256_sub_epi32(sumi, off);
            let d = _mm256_set1_ps(y.d * s.d);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    acc.map(|v| hsum8(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_quant::quantize_q8_k;
    use crate::kquant_rows::checks;
    use candle_core::Device;

    #[test]
    fn unpacking_gives_the_stored_values() {
        // candle's dequantization of the same blocks: d · scale · (q − 32) element by element
        let q = checks::quantized(GgmlDType::Q6K, 3, 512, 5);
        let t = q.dequantize(&Device::Cpu).unwrap();
        let deq: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        let mat = Q6KMatrix::from_qtensor(&q).unwrap();
        for i in 0..6 {
            let s = &mat.row(i / 2)[i % 2];
            for e in 0..QK_K {
                let v = s.d * s.scales[e / 16] as f32 * (s.q[e] as i32 - 32) as f32;
                assert_eq!(v, deq[i * QK_K + e], "block {i} element {e}");
            }
        }
    }

    #[test]
    fn agrees_with_candle_and_the_dequantized_product() {
        checks::agrees_with_candle_and_the_dequantized_product::<Q6KBlock>();
    }

    #[test]
    fn simd_and_portable_paths_agree_exactly_at_any_batch() {
        checks::simd_and_portable_agree_exactly_at_any_batch::<Q6KBlock>();
    }

    #[test]
    fn other_types_are_not_taken() {
        checks::other_types_are_not_taken::<Q6KBlock>();
    }

    #[test]
    fn the_portable_sum_is_the_scaled_integer_sum() {
        let q = checks::quantized(GgmlDType::Q6K, 1, QK_K, 7);
        let mat = Q6KMatrix::from_qtensor(&q).unwrap();
        let s = &mat.row(0)[0];
        let y = quantize_q8_k(&checks::acts(1, QK_K));
        let si: i64 = (0..QK_K)
            .map(|e| s.scales[e / 16] as i64 * (s.q[e] as i64 - 32) * y.qs[e] as i64)
            .sum();
        let want = y.d as f64 * s.d as f64 * si as f64;
        let got = dot_portable(mat.row(0), &[y]) as f64;
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
}
