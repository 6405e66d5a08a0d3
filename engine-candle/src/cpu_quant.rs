//! What the CPU matmul kernels share: Q8 activation blocks quantized exactly as ggml does
//! (Q8_1 blocks of 32 for the 32-element weight formats, Q8_K blocks of 256 for the K-quants),
//! the horizontal sum ggml uses, CPU feature detection, and the parallel row loop.

use crate::cpu_parallel::{current_workers, par_chunks_mut};
pub(crate) use crate::result_rows::ResultRows;
use crate::result_rows::RowStart;

#[cfg(test)]
pub(crate) use crate::act_quant::{quantize_q8_1, quantize_q8_k};
pub(crate) use crate::act_quant::{quantize_rows, BlockQ81, BlockQ8K, QK, QK_K};

/// Which activation blocks a weight format multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActBlocks {
    Q8_1,
    Q8K,
    /// The activations as they are (float weights).
    F32,
}

/// The integer dot-product instructions this CPU offers, best first. Every level computes the
/// same exact i32 pair sums (no saturation is possible with these operand ranges), so results
/// are bit-identical across levels — and equal to llama.cpp's, which picks the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Simd {
    Portable,
    /// `maddubs` + `madd` (AVX2, FMA, F16C).
    Avx2,
    /// `vpdpbusd` on 256-bit vectors (AVX-512 VNNI + VL): one instruction instead of two.
    Vnni,
}

impl Simd {
    /// The level matmuls use, detected once per process (the check reads the environment).
    pub(crate) fn current() -> Self {
        static LEVEL: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *LEVEL.get_or_init(Self::detect)
    }

    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            // F16C widens the tiles' f16 scales (every AVX2 CPU has it)
            if !(std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c"))
            {
                return Self::Portable;
            }
            if std::env::var_os("ORCHD_NO_VNNI").is_none()
                && std::is_x86_feature_detected!("avx512vnni")
                && std::is_x86_feature_detected!("avx512vl")
            {
                return Self::Vnni;
            }
            Self::Avx2
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Self::Portable
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hsum8(acc: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let hi = _mm256_extractf128_ps(acc, 1);
    let mut r = _mm_add_ps(hi, _mm256_castps256_ps128(acc));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// [`hsum8`]'s order of additions on eight lanes held in an array.
pub(crate) fn hsum8_portable(acc: [f32; 8]) -> f32 {
    let h = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// `m` rows of activations quantized to the blocks the weights take, row after row (a
/// format no weight takes is empty).
#[derive(Clone, Copy)]
pub(crate) struct Acts<'a> {
    pub xq: &'a [BlockQ81],
    pub xk: &'a [BlockQ8K],
    /// The activations unquantized, `m × k`.
    pub xf: &'a [f32],
    pub m: usize,
}

impl<'a> Acts<'a> {
    /// Row `r`'s Q8_1 blocks.
    pub fn row(&self, r: usize) -> &'a [BlockQ81] {
        let nb = self.xq.len() / self.m.max(1);
        &self.xq[r * nb..(r + 1) * nb]
    }

    /// Row `r`'s Q8_K blocks.
    pub fn row_k(&self, r: usize) -> &'a [BlockQ8K] {
        let nb = self.xk.len() / self.m.max(1);
        &self.xk[r * nb..(r + 1) * nb]
    }
}

/// A quantized `[n, k]` weight whose rows multiply Q8_1 activation blocks.
pub(crate) trait QuantRows: Sync {
    fn n(&self) -> usize;
    fn k(&self) -> usize;
    /// The activation blocks its rows multiply.
    fn act_blocks(&self) -> ActBlocks {
        ActBlocks::Q8_1
    }
    /// Weight rows `j0..j0 + count` times the `m` activation rows: every element of `out`
    /// written, row `r`'s column `jj` its weight row `j0 + jj`. A result depends only on its
    /// weight row and its activation row, never on `j0`, `count` or `m`.
    fn rows_into(&self, j0: usize, count: usize, a: Acts<'_>, simd: Simd, out: &mut ResultRows<'_>);
    /// The weight as float rows, when it is stored as floats (`quantized_matmuls` then writes
    /// each result in place, with no transposed copy).
    fn dense(&self) -> Option<&crate::dense_cpu::DenseRows> {
        None
    }
}

/// `out_i[r, j] = Σ_c x[r, c] · W_i[j, c]` for `m` rows of `x` (`m × k`) and weights `W_i`
/// that share `k` (say the query, key and value projections): the activations are quantized
/// to Q8_1 once and one parallel job covers the rows of all the weights. Returns each
/// weight's `m × n_i` result. A result does not depend on which weights come together.
pub(crate) fn quantized_matmuls(ws: &[&dyn QuantRows], x: &[f32], m: usize) -> Vec<Vec<f32>> {
    quantized_affine(ws, &[], x, m)
}

/// [`quantized_matmuls`] plus a bias per weight where `biases` has one (`biases[i]`: weight
/// `i`'s `n` values, added to every row; a short `biases` leaves the rest without), added
/// as each result is written — the bits of adding it after (one f32 addition either way),
/// without another pass over the result.
pub(crate) fn quantized_affine(
    ws: &[&dyn QuantRows],
    biases: &[Option<&[f32]>],
    x: &[f32],
    m: usize,
) -> Vec<Vec<f32>> {
    let Some(k) = ws.first().map(|w| w.k()) else {
        return Vec::new();
    };
    assert!(ws.iter().all(|w| w.k() == k) && x.len() == m * k);
    let bias = |i: usize| biases.get(i).copied().flatten();
    assert!((0..ws.len()).all(|i| bias(i).is_none_or(|b| b.len() == ws[i].n())));
    let dense: Option<Vec<&crate::dense_cpu::DenseRows>> = ws.iter().map(|w| w.dense()).collect();
    if let Some(dense) = dense {
        let mut outs = crate::dense_cpu::matmuls(&dense, x, m);
        for (i, out) in outs.iter_mut().enumerate() {
            if let Some(b) = bias(i) {
                add_to_rows(out, b);
            }
        }
        return outs;
    }
    let n_of: Vec<usize> = ws.iter().map(|w| w.n()).collect();
    let mut outs: Vec<Vec<f32>> = n_of.iter().map(|&n| Vec::with_capacity(m * n)).collect();
    let starts: Vec<Vec<RowStart>> = outs
        .iter_mut()
        .zip(&n_of)
        .map(|(o, &n)| (0..m).map(|r| RowStart::spare(o, r * n)).collect())
        .collect();
    fill(ws, biases, x, m, &starts);
    for (o, &n) in outs.iter_mut().zip(&n_of) {
        // SAFETY: `fill` wrote every row's n columns (a panic there propagates first).
        unsafe { o.set_len(m * n) };
    }
    outs
}

/// `b` added to every row of `out` (rows of `b.len()`), large results split among the workers.
fn add_to_rows(out: &mut [f32], b: &[f32]) {
    let n = b.len().max(1);
    let m = out.len() / n;
    let rows = match out.len() >= 64 << 10 {
        true => m.div_ceil(2 * current_workers()),
        false => m,
    };
    par_chunks_mut(out, rows.max(1) * n, |_, dst| {
        for row in dst.chunks_exact_mut(n) {
            for (y, b) in row.iter_mut().zip(b) {
                *y += b;
            }
        }
    });
}

/// One weight's [`quantized_matmuls`] as `m` rows of `n` (the logits, one row a sequence):
/// the same numbers, each row its own vector, written there by the kernels.
pub(crate) fn quantized_rows(w: &dyn QuantRows, x: &[f32], m: usize) -> Vec<Vec<f32>> {
    let n = w.n();
    if w.dense().is_some() {
        let flat = quantized_matmuls(&[w], x, m).remove(0);
        return flat.chunks(n.max(1)).map(<[f32]>::to_vec).collect();
    }
    assert!(x.len() == m * w.k());
    let mut rows: Vec<Vec<f32>> = (0..m).map(|_| Vec::with_capacity(n)).collect();
    let starts: Vec<RowStart> = rows.iter_mut().map(|v| RowStart::spare(v, 0)).collect();
    fill(&[w], &[], x, m, &[starts]);
    for v in &mut rows {
        // SAFETY: `fill` wrote the row's n columns (a panic there propagates first).
        unsafe { v.set_len(n) };
    }
    rows
}

/// `ws` over the `m` rows of `x`, plus weight `i`'s bias where `biases[i]` is given: weight
/// `i`'s result for activation row `r` written from `starts[i][r]` on (its `n` columns, each
/// element once). One parallel job over the weights' rows together.
fn fill(
    ws: &[&dyn QuantRows],
    biases: &[Option<&[f32]>],
    x: &[f32],
    m: usize,
    starts: &[Vec<RowStart>],
) {
    assert!(starts.len() == ws.len() && starts.iter().all(|s| s.len() == m));
    let k = ws.first().map_or(0, |w| w.k());
    let takes = |b: ActBlocks| ws.iter().any(|w| w.act_blocks() == b);
    let xq: Vec<BlockQ81> = match takes(ActBlocks::Q8_1) {
        true => quantize_rows(x),
        false => Vec::new(),
    };
    let xk: Vec<BlockQ8K> = match takes(ActBlocks::Q8K) {
        true => quantize_rows(x),
        false => Vec::new(),
    };
    let simd = Simd::current();
    // weight i has global rows first[i]..first[i + 1]
    let mut first = vec![0];
    for w in ws {
        first.push(first[first.len() - 1] + w.n());
    }
    let total = first[ws.len()];
    // about eight chunks per worker, so the last chunks of a job even out (a worker that is
    // late or descheduled leaves its share to the others), but never chunks so small that
    // taking one costs much next to its work (≥ 64 Ki multiply-adds); whole tiles of eight
    // (float weights: two chunks per worker, as gemm packs the activations again for each)
    let per_worker = match ws.iter().all(|w| w.act_blocks() == ActBlocks::F32) {
        true => 2,
        false => 8,
    };
    let rows = total
        .div_ceil(per_worker * current_workers())
        .max((64 << 10) / (m * k).max(1))
        .next_multiple_of(8);
    let mut chunks = vec![(); total.div_ceil(rows)];
    par_chunks_mut(&mut chunks, 1, |c, _| {
        let (mut g, end) = (c * rows, ((c + 1) * rows).min(total));
        let a = Acts {
            xq: &xq,
            xk: &xk,
            xf: x,
            m,
        };
        while g < end {
            let i = first.partition_point(|&s| s <= g) - 1;
            let (j0, count) = (g - first[i], end.min(first[i + 1]) - g);
            // SAFETY: the chunks cover disjoint global rows, so columns j0..j0 + count of
            // weight i's rows are this chunk's alone; every row start has room for the
            // weight's n columns (the callers' buffers outlive the job).
            let mut out = unsafe { ResultRows::new(&starts[i], j0, count) };
            ws[i].rows_into(j0, count, a, simd, &mut out);
            if let Some(b) = biases.get(i).copied().flatten() {
                out.add_to_every_row(&b[j0..j0 + count]);
            }
            g += count;
        }
    });
}

/// One weight's `quantized_matmuls` into `out` (`m × n`).
#[cfg(test)]
pub(crate) fn matmul_into(w: &dyn QuantRows, x: &[f32], m: usize, out: &mut [f32]) {
    let r = quantized_matmuls(&[w], x, m);
    out.copy_from_slice(&r[0]);
}

/// Weight rows per tile of the tiled kernels (`q4_1_cpu.rs`, `q8_0_cpu.rs`): the lanes of one
/// 256-bit f32 vector, a weight row each.
pub(crate) const TILE_ROWS: usize = 8;

/// `QuantRows::rows_into` for weights in tiles of [`TILE_ROWS`] rows: `dot4(t, rows)`
/// multiplies tile `t` by four activation rows, `dot1(t, row)` by one (the same arithmetic
/// per row, so a result depends on neither the batch nor the rows asked for).
pub(crate) fn rows_by_tiles(
    j0: usize,
    count: usize,
    a: Acts<'_>,
    out: &mut ResultRows<'_>,
    dot4: impl Fn(usize, [&[BlockQ81]; 4]) -> [[f32; TILE_ROWS]; 4],
    dot1: impl Fn(usize, &[BlockQ81]) -> [f32; TILE_ROWS],
) {
    let (m, row) = (a.m, |r: usize| a.row(r));
    assert!(out.m() == m && out.count() == count);
    let end = j0 + count;
    for t in j0 / TILE_ROWS..end.div_ceil(TILE_ROWS) {
        let lanes = (t * TILE_ROWS).max(j0)..((t + 1) * TILE_ROWS).min(end);
        let mut put = |r: usize, res: &[f32; TILE_ROWS]| {
            for j in lanes.clone() {
                out.put(r, j - j0, res[j - t * TILE_ROWS]);
            }
        };
        let mut r = 0;
        while r + 4 <= m {
            let res = dot4(t, [row(r), row(r + 1), row(r + 2), row(r + 3)]);
            for (i, res) in res.iter().enumerate() {
                put(r + i, res);
            }
            r += 4;
        }
        for r in r..m {
            put(r, &dot1(t, row(r)));
        }
    }
}

/// Weight rows that share each group of four activation rows while it is in L1.
const WEIGHT_ROWS_PER_TILE: usize = 16;

/// `QuantRows::rows_into` for weights whose kernel takes one weight row against four or one
/// of the `m` activation rows `row(r)` (`dot4`, `dot`: the same arithmetic per row, so
/// results do not depend on how many rows come together or in which order they are visited).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rows_by_dots<'a, B: 'a>(
    j0: usize,
    count: usize,
    m: usize,
    row: impl Fn(usize) -> &'a [B],
    simd: Simd,
    out: &mut ResultRows<'_>,
    dot4: impl Fn(usize, [&'a [B]; 4]) -> [f32; 4],
    dot: impl Fn(usize, &'a [B]) -> f32,
) {
    assert!(out.m() == m && out.count() == count);
    for t0 in (0..count).step_by(WEIGHT_ROWS_PER_TILE) {
        let tile = t0..count.min(t0 + WEIGHT_ROWS_PER_TILE);
        let mut r = 0;
        while simd != Simd::Portable && r + 4 <= m {
            let rows = [row(r), row(r + 1), row(r + 2), row(r + 3)];
            for jj in tile.clone() {
                for (i, v) in dot4(j0 + jj, rows).into_iter().enumerate() {
                    out.put(r + i, jj, v);
                }
            }
            r += 4;
        }
        for jj in tile {
            for rr in r..m {
                out.put(rr, jj, dot(j0 + jj, row(rr)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8_0_cpu::Q80Matrix;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// Every result lands in its row and column whatever the sizes (one chunk; many chunks
    /// split among the workers, a chunk crossing from one weight into the next), equal to the
    /// row computed alone; the logits' form (a vector a row) holds the same numbers, and a
    /// bias added as the result is written has the bits of adding it after.
    #[test]
    fn results_come_out_row_major_whatever_their_size() {
        let k = 64;
        let weight = |n: usize, salt: usize| {
            let w: Vec<f32> = (0..n * k)
                .map(|i| (((i * 31 + salt) % 97) as f32 / 48.0 - 1.0) * 0.4)
                .collect();
            let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
            Q80Matrix::from_qtensor(&QTensor::quantize(&t, GgmlDType::Q8_0).unwrap()).unwrap()
        };
        for (m, ns) in [
            (3, vec![10]),
            (1, vec![7, 9]),
            (9, vec![1001, 520, 64]),
            (130, vec![520]),
        ] {
            let ws: Vec<Q80Matrix> = ns.iter().enumerate().map(|(i, &n)| weight(n, i)).collect();
            let rows: Vec<&dyn QuantRows> = ws.iter().map(|w| w as &dyn QuantRows).collect();
            let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin() * 2.0).collect();
            let outs = quantized_matmuls(&rows, &x, m);
            let biases: Vec<Vec<f32>> = ns
                .iter()
                .map(|&n| (0..n).map(|j| (j as f32 * 0.11).cos()).collect())
                .collect();
            let given: Vec<Option<&[f32]>> = biases.iter().map(|b| Some(b.as_slice())).collect();
            let biased = quantized_affine(&rows, &given, &x, m);
            for (i, (w, &n)) in rows.iter().zip(&ns).enumerate() {
                assert_eq!(outs[i].len(), m * n);
                let as_rows = quantized_rows(*w, &x, m);
                assert_eq!(as_rows.len(), m);
                for r in 0..m {
                    let alone = quantized_matmuls(&[*w], &x[r * k..(r + 1) * k], 1).remove(0);
                    let got = &outs[i][r * n..(r + 1) * n];
                    assert_eq!(got, alone.as_slice(), "weight {i}, {m} rows: row {r}");
                    assert_eq!(as_rows[r], alone, "weight {i} as rows, row {r}");
                    for j in 0..n {
                        let want = got[j] + biases[i][j];
                        assert_eq!(
                            biased[i][r * n + j].to_bits(),
                            want.to_bits(),
                            "{i} @{r},{j}"
                        );
                    }
                }
            }
        }
    }
}
