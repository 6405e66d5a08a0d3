//! A CPU matmul for Q4_K weights (most of a Q4_K_M file) with ggml's arithmetic
//! (`ggml_vec_dot_q4_K_q8_K` on AVX2, bit-identical): activations quantized to Q8_K blocks,
//! per 256-element super-block the exact integer sums `Σ_j sc_j · Σ q_w·q_a` (eight i32
//! lanes) and `Σ_j m_j · Σ q_a` (four lanes), scaled once per super-block into f32 lanes.
//!
//! candle's kernel computes the same sums one weight row against one activation row, and its
//! CPU matmul visits the activation rows one by one, so a prompt pass re-reads and re-unpacks
//! every weight row once per token. Here the six-bit scales and minimums are unpacked at load,
//! and each weight super-block is unpacked once for four activation rows
//! (`kquant_rows.rs`), on the parallel row loop every own kernel shares.

use candle_core::quantized::GgmlDType;
use half::f16;

#[cfg(target_arch = "x86_64")]
use crate::cpu_quant::hsum8;
use crate::cpu_quant::{hsum8_portable, BlockQ8K};
#[cfg(target_arch = "x86_64")]
use crate::kquant_rows::scaled_sum;
use crate::kquant_rows::{KMatrix, SuperBlock};

/// A `[n, k]` Q4_K weight matrix.
pub(crate) type Q4KMatrix = KMatrix<Q4KBlock>;

/// One Q4_K super-block, scales unpacked.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Q4KBlock {
    /// As stored: bytes `32j..32j + 32` hold elements `64j..64j + 32` in their low nibbles
    /// and `64j + 32..64j + 64` in their high nibbles.
    qs: [u8; 128],
    /// The eight 32-element sub-blocks' scales and minimums (6 bits each).
    sc: [u8; 8],
    mins: [u8; 8],
    d: f32,
    dmin: f32,
}

/// ggml's `get_scale_min_k4`: sub-block `j`'s scale and minimum from the 12 packed bytes.
pub(crate) fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

impl SuperBlock for Q4KBlock {
    const DTYPE: GgmlDType = GgmlDType::Q4K;
    /// d, dmin (f16), 12 bytes of packed scales and minimums, 128 bytes of 4-bit values.
    const STORED: usize = 144;

    fn unpack(c: &[u8]) -> Self {
        let mut s = Self {
            qs: [0; 128],
            sc: [0; 8],
            mins: [0; 8],
            d: f16::from_le_bytes([c[0], c[1]]).to_f32(),
            dmin: f16::from_le_bytes([c[2], c[3]]).to_f32(),
        };
        for j in 0..8 {
            (s.sc[j], s.mins[j]) = scale_min(j, &c[4..16]);
        }
        s.qs.copy_from_slice(&c[16..]);
        s
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

/// The arithmetic of the AVX2 path, lane by lane.
fn dot_portable(w: &[Q4KBlock], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    let mut acc_m = [0f32; 4];
    for (s, y) in w.iter().zip(a) {
        let (d, dmin) = (y.d * s.d, -y.d * s.dmin);
        let q8s: Vec<i32> = (0..8)
            .map(|j| y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32)
            .collect();
        for (t, lane) in acc_m.iter_mut().enumerate() {
            let prod =
                s.mins[2 * t] as i32 * q8s[2 * t] + s.mins[2 * t + 1] as i32 * q8s[2 * t + 1];
            *lane = dmin.mul_add(prod as f32, *lane);
        }
        let mut sumi = [0i32; 8];
        for j in 0..4 {
            let (lo, hi) = (s.sc[2 * j] as i32, s.sc[2 * j + 1] as i32);
            for (l, lane) in sumi.iter_mut().enumerate() {
                for e in 4 * l..4 * l + 4 {
                    let byte = s.qs[32 * j + e];
                    *lane += lo * (byte & 0xF) as i32 * y.qs[64 * j + e] as i32;
                    *lane += hi * (byte >> 4) as i32 * y.qs[64 * j + 32 + e] as i32;
                }
            }
        }
        for (lane, si) in acc.iter_mut().zip(sumi) {
            *lane = d.mul_add(si as f32, *lane);
        }
    }
    hsum8_portable(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

/// One weight row against `R` activation rows, each super-block's values unpacked once.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots_simd<const R: usize, const VNNI: bool>(
    w: &[Q4KBlock],
    a: [&[BlockQ8K]; R],
) -> [f32; R] {
    use std::arch::x86_64::*;
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_m = [_mm_setzero_ps(); R];
    for (b, s) in w.iter().enumerate() {
        let mut q = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let bits = _mm256_loadu_si256(s.qs.as_ptr().add(32 * j) as *const __m256i);
            q[2 * j] = _mm256_and_si256(bits, m4);
            q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        }
        for (v, &c) in sc.iter_mut().zip(&s.sc) {
            *v = _mm256_set1_epi16(c as i16);
        }
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(s.mins.as_ptr() as *const __m128i));
        for r in 0..R {
            let y = &a[r][b];
            let sumi = scaled_sum::<VNNI>(|i| (q[i], sc[i]), y.qs.as_ptr());
            let d = y.d * s.d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
            let bsums = _mm256_load_si256(y.bsums.as_ptr() as *const __m256i);
            let q8s = _mm_hadd_epi16(
                _mm256_castsi256_si128(bsums),
                _mm256_extracti128_si256(bsums, 1),
            );
            let prod = _mm_madd_epi16(mins, q8s);
            let dmin = -y.d * s.dmin;
            acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[r]);
        }
    }
    let mut res = [0f32; R];
    for r in 0..R {
        let mut m = _mm_add_ps(acc_m[r], _mm_movehl_ps(acc_m[r], acc_m[r]));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        res[r] = hsum8(acc[r]) + _mm_cvtss_f32(m);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_quant::quantize_q8_k;
    use crate::kquant_rows::checks;

    #[test]
    fn agrees_with_candle_and_the_dequantized_product() {
        checks::agrees_with_candle_and_the_dequantized_product::<Q4KBlock>();
    }

    #[test]
    fn simd_and_portable_paths_agree_exactly_at_any_batch() {
        checks::simd_and_portable_agree_exactly_at_any_batch::<Q4KBlock>();
    }

    #[test]
    fn other_types_are_not_taken() {
        checks::other_types_are_not_taken::<Q4KBlock>();
    }

    #[test]
    fn the_portable_sum_is_the_scaled_integer_sum() {
        // one super-block: d·d_a·Σ_j sc_j Σ q_w q_a − dmin·d_a·Σ_j m_j Σ q_a, up to float order
        let q = checks::quantized(GgmlDType::Q4K, 1, 256, 7);
        let mat = Q4KMatrix::from_qtensor(&q).unwrap();
        let s = &mat.row(0)[0];
        let y = quantize_q8_k(&checks::acts(1, 256));
        let (mut si, mut mi) = (0i64, 0i64);
        for e in 0..256 {
            let (j, l) = (e / 64, e % 64);
            let (sub, nib) = match l < 32 {
                true => (2 * j, s.qs[32 * j + l] & 0xF),
                false => (2 * j + 1, s.qs[32 * j + l - 32] >> 4),
            };
            si += s.sc[sub] as i64 * nib as i64 * y.qs[e] as i64;
            mi += s.mins[sub] as i64 * y.qs[e] as i64;
        }
        let want = y.d as f64 * (s.d as f64 * si as f64 - s.dmin as f64 * mi as f64);
        let got = dot_portable(mat.row(0), &[y]) as f64;
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
}
