//! A CPU matmul for Q8_0 weights with ggml's arithmetic (`ggml_vec_dot_q8_0_q8_0`, AVX2 or
//! AVX-512 VNNI, bit-identical):
//! activations quantized to Q8 blocks, per block `fp16(d_w)·fp16(d_a)·Σ q_w·q_a` accumulated
//! in eight f32 lanes. Used for the output projection (the tied Q8_0 embedding of SmolLM2),
//! where it also lets four batched rows share each weight block.

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

#[cfg(target_arch = "x86_64")]
use crate::cpu_quant::{hsum8, pairs_avx2, pairs_vnni};
use crate::cpu_quant::{hsum8_portable, rows_by_dots, Acts, BlockQ81, QuantRows, Simd, QK};

/// A `[n, k]` Q8_0 weight matrix.
pub(crate) struct Q80Matrix {
    n: usize,
    k: usize,
    qs: Vec<[i8; 32]>,
    d: Vec<f32>,
}

impl Q80Matrix {
    /// Takes the raw blocks of a 2-D Q8_0 tensor, or of a Q4_0 / Q5_0 one — whose values are
    /// whole multiples of their block's scale (−8..7 and −16..15 of it), so they are Q8_0
    /// blocks exactly, and their products with Q8_0-quantized activations are llama.cpp's
    /// (the integer sums are exact either way). `None` for any other tensor.
    pub fn from_qtensor(q: &QTensor) -> Option<Self> {
        let block = match q.dtype() {
            GgmlDType::Q8_0 => 34,
            GgmlDType::Q4_0 => 18,
            GgmlDType::Q5_0 => 22,
            _ => return None,
        };
        let (n, k) = q.shape().dims2().ok()?;
        if k % QK != 0 {
            return None;
        }
        let data = q.data().ok()?;
        if data.len() != n * k / QK * block {
            return None;
        }
        let mut qs = Vec::with_capacity(n * k / QK);
        let mut d = Vec::with_capacity(n * k / QK);
        for c in data.chunks_exact(block) {
            d.push(f16::from_le_bytes([c[0], c[1]]).to_f32());
            let mut b = [0i8; 32];
            match q.dtype() {
                GgmlDType::Q4_0 => {
                    for (j, v) in c[2..18].iter().enumerate() {
                        b[j] = (v & 0x0f) as i8 - 8;
                        b[j + 16] = (v >> 4) as i8 - 8;
                    }
                }
                GgmlDType::Q5_0 => {
                    let qh = u32::from_le_bytes([c[2], c[3], c[4], c[5]]);
                    for (j, v) in c[6..22].iter().enumerate() {
                        let lo = (v & 0x0f) | (((qh >> j) & 1) << 4) as u8;
                        let hi = (v >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
                        b[j] = lo as i8 - 16;
                        b[j + 16] = hi as i8 - 16;
                    }
                }
                _ => {
                    for (o, v) in b.iter_mut().zip(&c[2..]) {
                        *o = *v as i8;
                    }
                }
            }
            qs.push(b);
        }
        Some(Self { n, k, qs, d })
    }
}

impl QuantRows for Q80Matrix {
    fn n(&self) -> usize {
        self.n
    }

    fn k(&self) -> usize {
        self.k
    }

    fn rows_into(&self, j0: usize, count: usize, a: Acts<'_>, simd: Simd, out: &mut [f32]) {
        let nb = self.k / QK;
        let r = |j: usize| j * nb..(j + 1) * nb;
        rows_by_dots(
            j0,
            count,
            a.m,
            |r| a.row(r),
            simd,
            out,
            |j, rows| dot4(&self.qs[r(j)], &self.d[r(j)], rows, simd),
            |j, row| dot(&self.qs[r(j)], &self.d[r(j)], row, simd),
        );
    }
}

fn dot(w: &[[i8; 32]], d: &[f32], a: &[BlockQ81], simd: Simd) -> f32 {
    // SAFETY: each SIMD level is only used when `Simd::detect` found its features; equal
    // lengths (one weight row, one activation row).
    match simd {
        #[cfg(target_arch = "x86_64")]
        Simd::Vnni => unsafe { dot_vnni(w, d, a) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { dot_avx2(w, d, a) },
        _ => dot_portable(w, d, a),
    }
}

fn dot4(w: &[[i8; 32]], d: &[f32], a: [&[BlockQ81]; 4], simd: Simd) -> [f32; 4] {
    // SAFETY: as in `dot`.
    match simd {
        #[cfg(target_arch = "x86_64")]
        Simd::Vnni => unsafe { dot4_vnni(w, d, a) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { dot4_avx2(w, d, a) },
        _ => a.map(|r| dot_portable(w, d, r)),
    }
}

/// Eight f32 lanes and ggml's pairwise horizontal sum, as the AVX2 path.
fn dot_portable(w: &[[i8; 32]], d: &[f32], a: &[BlockQ81]) -> f32 {
    let mut acc = [0f32; 8];
    for ((qw, dw), y) in w.iter().zip(d).zip(a) {
        let scale = dw * y.d;
        for (l, lane) in acc.iter_mut().enumerate() {
            let s: i32 = (4 * l..4 * l + 4)
                .map(|e| qw[e] as i32 * y.qs[e] as i32)
                .sum();
            *lane = (s as f32).mul_add(scale, *lane);
        }
    }
    hsum8_portable(acc)
}

/// The SIMD kernels of one instruction level: `$pairs` sums u8×i8 pairs into i32 lanes; the
/// signed weights are made unsigned (`|x|`) and their signs moved onto the activations.
macro_rules! simd_kernels {
    ($feat:literal, $dot:ident, $dot4:ident, $pairs:path) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $dot(w: &[[i8; 32]], d: &[f32], a: &[BlockQ81]) -> f32 {
            use std::arch::x86_64::*;
            let mut acc = _mm256_setzero_ps();
            for ((qw, dw), y) in w.iter().zip(d).zip(a) {
                let x = _mm256_loadu_si256(qw.as_ptr() as *const __m256i);
                let ax = _mm256_sign_epi8(x, x);
                let qy = _mm256_load_si256(y.qs.as_ptr() as *const __m256i);
                let sy = _mm256_sign_epi8(qy, x);
                let prod = $pairs(ax, sy);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), _mm256_cvtepi32_ps(prod), acc);
            }
            hsum8(acc)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $dot4(w: &[[i8; 32]], d: &[f32], a: [&[BlockQ81]; 4]) -> [f32; 4] {
            use std::arch::x86_64::*;
            let mut acc = [_mm256_setzero_ps(); 4];
            for (b, (qw, dw)) in w.iter().zip(d).enumerate() {
                let x = _mm256_loadu_si256(qw.as_ptr() as *const __m256i);
                let ax = _mm256_sign_epi8(x, x);
                for r in 0..4 {
                    let y = &a[r][b];
                    let qy = _mm256_load_si256(y.qs.as_ptr() as *const __m256i);
                    let sy = _mm256_sign_epi8(qy, x);
                    let prod = $pairs(ax, sy);
                    let scale = _mm256_set1_ps(dw * y.d);
                    acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(prod), acc[r]);
                }
            }
            [hsum8(acc[0]), hsum8(acc[1]), hsum8(acc[2]), hsum8(acc[3])]
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
    use candle_core::{Device, Module, Tensor};

    fn matrix(n: usize, k: usize) -> QTensor {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        QTensor::quantize(&t, GgmlDType::Q8_0).unwrap()
    }

    #[test]
    fn agrees_with_candles_q8_0_kernel_and_is_batch_invariant() {
        let (n, k, m) = (40, 576, 6);
        let q = matrix(n, k);
        let mat = Q80Matrix::from_qtensor(&q).unwrap();
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i as f32) * 0.731).sin() * 3.0)
            .collect();
        let mut out = vec![0f32; m * n];
        matmul_into(&mat, &x, m, &mut out);
        let qm = candle_core::quantized::QMatMul::from_qtensor(q).unwrap();
        let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
        let theirs: Vec<f32> = qm
            .forward(&xt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for (a, b) in out.iter().zip(&theirs) {
            assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0), "{a} vs {b}");
        }
        for r in 0..m {
            let mut one = vec![0f32; n];
            matmul_into(&mat, &x[r * k..(r + 1) * k], 1, &mut one);
            assert_eq!(one, out[r * n..(r + 1) * n]);
        }
    }

    #[test]
    fn simd_and_portable_paths_agree_exactly() {
        let q = matrix(4, 64);
        let mat = Q80Matrix::from_qtensor(&q).unwrap();
        let x: Vec<f32> = (0..64).map(|i| (i as f32).cos()).collect();
        let xq: Vec<BlockQ81> = x.chunks_exact(QK).map(quantize_q8_1).collect();
        for j in 0..4 {
            let w = &mat.qs[j * 2..j * 2 + 2];
            let d = &mat.d[j * 2..j * 2 + 2];
            let p = dot_portable(w, d, &xq);
            let best = Simd::detect();
            for level in [Simd::Avx2, Simd::Vnni] {
                if level == Simd::Avx2 && best != Simd::Portable || level == best {
                    assert_eq!(p.to_bits(), dot(w, d, &xq, level).to_bits(), "{level:?}");
                    let four = dot4(w, d, [&xq, &xq, &xq, &xq], level);
                    assert!(four.iter().all(|f| f.to_bits() == p.to_bits()), "{level:?}");
                }
            }
        }
    }

    /// ENG-KQ-2: Q4_0 and Q5_0 blocks become Q8_0 blocks without changing a value.
    #[test]
    fn q4_0_and_q5_0_are_taken_exactly() {
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q5_0] {
            let (n, k) = (6, 96);
            let w: Vec<f32> = (0..n * k).map(|i| ((i as f32) * 0.37).sin()).collect();
            let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&t, dtype).unwrap();
            let want: Vec<f32> = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let mat = Q80Matrix::from_qtensor(&q).unwrap();
            let got: Vec<f32> = mat
                .qs
                .iter()
                .zip(&mat.d)
                .flat_map(|(b, d)| b.iter().map(move |v| f32::from(*v) * d))
                .collect();
            assert_eq!(got, want, "{dtype:?}");
        }
    }
}
