//! A CPU matmul for Q5_K weights (most of a Q5_K_M file) with ggml's arithmetic
//! (`ggml_vec_dot_q5_K_q8_K` on AVX2, bit-identical): activations quantized to Q8_K blocks,
//! per 256-element super-block the exact integer sum `Σ_j sc_j · Σ q_w·q_a` in eight i32
//! lanes scaled once into f32 lanes, and the minimums' `Σ_j m_j · Σ q_a` as one exact integer
//! fused-multiply-added into a scalar sum (GCC contracts ggml's `summs += dmin * i` so).
//!
//! The five-bit values (four low bits in nibbles, the fifth in a bit plane) are unpacked to
//! one byte each at load (256 bytes a super-block for the file's 176) and the six-bit scales
//! and minimums to bytes; each weight row meets four activation rows at once
//! ([`rows_by_dots`]).

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

#[cfg(target_arch = "x86_64")]
use crate::cpu_quant::hsum8;
use crate::cpu_quant::{
    hsum8_portable, rows_by_dots, ActBlocks, Acts, BlockQ8K, QuantRows, Simd, QK_K,
};
use crate::q4_k_cpu::scale_min;

/// Bytes of one stored Q5_K super-block: d, dmin (f16), 12 bytes of packed scales and
/// minimums, 32 bytes of fifth bits, 128 bytes of low nibbles.
const STORED: usize = 176;

/// One Q5_K super-block, unpacked.
#[derive(Clone, Copy)]
#[repr(C)]
struct Super {
    /// Element `e`'s value (0..31), in element order.
    q: [u8; QK_K],
    /// The eight 32-element sub-blocks' scales and minimums.
    sc: [u8; 8],
    mins: [u8; 8],
    d: f32,
    dmin: f32,
}

/// A `[n, k]` Q5_K weight matrix.
pub(crate) struct Q5KMatrix {
    n: usize,
    k: usize,
    /// `blocks[j · k / 256 + b]`: super-block `b` of row `j`.
    blocks: Vec<Super>,
}

/// ggml's layout (`dequantize_row_q5_K`): per 64 elements, 32 bytes whose low nibbles are
/// the first 32 and high nibbles the next 32; bit `2j` / `2j + 1` of `qh[l]` is the fifth bit
/// of element `l` of sub-block `2j` / `2j + 1`.
fn unpack(c: &[u8]) -> Super {
    let (scales, qh, ql) = (&c[4..16], &c[16..48], &c[48..176]);
    let mut s = Super {
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

impl Q5KMatrix {
    /// Takes the raw blocks of a 2-D Q5_K tensor; `None` for any other tensor.
    pub fn from_qtensor(q: &QTensor) -> Option<Self> {
        if q.dtype() != GgmlDType::Q5K {
            return None;
        }
        let (n, k) = q.shape().dims2().ok()?;
        let data = q.data().ok()?;
        if k % QK_K != 0 || data.len() != n * k / QK_K * STORED {
            return None;
        }
        let blocks = data.chunks_exact(STORED).map(unpack).collect();
        Some(Self { n, k, blocks })
    }

    fn row(&self, j: usize) -> &[Super] {
        let nb = self.k / QK_K;
        &self.blocks[j * nb..(j + 1) * nb]
    }
}

impl QuantRows for Q5KMatrix {
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

/// The minimums' exact integer sum: `Σ_j m_j · (bsums[2j] + bsums[2j + 1])`.
fn mins_sum(s: &Super, y: &BlockQ8K) -> i32 {
    (0..8)
        .map(|j| s.mins[j] as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32))
        .sum()
}

/// The arithmetic of the AVX2 path, lane by lane.
fn dot_portable(w: &[Super], a: &[BlockQ8K]) -> f32 {
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
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<const R: usize>(a: [&[BlockQ8K]; R], w: &[Super]) -> [f32; R] {
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
            let mut sumi = _mm256_setzero_si256();
            for (i, si) in sc.iter().enumerate() {
                let qw = _mm256_loadu_si256(s.q.as_ptr().add(32 * i) as *const __m256i);
                let qy = _mm256_load_si256(y.qs.as_ptr().add(32 * i) as *const __m256i);
                let p = _mm256_madd_epi16(*si, _mm256_maddubs_epi16(qw, qy));
                sumi = _mm256_add_epi32(sumi, p);
            }
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
    use crate::cpu_quant::{matmul_into, quantize_q8_k};
    use candle_core::{Device, Module, Tensor};

    fn matrix(n: usize, k: usize, seed: usize) -> QTensor {
        let w: Vec<f32> = (0..n * k)
            .map(|i| (((i + seed) * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        QTensor::quantize(&t, GgmlDType::Q5K).unwrap()
    }

    fn acts(m: usize, k: usize) -> Vec<f32> {
        (0..m * k).map(|i| (i as f32 * 0.731).sin() * 3.0).collect()
    }

    #[test]
    fn unpacking_gives_the_stored_values() {
        let q = matrix(3, 512, 5);
        let t = q.dequantize(&Device::Cpu).unwrap();
        let deq: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        let mat = Q5KMatrix::from_qtensor(&q).unwrap();
        for (i, s) in mat.blocks.iter().enumerate() {
            for e in 0..QK_K {
                let sub = e / 32;
                let v = s.d * s.sc[sub] as f32 * s.q[e] as f32 - s.dmin * s.mins[sub] as f32;
                let want = deq[i * QK_K + e];
                assert!(
                    (v - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "block {i} element {e}: {v} vs {want}"
                );
            }
        }
    }

    #[test]
    fn agrees_with_candles_q5_k_kernel() {
        let (n, k, m) = (40, 768, 5);
        let q = matrix(n, k, 3);
        let mat = Q5KMatrix::from_qtensor(&q).unwrap();
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
        for (a, b) in out.iter().zip(&theirs) {
            assert!((a - b).abs() <= 2e-2 * b.abs().max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn simd_and_portable_paths_agree_exactly_at_any_batch() {
        let (n, k) = (12, 512);
        let mat = Q5KMatrix::from_qtensor(&matrix(n, k, 1)).unwrap();
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
}
