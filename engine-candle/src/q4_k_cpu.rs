//! A CPU matmul for Q4_K weights (most of a Q4_K_M file) with ggml's arithmetic
//! (`ggml_vec_dot_q4_K_q8_K` on AVX2, bit-identical): activations quantized to Q8_K blocks,
//! per 256-element super-block the exact integer sums `Σ_j sc_j · Σ q_w·q_a` (eight i32
//! lanes) and `Σ_j m_j · Σ q_a` (four lanes), scaled once per super-block into f32 lanes.
//!
//! candle's kernel computes the same sums one weight row against one activation row, and its
//! CPU matmul visits the activation rows one by one, so a prompt pass re-reads and re-unpacks
//! every weight row once per token. Here the six-bit scales and minimums are unpacked at load,
//! and each weight super-block is unpacked once for four activation rows
//! ([`rows_by_dots`]), on the parallel row loop every own kernel shares.

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

#[cfg(target_arch = "x86_64")]
use crate::cpu_quant::hsum8;
use crate::cpu_quant::{
    hsum8_portable, rows_by_dots, ActBlocks, Acts, BlockQ8K, QuantRows, Simd, QK_K,
};

/// Bytes of one stored Q4_K super-block: d, dmin (f16), 12 bytes of packed scales and
/// minimums, 128 bytes of 4-bit values.
const STORED: usize = 144;

/// One Q4_K super-block, scales unpacked.
#[derive(Clone, Copy)]
#[repr(C)]
struct Super {
    /// As stored: bytes `32j..32j + 32` hold elements `64j..64j + 32` in their low nibbles
    /// and `64j + 32..64j + 64` in their high nibbles.
    qs: [u8; 128],
    /// The eight 32-element sub-blocks' scales and minimums (6 bits each).
    sc: [u8; 8],
    mins: [u8; 8],
    d: f32,
    dmin: f32,
}

/// A `[n, k]` Q4_K weight matrix.
pub(crate) struct Q4KMatrix {
    n: usize,
    k: usize,
    /// `blocks[j · k / 256 + b]`: super-block `b` of row `j`.
    blocks: Vec<Super>,
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

impl Q4KMatrix {
    /// Takes the raw blocks of a 2-D Q4_K tensor; `None` for any other tensor.
    pub fn from_qtensor(q: &QTensor) -> Option<Self> {
        if q.dtype() != GgmlDType::Q4K {
            return None;
        }
        let (n, k) = q.shape().dims2().ok()?;
        let data = q.data().ok()?;
        if k % QK_K != 0 || data.len() != n * k / QK_K * STORED {
            return None;
        }
        let blocks = data
            .chunks_exact(STORED)
            .map(|c| {
                let mut s = Super {
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
            })
            .collect();
        Some(Self { n, k, blocks })
    }

    fn row(&self, j: usize) -> &[Super] {
        let nb = self.k / QK_K;
        &self.blocks[j * nb..(j + 1) * nb]
    }
}

impl QuantRows for Q4KMatrix {
    fn n(&self) -> usize {
        self.n
    }

    fn k(&self) -> usize {
        self.k
    }

    fn act_blocks(&self) -> ActBlocks {
        ActBlocks::Q8K
    }

    fn rows_into(&self, j0: usize, count: usize, a: Acts<'_>, simd: Simd, out: &mut [f32]) {
        rows_by_dots(
            j0,
            count,
            a.m,
            |r| a.row_k(r),
            simd,
            out,
            |j, rows| dot4(self.row(j), rows, simd),
            |j, row| dot(self.row(j), row, simd),
        );
    }
}

fn dot(w: &[Super], a: &[BlockQ8K], simd: Simd) -> f32 {
    match simd {
        // SAFETY: AVX2 and FMA were detected (every level above portable has them); one
        // weight row and one activation row of equal length.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 | Simd::Vnni => unsafe { dots_avx2([a], w)[0] },
        _ => dot_portable(w, a),
    }
}

fn dot4(w: &[Super], a: [&[BlockQ8K]; 4], simd: Simd) -> [f32; 4] {
    match simd {
        // SAFETY: as in `dot`.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 | Simd::Vnni => unsafe { dots_avx2(a, w) },
        _ => a.map(|r| dot_portable(w, r)),
    }
}

/// The arithmetic of the AVX2 path, lane by lane.
fn dot_portable(w: &[Super], a: &[BlockQ8K]) -> f32 {
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
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<const R: usize>(a: [&[BlockQ8K]; R], w: &[Super]) -> [f32; R] {
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
            let mut sumi = _mm256_setzero_si256();
            for (i, (qi, si)) in q.iter().zip(&sc).enumerate() {
                let qy = _mm256_load_si256(y.qs.as_ptr().add(32 * i) as *const __m256i);
                let p = _mm256_madd_epi16(*si, _mm256_maddubs_epi16(*qi, qy));
                sumi = _mm256_add_epi32(sumi, p);
            }
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
    use crate::cpu_quant::{matmul_into, quantize_q8_k};
    use candle_core::{Device, Module, Tensor};

    fn matrix(n: usize, k: usize, seed: usize) -> QTensor {
        let w: Vec<f32> = (0..n * k)
            .map(|i| (((i + seed) * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        QTensor::quantize(&t, GgmlDType::Q4K).unwrap()
    }

    fn acts(m: usize, k: usize) -> Vec<f32> {
        (0..m * k).map(|i| (i as f32 * 0.731).sin() * 3.0).collect()
    }

    #[test]
    fn matches_the_dequantized_product_closely() {
        let (n, k, m) = (24, 512, 3);
        let q = matrix(n, k, 0);
        let deq: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let mat = Q4KMatrix::from_qtensor(&q).unwrap();
        let x = acts(m, k);
        let mut out = vec![0f32; m * n];
        matmul_into(&mat, &x, m, &mut out);
        for r in 0..m {
            for j in 0..n {
                let exact: f32 = (0..k).map(|i| x[r * k + i] * deq[j * k + i]).sum();
                // activations are 8-bit: allow their rounding
                let err = (out[r * n + j] - exact).abs();
                assert!(
                    err < 0.02 * exact.abs().max(4.0),
                    "{r},{j}: {} vs {exact}",
                    out[r * n + j]
                );
            }
        }
    }

    #[test]
    fn agrees_with_candles_q4_k_kernel() {
        let (n, k, m) = (40, 768, 5);
        let q = matrix(n, k, 3);
        let mat = Q4KMatrix::from_qtensor(&q).unwrap();
        let x = acts(m, k);
        let mut out = vec![0f32; m * n];
        matmul_into(&mat, &x, m, &mut out);
        let qm = candle_core::quantized::QMatMul::from_qtensor(q).unwrap();
        let xt = Tensor::from_vec(x, (m, k), &Device::Cpu).unwrap();
        let theirs: Vec<f32> = qm
            .forward(&xt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        // the same integer sums; candle quantizes activations to ±128 where ggml (and we)
        // use ±127, and adds in another order
        for (a, b) in out.iter().zip(&theirs) {
            assert!((a - b).abs() <= 2e-2 * b.abs().max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn simd_and_portable_paths_agree_exactly_at_any_batch() {
        let (n, k) = (12, 512);
        let mat = Q4KMatrix::from_qtensor(&matrix(n, k, 1)).unwrap();
        let x = acts(6, k);
        let xk: Vec<BlockQ8K> = x.chunks_exact(QK_K).map(quantize_q8_k).collect();
        let row = |r: usize| &xk[2 * r..2 * r + 2];
        for j in 0..n {
            for r in 0..6 {
                let p = dot_portable(mat.row(j), row(r));
                for level in [Simd::detect(), Simd::Portable] {
                    assert_eq!(dot(mat.row(j), row(r), level).to_bits(), p.to_bits());
                    let four = dot4(mat.row(j), [row(r), row(0), row(5), row(r)], level);
                    assert_eq!(
                        (four[0].to_bits(), four[3].to_bits()),
                        (p.to_bits(), p.to_bits())
                    );
                }
            }
        }
        let mut all = vec![0f32; 6 * n];
        matmul_into(&mat, &x, 6, &mut all);
        for r in 0..6 {
            let mut one = vec![0f32; n];
            matmul_into(&mat, &x[r * k..(r + 1) * k], 1, &mut one);
            assert_eq!(one, all[r * n..(r + 1) * n]);
        }
    }

    #[test]
    fn the_portable_sum_is_the_scaled_integer_sum() {
        // one super-block: d·d_a·Σ_j sc_j Σ q_w q_a − dmin·d_a·Σ_j m_j Σ q_a, up to float order
        let q = matrix(1, QK_K, 7);
        let mat = Q4KMatrix::from_qtensor(&q).unwrap();
        let s = &mat.row(0)[0];
        let y = quantize_q8_k(&acts(1, QK_K));
        let (mut si, mut mi) = (0i64, 0i64);
        for e in 0..QK_K {
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

    #[test]
    fn other_types_are_not_taken() {
        let t = Tensor::zeros((4, 256), candle_core::DType::F32, &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, GgmlDType::Q6K).unwrap();
        assert!(Q4KMatrix::from_qtensor(&q).is_none());
    }
}
