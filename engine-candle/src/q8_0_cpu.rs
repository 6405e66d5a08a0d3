//! A CPU matmul for Q8_0 weights (and Q4_0, whose values are Q8_0 blocks exactly):
//! activations quantized to Q8 blocks as ggml does, weights in tiles of eight rows.
//!
//! At load the weights are repacked into tiles of eight rows, as `q4_1_cpu.rs` does: per
//! 32-element block, bytes `4g..4g+4` of the eight rows side by side in one 32-byte vector,
//! and apart from them the rows' scales as eight f16 lanes (as the file holds them: 34 bytes
//! a row's block, as in the file — f32 scales read 6 % more per token, and single-stream
//! decode reads every weight once a token), widened by `vcvtph2ps` in the kernel. One lane then carries one weight row: a block's
//! exact integer dot `Σ q_w·q_a` comes out of `|q_w|` times the activation's four bytes
//! (broadcast, with the weights' signs moved onto them) — `vpdpbusd` on AVX-512 VNNI,
//! `maddubs` and `madd` on AVX2 — summed over the eight groups in i32; then per block and
//! row `acc = fma(d_w·d_a, Σ, acc)`.
//!
//! ggml's `ggml_vec_dot_q8_0_q8_0` keeps eight partial sums per block and row and scales each
//! (about seven instructions per 32-element block and row pair where four activation rows
//! share the weight block); here about three and a half on VNNI. The float order differs from
//! ggml's, which moves results by float rounding only. A row's result depends only on its
//! weight row and its activation row: not on the batch, the tile or the instruction set.

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

use crate::cpu_quant::{BlockQ81, Simd, TILE_ROWS};
use crate::scaled_tiles::{self, ScaledTiles, TileFormat};

/// Weight rows per tile.
const ROWS: usize = TILE_ROWS;

/// One 32-element block of a tile's eight rows: `qs[g][4·row + i]` = element `4g + i` of
/// that row's block.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct TileBlock {
    qs: [[i8; 32]; 8],
}

/// A `[n, k]` Q8_0 weight matrix in tiles of eight rows (the last tile padded with zero
/// rows).
pub(crate) type Q80Matrix = ScaledTiles<TileBlock>;

type Tile<'a> = scaled_tiles::Tile<'a, TileBlock>;

/// One stored block's 32 values as i8.
fn block_values(dtype: GgmlDType, c: &[u8]) -> [i8; 32] {
    let mut b = [0i8; 32];
    match dtype {
        GgmlDType::Q4_0 => {
            for (j, v) in c[2..18].iter().enumerate() {
                b[j] = (v & 0x0f) as i8 - 8;
                b[j + 16] = (v >> 4) as i8 - 8;
            }
        }
        _ => {
            for (o, v) in b.iter_mut().zip(&c[2..]) {
                *o = *v as i8;
            }
        }
    }
    b
}

impl Q80Matrix {
    /// Takes the raw blocks of a 2-D Q8_0 tensor, or of a Q4_0 one — whose values are whole
    /// multiples of their block's scale (−8..7 of it), so they are Q8_0 blocks exactly (the
    /// integer sums with Q8_0-quantized activations are llama.cpp's). `None` for any other
    /// tensor (Q5_0 has its own tiles, `q5_0_cpu.rs`).
    pub fn from_qtensor(q: &QTensor) -> Option<Self> {
        let (dtype, stored) = match q.dtype() {
            GgmlDType::Q8_0 => (GgmlDType::Q8_0, 34),
            GgmlDType::Q4_0 => (GgmlDType::Q4_0, 18),
            _ => return None,
        };
        let (n, k) = q.shape().dims2().ok()?;
        let data = q.data().ok()?;
        Self::from_blocks(n, k, &data, stored, |tb: &mut TileBlock, lane, c| {
            let v = block_values(dtype, c);
            for (g, group) in tb.qs.iter_mut().enumerate() {
                group[4 * lane..4 * lane + 4].copy_from_slice(&v[4 * g..4 * g + 4]);
            }
        })
    }
}

impl TileFormat for TileBlock {
    const ZERO: Self = Self { qs: [[0; 32]; 8] };

    fn dot<const R: usize>(a: [&[BlockQ81]; R], tile: Tile<'_>, simd: Simd) -> [[f32; ROWS]; R] {
        tile_dot(a, tile, simd)
    }
}

/// The eight rows of a tile times `R` activation rows: `[R][8]`.
fn tile_dot<const R: usize>(a: [&[BlockQ81]; R], tile: Tile<'_>, simd: Simd) -> [[f32; ROWS]; R] {
    match simd {
        // SAFETY: each level is used only where `Simd::detect` found its features; each
        // activation row has as many blocks as the tile.
        #[cfg(target_arch = "x86_64")]
        Simd::Vnni => unsafe { tile_dot_vnni(a, tile) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { tile_dot_avx2(a, tile) },
        _ => a.map(|row| tile_dot_portable(row, tile)),
    }
}

/// The arithmetic every path computes, one lane (row) at a time.
fn tile_dot_portable(a: &[BlockQ81], tile: Tile<'_>) -> [f32; ROWS] {
    let mut acc = [0f32; ROWS];
    for ((tb, sc), y) in tile.blocks.iter().zip(tile.scales).zip(a) {
        let d = sc.map(|s| f16::from_bits(s).to_f32());
        for (lane, acc) in acc.iter_mut().enumerate() {
            let mut sum = 0i32;
            for (g, group) in tb.qs.iter().enumerate() {
                for i in 0..4 {
                    sum += group[4 * lane + i] as i32 * y.qs[4 * g + i] as i32;
                }
            }
            *acc = (d[lane] * y.d).mul_add(sum as f32, *acc);
        }
    }
    acc
}

/// AVX2: `|w|` times the activation's four bytes (broadcast, the weights' signs moved onto
/// them) with `maddubs` + `madd` — exact: at most 4·128·127 in magnitude — the eight groups
/// added in i32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_dot_avx2<const R: usize>(a: [&[BlockQ81]; R], tile: Tile<'_>) -> [[f32; ROWS]; R] {
    use std::arch::x86_64::*;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, (tb, sc)) in tile.blocks.iter().zip(tile.scales).enumerate() {
        let mut w = [_mm256_setzero_si256(); 8];
        let mut aw = [_mm256_setzero_si256(); 8];
        for g in 0..8 {
            w[g] = _mm256_load_si256(tb.qs[g].as_ptr() as *const __m256i);
            aw[g] = _mm256_sign_epi8(w[g], w[g]);
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        for r in 0..R {
            let y = &a[r][b];
            let p = y.qs.as_ptr();
            let mut sum = _mm256_setzero_si256();
            for g in 0..8 {
                // the activation's four bytes of group g, for every row
                let four = _mm256_set1_epi32((p.add(4 * g) as *const i32).read_unaligned());
                let signed = _mm256_sign_epi8(four, w[g]);
                let pairs = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(aw[g], signed));
                sum = _mm256_add_epi32(sum, pairs);
            }
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(y.d));
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc[r]);
        }
    }
    let mut res = [[0f32; ROWS]; R];
    for (o, v) in res.iter_mut().zip(acc) {
        _mm256_storeu_ps(o.as_mut_ptr(), v);
    }
    res
}

/// AVX-512 VNNI: the weights made unsigned once per block (`w ^ 0x80` = w + 128), `vpdpbusd`
/// adding the eight groups' products straight into i32 lanes that start at −128·Σa (the
/// activation block's exact sum): the same integers as the AVX2 path, one instruction a
/// group and activation row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn tile_dot_vnni<const R: usize>(a: [&[BlockQ81]; R], tile: Tile<'_>) -> [[f32; ROWS]; R] {
    use std::arch::x86_64::*;
    let flip = _mm256_set1_epi8(i8::MIN);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, (tb, sc)) in tile.blocks.iter().zip(tile.scales).enumerate() {
        let mut u = [_mm256_setzero_si256(); 8];
        for (g, u) in u.iter_mut().enumerate() {
            let w = _mm256_load_si256(tb.qs[g].as_ptr() as *const __m256i);
            *u = _mm256_xor_si256(w, flip);
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        for r in 0..R {
            let y = &a[r][b];
            let p = y.qs.as_ptr();
            let mut sum = _mm256_set1_epi32(-128 * y.isum);
            for (g, u) in u.iter().enumerate() {
                let four = _mm256_set1_epi32((p.add(4 * g) as *const i32).read_unaligned());
                sum = _mm256_dpbusd_epi32(sum, *u, four);
            }
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(y.d));
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc[r]);
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
    use crate::cpu_quant::QK;
    use candle_core::{Device, Module, Tensor};

    fn matrix(n: usize, k: usize) -> QTensor {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        QTensor::quantize(&t, GgmlDType::Q8_0).unwrap()
    }

    /// Row `j`'s values and block scales, read back from the tiles.
    fn row_of(mat: &Q80Matrix, j: usize) -> Vec<f32> {
        let (t, lane) = (j / ROWS, j % ROWS);
        let tile = mat.tile(t);
        tile.blocks
            .iter()
            .zip(tile.scales)
            .flat_map(|(tb, sc)| {
                let d = f16::from_bits(sc[lane]).to_f32();
                (0..32).map(move |e| tb.qs[e / 4][4 * lane + e % 4] as f32 * d)
            })
            .collect()
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
        // 12 rows: a whole tile and a padded one; weights over the whole i8 range (−128
        // included, whose magnitude is 128 only as an unsigned byte)
        let (n, k) = (12, 96);
        let w: Vec<f32> = (0..n * k)
            .map(|i| match i % 7 {
                0 => -1.0,
                1 => 1.0,
                _ => ((i as f32) * 0.61).sin(),
            })
            .collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let mut mat =
            Q80Matrix::from_qtensor(&QTensor::quantize(&t, GgmlDType::Q8_0).unwrap()).unwrap();
        mat.blocks[0].qs[0][0] = -128;
        let x: Vec<f32> = (0..5 * k).map(|i| (i as f32 * 1.7).sin() * 4.0).collect();
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
        let q = matrix(3, 64);
        let mat = Q80Matrix::from_qtensor(&q).unwrap();
        let x: Vec<f32> = (0..64).map(|i| i as f32 - 31.5).collect();
        let xq: Vec<BlockQ81> = x.chunks_exact(QK).map(quantize_q8_1).collect();
        let got = tile_dot_portable(&xq, mat.tile(0));
        for (j, got) in got.iter().take(3).enumerate() {
            let mut want = 0f32;
            let tile = mat.tile(0);
            for (b, (tb, sc)) in tile.blocks.iter().zip(tile.scales).enumerate() {
                let sum: i32 = (0..32)
                    .map(|e| tb.qs[e / 4][4 * j + e % 4] as i32 * xq[b].qs[e] as i32)
                    .sum();
                let d = f16::from_bits(sc[j]).to_f32();
                want = (d * xq[b].d).mul_add(sum as f32, want);
            }
            assert_eq!(*got, want, "row {j}");
        }
    }

    /// ENG-KQ-2: Q4_0 blocks become Q8_0 blocks without changing a value (Q5_0 has its own
    /// tiles, `q5_0_cpu.rs`).
    #[test]
    fn q4_0_is_taken_exactly() {
        let (n, k) = (6, 96);
        let w: Vec<f32> = (0..n * k).map(|i| ((i as f32) * 0.37).sin()).collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, GgmlDType::Q4_0).unwrap();
        let want: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let mat = Q80Matrix::from_qtensor(&q).unwrap();
        let got: Vec<f32> = (0..n).flat_map(|j| row_of(&mat, j)).collect();
        assert_eq!(got, want);
    }
}
