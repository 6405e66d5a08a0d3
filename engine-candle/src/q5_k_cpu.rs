//! A CPU matmul for Q5_K weights (most of a Q5_K_M file) with ggml's arithmetic
//! (`ggml_vec_dot_q5_K_q8_K` on AVX2, bit-identical): activations quantized to Q8_K blocks,
//! per 256-element super-block the exact integer sum `Σ_j sc_j · Σ q_w·q_a` in eight i32
//! lanes scaled once into f32 lanes, and the minimums' `Σ_j m_j · Σ q_a` as one exact integer
//! fused-multiply-added into a scalar sum (GCC contracts ggml's `summs += dmin * i` so).
//!
//! The five-bit values (four low bits in nibbles, the fifth in a bit plane) are unpacked to
//! one byte each at load (256 bytes a super-block for the file's 176) and the six-bit scales
//! and minimums to bytes; each weight row meets four activation rows at once
//! (`kquant_rows.rs`).

use candle_core::quantized::GgmlDType;
use half::f16;

#[cfg(target_arch = "x86_64")]
use crate::cpu_quant::hsum8;
use crate::cpu_quant::{hsum8_portable, BlockQ8K, QK_K};
#[cfg(target_arch = "x86_64")]
use crate::kquant_rows::scaled_sum;
use crate::kquant_rows::{KMatrix, SuperBlock};
use crate::q4_k_cpu::scale_min;

/// A `[n, k]` Q5_K weight matrix.
pub(crate) type Q5KMatrix = KMatrix<Q5KBlock>;

/// One Q5_K super-block, unpacked.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Q5KBlock {
    /// Element `e`'s value (0..31), in element order.
    q: [u8; QK_K],
    /// The eight 32-element sub-blocks' scales and minimums.
    sc: [u8; 8],
    mins: [u8; 8],
    d: f32,
    dmin: f32,
}

impl SuperBlock for Q5KBlock {
    const DTYPE: GgmlDType = GgmlDType::Q5K;
    /// d, dmin (f16), 12 bytes of packed scales and minimums, 32 bytes of fifth bits, 128
    /// bytes of low nibbles.
    const STORED: usize = 176;

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

/// ggml's layout (`dequantize_row_q5_K`): per 64 elements, 32 bytes whose low nibbles are
/// the first 32 and high nibbles the next 32; bit `2j` / `2j + 1` of `qh[l]` is the fifth bit
/// of element `l` of sub-block `2j` / `2j + 1`.
fn unpack(c: &[u8]) -> Q5KBlock {
    let (scales, qh, ql) = (&c[4..16], &c[16..48], &c[48..176]);
    let mut s = Q5KBlock {
        q: [0; QK_K],
        sc: [0; 8],
        mins: [0; 8],
        d: f16::from_le_bytes([c[0], c[1]]).to_f32(),
        dmin: f16::from_le_bytes([c[2], c[3]]).to_f32(),
    };
    for j in 0..8 {
        (s.sc[j], s.mins[j]) = scale_min(j, scales);
    }
    for j in 0..4 {
        for l in 0..32 {
            let byte = ql[32 * j + l];
            let (lo, hi) = ((qh[l] >> (2 * j)) & 1, (qh[l] >> (2 * j + 1)) & 1);
            s.q[64 * j + l] = (byte & 0xF) | (lo << 4);
            s.q[64 * j + 32 + l] = (byte >> 4) | (hi << 4);
        }
    }
    s
}

/// The minimums' exact integer sum: `Σ_j m_j · (bsums[2j] + bsums[2j + 1])`.
fn mins_sum(s: &Q5KBlock, y: &BlockQ8K) -> i32 {
    (0..8)
        .map(|j| s.mins[j] as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32))
        .sum()
}

/// The arithmetic of the AVX2 path, lane by lane.
fn dot_portable(w: &[Q5KBlock], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (s, y) in w.iter().zip(a) {
        let (d, dmin) = (y.d * s.d, -y.d * s.dmin);
        summs = dmin.mul_add(mins_sum(s, y) as f32, summs);
        let mut sumi = [0i32; 8];
        for sub in 0..8 {
            let sc = s.sc[sub] as i32;
            for (l, lane) in sumi.iter_mut().enumerate() {
                for e in 32 * sub + 4 * l..32 * sub + 4 * l + 4 {
                    *lane += sc * s.q[e] as i32 * y.qs[e] as i32;
                }
            }
        }
        for (lane, si) in acc.iter_mut().zip(sumi) {
            *lane = d.mul_add(si as f32, *lane);
        }
    }
    hsum8_portable(acc) + summs
}

/// One weight row against `R` activation rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots_simd<const R: usize, const VNNI: bool>(
    w: &[Q5KBlock],
    a: [&[BlockQ8K]; R],
) -> [f32; R] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); R];
    let mut summs = [0f32; R];
    for (b, s) in w.iter().enumerate() {
        let mut sc = [_mm256_setzero_si256(); 8];
        for (v, &c) in sc.iter_mut().zip(&s.sc) {
            *v = _mm256_set1_epi16(c as i16);
        }
        for r in 0..R {
            let y = &a[r][b];
            let chunk = |i: usize| {
                let qw = _mm256_loadu_si256(s.q.as_ptr().add(32 * i) as *const __m256i);
                (qw, sc[i])
            };
            let sumi = scaled_sum::<VNNI>(chunk, y.qs.as_ptr());
            let d = y.d * s.d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
            let dmin = -y.d * s.dmin;
            summs[r] = dmin.mul_add(mins_sum(s, y) as f32, summs[r]);
        }
    }
    let mut res = [0f32; R];
    for r in 0..R {
        res[r] = hsum8(acc[r]) + summs[r];
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquant_rows::checks;
    use candle_core::Device;

    #[test]
    fn unpacking_gives_the_stored_values() {
        let q = checks::quantized(GgmlDType::Q5K, 3, 512, 5);
        let t = q.dequantize(&Device::Cpu).unwrap();
        let deq: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        let mat = Q5KMatrix::from_qtensor(&q).unwrap();
        for i in 0..6 {
            let s = &mat.row(i / 2)[i % 2];
            for e in 0..QK_K {
                let sub = e / 32;
                let v = s.d * s.sc[sub] as f32 * s.q[e] as f32 - s.dmin * s.mins[sub] as f32;
                let want = deq[i * QK_K + e];
                let close = (v - want).abs() <= 1e-6 * want.abs().max(1.0);
                assert!(close, "block {i} element {e}: {v} vs {want}");
            }
        }
    }

    #[test]
    fn agrees_with_candle_and_the_dequantized_product() {
        checks::agrees_with_candle_and_the_dequantized_product::<Q5KBlock>();
    }

    #[test]
    fn simd_and_portable_paths_agree_exactly_at_any_batch() {
        checks::simd_and_portable_agree_exactly_at_any_batch::<Q5KBlock>();
    }

    #[test]
    fn other_types_are_not_taken() {
        checks::other_types_are_not_taken::<Q5KBlock>();
    }
}
