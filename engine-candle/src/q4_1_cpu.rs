//! A CPU matmul for Q4_1 weights that computes what llama.cpp computes: activations are
//! quantized to Q8_1 blocks (scale and sum rounded to f16), each 32-element block contributes
//! `d_w·d_a·Σ q_w·q_a + m_w·s_a`, accumulated in eight f32 lanes and summed the way ggml's AVX2
//! `ggml_vec_dot_q4_1_q8_1` does. candle's own Q4_1 path is scalar; this one uses AVX-512 VNNI or
//! AVX2 when the CPU has them (detected at run time; bit-identical results) and a portable loop
//! otherwise.

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

#[cfg(target_arch = "x86_64")]
use crate::cpu_quant::{hsum8, pairs_avx2, pairs_vnni};
use crate::cpu_quant::{BlockQ81, QuantRows, Simd, QK};

/// One Q4_1 block as stored in GGUF: scale, minimum, 32 four-bit values.
#[derive(Clone, Copy)]
#[repr(C)]
struct BlockQ41 {
    d: f16,
    m: f16,
    qs: [u8; 16],
}

/// A `[n, k]` Q4_1 weight matrix (n output features).
pub(crate) struct Q41Matrix {
    n: usize,
    k: usize,
    blocks: Vec<BlockQ41>,
    /// `(d, m)` of every block as f32, converted once at load (not once per row per dot).
    scales: Vec<[f32; 2]>,
}

impl Q41Matrix {
    /// Takes the raw blocks of a 2-D Q4_1 tensor; `None` for any other tensor.
    pub fn from_qtensor(q: &QTensor) -> Option<Self> {
        if q.dtype() != GgmlDType::Q4_1 {
            return None;
        }
        let (n, k) = q.shape().dims2().ok()?;
        if k % QK != 0 {
            return None;
        }
        let data = q.data().ok()?;
        let nb = n * k / QK;
        if data.len() != nb * std::mem::size_of::<BlockQ41>() {
            return None;
        }
        let blocks = data
            .chunks_exact(20)
            .map(|c| {
                let mut qs = [0u8; 16];
                qs.copy_from_slice(&c[4..20]);
                BlockQ41 {
                    d: f16::from_le_bytes([c[0], c[1]]),
                    m: f16::from_le_bytes([c[2], c[3]]),
                    qs,
                }
            })
            .collect::<Vec<BlockQ41>>();
        let scales = blocks
            .iter()
            .map(|b| [b.d.to_f32(), b.m.to_f32()])
            .collect();
        Some(Self {
            n,
            k,
            blocks,
            scales,
        })
    }
}

impl QuantRows for Q41Matrix {
    fn n(&self) -> usize {
        self.n
    }

    fn k(&self) -> usize {
        self.k
    }

    fn dot4(&self, j: usize, rows: [&[BlockQ81]; 4], simd: Simd) -> [f32; 4] {
        let nb = self.k / QK;
        let r = j * nb..(j + 1) * nb;
        dot4(&self.blocks[r.clone()], &self.scales[r], rows, simd)
    }

    fn dot(&self, j: usize, row: &[BlockQ81], simd: Simd) -> f32 {
        let nb = self.k / QK;
        let r = j * nb..(j + 1) * nb;
        dot(&self.blocks[r.clone()], &self.scales[r], row, simd)
    }
}

fn dot(w: &[BlockQ41], sc: &[[f32; 2]], a: &[BlockQ81], simd: Simd) -> f32 {
    // SAFETY: each SIMD level is only used when `Simd::detect` found its features; the
    // slices have equal lengths (one weight row and one activation row of `nb` blocks).
    match simd {
        #[cfg(target_arch = "x86_64")]
        Simd::Vnni => unsafe { dot_vnni(w, sc, a) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { dot_avx2(w, sc, a) },
        _ => dot_portable(w, sc, a),
    }
}

/// Four rows at once; each row's arithmetic is exactly that of `dot` (batch-invariant).
fn dot4(w: &[BlockQ41], sc: &[[f32; 2]], a: [&[BlockQ81]; 4], simd: Simd) -> [f32; 4] {
    // SAFETY: as in `dot`.
    match simd {
        #[cfg(target_arch = "x86_64")]
        Simd::Vnni => unsafe { dot4_vnni(w, sc, a) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { dot4_avx2(w, sc, a) },
        _ => a.map(|r| dot_portable(w, sc, r)),
    }
}

/// The same arithmetic as the AVX2 path: eight f32 lanes, then a pairwise horizontal sum.
fn dot_portable(w: &[BlockQ41], sc: &[[f32; 2]], a: &[BlockQ81]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for ((x, [xd, xm]), y) in w.iter().zip(sc).zip(a) {
        summs += xm * y.s;
        let d = xd * y.d;
        // lane l of madd holds elements 4l..4l+3 of the 32 (low nibbles 0-15, high 16-31)
        for (l, lane) in acc.iter_mut().enumerate() {
            let mut s = 0i32;
            for e in 4 * l..4 * l + 4 {
                let q = if e < 16 {
                    x.qs[e] & 0x0F
                } else {
                    x.qs[e - 16] >> 4
                };
                s += q as i32 * y.qs[e] as i32;
            }
            *lane = (s as f32).mul_add(d, *lane);
        }
    }
    let h = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    let h2 = [h[0] + h[2], h[1] + h[3]];
    (h2[0] + h2[1]) + summs
}

/// The SIMD kernels of one instruction level: `$pairs` sums u8×i8 pairs into i32 lanes.
macro_rules! simd_kernels {
    ($feat:literal, $dot:ident, $dot4:ident, $pairs:path) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $dot(w: &[BlockQ41], sc: &[[f32; 2]], a: &[BlockQ81]) -> f32 {
            use std::arch::x86_64::*;
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0f32;
            let low = _mm256_set1_epi8(0x0F);
            for ((x, [xd, xm]), y) in w.iter().zip(sc).zip(a) {
                summs += xm * y.s;
                let d = _mm256_set1_ps(xd * y.d);
                let tmp = _mm_loadu_si128(x.qs.as_ptr() as *const __m128i);
                let qx = _mm256_and_si256(low, _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp));
                let qy = _mm256_load_si256(y.qs.as_ptr() as *const __m256i);
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($pairs(qx, qy)), acc);
            }
            hsum8(acc) + summs
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $dot4(w: &[BlockQ41], sc: &[[f32; 2]], a: [&[BlockQ81]; 4]) -> [f32; 4] {
            use std::arch::x86_64::*;
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut summs = [0f32; 4];
            let low = _mm256_set1_epi8(0x0F);
            for (b, (x, [xd, xm])) in w.iter().zip(sc).enumerate() {
                let tmp = _mm_loadu_si128(x.qs.as_ptr() as *const __m128i);
                let qx = _mm256_and_si256(low, _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp));
                for r in 0..4 {
                    let y = &a[r][b];
                    summs[r] += xm * y.s;
                    let d = _mm256_set1_ps(xd * y.d);
                    let qy = _mm256_load_si256(y.qs.as_ptr() as *const __m256i);
                    acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($pairs(qx, qy)), acc[r]);
                }
            }
            [
                hsum8(acc[0]) + summs[0],
                hsum8(acc[1]) + summs[1],
                hsum8(acc[2]) + summs[2],
                hsum8(acc[3]) + summs[3],
            ]
        }
    };
}

simd_kernels!("avx2,fma", dot_avx2, dot4_avx2, pairs_avx2);
simd_kernels!(
    "avx2,fma,avx512vnni,avx512vl",
    dot_vnni,
    dot4_vnni,
    pairs_vnni
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_quant::matmul_into;
    use crate::cpu_quant::quantize_q8_1;
    use candle_core::{Device, Tensor};

    fn matrix(n: usize, k: usize) -> (QTensor, Vec<f32>) {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, GgmlDType::Q4_1).unwrap();
        let deq = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        (q, deq)
    }

    #[test]
    fn matches_the_dequantized_product_closely() {
        let (n, k, m) = (48, 96, 3);
        let (q, deq) = matrix(n, k);
        let mat = Q41Matrix::from_qtensor(&q).unwrap();
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0)
            .collect();
        let mut out = vec![0f32; m * n];
        matmul_into(&mat, &x, m, &mut out);
        for r in 0..m {
            for j in 0..n {
                let exact: f32 = (0..k).map(|i| x[r * k + i] * deq[j * k + i]).sum();
                // activations are 8-bit: allow their rounding
                assert!(
                    (out[r * n + j] - exact).abs() < 0.05,
                    "{r},{j}: {} vs {exact}",
                    out[r * n + j]
                );
            }
        }
    }

    #[test]
    fn agrees_with_candles_q4_1_kernel() {
        use candle_core::Module;
        let (n, k, m) = (64, 576, 2);
        let (q, _) = matrix(n, k);
        let mat = Q41Matrix::from_qtensor(&q).unwrap();
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i as f32) * 0.731).sin() * 3.0)
            .collect();
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
        // candle rounds the activation block sum as f16(sum)·f16(d), ggml (and we) as
        // f16(d·sum): the results differ by that f16 rounding only
        for (a, b) in out.iter().zip(&theirs) {
            assert!((a - b).abs() <= 5e-3 * b.abs().max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn simd_and_portable_paths_agree_exactly() {
        let (q, _) = matrix(8, 64);
        let mat = Q41Matrix::from_qtensor(&q).unwrap();
        let x: Vec<f32> = (0..64).map(|i| (i as f32).sin()).collect();
        let xq: Vec<BlockQ81> = x.chunks_exact(QK).map(quantize_q8_1).collect();
        let best = Simd::detect();
        for (row, sc) in mat.blocks.chunks_exact(2).zip(mat.scales.chunks_exact(2)) {
            let p = dot_portable(row, sc, &xq);
            // every level this CPU has gives the portable loop's bits
            for level in [Simd::Avx2, Simd::Vnni] {
                if level == Simd::Avx2 && best != Simd::Portable || level == best {
                    assert_eq!(p.to_bits(), dot(row, sc, &xq, level).to_bits(), "{level:?}");
                    let four = dot4(row, sc, [&xq, &xq, &xq, &xq], level);
                    assert!(four.iter().all(|f| f.to_bits() == p.to_bits()), "{level:?}");
                }
            }
        }
    }

    #[test]
    fn batched_rows_equal_single_rows() {
        let (q, _) = matrix(40, 64);
        let mat = Q41Matrix::from_qtensor(&q).unwrap();
        let x: Vec<f32> = (0..7 * 64).map(|i| (i as f32 * 0.37).cos()).collect();
        let mut all = vec![0f32; 7 * 40];
        matmul_into(&mat, &x, 7, &mut all);
        for r in 0..7 {
            let mut one = vec![0f32; 40];
            matmul_into(&mat, &x[r * 64..(r + 1) * 64], 1, &mut one);
            assert_eq!(one, all[r * 40..(r + 1) * 40]);
        }
    }

    #[test]
    fn weights_multiplied_together_equal_each_alone() {
        use crate::cpu_quant::quantized_matmuls;
        let a = Q41Matrix::from_qtensor(&matrix(40, 64).0).unwrap();
        // different values from a's rows, so a row taken from the wrong weight shows
        let w: Vec<f32> = (0..24 * 64).map(|i| (i as f32 * 0.05).cos()).collect();
        let t = Tensor::from_vec(w, (24, 64), &Device::Cpu).unwrap();
        let b = Q41Matrix::from_qtensor(&QTensor::quantize(&t, GgmlDType::Q4_1).unwrap()).unwrap();
        let x: Vec<f32> = (0..5 * 64).map(|i| (i as f32 * 0.21).sin()).collect();
        let both = quantized_matmuls(&[&a, &b], &x, 5);
        assert_eq!(both[0], quantized_matmuls(&[&a], &x, 5)[0]);
        assert_eq!(both[1], quantized_matmuls(&[&b], &x, 5)[0]);
    }
}
