//! SwiGLU, `silu(gate) · up` (the feed-forward of Llama-style models such as SmolLM2, and of
//! nomic-bert encoders), with ggml's CPU arithmetic (`ggml_vec_swiglu_f32`): eight lanes at a
//! time through ggml's vector `exp` (ARM's optimized-routines `expf`: `2^n · (1 + p(b))` with
//! `n = round(x · log2 e)`, a degree-5 polynomial in the remainder, exact scaling where `2^n`
//! would overflow), then `x / (1 + e^-x) · up`; a row's last `len % 8` elements with the C
//! library's `expf`, as ggml does. The lanes run as AVX2 + FMA where the CPU has them and as
//! the same fused operations one lane at a time elsewhere: the same bits either way.
//!
//! candle's `silu` called the C library's `expf` element by element on the decode thread,
//! then multiplied in a second pass: ~1.9 % of the samples of a SmolLM2 single-stream run
//! (0.3 % now).

use candle_core::{DType, Result, Tensor};

use crate::cpu_parallel::par_chunks_mut;
use crate::cpu_tensor::{cpu_tensor, with_f32};

/// Elements one worker takes at least (a decode step's few stay on the calling thread).
const PER_JOB: usize = 16 << 10;
/// Lanes of one vector step.
const LANES: usize = 8;

/// `silu(gate) · up` for two f32 tensors of one shape on the CPU, the elements split among
/// the compute pool's workers; elsewhere (another device or type) candle's `silu`.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if !gate.device().is_cpu() || gate.dtype() != DType::F32 || up.dtype() != DType::F32 {
        return candle_nn::ops::silu(gate)? * up;
    }
    if gate.shape() != up.shape() {
        candle_core::bail!("swiglu: gate {:?} and up {:?}", gate.shape(), up.shape());
    }
    let (gate, up) = (gate.contiguous()?, up.contiguous()?);
    // ggml goes row by row: each row's last `n % 8` elements through `expf`
    let n = gate.dims().last().copied().unwrap_or(0).max(1);
    let out = with_f32(&gate, |xs| {
        with_f32(&up, |gs| {
            let mut y = vec![0f32; xs.len()];
            let per = (PER_JOB / n).max(1) * n;
            par_chunks_mut(&mut y, per, |c, dst| {
                let o = c * per;
                for (i, row) in dst.chunks_mut(n).enumerate() {
                    let at = o + i * n;
                    swiglu_slice(&xs[at..at + row.len()], &gs[at..at + row.len()], row);
                }
            });
            y
        })
    });
    match out.flatten() {
        Some(y) => cpu_tensor(y, gate.shape()),
        None => candle_core::bail!("swiglu: a CPU f32 tensor could not be read"),
    }
}

/// `y[i] = silu(x[i]) · g[i]`: whole groups of eight through the vector `exp`, the rest
/// through `expf`.
fn swiglu_slice(x: &[f32], g: &[f32], y: &mut [f32]) {
    let whole = x.len() / LANES * LANES;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA were detected; the three slices hold `whole` elements at least.
        unsafe { avx2::swiglu(&x[..whole], &g[..whole], &mut y[..whole]) };
        tail(&x[whole..], &g[whole..], &mut y[whole..]);
        return;
    }
    for ((y, &x), &g) in y[..whole].iter_mut().zip(&x[..whole]).zip(&g[..whole]) {
        *y = lane::silu(x) * g;
    }
    tail(&x[whole..], &g[whole..], &mut y[whole..]);
}

/// ggml's scalar `silu` (`x / (1 + expf(-x))`) times `g`.
fn tail(x: &[f32], g: &[f32], y: &mut [f32]) {
    for ((y, &x), &g) in y.iter_mut().zip(x).zip(g) {
        *y = x / (1.0 + (-x).exp()) * g;
    }
}

/// The vector `exp`'s constants.
mod k {
    /// 1.5 · 2^23: adding it rounds to an integer in the low mantissa bits.
    pub const SHIFT: f32 = f32::from_bits(0x4b40_0000);
    pub const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
    /// ln 2 in two parts (high bits exact).
    pub const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
    pub const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    /// The polynomial's coefficients, first power to fifth.
    pub const C1: f32 = f32::from_bits(0x3f7f_fff6);
    pub const C2: f32 = f32::from_bits(0x3eff_fedb);
    pub const C3: f32 = f32::from_bits(0x3e2a_af33);
    pub const C4: f32 = f32::from_bits(0x3d2b_9f17);
    pub const C5: f32 = f32::from_bits(0x3c07_2010);
}

/// One lane of the vector code, with the same fused operations.
mod lane {
    use super::k;

    /// e^x: `2^n · (1 + p(b))`, scaled in two steps where `|n| > 126`, zero or infinity past
    /// `|n| > 192`.
    pub fn exp(x: f32) -> f32 {
        let z = x.mul_add(k::LOG2E, k::SHIFT);
        let n = z - k::SHIFT;
        let b = (-n).mul_add(k::LN2_LO, (-n).mul_add(k::LN2_HI, x));
        let e = z.to_bits() << 23;
        let scale = f32::from_bits(e.wrapping_add(1f32.to_bits()));
        let u = b * b;
        let j = k::C5
            .mul_add(b, k::C4)
            .mul_add(u, k::C3.mul_add(b, k::C2))
            .mul_add(u, k::C1 * b);
        if n.abs() <= 126.0 {
            return j.mul_add(scale, scale);
        }
        let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
        let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
        let s2 = f32::from_bits(e.wrapping_sub(g));
        if n.abs() > 192.0 {
            return s1 * s1;
        }
        s2.mul_add(j, s2) * s1
    }

    /// `x / (1 + e^-x)`, `-x` as `0 - x`.
    pub fn silu(x: f32) -> f32 {
        x / (1.0 + exp(0.0 - x))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{k, LANES};
    use std::arch::x86_64::*;

    /// `lane::exp` on eight lanes.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp(x: __m256) -> __m256 {
        let shift = _mm256_set1_ps(k::SHIFT);
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(k::LOG2E), shift);
        let n = _mm256_sub_ps(z, shift);
        let b = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(k::LN2_LO),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(k::LN2_HI), x),
        );
        let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
        let scale = _mm256_castsi256_ps(_mm256_add_epi32(
            e,
            _mm256_castps_si256(_mm256_set1_ps(1.0)),
        ));
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let big = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(_mm256_set1_ps(k::C5), b, _mm256_set1_ps(k::C4)),
                u,
                _mm256_fmadd_ps(_mm256_set1_ps(k::C3), b, _mm256_set1_ps(k::C2)),
            ),
            u,
            _mm256_mul_ps(_mm256_set1_ps(k::C1), b),
        );
        let plain = _mm256_fmadd_ps(j, scale, scale);
        if _mm256_movemask_ps(big) == 0 {
            return plain;
        }
        let g = _mm256_and_si256(
            _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
            _mm256_set1_epi32(0x8200_0000u32 as i32),
        );
        let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
        let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
        let huge = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        let scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
        let outside = _mm256_blendv_ps(scaled, _mm256_mul_ps(s1, s1), huge);
        _mm256_blendv_ps(plain, outside, big)
    }

    /// `y = silu(x) · g`, eight lanes at a time (lengths multiples of eight).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; the three slices must be equally long.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn swiglu(x: &[f32], g: &[f32], y: &mut [f32]) {
        assert!(x.len() == g.len() && y.len() == x.len() && x.len().is_multiple_of(LANES));
        for i in (0..x.len()).step_by(LANES) {
            // SAFETY: i + 8 ≤ len for all three (checked above).
            unsafe {
                let v = _mm256_loadu_ps(x.as_ptr().add(i));
                let e = exp(_mm256_sub_ps(_mm256_setzero_ps(), v));
                let s = _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0), e));
                let out = _mm256_mul_ps(s, _mm256_loadu_ps(g.as_ptr().add(i)));
                _mm256_storeu_ps(y.as_mut_ptr().add(i), out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Inputs over the whole range: tiny, ordinary, where `e^-x` leaves the plain path
    /// (|x · log2 e| > 126), where it flushes (> 192), the signed zeros.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..4000).map(|i| (i as f32 - 2000.0) * 0.013).collect();
        v.extend((0..400).map(|i| -150.0 + i as f32 * 0.75));
        v.extend([
            0.0, -0.0, 1e-30, -1e-30, 87.0, 88.5, 89.0, -103.0, -104.0, 140.0, -140.0,
        ]);
        v.extend([f32::MIN_POSITIVE, 1e-3, -1e-3, 3.0, -3.0, 20.0, -20.0]);
        // a multiple of eight plus a tail of five
        while v.len() % 8 != 5 {
            v.push(0.37);
        }
        v
    }

    #[test]
    fn the_vector_exp_is_close_to_expf() {
        for x in (0..20000).map(|i| (i as f32 - 10000.0) * 0.0085) {
            let (got, want) = (lane::exp(x), x.exp());
            // ggml's routine: at most 1.5 ulp from the true value
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 2, "exp({x}) = {got}, expf {want} ({ulps} ulp)");
        }
        assert_eq!(lane::exp(200.0), f32::INFINITY);
        assert_eq!(lane::exp(-200.0), 0.0);
    }

    /// Every element the same bits wherever it is computed: the vector code on the CPU, one
    /// lane at a time, split among the workers; the tail through `expf` as ggml's scalar
    /// code.
    #[test]
    fn every_element_has_ggmls_bits_whatever_the_path() {
        let x = inputs();
        let g: Vec<f32> = (0..x.len())
            .map(|i| 0.5 + (i as f32 * 0.31).sin())
            .collect();
        let whole = x.len() / LANES * LANES;
        let want: Vec<f32> = (0..x.len())
            .map(|i| match i < whole {
                true => lane::silu(x[i]) * g[i],
                false => x[i] / (1.0 + (-x[i]).exp()) * g[i],
            })
            .collect();
        let mut y = vec![0f32; x.len()];
        swiglu_slice(&x, &g, &mut y);
        for (i, (a, b)) in y.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "x = {} at {i}", x[i]);
        }
        // close to candle's silu (the C library's expf for every element)
        let xt = Tensor::from_vec(x.clone(), x.len(), &Device::Cpu).unwrap();
        let gt = Tensor::from_vec(g.clone(), g.len(), &Device::Cpu).unwrap();
        let theirs: Vec<f32> = (candle_nn::ops::silu(&xt).unwrap() * &gt)
            .unwrap()
            .to_vec1()
            .unwrap();
        let ours: Vec<f32> = swiglu(&xt, &gt).unwrap().to_vec1().unwrap();
        assert_eq!(ours, y);
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{i}: {a} vs {b}");
        }
        // a large tensor (split among the workers), rows of a length that leaves a tail:
        // each row as ggml computes it, alone
        let n = x.len();
        let rows = 40;
        let big: Vec<f32> = x.iter().cycle().take(rows * n).copied().collect();
        let gb: Vec<f32> = g.iter().cycle().take(rows * n).copied().collect();
        let bt = Tensor::from_vec(big.clone(), (rows, n), &Device::Cpu).unwrap();
        let gbt = Tensor::from_vec(gb.clone(), (rows, n), &Device::Cpu).unwrap();
        let split: Vec<f32> = swiglu(&bt, &gbt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for r in 0..rows {
            let mut alone = vec![0f32; n];
            swiglu_slice(
                &big[r * n..(r + 1) * n],
                &gb[r * n..(r + 1) * n],
                &mut alone,
            );
            assert_eq!(&split[r * n..(r + 1) * n], alone.as_slice(), "row {r}");
        }
        // shapes that differ are an error, not a panic
        assert!(swiglu(&xt, &bt).is_err());
    }

    /// The lane code is the AVX2 code: the same bits on every input.
    #[test]
    fn lanes_and_vectors_agree() {
        let x = inputs();
        let whole = x.len() / LANES * LANES;
        let ones = vec![1f32; whole];
        let mut y = vec![0f32; whole];
        swiglu_slice(&x[..whole], &ones, &mut y);
        for (i, &v) in y.iter().enumerate() {
            assert_eq!(v.to_bits(), lane::silu(x[i]).to_bits(), "x = {}", x[i]);
        }
    }
}
