//! Float weights (f32, and f16 / bf16 widened to f32 once) on the CPU: gemm's f32 kernel on
//! chunks of weight rows, spread over the process's compute pool like the quantized kernels.
//!
//! candle's own matmul runs gemm on rayon while its elementwise ops run on the compute pool,
//! whose workers spin for a while after each job: an encoder pass alternated the two and the
//! spinning worker held the core the second rayon thread needed (measured on 2 cores:
//! all-MiniLM-L6-v2 F16 at 28 inputs/s, the pool's worker 37 % of the samples spinning).
//! One pool for both keeps every core on the work.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use crate::cpu_quant::{ActBlocks, Acts, QuantRows, Simd};

/// A float `[n, k]` weight, row-major f32.
pub(crate) struct DenseRows {
    w: Vec<f32>,
    n: usize,
    k: usize,
}

impl DenseRows {
    /// The weight widened to f32, when it is stored as floats.
    pub fn from_qtensor(q: &QTensor) -> candle_core::Result<Option<Self>> {
        if !matches!(q.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
            return Ok(None);
        }
        let (n, k) = q.shape().dims2()?;
        let w = q
            .dequantize(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(Some(Self { w, n, k }))
    }
}

impl QuantRows for DenseRows {
    fn n(&self) -> usize {
        self.n
    }

    fn k(&self) -> usize {
        self.k
    }

    fn act_blocks(&self) -> ActBlocks {
        ActBlocks::F32
    }

    fn rows_into(&self, j0: usize, count: usize, a: Acts<'_>, _simd: Simd, out: &mut [f32]) {
        let (k, m) = (self.k, a.m);
        assert!(
            j0 + count <= self.n && out.len() == count * m && a.xf.len() == m * k,
            "dense rows {j0}+{count} of {}, {m} activation rows",
            self.n
        );
        let w = &self.w[j0 * k..(j0 + count) * k];
        // out[jj · m + r] = Σ_c w[jj, c] · x[r, c]: the weight rows (row stride k) times the
        // activations' transpose (x[r, c] at r · k + c: row stride 1, column stride k)
        // SAFETY: the pointers cover count × k, m × k and count × m elements with the strides
        // given, checked above; gemm reads and writes nothing else.
        unsafe {
            gemm::gemm(
                count,
                m,
                k,
                out.as_mut_ptr(),
                1,
                m as isize,
                false,
                w.as_ptr(),
                1,
                k as isize,
                a.xf.as_ptr(),
                k as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_quant::matmul_into;
    use candle_core::Tensor;

    /// Every weight row times every activation row, as a plain sum would give.
    #[test]
    fn rows_times_activations() {
        let (n, k, m) = (37, 64, 5);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7) % 13) as f32 / 13.0 - 0.5)
            .collect();
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 5) % 11) as f32 / 11.0 - 0.5)
            .collect();
        let t = Tensor::from_vec(w.clone(), (n, k), &Device::Cpu).unwrap();
        let d = DenseRows::from_qtensor(&QTensor::quantize(&t, GgmlDType::F32).unwrap())
            .unwrap()
            .unwrap();
        let mut out = vec![0f32; m * n];
        matmul_into(&d, &x, m, &mut out);
        for r in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|c| w[j * k + c] * x[r * k + c]).sum();
                let got = out[r * n + j];
                assert!((got - want).abs() < 1e-4, "[{r}, {j}]: {got} vs {want}");
            }
        }
    }
}
