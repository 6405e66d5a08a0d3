//! GeGLU, `gelu(gate) · up` with GELU's tanh form, as ggml computes it on the CPU
//! (`ggml_vec_geglu_f32` under `GGML_GELU_FP16`, its default): the gate rounded to f16 picks
//! one of 65,536 precomputed values (`ggml_table_gelu_f16`: `gelu` of that f16 in f32 with
//! `tanhf`, rounded to f16), except below −10 (0) and from 10 up (the gate itself).
//!
//! The same table gives llama.cpp's values exactly — what Gemma's feed-forward layers multiply
//! next — and replaces a `tanhf` per element (libm's, about a sixth of a Gemma 3 prompt
//! pass) by a lookup.

use std::sync::OnceLock;

use candle_core::{DType, Result, Tensor};
use half::f16;

use crate::cpu_parallel::par_chunks_mut;
use crate::cpu_tensor::{cpu_tensor, with_f32};

const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// ggml's `ggml_gelu_f32`, in its order of operations.
fn gelu_f32(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// `gelu` of every f16 (by its bits), rounded to f16 and widened back.
fn table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let x = f16::from_bits(bits).to_f32();
                f16::from_f32(gelu_f32(x)).to_f32()
            })
            .collect()
    })
}

/// One element of ggml's GeGLU.
fn geglu_one(table: &[f32], x: f32, g: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x * g
    } else {
        table[f16::from_f32(x).to_bits() as usize] * g
    }
}

/// Elements one worker takes at least (a decode step's few stay on the calling thread).
const PER_JOB: usize = 16 << 10;

/// `gelu(gate) · up` for two f32 tensors of one shape on the CPU: ggml's table, the elements
/// split among the compute pool's workers; elsewhere (another device or type) candle's exact
/// `gelu`.
pub(crate) fn geglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if !gate.device().is_cpu() || gate.dtype() != DType::F32 || up.dtype() != DType::F32 {
        return gate.gelu()? * up;
    }
    if gate.shape() != up.shape() {
        candle_core::bail!("geglu: gate {:?} and up {:?}", gate.shape(), up.shape());
    }
    let (gate, up) = (gate.contiguous()?, up.contiguous()?);
    let t = table();
    let out = with_f32(&gate, |xs| {
        with_f32(&up, |gs| {
            let mut y = vec![0f32; xs.len()];
            par_chunks_mut(&mut y, PER_JOB, |c, dst| {
                let o = c * PER_JOB;
                geglu_slice(t, &xs[o..o + dst.len()], &gs[o..o + dst.len()], dst);
            });
            y
        })
    });
    match out.flatten() {
        Some(y) => cpu_tensor(y, gate.shape()),
        None => candle_core::bail!("geglu: a CPU f32 tensor could not be read"),
    }
}

/// `gelu(x)` as ggml computes it on the CPU (`ggml_vec_gelu_f32`, the same table): BERT's
/// feed-forward activation. Elsewhere (another device or type) candle's `gelu`.
pub(crate) fn gelu(x: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 {
        return x.gelu();
    }
    let x = x.contiguous()?;
    let t = table();
    let out = with_f32(&x, |xs| {
        let mut y = vec![0f32; xs.len()];
        par_chunks_mut(&mut y, PER_JOB, |c, dst| {
            let o = c * PER_JOB;
            gelu_slice(t, &xs[o..o + dst.len()], dst);
        });
        y
    });
    match out {
        Some(y) => cpu_tensor(y, x.shape()),
        None => candle_core::bail!("gelu: a CPU f32 tensor could not be read"),
    }
}

/// `y[i] = geglu_one(x[i], g[i])`, eight at a time where the CPU converts to f16 itself.
fn geglu_slice(t: &[f32], x: &[f32], g: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
        // SAFETY: AVX2 and F16C were detected.
        unsafe { geglu_avx2(t, x, Some(g), y) };
        return;
    }
    for ((y, &x), &g) in y.iter_mut().zip(x).zip(g) {
        *y = geglu_one(t, x, g);
    }
}

/// `y[i] = geglu_one(x[i], 1)`: the table's GELU, eight at a time as `geglu_slice`.
fn gelu_slice(t: &[f32], x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
        // SAFETY: AVX2 and F16C were detected.
        unsafe { geglu_avx2(t, x, None, y) };
        return;
    }
    for (y, &x) in y.iter_mut().zip(x) {
        *y = geglu_one(t, x, 1.0);
    }
}

/// `geglu_slice` with F16C's conversion (round to nearest even, as `f16::from_f32`) and a
/// gather from the table: the same value per element.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn geglu_avx2(t: &[f32], x: &[f32], g: Option<&[f32]>, y: &mut [f32]) {
    use std::arch::x86_64::*;
    assert!(t.len() == 1 << 16 && x.len() == y.len() && g.is_none_or(|g| g.len() == y.len()));
    let whole = y.len() - y.len() % 8;
    let (low, high) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let one = _mm256_set1_ps(1.0);
    for i in (0..whole).step_by(8) {
        let xv = _mm256_loadu_ps(x.as_ptr().add(i));
        let gv = match g {
            Some(g) => _mm256_loadu_ps(g.as_ptr().add(i)),
            None => one,
        };
        let bits = _mm256_cvtepu16_epi32(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(xv));
        // SAFETY (of the gather): every 16-bit index is inside the 65,536-entry table
        let tabled = _mm256_mul_ps(_mm256_i32gather_ps::<4>(t.as_ptr(), bits), gv);
        let above = _mm256_cmp_ps::<_CMP_GE_OQ>(xv, high);
        let below = _mm256_cmp_ps::<_CMP_LE_OQ>(xv, low);
        let v = _mm256_blendv_ps(tabled, _mm256_mul_ps(xv, gv), above);
        _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_andnot_ps(below, v));
    }
    for i in whole..y.len() {
        y[i] = geglu_one(t, x[i], g.map_or(1.0, |g| g[i]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_table_is_gelu_rounded_through_f16() {
        let t = table();
        for x in [-9.99f32, -3.0, -0.5, -1e-3, 0.0, 1e-3, 0.5, 1.0, 2.5, 9.99] {
            let want = f16::from_f32(gelu_f32(f16::from_f32(x).to_f32())).to_f32();
            assert_eq!(geglu_one(t, x, 1.0), want, "{x}");
            // close to the exact GELU: f16 rounding of input and output only
            assert!(
                (want - gelu_f32(x)).abs() <= 4e-3 * gelu_f32(x).abs().max(1.0),
                "{x}"
            );
        }
        assert_eq!(geglu_one(t, -10.0, 3.0), 0.0);
        assert_eq!(geglu_one(t, -50.0, 3.0), 0.0);
        assert_eq!(geglu_one(t, 10.0, 3.0), 30.0);
        assert_eq!(geglu_one(t, 12.5, -2.0), -25.0);
        assert_eq!(geglu_one(t, 1.0, 0.0), 0.0);
    }

    #[test]
    fn tensors_multiply_element_by_element() {
        let d = Device::Cpu;
        let gate = Tensor::new(&[[-11.0f32, -1.0, 0.25], [0.0, 3.0, 20.0]], &d).unwrap();
        let up = Tensor::new(&[[5.0f32, 2.0, -4.0], [7.0, 0.5, 0.1]], &d).unwrap();
        let got: Vec<Vec<f32>> = geglu(&gate, &up).unwrap().to_vec2().unwrap();
        let exact: Vec<Vec<f32>> = (gate.gelu().unwrap() * &up).unwrap().to_vec2().unwrap();
        for (a, b) in got.iter().flatten().zip(exact.iter().flatten()) {
            assert!((a - b).abs() <= 5e-3 * b.abs().max(1.0), "{a} vs {b}");
        }
        assert_eq!(got[1][2], 2.0);
        assert!(geglu(&gate, &up.narrow(1, 0, 2).unwrap()).is_err());
    }

    #[test]
    fn every_element_takes_the_tables_value_wherever_it_is_computed() {
        let t = table();
        // every f16 up to ±12 and values between them, against arbitrary multipliers
        let x: Vec<f32> = (0..=u16::MAX)
            .map(|b| f16::from_bits(b).to_f32())
            .filter(|v| v.abs() <= 12.0)
            .flat_map(|v| [v, v + 1e-4, v * 0.9993])
            .collect();
        let g: Vec<f32> = (0..x.len())
            .map(|i| (i as f32 * 0.61).sin() * 4.0)
            .collect();
        let mut y = vec![0f32; x.len()];
        geglu_slice(t, &x, &g, &mut y);
        for i in 0..x.len() {
            assert_eq!(
                y[i].to_bits(),
                geglu_one(t, x[i], g[i]).to_bits(),
                "{}",
                x[i]
            );
        }
        gelu_slice(t, &x, &mut y);
        for i in 0..x.len() {
            assert_eq!(
                y[i].to_bits(),
                geglu_one(t, x[i], 1.0).to_bits(),
                "{}",
                x[i]
            );
        }
    }
}
