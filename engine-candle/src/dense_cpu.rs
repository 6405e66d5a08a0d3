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

    fn dense(&self) -> Option<&DenseRows> {
        Some(self)
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

/// A result buffer the workers of one `matmuls` write disjoint columns of.
struct Out(*mut f32);
// SAFETY: each (weight, column range) is handed to exactly one worker (see `matmuls`).
unsafe impl Sync for Out {}

/// `out_i[r, j] = Σ_c x[r, c] · W_i[j, c]` for `m` rows of `x` (`m × k`) and float weights
/// `W_i` that share `k`: one parallel job over the weights' rows together, two chunks a worker
/// (gemm packs the activations again for each), each chunk's gemm writing its columns of the
/// `m × n_i` result in place.
pub(crate) fn matmuls(ws: &[&DenseRows], x: &[f32], m: usize) -> Vec<Vec<f32>> {
    let Some(k) = ws.first().map(|w| w.k) else {
        return Vec::new();
    };
    assert!(ws.iter().all(|w| w.k == k) && x.len() == m * k);
    let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; m * w.n]).collect();
    let ptrs: Vec<Out> = outs.iter_mut().map(|o| Out(o.as_mut_ptr())).collect();
    // weight i has global rows starts[i]..starts[i + 1]
    let mut starts = vec![0];
    for w in ws {
        starts.push(starts[starts.len() - 1] + w.n);
    }
    let total = starts[ws.len()];
    let rows = total
        .div_ceil(2 * crate::cpu_parallel::current_workers())
        .max((64 << 10) / (m * k).max(1))
        .next_multiple_of(8);
    let mut chunks = vec![(); total.div_ceil(rows)];
    crate::cpu_parallel::par_chunks_mut(&mut chunks, 1, |c, _| {
        let (mut g, end) = (c * rows, ((c + 1) * rows).min(total));
        while g < end {
            let i = starts.partition_point(|&s| s <= g) - 1;
            let (w, j0) = (ws[i], g - starts[i]);
            let count = end.min(starts[i + 1]) - g;
            // dst[r, jj] = out_i[r · n + j0 + jj] = Σ_c x[r, c] · w[j0 + jj, c]: the
            // activations (row stride k) times the weight rows' transpose (column stride k)
            // SAFETY: columns j0..j0 + count of out_i's m rows of n are this chunk's alone
            // (chunks cover disjoint global rows); the weight rows and activations read are
            // in bounds (j0 + count ≤ n, x is m × k); `outs` outlives the job.
            unsafe {
                gemm::gemm(
                    m,
                    count,
                    k,
                    ptrs[i].0.add(j0),
                    1,
                    w.n as isize,
                    false,
                    x.as_ptr(),
                    1,
                    k as isize,
                    w.w.as_ptr().add(j0 * k),
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
            g += count;
        }
    });
    drop(ptrs);
    outs
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    fn weight(n: usize, k: usize, salt: usize) -> (Vec<f32>, DenseRows) {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7 + salt) % 13) as f32 / 13.0 - 0.5)
            .collect();
        let t = Tensor::from_vec(w.clone(), (n, k), &Device::Cpu).unwrap();
        let d = DenseRows::from_qtensor(&QTensor::quantize(&t, GgmlDType::F32).unwrap())
            .unwrap()
            .unwrap();
        (w, d)
    }

    /// Every weight row times every activation row, as a plain sum would give: one weight
    /// and a few rows (one chunk), and three weights over many rows (chunks that cross from
    /// one weight into the next, each writing its columns in place).
    #[test]
    fn rows_times_activations() {
        for (ns, k, m) in [(vec![37], 64, 5), (vec![37, 50, 96], 64, 300)] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 5) % 11) as f32 / 11.0 - 0.5)
                .collect();
            let ws: Vec<_> = ns
                .iter()
                .enumerate()
                .map(|(i, &n)| weight(n, k, i))
                .collect();
            let rows: Vec<&dyn QuantRows> = ws.iter().map(|(_, d)| d as &dyn QuantRows).collect();
            let outs = crate::cpu_quant::quantized_matmuls(&rows, &x, m);
            for ((w, _), (out, &n)) in ws.iter().zip(outs.iter().zip(&ns)) {
                assert_eq!(out.len(), m * n);
                for r in 0..m {
                    for j in 0..n {
                        let want: f32 = (0..k).map(|c| w[j * k + c] * x[r * k + c]).sum();
                        let got = out[r * n + j];
                        assert!((got - want).abs() < 1e-4, "[{r}, {j}]: {got} vs {want}");
                    }
                }
            }
        }
    }
}
