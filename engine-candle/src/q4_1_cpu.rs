//! A CPU matmul for Q4_1 weights: activations quantized to Q8_1 blocks (scale and sum rounded
//! to f16, as ggml does), eight weight rows at a time.
//!
//! At load the weights are repacked into tiles of eight rows: per 32-element block, the four
//! bytes `4g..4g+4` of the eight rows side by side in one 32-byte vector (their low nibbles
//! are elements `4g..4g+4`, their high nibbles elements `16+4g..16+4g+4`), and the rows'
//! scales and minimums as eight f16 lanes each (as the file holds them: 20 bytes a row's
//! block — f32 lanes read 20 % more per token), widened by `vcvtph2ps` in the kernel. One lane then carries one weight row: a block's
//! exact integer dot `Σ q_w·q_a` comes out of `maddubs` (four u8×i8 products per row, the
//! activation's four bytes broadcast), summed over the eight groups in i16 (at most
//! 8·2·15·127 = 30,480: no saturation) and widened once; then per block and row, in block
//! order, `acc = fma(d_w·d_a, Σ, acc)` and `acc = fma(m_w, s_a, acc)`.
//!
//! ggml's `ggml_vec_dot_q4_1_q8_1` (the path llama.cpp takes for Q4_1 on AVX2) spends about
//! twelve instructions on each 32-element block of each row pair — the horizontal sums stay in
//! eight lanes and every block pays its own conversion and scale; here about three, so prompt
//! passes and decode steps both do a third of the work. The float order differs from ggml's
//! (its eight partial sums per block are scaled before they are added), which moves results by
//! float rounding only (`tests/llama_parity.rs` keeps its agreement bounds). Every row's result
//! depends only on its weight row and its activation row: not on the batch, the tile or the
//! instruction set (the tests compare the portable loop, the AVX2 kernel and batch sizes).

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

use crate::cpu_quant::{rows_by_tiles, Acts, BlockQ81, QuantRows, ResultRows, Simd, QK, TILE_ROWS};

/// Weight rows per tile.
const ROWS: usize = TILE_ROWS;

/// One 32-element block of a tile's eight rows.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct TileBlock {
    /// `qs[g][4·row + i]` = byte `4g + i` of that row's block (two 4-bit values).
    qs: [[u8; 32]; 4],
    /// The rows' scales (f16 bits).
    d: [u16; ROWS],
    /// The rows' minimums (f16 bits).
    m: [u16; ROWS],
}

/// A `[n, k]` Q4_1 weight matrix (n output features), in tiles of eight rows (the last tile
/// padded with zero rows).
pub(crate) struct Q41Matrix {
    n: usize,
    k: usize,
    /// `blocks[t · nb + b]`: block `b` of tile `t`.
    blocks: Vec<TileBlock>,
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
        let nb = k / QK;
        // d (f16), m (f16), 16 bytes of nibbles
        const BYTES: usize = 20;
        if data.len() != n * nb * BYTES {
            return None;
        }
        let tiles = n.div_ceil(ROWS);
        let zero = TileBlock {
            qs: [[0; 32]; 4],
            d: [0; ROWS],
            m: [0; ROWS],
        };
        let mut blocks = vec![zero; tiles * nb];
        for (j, row) in data.chunks_exact(nb * BYTES).enumerate() {
            let (t, lane) = (j / ROWS, j % ROWS);
            for (b, c) in row.chunks_exact(BYTES).enumerate() {
                let tb = &mut blocks[t * nb + b];
                tb.d[lane] = u16::from_le_bytes([c[0], c[1]]);
                tb.m[lane] = u16::from_le_bytes([c[2], c[3]]);
                for (g, group) in tb.qs.iter_mut().enumerate() {
                    group[4 * lane..4 * lane + 4].copy_from_slice(&c[4 + 4 * g..8 + 4 * g]);
                }
            }
        }
        Some(Self { n, k, blocks })
    }

    fn tile(&self, t: usize) -> &[TileBlock] {
        let nb = self.k / QK;
        &self.blocks[t * nb..(t + 1) * nb]
    }
}

impl QuantRows for Q41Matrix {
    fn n(&self) -> usize {
        self.n
    }

    fn k(&self) -> usize {
        self.k
    }

    fn rows_into(
        &self,
        j0: usize,
        count: usize,
        a: Acts<'_>,
        simd: Simd,
        out: &mut ResultRows<'_>,
    ) {
        rows_by_tiles(
            j0,
            count,
            a,
            out,
            |t, rows| tile_dot(rows, self.tile(t), simd),
            |t, row| tile_dot([row], self.tile(t), simd)[0],
        );
    }
}

/// The eight rows of a tile times `R` activation rows: `[R][8]`.
fn tile_dot<const R: usize>(
    a: [&[BlockQ81]; R],
    tile: &[TileBlock],
    simd: Simd,
) -> [[f32; ROWS]; R] {
    match simd {
        // SAFETY: AVX2 and FMA were detected (every level above portable has them); each
        // activation row has as many blocks as the tile.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { tile_dot_avx2(a, tile) },
        // SAFETY: AVX-512 VNNI and VL were detected besides AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Simd::Vnni => unsafe { tile_dot_vnni(a, tile) },
        _ => a.map(|row| tile_dot_portable(row, tile)),
    }
}

/// A scale or minimum as the kernels widen it (exactly).
fn f32_of(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// The arithmetic every path computes, one lane (row) at a time.
fn tile_dot_portable(a: &[BlockQ81], tile: &[TileBlock]) -> [f32; ROWS] {
    let mut acc = [0f32; ROWS];
    for (tb, y) in tile.iter().zip(a) {
        let (d, m) = (tb.d.map(f32_of), tb.m.map(f32_of));
        for (lane, acc) in acc.iter_mut().enumerate() {
            let mut sum = 0i32;
            for (g, group) in tb.qs.iter().enumerate() {
                for i in 0..4 {
                    let byte = group[4 * lane + i];
                    sum += (byte & 0x0F) as i32 * y.qs[4 * g + i] as i32;
                    sum += (byte >> 4) as i32 * y.qs[16 + 4 * g + i] as i32;
                }
            }
            *acc = (d[lane] * y.d).mul_add(sum as f32, *acc);
            *acc = m[lane].mul_add(y.s, *acc);
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_dot_avx2<const R: usize>(
    a: [&[BlockQ81]; R],
    tile: &[TileBlock],
) -> [[f32; ROWS]; R] {
    tile_dot_simd::<R, false>(a, tile)
}

/// [`tile_dot_avx2`] with `vpdpbusd`: the nibbles (unsigned) times the activation's bytes
/// (signed), four products a lane summed straight into i32 — one instruction a group where
/// `maddubs` took one and the i16 sums and their widening took more.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn tile_dot_vnni<const R: usize>(
    a: [&[BlockQ81]; R],
    tile: &[TileBlock],
) -> [[f32; ROWS]; R] {
    tile_dot_simd::<R, true>(a, tile)
}

/// The body of both, inlined into each (so compiled with its features). A block's integer
/// sum is the same exact number either way, so both give the same bits.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_dot_simd<const R: usize, const VNNI: bool>(
    a: [&[BlockQ81]; R],
    tile: &[TileBlock],
) -> [[f32; ROWS]; R] {
    use std::arch::x86_64::*;
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, tb) in tile.iter().enumerate() {
        // the eight groups of four elements, eight rows each, as bytes 0..15
        let mut w = [_mm256_setzero_si256(); 8];
        for g in 0..4 {
            let raw = _mm256_load_si256(tb.qs[g].as_ptr() as *const __m256i);
            w[g] = _mm256_and_si256(raw, low);
            w[g + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(tb.d.as_ptr() as *const __m128i));
        let mw = _mm256_cvtph_ps(_mm_loadu_si128(tb.m.as_ptr() as *const __m128i));
        for r in 0..R {
            let y = &a[r][b];
            let p = y.qs.as_ptr();
            // the activation's four bytes of a group, broadcast to every row
            let four = |g: usize| _mm256_set1_epi32((p.add(4 * g) as *const i32).read_unaligned());
            let sum = if VNNI {
                // four independent chains (a `vpdpbusd` waits for its accumulator)
                let mut s = [_mm256_setzero_si256(); 4];
                for (g, wg) in w.iter().enumerate() {
                    s[g % 4] = _mm256_dpbusd_epi32(s[g % 4], *wg, four(g));
                }
                _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]))
            } else {
                let mut s = _mm256_maddubs_epi16(w[0], four(0));
                for (g, wg) in w.iter().enumerate().skip(1) {
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(*wg, four(g)));
                }
                _mm256_madd_epi16(s, ones)
            };
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(y.d));
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc[r]);
            acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(y.s), acc[r]);
        }
    }
    let mut res = [[0f32; ROWS]; R];
    for (o, v) in res.iter_mut().zip(acc) {
        _mm256_storeu_ps(o.as_mut_ptr(), v);
    }
    res
}

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
        // 12 rows: a whole tile and a padded one; values over the whole nibble range
        let (q, _) = matrix(12, 96);
        let mat = Q41Matrix::from_qtensor(&q).unwrap();
        let x: Vec<f32> = (0..5 * 96).map(|i| (i as f32 * 1.7).sin() * 4.0).collect();
        let xq: Vec<BlockQ81> = x.chunks_exact(QK).map(quantize_q8_1).collect();
        let row = |r: usize| &xq[r * 3..(r + 1) * 3];
        let best = Simd::detect();
        for t in 0..2 {
            let tile = mat.tile(t);
            for r in 0..5 {
                let p = tile_dot_portable(row(r), tile);
                for level in [Simd::Avx2, Simd::Vnni] {
                    if best == Simd::Portable || (level == Simd::Vnni && best != Simd::Vnni) {
                        continue;
                    }
                    let one = tile_dot([row(r)], tile, level)[0];
                    assert_eq!(p.map(f32::to_bits), one.map(f32::to_bits), "{level:?}");
                    let four = tile_dot([row(r), row(0), row(r), row(4)], tile, level);
                    assert_eq!(p.map(f32::to_bits), four[0].map(f32::to_bits));
                    assert_eq!(p.map(f32::to_bits), four[2].map(f32::to_bits));
                }
            }
        }
    }

    #[test]
    fn the_portable_loop_is_the_exact_block_sum_scaled() {
        // one row, one block: d_w·d_a·Σ q_w·q_a + m_w·s_a with the integer sum exact
        let (q, deq) = matrix(1, 32);
        let mat = Q41Matrix::from_qtensor(&q).unwrap();
        let x: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
        let y = quantize_q8_1(&x);
        let tb = &mat.tile(0)[0];
        let (d, m) = (f32_of(tb.d[0]), f32_of(tb.m[0]));
        let qw: Vec<i32> = (0..32).map(|e| ((deq[e] - m) / d).round() as i32).collect();
        let sum: i32 = qw.iter().zip(&y.qs).map(|(a, b)| a * *b as i32).sum();
        let want = m.mul_add(y.s, (d * y.d) * sum as f32);
        assert_eq!(tile_dot_portable(&[y], mat.tile(0))[0], want);
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
        // a bias for the second weight only, added as the results are written: the bits of
        // adding it after; and one row of one weight (its own path)
        let bias: Vec<f32> = (0..24).map(|j| (j as f32 * 0.7).cos()).collect();
        let biased = crate::cpu_quant::quantized_affine(&[&a, &b], &[None, Some(&bias)], &x, 5);
        assert_eq!(biased[0], both[0]);
        let after: Vec<f32> = both[1]
            .chunks(24)
            .flat_map(|row| row.iter().zip(&bias).map(|(y, b)| y + b))
            .collect();
        assert_eq!(biased[1], after);
        let one = crate::cpu_quant::quantized_affine(&[&b], &[Some(&bias)], &x[..64], 1);
        assert_eq!(one[0], after[..24]);
    }
}
