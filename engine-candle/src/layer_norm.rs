//! LayerNorm of a residual sum as ggml computes it on the CPU (`ggml_compute_forward_norm_f32`,
//! then the graph's weight and bias): per row the mean summed in f64, the centred squares
//! summed in f64, `scale = 1 / sqrtf(variance + eps)`, and `(x − mean) · scale · w + b` per
//! element. The residual's two terms are added as each row is read (no tensor of the sum).
//! The rows are split among the compute pool's workers: candle's own norm runs on rayon's
//! threads, which found the cores held by the pool's spinning workers (an encoder pass lost
//! most of a core to it on 2 cores).

use candle_core::{Result, Tensor};

use crate::cpu_parallel::par_chunks_mut;
use crate::cpu_tensor::{cpu_tensor, with_f32};

/// Elements one worker normalizes at least (a few tokens' rows stay on the calling thread).
const PER_JOB: usize = 16 << 10;

/// `a + b` normalized over its last dimension, times `w`, plus `bias` (that dimension's
/// length each): ggml's arithmetic for contiguous f32 tensors on the CPU, candle's elsewhere.
pub(crate) fn add_layer_norm(
    a: &Tensor,
    b: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    let out = (a.shape() == b.shape())
        .then(|| with_f32(b, |xb| norm(a, Some(xb), w, bias, eps)))
        .flatten()
        .flatten();
    match out {
        Some(y) => cpu_tensor(y, a.shape()),
        None => candle_nn::ops::layer_norm(&(a + b)?, w, bias, eps),
    }
}

/// `x` normalized as `add_layer_norm` does, with no second term.
pub(crate) fn layer_norm(x: &Tensor, w: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor> {
    match norm(x, None, w, bias, eps) {
        Some(y) => cpu_tensor(y, x.shape()),
        None => candle_nn::ops::layer_norm(x, w, bias, eps),
    }
}

/// The rows of `a` (plus `b`'s) normalized, when every tensor is contiguous f32 on the CPU.
fn norm(a: &Tensor, b: Option<&[f32]>, w: &Tensor, bias: &Tensor, eps: f32) -> Option<Vec<f32>> {
    let n = a.dims().last().copied().unwrap_or(0);
    let ws = with_f32(w, <[f32]>::to_vec)?;
    let bs = with_f32(bias, <[f32]>::to_vec)?;
    with_f32(a, |xa| {
        if n == 0 || ws.len() != n || bs.len() != n || b.is_some_and(|b| b.len() != xa.len()) {
            return None;
        }
        let mut y = vec![0f32; xa.len()];
        let rows = (PER_JOB / n).max(1);
        par_chunks_mut(&mut y, rows * n, |c, dst| {
            let at = c * rows * n;
            for (i, y) in dst.chunks_exact_mut(n).enumerate() {
                let span = at + i * n..at + (i + 1) * n;
                let second = b.map(|b| &b[span.clone()]);
                row(&xa[span], second, &ws, &bs, eps, y);
            }
        });
        Some(y)
    })
    .flatten()
}

fn row(a: &[f32], b: Option<&[f32]>, w: &[f32], bias: &[f32], eps: f32, y: &mut [f32]) {
    let n = a.len();
    match b {
        Some(b) => {
            for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                *y = a + b;
            }
        }
        None => y.copy_from_slice(a),
    }
    let mean = (y.iter().fold(0f64, |s, &v| s + f64::from(v)) / n as f64) as f32;
    let mut sum2 = 0f64;
    for v in y.iter_mut() {
        *v -= mean;
        sum2 += f64::from(*v * *v);
    }
    let variance = (sum2 / n as f64) as f32;
    let scale = 1.0 / (variance + eps).sqrt();
    for ((y, &w), &b) in y.iter_mut().zip(w).zip(bias) {
        *y = *y * scale * w + b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Every row, wherever it was computed, within f32 rounding of candle's LayerNorm of the
    /// sum (many rows: several chunks over the pool).
    #[test]
    fn rows_of_a_sum_are_normalized() {
        let (rows, n) = (300, 384);
        let d = Device::Cpu;
        let v = |salt: f32| -> Vec<f32> {
            (0..rows * n)
                .map(|i| (i as f32 * 0.37 + salt).sin() * (1 + i % 7) as f32)
                .collect()
        };
        let a = Tensor::from_vec(v(0.0), (rows, n), &d).unwrap();
        let b = Tensor::from_vec(v(1.3), (rows, n), &d).unwrap();
        let w: Vec<f32> = (0..n).map(|i| 0.5 + (i as f32 * 0.11).cos()).collect();
        let bias: Vec<f32> = (0..n).map(|i| (i as f32 * 0.07).sin() * 0.1).collect();
        let w = Tensor::from_vec(w, n, &d).unwrap();
        let bias = Tensor::from_vec(bias, n, &d).unwrap();
        let got: Vec<Vec<f32>> = add_layer_norm(&a, &b, &w, &bias, 1e-12)
            .unwrap()
            .to_vec2()
            .unwrap();
        let want: Vec<Vec<f32>> = candle_nn::ops::layer_norm(&(&a + &b).unwrap(), &w, &bias, 1e-12)
            .unwrap()
            .to_vec2()
            .unwrap();
        for (r, (g, e)) in got.iter().zip(&want).enumerate() {
            for (i, (x, y)) in g.iter().zip(e).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                    "[{r}, {i}] {x} vs {y}"
                );
            }
        }
        let one: Vec<Vec<f32>> = layer_norm(&(&a + &b).unwrap(), &w, &bias, 1e-12)
            .unwrap()
            .to_vec2()
            .unwrap();
        assert_eq!(one, got);
        // a sum of another shape: candle's path, which refuses it
        assert!(add_layer_norm(&a, &b.narrow(0, 0, 2).unwrap(), &w, &bias, 1e-12).is_err());
    }
}
