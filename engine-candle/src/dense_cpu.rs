//! Float weights (f32, and f16 / bf16 widened to f32 once) on the CPU: gemm's f32 kernel on
//! chunks of weight rows, spread over the process's compute pool like the quantized kernels.
//!
//! candle's own matmul runs gemm on rayon while its elementwise ops run on the compute pool,
//! whose workers spin for a while after each job: an encoder pass alternated the two and the
//! spinning worker held the core the second rayon thread needed (measured on 2 cores:
//! all-MiniLM-L6-v2 F16 at 28 inputs/s, the pool's worker 37 % of the samples spinning).
//! One pool for both keeps every core on the work.
//!
//! The weight is kept column by column (`W[j, c]` at `c · n + j`) and is gemm's left operand:
//! its rows run down gemm's long register tile (64 rows with AVX-512) and the activations'
//! rows across its short one (6), so a pass of a few tokens (one short query) fills its tiles,
//! and gemm reads the weight where it lies, with no packed copy. With the activations on the
//! long side, a 10-token pass used a sixth of each tile (a short query's pass took 3.5 ms).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use crate::cpu_quant::{ActBlocks, Acts, QuantRows, ResultRows, Simd};

/// A float `[n, k]` weight, f32, column-major: `W[j, c]` at `cols[c · n + j]`.
pub(crate) struct DenseRows {
    cols: Vec<f32>,
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
        let cols = q
            .dequantize(&Device::Cpu)?
            .t()?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(Some(Self { cols, n, k }))
    }

    /// `dst[jj, r] = Σ_c W[j0 + jj, c] · x[r, c]` for the weight rows `j0..j0 + count` and
    /// the `m` activation rows of `x` (`m × k`); `dst[jj, r]` at `dst + jj · dst_rs + r ·
    /// dst_cs`.
    ///
    /// # Safety
    /// `dst` must be valid for writes at every such offset, and no other thread may touch
    /// them meanwhile; `j0 + count ≤ n` and `x.len() == m · k` are checked.
    unsafe fn rows_times(
        &self,
        rows: std::ops::Range<usize>,
        x: &[f32],
        m: usize,
        dst: *mut f32,
        dst_rs: isize,
        dst_cs: isize,
    ) {
        let (n, k) = (self.n, self.k);
        let (j0, count) = (rows.start, rows.len());
        assert!(
            j0 + count <= n && x.len() == m * k,
            "dense rows {j0}+{count} of {n}, {m} activation rows"
        );
        // lhs: W's rows j0.. (row stride 1, column stride n, as stored); rhs: xᵀ (x[r, c]
        // at r · k + c: row stride 1, column stride k)
        // SAFETY: lhs covers cols[j0 + jj + c · n] for jj < count, c < k (in bounds: j0 +
        // count ≤ n); rhs covers x; dst as the caller promised.
        unsafe {
            gemm::gemm(
                count,
                m,
                k,
                dst,
                dst_cs,
                dst_rs,
                false,
                self.cols.as_ptr().add(j0),
                n as isize,
                1,
                x.as_ptr(),
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

    fn rows_into(
        &self,
        j0: usize,
        count: usize,
        a: Acts<'_>,
        _simd: Simd,
        out: &mut ResultRows<'_>,
    ) {
        let m = a.m;
        assert!(
            out.count() == count && out.m() == m,
            "dense rows {j0}+{count}: {} results for {m} rows",
            out.count()
        );
        // only a float weight among quantized ones comes here (the rest go through
        // `matmuls`): its columns computed together, then put in place
        let mut part = vec![0f32; count * m];
        // part[jj · m + r]: row stride m, column stride 1
        // SAFETY: part holds count × m elements, all ours (a unique borrow).
        unsafe { self.rows_times(j0..j0 + count, a.xf, m, part.as_mut_ptr(), m as isize, 1) };
        for (jj, col) in part.chunks_exact(m.max(1)).enumerate() {
            for (r, &v) in col.iter().enumerate() {
                out.put(r, jj, v);
            }
        }
    }
}

/// A result buffer the workers of one `matmuls` write disjoint columns of.
struct Out(*mut f32);
// SAFETY: each (weight, column range) is handed to exactly one worker (see `matmuls`).
unsafe impl Sync for Out {}

/// `out_i[r, j] = Σ_c x[r, c] · W_i[j, c]` for `m` rows of `x` (`m × k`) and float weights
/// `W_i` that share `k`: one parallel job over the weights' rows together, two chunks a worker
/// (gemm packs the activations again for each), whole register tiles of weight rows, each
/// chunk's gemm writing its columns of the `m × n_i` result in place.
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
        .next_multiple_of(64);
    let mut chunks = vec![(); total.div_ceil(rows)];
    crate::cpu_parallel::par_chunks_mut(&mut chunks, 1, |c, _| {
        let (mut g, end) = (c * rows, ((c + 1) * rows).min(total));
        while g < end {
            let i = starts.partition_point(|&s| s <= g) - 1;
            let (w, j0) = (ws[i], g - starts[i]);
            let count = end.min(starts[i + 1]) - g;
            // out_i[r · n + j0 + jj]: row stride (of jj) 1, column stride (of r) n
            // SAFETY: columns j0..j0 + count of out_i's m rows of n are this chunk's alone
            // (chunks cover disjoint global rows); `outs` outlives the job.
            unsafe { w.rows_times(j0..j0 + count, x, m, ptrs[i].0.add(j0), 1, w.n as isize) };
            g += count;
        }
    });
    drop(ptrs);
    outs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result_rows::RowStart;
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
            // biases added to the first and last weights: the bits of adding them after
            let biases: Vec<Vec<f32>> = ns
                .iter()
                .map(|&n| (0..n).map(|j| j as f32 * 0.01 - 0.2).collect())
                .collect();
            let given: Vec<Option<&[f32]>> = (0..ns.len())
                .map(|i| (i == 0 || i + 1 == ns.len()).then_some(biases[i].as_slice()))
                .collect();
            let biased = crate::cpu_quant::quantized_affine(&rows, &given, &x, m);
            for (i, (out, b)) in outs.iter().zip(&biased).enumerate() {
                let n = ns[i];
                let want: Vec<f32> = match given[i] {
                    Some(bias) => out
                        .chunks(n)
                        .flat_map(|row| row.iter().zip(bias).map(|(y, b)| y + b))
                        .collect(),
                    None => out.clone(),
                };
                assert_eq!(b, &want, "weight {i}");
            }
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
            // one weight's rows 3..20 alone, as the mixed (float and quantized) path asks:
            // each activation row's columns, the same values
            let (w, d) = &ws[0];
            let mut part: Vec<Vec<f32>> = (0..m).map(|_| Vec::with_capacity(17)).collect();
            let starts: Vec<RowStart> = part.iter_mut().map(|v| RowStart::spare(v, 0)).collect();
            let acts = Acts {
                xq: &[],
                xk: &[],
                xf: &x,
                m,
            };
            // SAFETY: columns 0..17 of rows with room for 17, nothing else touching them.
            let mut out = unsafe { ResultRows::new(&starts, 0, 17) };
            d.rows_into(3, 17, acts, Simd::current(), &mut out);
            for v in &mut part {
                // SAFETY: rows_into wrote the 17 columns of every row.
                unsafe { v.set_len(17) };
            }
            for jj in 0..17 {
                for r in 0..m {
                    let want: f32 = (0..k).map(|c| w[(3 + jj) * k + c] * x[r * k + c]).sum();
                    let got = part[r][jj];
                    assert!(
                        (got - want).abs() < 1e-4,
                        "rows_into [{jj}, {r}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}
