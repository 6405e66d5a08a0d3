//! What the K-quant kernels share (`q4_k_cpu.rs`, `q5_k_cpu.rs`, `q6_k_cpu.rs`): a matrix of
//! super-blocks unpacked at load, row after row, whose rows multiply Q8_K activation blocks —
//! one weight row against four activation rows, or one ([`rows_by_dots`]). A format says how
//! its stored super-block unpacks and how one multiplies, portably and on AVX2, with ggml's
//! arithmetic.

use candle_core::quantized::{GgmlDType, QTensor};

use crate::cpu_quant::{
    rows_by_dots, ActBlocks, Acts, BlockQ8K, QuantRows, ResultRows, Simd, QK_K,
};

/// One K-quant format's 256-element super-block, unpacked for its kernel.
pub(crate) trait SuperBlock: Copy + Send + Sync + 'static {
    /// The stored type.
    const DTYPE: GgmlDType;
    /// Bytes of one stored super-block.
    const STORED: usize;
    /// Unpacks one stored super-block.
    fn unpack(stored: &[u8]) -> Self;
    /// One weight row times one activation row, lane by lane as the AVX2 path.
    fn dot_portable(w: &[Self], a: &[BlockQ8K]) -> f32;
    /// One weight row times `R` activation rows with AVX2 (with `VNNI`, AVX-512 VNNI's
    /// `vpdpwssd` for the scaled sums: the same bits). Implementations are
    /// `#[inline(always)]`: [`dots`] compiles them into one function per level.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA (and AVX-512 VNNI and VL with `VNNI`), and the caller's
    /// features say so; every activation row has as many blocks as `w`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn dots_simd<const R: usize, const VNNI: bool>(
        w: &[Self],
        a: [&[BlockQ8K]; R],
    ) -> [f32; R];
}

/// `Σ_c sc_c · (qw_c · qy_c)` over a super-block's eight 32-byte chunks, eight i32 lanes:
/// `part(c)` gives chunk `c`'s weight bytes (unsigned) and its scales (i16 pairs), `qy` the
/// activation's 256 bytes. The bytes multiply in `maddubs` pairs; with `VNNI` one `vpdpwssd`
/// scales and adds each chunk (two chains, as one waits for its accumulator), else `madd`
/// and an add. Every sum is exact in i32, so both give the same lanes.
///
/// # Safety
/// AVX2 (and AVX-512 VNNI and VL with `VNNI`) in the caller's features; `qy` is 32-byte
/// aligned.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn scaled_sum<const VNNI: bool>(
    part: impl Fn(usize) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i),
    qy: *const i8,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let product = |c: usize| {
        let (qw, sc) = part(c);
        let y = _mm256_load_si256(qy.add(32 * c) as *const __m256i);
        (_mm256_maddubs_epi16(qw, y), sc)
    };
    if VNNI {
        let mut s = [_mm256_setzero_si256(); 2];
        for c in 0..8 {
            let (p, sc) = product(c);
            s[c % 2] = _mm256_dpwssd_epi32(s[c % 2], sc, p);
        }
        _mm256_add_epi32(s[0], s[1])
    } else {
        let mut sumi = _mm256_setzero_si256();
        for c in 0..8 {
            let (p, sc) = product(c);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, p));
        }
        sumi
    }
}

/// One weight row times `R` activation rows at `simd`'s level: bit-identical at every level.
pub(crate) fn dots<S: SuperBlock, const R: usize>(
    w: &[S],
    a: [&[BlockQ8K]; R],
    simd: Simd,
) -> [f32; R] {
    match simd {
        // SAFETY: AVX2 and FMA were detected (every level above portable has them); each
        // activation row has as many blocks as the weight row (`Acts::row_k` of this k).
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { dots_avx2(w, a) },
        // SAFETY: as above, and AVX-512 VNNI and VL were detected.
        #[cfg(target_arch = "x86_64")]
        Simd::Vnni => unsafe { dots_vnni(w, a) },
        _ => a.map(|r| S::dot_portable(w, r)),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<S: SuperBlock, const R: usize>(w: &[S], a: [&[BlockQ8K]; R]) -> [f32; R] {
    S::dots_simd::<R, false>(w, a)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn dots_vnni<S: SuperBlock, const R: usize>(w: &[S], a: [&[BlockQ8K]; R]) -> [f32; R] {
    S::dots_simd::<R, true>(w, a)
}

/// A `[n, k]` matrix of one K-quant format.
pub(crate) struct KMatrix<S> {
    n: usize,
    k: usize,
    /// `blocks[j · k / 256 + b]`: super-block `b` of row `j`.
    blocks: Vec<S>,
}

impl<S: SuperBlock> KMatrix<S> {
    /// Takes the raw blocks of a 2-D tensor of the format; `None` for any other tensor.
    pub fn from_qtensor(q: &QTensor) -> Option<Self> {
        if q.dtype() != S::DTYPE {
            return None;
        }
        let (n, k) = q.shape().dims2().ok()?;
        let data = q.data().ok()?;
        if k % QK_K != 0 || data.len() != n * k / QK_K * S::STORED {
            return None;
        }
        let blocks = data.chunks_exact(S::STORED).map(S::unpack).collect();
        Some(Self { n, k, blocks })
    }

    /// Row `j`'s super-blocks.
    pub fn row(&self, j: usize) -> &[S] {
        let nb = self.k / QK_K;
        &self.blocks[j * nb..(j + 1) * nb]
    }
}

impl<S: SuperBlock> QuantRows for KMatrix<S> {
    fn n(&self) -> usize {
        self.n
    }

    fn k(&self) -> usize {
        self.k
    }

    fn act_blocks(&self) -> ActBlocks {
        ActBlocks::Q8K
    }

    fn rows_into(
        &self,
        j0: usize,
        count: usize,
        a: Acts<'_>,
        simd: Simd,
        out: &mut ResultRows<'_>,
    ) {
        rows_by_dots(
            j0,
            count,
            a.m,
            |r| a.row_k(r),
            simd,
            out,
            |j, rows| dots(self.row(j), rows, simd),
            |j, row| dots(self.row(j), [row], simd)[0],
        );
    }
}

/// The checks every K-quant kernel passes, for the formats' own tests.
#[cfg(test)]
pub(crate) mod checks {
    use super::*;
    use crate::cpu_quant::{matmul_into, quantize_q8_k};
    use candle_core::{Device, Module, Tensor};

    /// A `[n, k]` tensor of `dtype` from a fixed pattern (`seed` shifts it).
    pub fn quantized(dtype: GgmlDType, n: usize, k: usize, seed: usize) -> QTensor {
        let w: Vec<f32> = (0..n * k)
            .map(|i| (((i + seed) * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        QTensor::quantize(&t, dtype).unwrap()
    }

    /// `m × k` activations over several units of magnitude.
    pub fn acts(m: usize, k: usize) -> Vec<f32> {
        (0..m * k).map(|i| (i as f32 * 0.731).sin() * 3.0).collect()
    }

    /// The product agrees with candle's kernel for the format (the same integer sums;
    /// candle quantizes activations to ±128 where ggml, and we, use ±127, and adds in another
    /// order) and with the product of the dequantized weights.
    pub fn agrees_with_candle_and_the_dequantized_product<S: SuperBlock>() {
        let (n, k, m) = (40, 768, 5);
        let q = quantized(S::DTYPE, n, k, 3);
        let deq: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let mat = KMatrix::<S>::from_qtensor(&q).unwrap();
        let x = acts(m, k);
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
        for (i, (a, b)) in out.iter().zip(&theirs).enumerate() {
            assert!((a - b).abs() <= 2e-2 * b.abs().max(1.0), "{a} vs {b}");
            let (r, j) = (i / n, i % n);
            let exact: f32 = (0..k).map(|c| x[r * k + c] * deq[j * k + c]).sum();
            // activations are 8-bit: each is off by at most half its block's step
            // (largest magnitude / 127), weighted by its weight
            let bound: f32 = (0..k)
                .map(|c| {
                    let b = r * k + c / QK_K * QK_K;
                    let amax = x[b..b + QK_K].iter().fold(0f32, |m, v| m.max(v.abs()));
                    amax / 254.0 * deq[j * k + c].abs()
                })
                .sum();
            assert!(
                (a - exact).abs() <= bound + 1e-3,
                "{a} vs {exact} (bound {bound})"
            );
        }
    }

    /// The portable loop and the SIMD path give the same bits, one activation row or four,
    /// and a row's result does not depend on the batch it comes in.
    pub fn simd_and_portable_agree_exactly_at_any_batch<S: SuperBlock>() {
        let (n, k) = (12, 512);
        let mat = KMatrix::<S>::from_qtensor(&quantized(S::DTYPE, n, k, 1)).unwrap();
        let x = acts(6, k);
        let xk: Vec<BlockQ8K> = x.chunks_exact(QK_K).map(quantize_q8_k).collect();
        let row = |r: usize| &xk[2 * r..2 * r + 2];
        for j in 0..n {
            for r in 0..6 {
                let p = S::dot_portable(mat.row(j), row(r)).to_bits();
                for &level in checks_levels() {
                    assert_eq!(dots(mat.row(j), [row(r)], level)[0].to_bits(), p);
                    let four = dots(mat.row(j), [row(r), row(0), row(5), row(r)], level);
                    assert_eq!((four[0].to_bits(), four[3].to_bits()), (p, p));
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

    /// Every level this CPU can run, the portable one included.
    fn checks_levels() -> &'static [Simd] {
        match Simd::detect() {
            Simd::Vnni => &[Simd::Vnni, Simd::Avx2, Simd::Portable],
            Simd::Avx2 => &[Simd::Avx2, Simd::Portable],
            Simd::Portable => &[Simd::Portable],
        }
    }

    /// Another format's tensor is not taken.
    pub fn other_types_are_not_taken<S: SuperBlock>() {
        for dtype in [
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
            GgmlDType::Q8_0,
        ] {
            if dtype != S::DTYPE {
                let q = quantized(dtype, 2, 256, 0);
                assert!(KMatrix::<S>::from_qtensor(&q).is_none(), "{dtype:?}");
            }
        }
    }
}
