//! Loading the quantized weights of a llama-family GGUF, with the load-time weight format choice.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::cpu_quant::{quantized_affine, QuantRows};
use crate::dense_cpu::DenseRows;
use crate::error::{message_of, EngineError, Result};
use crate::hparams::Hparams;
use crate::q4_1_cpu::Q41Matrix;
use crate::q4_k_cpu::Q4KMatrix;
use crate::q5_0_cpu::Q50Matrix;
use crate::q5_k_cpu::Q5KMatrix;
use crate::q6_k_cpu::Q6KMatrix;
use crate::q8_0_cpu::Q80Matrix;

/// How matmul weights are held in memory after loading, and which kernel multiplies them.
///
/// candle's CPU kernel for Q4_1 is scalar, several times slower than its SIMD Q8_0 kernel;
/// re-quantizing to Q8_0 is fast but moves results away from llama.cpp's. `Auto` keeps Q4_1
/// weights as stored and multiplies them on the CPU with this crate's SIMD Q4_1×Q8_1 kernel
/// (eight-row tiles, see `q4_1_cpu.rs`); Q8_0, and Q4_0/Q5_0 (whose values are Q8_0 blocks
/// exactly), go through the Q8_0 kernel (`q8_0_cpu.rs`); Q5_1 (scalar in candle) is
/// re-quantized to Q8_0; Q4_K, Q5_K and Q6_K (what Q4_K_M and Q5_K_M files are made of) go
/// through this crate's K-quant kernels with llama.cpp's arithmetic (`q4_k_cpu.rs`,
/// `q5_k_cpu.rs`, `q6_k_cpu.rs`); the rest (Q2_K, Q3_K) use candle's kernels. Figures in `.specs/engine.md`
/// (ENG-WFMT-1, ENG-WFMT-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// The fastest kernel that keeps the stored values (see above).
    #[default]
    Auto,
    /// Every tensor as stored, candle's kernels only.
    AsStored,
    /// Re-quantize every 2-D matmul weight to Q8_0, candle's kernels.
    Q8_0,
}

/// A matmul weight with the kernel that multiplies it.
pub(crate) enum Linear {
    Candle(QMatMul),
    /// On an accelerator, whatever the weight format: the weight (as stored for `Auto`, else
    /// in the format's type) dequantized to f32 `[n, k]` once, through the BLAS matmul (cuBLAS)
    /// at every batch size. candle 0.11.1's CUDA MMQ kernel (its quantized
    /// path above 8 rows) gave non-finite results on an H200 — Q4_1 weights of 192, 576 and
    /// 1536 rows in `tests/device_kernels.rs` (which ones varied between runs), NaN logits for
    /// whole prompts through the default model's Q8_0 weights — and one path for every batch
    /// size keeps a sequence's numbers independent of how many rows share its pass
    /// (ENG-BATCH-1). Four bytes a weight: 540 MB for the default model (ENG-CUDA-3).
    Dense(Tensor),
    /// Q4_1 on the CPU with the eight-row-tile SIMD kernel.
    Q41(Q41Matrix),
    /// Q5_0 on the CPU, five bits a value in eight-row tiles.
    Q50(Q50Matrix),
    /// Q8_0 on the CPU with the llama.cpp-arithmetic SIMD kernel.
    Q80(Q80Matrix),
    /// Q4_K on the CPU with llama.cpp's arithmetic, four activation rows per weight pass.
    Q4K(Q4KMatrix),
    /// Q5_K on the CPU, likewise.
    Q5K(Q5KMatrix),
    /// Q6_K on the CPU, likewise.
    Q6K(Q6KMatrix),
    /// Float weights of an encoder on the CPU: gemm on the compute pool (`dense_cpu.rs`).
    Float(DenseRows),
}

/// `f(dims, m, floats)` of `x[.., k]` for the own CPU kernels of `ws`: its leading dims, its
/// `m` rows and its floats — borrowed where `x` is a contiguous f32 CPU tensor (an encoder's
/// 282 × 1,536 activations were copied out on one thread before every matmul), else copied.
fn with_cpu_input<R>(
    x: &Tensor,
    ws: &[&dyn QuantRows],
    f: impl FnOnce(Vec<usize>, usize, &[f32]) -> R,
) -> candle_core::Result<R> {
    let mut dims = x.dims().to_vec();
    let k = dims.pop().unwrap_or(0);
    if let Some(w) = ws.iter().find(|w| w.k() != k) {
        candle_core::bail!("matmul: input has {k} columns, weight has {}", w.k());
    }
    let m: usize = dims.iter().product();
    let mut f = Some(f);
    let mut call = |xs: &[f32]| f.take().map(|f| f(dims.clone(), m, xs));
    if let Some(Some(r)) = crate::cpu_tensor::with_f32(x, &mut call) {
        return Ok(r);
    }
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    call(&xs).ok_or_else(|| candle_core::Error::Msg("matmul: input taken twice".into()))
}

/// `x[.., k]` through own CPU kernels, several weights sharing `k` at once: `[.., n_i]` each.
fn cpu_matmuls(
    x: &Tensor,
    ws: &[&dyn QuantRows],
    biases: &[Option<&[f32]>],
) -> candle_core::Result<Vec<Tensor>> {
    let (dims, outs) = with_cpu_input(x, ws, |dims, m, xs| {
        (dims, quantized_affine(ws, biases, xs, m))
    })?;
    outs.into_iter()
        .zip(ws)
        .map(|(out, w)| {
            let mut d = dims.clone();
            d.push(w.n());
            Tensor::from_vec(out, d, x.device())
        })
        .collect()
}

impl Linear {
    /// The own CPU kernel of this weight, if it has one.
    fn cpu_rows(&self) -> Option<&dyn QuantRows> {
        match self {
            Self::Candle(_) | Self::Dense(_) => None,
            Self::Q41(w) => Some(w),
            Self::Q50(w) => Some(w),
            Self::Q80(w) => Some(w),
            Self::Q4K(w) => Some(w),
            Self::Q5K(w) => Some(w),
            Self::Q6K(w) => Some(w),
            Self::Float(w) => Some(w),
        }
    }

    /// `x[.., k]` times the weight's transpose: `[.., n]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match (self, self.cpu_rows()) {
            (_, Some(w)) => Ok(cpu_matmuls(x, &[w], &[])?.remove(0)),
            (Self::Candle(q), None) => q.forward(x),
            (Self::Dense(w), None) => x.broadcast_matmul(&w.t()?),
            _ => candle_core::bail!("matmul: weight without a kernel"),
        }
    }

    /// [`Self::forward`] of a `[m, k]` input as `m` rows of `n` floats (the logits): with an
    /// own CPU kernel the same numbers without a tensor to copy them out of.
    pub fn forward_rows(&self, x: &Tensor) -> candle_core::Result<Vec<Vec<f32>>> {
        let Some(w) = self.cpu_rows() else {
            return self
                .forward(x)?
                .to_dtype(candle_core::DType::F32)?
                .to_vec2();
        };
        with_cpu_input(x, &[w], |_, m, xs| {
            crate::cpu_quant::quantized_rows(w, xs, m)
        })
    }

    /// `x` times several weights: with own CPU kernels in one pass (the activations are
    /// quantized once, one parallel job), else one after another. Same results either way.
    pub fn forward_all<const N: usize>(
        ls: [&Linear; N],
        x: &Tensor,
    ) -> candle_core::Result<[Tensor; N]> {
        Self::forward_all_biased(ls, [None; N], x)
    }

    /// [`Self::forward_all`] plus each weight's bias where given (the tensor, and its values
    /// for the own CPU kernels, which add it as they write the result).
    pub fn forward_all_biased<const N: usize>(
        ls: [&Linear; N],
        biases: [Option<(&Tensor, &[f32])>; N],
        x: &Tensor,
    ) -> candle_core::Result<[Tensor; N]> {
        let rows: Option<Vec<&dyn QuantRows>> = ls.iter().map(|l| l.cpu_rows()).collect();
        let outs = match rows {
            Some(ws) => cpu_matmuls(x, &ws, &biases.map(|b| b.map(|(_, v)| v)))?,
            None => ls
                .iter()
                .zip(biases)
                .map(|(l, b)| {
                    let y = l.forward(x)?;
                    match b {
                        Some((t, _)) => y.broadcast_add(t),
                        None => Ok(y),
                    }
                })
                .collect::<candle_core::Result<_>>()?,
        };
        outs.try_into()
            .map_err(|_| candle_core::Error::Msg("matmul: result count".into()))
    }
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "as-stored" => Ok(Self::AsStored),
            "q8_0" => Ok(Self::Q8_0),
            other => Err(format!(
                "unknown weight format {other:?} (auto | as-stored | q8_0)"
            )),
        }
    }
}

/// One transformer block.
pub(crate) struct Layer {
    pub attn_norm: Tensor,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub bq: Option<Tensor>,
    pub bk: Option<Tensor>,
    pub bv: Option<Tensor>,
    pub wo: Linear,
    /// Per-head RMS norms of queries and keys (`attn_q_norm`, `attn_k_norm`: Gemma 3).
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    /// RMS norms of the attention's and the feed-forward's outputs before each residual add
    /// (`post_attention_norm`, `post_ffw_norm`: Gemma 3).
    pub post_attn_norm: Option<Tensor>,
    pub post_ffw_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub w_gate: Linear,
    pub w_up: Linear,
    pub w_down: Linear,
}

/// All weights of the model, ready for the forward pass.
pub(crate) struct Weights {
    pub tok_embd: QTensor,
    pub layers: Vec<Layer>,
    pub out_norm: Tensor,
    pub output: Linear,
    /// Per-dimension RoPE frequency divisors (`rope_freqs.weight`), when the model has them.
    pub rope_freqs: Option<Vec<f32>>,
}

pub(crate) struct GgufFile {
    pub content: gguf_file::Content,
    reader: BufReader<File>,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| EngineError::ModelFile {
            path: path.display().to_string(),
            source,
        })?;
        let mut reader = BufReader::new(file);
        let content = gguf_file::Content::read(&mut reader).map_err(|e| {
            EngineError::BadModel(format!("{}: {}", path.display(), message_of(&e)))
        })?;
        Ok(Self { content, reader })
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    pub(crate) fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        self.content
            .tensor(&mut self.reader, name, device)
            .map_err(|e| EngineError::BadModel(format!("tensor {name}: {}", message_of(&e))))
    }

    pub(crate) fn dense(&mut self, name: &str, device: &Device) -> Result<Tensor> {
        Ok(self.qtensor(name, device)?.dequantize(device)?)
    }

    pub(crate) fn matmul(
        &mut self,
        name: &str,
        device: &Device,
        format: WeightFormat,
    ) -> Result<Linear> {
        let q = self.qtensor(name, device)?;
        linear(q, device, format)
    }

    /// [`Self::matmul`] for an encoder: float weights on the CPU through [`DenseRows`], whose
    /// passes of hundreds of rows are where the time goes. (The decoders keep candle's matmul
    /// for them: their results are bit-for-bit independent of the batch, ENG-BATCH-1, which
    /// gemm's blocking does not promise.)
    pub(crate) fn encoder_matmul(
        &mut self,
        name: &str,
        device: &Device,
        format: WeightFormat,
    ) -> Result<Linear> {
        let q = self.qtensor(name, device)?;
        encoder_linear(q, device, format)
    }

    /// [`Self::split`] for an encoder (its kernels as [`Self::encoder_matmul`] picks them).
    pub(crate) fn encoder_split(
        &mut self,
        name: &str,
        rows: &[usize],
        device: &Device,
        format: WeightFormat,
    ) -> Result<Vec<Linear>> {
        self.split_with(name, rows, device, format, encoder_linear)
    }

    /// A fused weight (`attn_qkv`, Phi-3's `ffn_up` holding gate and up) cut into its parts of
    /// `rows` rows each, in order.
    fn split(
        &mut self,
        name: &str,
        rows: &[usize],
        device: &Device,
        format: WeightFormat,
    ) -> Result<Vec<Linear>> {
        self.split_with(name, rows, device, format, linear)
    }

    fn split_with(
        &mut self,
        name: &str,
        rows: &[usize],
        device: &Device,
        format: WeightFormat,
        kernel: fn(QTensor, &Device, WeightFormat) -> Result<Linear>,
    ) -> Result<Vec<Linear>> {
        let q = self.qtensor(name, &Device::Cpu)?;
        let (n, k) = q.shape().dims2()?;
        if rows.iter().sum::<usize>() != n {
            return Err(EngineError::BadModel(format!(
                "tensor {name}: {n} rows, expected {} ({rows:?})",
                rows.iter().sum::<usize>()
            )));
        }
        let dtype = q.dtype();
        let row_bytes = k / dtype.block_size() * dtype.type_size();
        let data = q.data()?;
        let mut at = 0;
        let mut out = Vec::with_capacity(rows.len());
        for &r in rows {
            let part = candle_core::quantized::ggml_file::qtensor_from_ggml(
                dtype,
                &data[at * row_bytes..(at + r) * row_bytes],
                vec![r, k],
                device,
            )?;
            out.push(kernel(part, device, format)?);
            at += r;
        }
        Ok(out)
    }
}

/// [`linear`] for an encoder: float weights on the CPU through [`DenseRows`].
fn encoder_linear(q: QTensor, device: &Device, format: WeightFormat) -> Result<Linear> {
    if device.is_cpu() && format != WeightFormat::Q8_0 {
        if let Some(d) = DenseRows::from_qtensor(&q)? {
            return Ok(Linear::Float(d));
        }
    }
    linear(q, device, format)
}

/// A matmul weight with the kernel `format` picks for it on `device`.
fn linear(q: QTensor, device: &Device, format: WeightFormat) -> Result<Linear> {
    if !device.is_cpu() && format == WeightFormat::Auto {
        // the stored values exactly, whatever they were quantized to
        return Ok(Linear::Dense(q.dequantize(device)?));
    }
    if format == WeightFormat::Auto && device.is_cpu() {
        if let Some(m) = Q41Matrix::from_qtensor(&q) {
            return Ok(Linear::Q41(m));
        }
        if let Some(m) = Q50Matrix::from_qtensor(&q) {
            return Ok(Linear::Q50(m));
        }
        if let Some(m) = Q80Matrix::from_qtensor(&q) {
            return Ok(Linear::Q80(m));
        }
        if let Some(m) = Q4KMatrix::from_qtensor(&q) {
            return Ok(Linear::Q4K(m));
        }
        if let Some(m) = Q5KMatrix::from_qtensor(&q) {
            return Ok(Linear::Q5K(m));
        }
        if let Some(m) = Q6KMatrix::from_qtensor(&q) {
            return Ok(Linear::Q6K(m));
        }
    }
    let target = match (format, q.dtype()) {
        (WeightFormat::AsStored, _) => None,
        (WeightFormat::Q8_0, GgmlDType::Q8_0) => None,
        (WeightFormat::Q8_0, _) => Some(GgmlDType::Q8_0),
        (WeightFormat::Auto, GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1) => {
            Some(GgmlDType::Q8_0)
        }
        (WeightFormat::Auto, _) => None,
    };
    let q = match target {
        Some(dtype)
            if q.shape()
                .dims()
                .last()
                .is_some_and(|k| k.is_multiple_of(dtype.block_size())) =>
        {
            let dense = q.dequantize(device)?;
            QTensor::quantize(&dense, dtype)?
        }
        _ => q,
    };
    if !device.is_cpu() {
        // the format's values, through the one kernel that is right on an accelerator
        return Ok(Linear::Dense(q.dequantize(device)?));
    }
    Ok(Linear::Candle(QMatMul::from_qtensor(q)?))
}

impl GgufFile {
    pub fn load_weights(
        &mut self,
        hp: &Hparams,
        device: &Device,
        format: WeightFormat,
    ) -> Result<Weights> {
        if let Some(name) = ["rope_factors_long.weight", "blk.0.rope_factors_long.weight"]
            .into_iter()
            .find(|n| self.has(n))
        {
            return Err(EngineError::Unsupported(format!(
                "LongRoPE ({name}: Phi-3's 128k context models)"
            )));
        }
        let tok_embd = self.qtensor("token_embd.weight", device)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for i in 0..hp.n_layer {
            let p = format!("blk.{i}");
            let optional = |this: &mut Self, name: String| -> Result<Option<Tensor>> {
                if this.has(&name) {
                    Ok(Some(this.dense(&name, device)?))
                } else {
                    Ok(None)
                }
            };
            let bq = optional(self, format!("{p}.attn_q.bias"))?;
            let bk = optional(self, format!("{p}.attn_k.bias"))?;
            let bv = optional(self, format!("{p}.attn_v.bias"))?;
            let q_norm = optional(self, format!("{p}.attn_q_norm.weight"))?;
            let k_norm = optional(self, format!("{p}.attn_k_norm.weight"))?;
            let post_attn_norm = optional(self, format!("{p}.post_attention_norm.weight"))?;
            let post_ffw_norm = optional(self, format!("{p}.post_ffw_norm.weight"))?;
            let qkv = format!("{p}.attn_qkv.weight");
            let [wq, wk, wv] = if self.has(&qkv) {
                // fused (Phi-3): queries, keys, values by rows
                let kv = hp.n_head_kv * hp.head_dim;
                let parts = self.split(&qkv, &[hp.n_head * hp.head_dim, kv, kv], device, format)?;
                <[Linear; 3]>::try_from(parts)
                    .map_err(|_| EngineError::BadModel(format!("{qkv}: three parts")))?
            } else {
                [
                    self.matmul(&format!("{p}.attn_q.weight"), device, format)?,
                    self.matmul(&format!("{p}.attn_k.weight"), device, format)?,
                    self.matmul(&format!("{p}.attn_v.weight"), device, format)?,
                ]
            };
            let gate = format!("{p}.ffn_gate.weight");
            let up = format!("{p}.ffn_up.weight");
            let [w_gate, w_up] = if self.has(&gate) {
                [
                    self.matmul(&gate, device, format)?,
                    self.matmul(&up, device, format)?,
                ]
            } else {
                // fused (Phi-3): the gate's rows, then the up projection's
                let parts = self.split(&up, &[hp.n_ff, hp.n_ff], device, format)?;
                <[Linear; 2]>::try_from(parts)
                    .map_err(|_| EngineError::BadModel(format!("{up}: two parts")))?
            };
            layers.push(Layer {
                attn_norm: self.dense(&format!("{p}.attn_norm.weight"), device)?,
                wq,
                wk,
                wv,
                bq,
                bk,
                bv,
                wo: self.matmul(&format!("{p}.attn_output.weight"), device, format)?,
                q_norm,
                k_norm,
                post_attn_norm,
                post_ffw_norm,
                ffn_norm: self.dense(&format!("{p}.ffn_norm.weight"), device)?,
                w_gate,
                w_up,
                w_down: self.matmul(&format!("{p}.ffn_down.weight"), device, format)?,
            });
        }
        let out_norm = self.dense("output_norm.weight", device)?;
        let output_name = if self.has("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let output = self.matmul(output_name, device, format)?;
        let rope_freqs = if self.has("rope_freqs.weight") {
            Some(
                self.dense("rope_freqs.weight", &Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            )
        } else {
            None
        };
        Ok(Weights {
            tok_embd,
            layers,
            out_norm,
            output,
            rope_freqs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ENG-WFMT-4: every K-quant a GGUF may hold — Q2_K and Q3_K through candle's kernels, Q4_K,
    /// Q5_K and Q6_K through ours — loads as a matmul weight and multiplies like its
    /// dequantized values, to within what quantizing the activations to 8 bits may move
    /// (half a step of each 256-element block, times the weights it meets) and f32 sums.
    #[test]
    fn every_k_quant_multiplies_like_its_dequantized_weights() {
        let (n, k, m) = (40, 768, 5);
        let cpu = Device::Cpu;
        let f = |i: usize, s: f32| ((i as f32 * 0.7317).sin() * s).tanh();
        let x: Vec<f32> = (0..m * k).map(|i| f(i, 3.1) * (1 + i % 5) as f32).collect();
        let xt = Tensor::from_vec(x.clone(), (m, k), &cpu).unwrap();
        for dtype in [
            GgmlDType::Q2K,
            GgmlDType::Q3K,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
        ] {
            let w: Vec<f32> = (0..n * k).map(|i| f(i + 17, 1.9) * 0.2).collect();
            let q = QTensor::quantize(&Tensor::from_vec(w, (n, k), &cpu).unwrap(), dtype).unwrap();
            let deq: Vec<f32> = q
                .dequantize(&cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let lin = linear(q, &cpu, WeightFormat::Auto).unwrap();
            let y: Vec<f32> = lin
                .forward(&xt)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            for r in 0..m {
                let xr = &x[r * k..(r + 1) * k];
                for j in 0..n {
                    let wj = &deq[j * k..(j + 1) * k];
                    let exact: f64 = xr
                        .iter()
                        .zip(wj)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    let bound: f64 = xr
                        .chunks(256)
                        .zip(wj.chunks(256))
                        .map(|(xb, wb)| {
                            let step = xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                            wb.iter().map(|w| f64::from(w.abs())).sum::<f64>()
                                * f64::from(step)
                                * 0.5
                        })
                        .sum::<f64>()
                        * 1.02
                        + 1e-4 * exact.abs()
                        + 1e-5;
                    let got = f64::from(y[r * n + j]);
                    assert!(
                        (got - exact).abs() <= bound,
                        "{dtype:?} row {r} col {j}: {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }
}
