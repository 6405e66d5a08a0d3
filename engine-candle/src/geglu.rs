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

/// `gelu(gate) · up` for two f32 tensors of one shape on the CPU: ggml's table; elsewhere
/// (another device or type) candle's exact `gelu`.
pub(crate) fn geglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if !gate.device().is_cpu() || gate.dtype() != DType::F32 || up.dtype() != DType::F32 {
        return gate.gelu()? * up;
    }
    if gate.shape() != up.shape() {
        candle_core::bail!("geglu: gate {:?} and up {:?}", gate.shape(), up.shape());
    }
    let xs = gate.flatten_all()?.to_vec1::<f32>()?;
    let gs = up.flatten_all()?.to_vec1::<f32>()?;
    let t = table();
    let out: Vec<f32> = xs
        .iter()
        .zip(&gs)
        .map(|(&x, &g)| geglu_one(t, x, g))
        .collect();
    Tensor::from_vec(out, gate.shape(), gate.device())
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
}
