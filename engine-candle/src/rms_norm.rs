//! RMS norm as ggml computes it on the CPU (`ggml_compute_forward_rms_norm_f32`, then the
//! graph's multiplication by the weight): per row the squares summed in f64 in order, the
//! mean rounded to f32, `scale = 1 / sqrtf(mean + eps)`, and `(x · scale) · w` per element.
//! The rows are split among the compute pool's workers (candle's own norm ran on the decode
//! thread alone, its division per element and f32 sum giving other bits than llama.cpp's).

use candle_core::{Result, Tensor};

use crate::cpu_parallel::par_chunks_mut;
use crate::cpu_tensor::{cpu_tensor, with_f32};

/// Elements one worker normalizes at least (a decode step's rows stay on the calling thread).
const PER_JOB: usize = 16 << 10;

/// `x` normalized over its last dimension and multiplied by `w` (that dimension's length):
/// ggml's arithmetic for f32 tensors on the CPU, candle's elsewhere.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let n = x.dims().last().copied().unwrap_or(0);
    let out = with_f32(x, |xs| {
        with_f32(w, |ws| {
            if n == 0 || ws.len() != n {
                return None;
            }
            let mut y = vec![0f32; xs.len()];
            let rows = (PER_JOB / n).max(1);
            par_chunks_mut(&mut y, rows * n, |c, dst| {
                let src = &xs[c * rows * n..];
                for (y, x) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
                    row(x, ws, eps, y);
                }
            });
            Some(y)
        })
    });
    match out.flatten().flatten() {
        Some(y) => cpu_tensor(y, x.shape()),
        None => candle_nn::ops::rms_norm(x, w, eps),
    }
}

fn row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let sum = x.iter().fold(0f64, |s, &v| s + f64::from(v * v));
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((y, &v), &w) in y.iter_mut().zip(x).zip(w) {
        *y = v * scale * w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn rows_are_normalized_with_ggmls_arithmetic() {
        let (rows, n) = (300, 640);
        let xs: Vec<f32> = (0..rows * n)
            .map(|i| (i as f32 * 0.37).sin() * (1 + i % 7) as f32)
            .collect();
        let ws: Vec<f32> = (0..n).map(|i| 0.5 + (i as f32 * 0.11).cos()).collect();
        let x = Tensor::from_vec(xs.clone(), (rows, n), &Device::Cpu).unwrap();
        let w = Tensor::from_vec(ws.clone(), n, &Device::Cpu).unwrap();
        let got: Vec<Vec<f32>> = rms_norm(&x, &w, 1e-6).unwrap().to_vec2().unwrap();
        let exact: Vec<Vec<f32>> = candle_nn::ops::rms_norm(&x, &w, 1e-6)
            .unwrap()
            .to_vec2()
            .unwrap();
        for (r, (g, e)) in got.iter().zip(&exact).enumerate() {
            // every row, wherever it was computed, is ggml's formula
            let x = &xs[r * n..(r + 1) * n];
            let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
            let scale = 1.0 / ((sum / n as f64) as f32 + 1e-6).sqrt();
            for (i, (a, b)) in g.iter().zip(e).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    (x[i] * scale * ws[i]).to_bits(),
                    "row {r} col {i}"
                );
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "row {r} col {i}: {a} vs {b}"
                );
            }
        }
        // a weight of another length is candle's error, not a panic
        let short = Tensor::from_vec(ws[..10].to_vec(), 10, &Device::Cpu).unwrap();
        assert!(rms_norm(&x, &short, 1e-6).is_err());
    }
}
