//! A CPU matmul for Q5_0 weights (Gemma 3's query, key, gate and up projections in its
//! Q4_K_M file): activations quantized to Q8_1 blocks as ggml does, weights in tiles of
//! eight rows kept five bits a value.
//!
//! A Q5_0 value is `u − 16` with `u` in 0..31: four bits in a nibble, the fifth in a bit
//! plane. At load the blocks are repacked into tiles of eight rows as `q4_1_cpu.rs` does —
//! per 32-element block, bytes `4g..4g+4` of the eight rows' nibbles side by side in one
//! 32-byte vector (low nibbles elements `4g..4g+4`, high nibbles `16+4g..`) — plus one
//! 32-byte vector of fifth bits (bit `g` of byte `4·row + i`: element `4g + i` of that row),
//! and apart from them the rows' scales as eight f16 lanes: 22 bytes a row's block, as in
//! the file. Repacked as Q8_0 tiles (one byte a value, f32 scales) they read 64 % more
//! bytes, and single-stream decode reads every weight once a token: on a two-core machine
//! it is bound by memory, not by the few instructions that put `u` together again.
//!
//! A block's exact integer dot `Σ (u − 16)·q_a` is `Σ u·q_a − 16·Σ q_a`: `maddubs` of the
//! unsigned `u` with the activation's four bytes (broadcast) in i16 — four groups at most
//! before widening (4·2·31·127 = 31,496) — or `vpdpbusd` starting at `−16·Σ q_a`; then per
//! block and row `acc = fma(d_w·d_a, Σ, acc)`: the same integers and the same float
//! operations as the Q8_0 tiles, so the same bits as when Q5_0 was taken as Q8_0 blocks.

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

use crate::cpu_quant::{BlockQ81, Simd, TILE_ROWS};
use crate::scaled_tiles::{self, ScaledTiles, TileFormat};

/// Weight rows per tile.
const ROWS: usize = TILE_ROWS;

/// One 32-element block of a tile's eight rows, five bits a value.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct TileBlock {
    /// `qs[g][4·row + i]`: byte `4g + i` of that row's nibbles (elements `4g + i` low,
    /// `16 + 4g + i` high).
    qs: [[u8; 32]; 4],
    /// Bit `g` of `hi[4·row + i]`: the fifth bit of element `4g + i` of that row.
    hi: [u8; 32],
}

/// A `[n, k]` Q5_0 weight matrix in tiles of eight rows (the last tile padded with zero
/// rows).
pub(crate) type Q50Matrix = ScaledTiles<TileBlock>;

type Tile<'a> = scaled_tiles::Tile<'a, TileBlock>;

/// d (f16), the fifth bits (u32), 16 bytes of nibbles.
const STORED: usize = 22;

impl Q50Matrix {
    /// Takes the raw blocks of a 2-D Q5_0 tensor; `None` for any other tensor.
    pub fn from_qtensor(q: &QTensor) -> Option<Self> {
        if q.dtype() != GgmlDType::Q5_0 {
            return None;
        }
        let (n, k) = q.shape().dims2().ok()?;
        let data = q.data().ok()?;
        Self::from_blocks(n, k, &data, STORED, |tb: &mut TileBlock, lane, c| {
            let qh = u32::from_le_bytes([c[2], c[3], c[4], c[5]]);
            for (g, group) in tb.qs.iter_mut().enumerate() {
                group[4 * lane..4 * lane + 4].copy_from_slice(&c[6 + 4 * g..10 + 4 * g]);
            }
            for e in 0..32 {
                let (g, i) = (e / 4, e % 4);
                tb.hi[4 * lane + i] |= (((qh >> e) & 1) as u8) << g;
            }
        })
    }
}

impl TileFormat for TileBlock {
    const ZERO: Self = Self {
        qs: [[0; 32]; 4],
        hi: [0; 32],
    };

    fn dot<const R: usize>(a: [&[BlockQ81]; R], tile: Tile<'_>, simd: Simd) -> [[f32; ROWS]; R] {
        tile_dot(a, tile, simd)
    }
}

/// The eight rows of a tile times `R` activation rows: `[R][8]`.
fn tile_dot<const R: usize>(a: [&[BlockQ81]; R], tile: Tile<'_>, simd: Simd) -> [[f32; ROWS]; R] {
    match simd {
        // SAFETY: AVX2, FMA and F16C were detected (every level above portable has them);
        // each activation row has as many blocks as the tile.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { tile_dot_avx2(a, tile) },
        // SAFETY: AVX-512 VNNI and VL were detected besides them.
        #[cfg(target_arch = "x86_64")]
        Simd::Vnni => unsafe { tile_dot_vnni(a, tile) },
        _ => a.map(|row| tile_dot_portable(row, tile)),
    }
}

/// Element `4g + i` of row `lane` of a tile block: `u` in 0..31 (the value is `u − 16`).
fn value(tb: &TileBlock, lane: usize, g: usize, i: usize) -> i32 {
    let byte = tb.qs[g % 4][4 * lane + i];
    let nibble = if g < 4 { byte & 0x0F } else { byte >> 4 };
    let fifth = (tb.hi[4 * lane + i] >> g) & 1;
    i32::from(nibble | (fifth << 4))
}

/// The arithmetic every path computes, one lane (row) at a time.
fn tile_dot_portable(a: &[BlockQ81], tile: Tile<'_>) -> [f32; ROWS] {
    let mut acc = [0f32; ROWS];
    for ((tb, sc), y) in tile.blocks.iter().zip(tile.scales).zip(a) {
        for (lane, acc) in acc.iter_mut().enumerate() {
            let mut sum = 0i32;
            for g in 0..8 {
                for i in 0..4 {
                    sum += (value(tb, lane, g, i) - 16) * i32::from(y.qs[4 * g + i]);
                }
            }
            let d = f16::from_bits(sc[lane]).to_f32();
            *acc = (d * y.d).mul_add(sum as f32, *acc);
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_dot_avx2<const R: usize>(a: [&[BlockQ81]; R], tile: Tile<'_>) -> [[f32; ROWS]; R] {
    tile_dot_simd::<R, false>(a, tile)
}

/// [`tile_dot_avx2`] with `vpdpbusd`: `u` (unsigned) times the activation's bytes (signed),
/// four products a lane summed straight into i32 lanes that start at `−16·Σ q_a`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn tile_dot_vnni<const R: usize>(a: [&[BlockQ81]; R], tile: Tile<'_>) -> [[f32; ROWS]; R] {
    tile_dot_simd::<R, true>(a, tile)
}

/// The body of both, inlined into each (so compiled with its features). A block's integer
/// sum is the same exact number either way, so both give the same bits.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_dot_simd<const R: usize, const VNNI: bool>(
    a: [&[BlockQ81]; R],
    tile: Tile<'_>,
) -> [[f32; ROWS]; R] {
    use std::arch::x86_64::*;
    let low = _mm256_set1_epi8(0x0F);
    let fifth = _mm256_set1_epi8(0x10);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, (tb, sc)) in tile.blocks.iter().zip(tile.scales).enumerate() {
        // the eight groups of four elements, eight rows each, as `u` in 0..31: the nibble,
        // and bit g of the fifth-bit plane moved to bit 4 (16-bit shifts: a byte's bit 4
        // comes from bit g of the same byte for every g in 0..8)
        let hi = _mm256_load_si256(tb.hi.as_ptr() as *const __m256i);
        let at4 = |g: usize| {
            let moved = match g {
                0 => _mm256_slli_epi16(hi, 4),
                1 => _mm256_slli_epi16(hi, 3),
                2 => _mm256_slli_epi16(hi, 2),
                3 => _mm256_slli_epi16(hi, 1),
                4 => hi,
                5 => _mm256_srli_epi16(hi, 1),
                6 => _mm256_srli_epi16(hi, 2),
                _ => _mm256_srli_epi16(hi, 3),
            };
            _mm256_and_si256(moved, fifth)
        };
        let mut u = [_mm256_setzero_si256(); 8];
        for g in 0..4 {
            let raw = _mm256_load_si256(tb.qs[g].as_ptr() as *const __m256i);
            u[g] = _mm256_or_si256(_mm256_and_si256(raw, low), at4(g));
            let high = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            u[g + 4] = _mm256_or_si256(high, at4(g + 4));
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        for r in 0..R {
            let y = &a[r][b];
            let p = y.qs.as_ptr();
            // the activation's four bytes of a group, broadcast to every row
            let four = |g: usize| _mm256_set1_epi32((p.add(4 * g) as *const i32).read_unaligned());
            let sum = if VNNI {
                // two chains (a `vpdpbusd` waits for its accumulator), one starting at −16·Σa
                let mut s = [_mm256_set1_epi32(-16 * y.isum), _mm256_setzero_si256()];
                for (g, ug) in u.iter().enumerate() {
                    s[g % 2] = _mm256_dpbusd_epi32(s[g % 2], *ug, four(g));
                }
                _mm256_add_epi32(s[0], s[1])
            } else {
                // four groups in i16 at most: 4·2·31·127 fits
                let mut lo = _mm256_maddubs_epi16(u[0], four(0));
                let mut hi = _mm256_maddubs_epi16(u[4], four(4));
                for g in 1..4 {
                    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(u[g], four(g)));
                    hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(u[g + 4], four(g + 4)));
                }
                let s = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
                _mm256_sub_epi32(s, _mm256_set1_epi32(16 * y.isum))
            };
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
        // the whole range of u: extremes, zeros and a sweep
        let w: Vec<f32> = (0..n * k)
            .map(|i| match i % 11 {
                0 => -1.0,
                1 => 1.0,
                2 => 0.0,
                _ => ((i as f32) * 0.37).sin(),
            })
            .collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        QTensor::quantize(&t, GgmlDType::Q5_0).unwrap()
    }

    /// ENG-KQ-2: every value and scale of the file, read back from the tiles.
    #[test]
    fn the_tiles_hold_the_files_values_exactly() {
        let (n, k) = (11, 96);
        let q = matrix(n, k);
        let want: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let mat = Q50Matrix::from_qtensor(&q).unwrap();
        for j in 0..n {
            let tile = mat.tile(j / ROWS);
            let lane = j % ROWS;
            let got: Vec<f32> = tile
                .blocks
                .iter()
                .zip(tile.scales)
                .flat_map(|(tb, sc)| {
                    let d = f16::from_bits(sc[lane]).to_f32();
                    (0..32).map(move |e| (value(tb, lane, e / 4, e % 4) - 16) as f32 * d)
                })
                .collect();
            assert_eq!(got, want[j * k..(j + 1) * k], "row {j}");
        }
    }

    /// Each result is the exact integer block sum of the file's values scaled block by block
    /// (the arithmetic of the Q8_0 tiles Q5_0 was taken as before: the same bits), whatever
    /// the batch, and close to candle's own Q5_0 kernel.
    #[test]
    fn each_result_is_the_exact_block_sum_scaled() {
        let (n, k, m) = (20, 576, 6);
        let q = matrix(n, k);
        let mat = Q50Matrix::from_qtensor(&q).unwrap();
        let deq: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let raw = q.data().unwrap();
        let nb = k / QK;
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i as f32) * 0.731).sin() * 3.0)
            .collect();
        let mut out = vec![0f32; m * n];
        matmul_into(&mat, &x, m, &mut out);
        for r in 0..m {
            let xq: Vec<BlockQ81> = x[r * k..(r + 1) * k]
                .chunks_exact(QK)
                .map(quantize_q8_1)
                .collect();
            for j in 0..n {
                let mut want = 0f32;
                for (b, y) in xq.iter().enumerate() {
                    let at = (j * nb + b) * STORED;
                    let d = f16::from_le_bytes([raw[at], raw[at + 1]]).to_f32();
                    let sum: i32 = (0..QK)
                        .map(|e| (deq[j * k + b * QK + e] / d) as i32 * i32::from(y.qs[e]))
                        .sum();
                    want = (d * y.d).mul_add(sum as f32, want);
                }
                assert_eq!(
                    out[r * n + j].to_bits(),
                    want.to_bits(),
                    "row {j}, input {r}"
                );
            }
            let mut one = vec![0f32; n];
            matmul_into(&mat, &x[r * k..(r + 1) * k], 1, &mut one);
            assert_eq!(one, out[r * n..(r + 1) * n]);
        }
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
            assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn simd_and_portable_paths_agree_exactly() {
        // 12 rows: a whole tile and a padded one
        let (n, k) = (12, 96);
        let mat = Q50Matrix::from_qtensor(&matrix(n, k)).unwrap();
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
}
