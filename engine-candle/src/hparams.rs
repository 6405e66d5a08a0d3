//! Hyperparameters of a llama-family model (llama, mistral, qwen2) or a Gemma 3, read from
//! GGUF metadata with the defaults llama.cpp gives missing keys.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use crate::error::{EngineError, Result};

/// How RoPE rotates pairs of dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (llama.cpp "norm" mode; GGUF llama weights are permuted for it).
    Interleaved,
    /// First half against second half (llama.cpp "neox" mode, used by Qwen2).
    Halves,
}

/// The feed-forward's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (llama, qwen2).
    Silu,
    /// GeGLU with the tanh approximation (Gemma).
    GeluTanh,
}

/// Local attention layers (Gemma 3): a window of recent positions, their own RoPE base.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    /// A query at position p sees keys at positions > p − window.
    pub window: usize,
    /// Layer `i` is local unless `i % period == period − 1` (llama.cpp's pattern).
    pub period: usize,
    /// RoPE frequency base of the local layers.
    pub rope_base: f32,
}

/// The model shape and numerics the forward pass needs.
#[derive(Debug, Clone)]
pub struct Hparams {
    pub architecture: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Linear RoPE scaling factor (1.0 = none).
    pub rope_linear_factor: f32,
    pub rope_style: RopeStyle,
    pub ctx_train: usize,
    /// Input embeddings are multiplied by this (Gemma: √n_embd).
    pub embed_scale: Option<f32>,
    pub activation: Activation,
    /// Scale of `q·k` (1/√head_dim; Gemma 3 27B: 1/√(n_embd/n_head)).
    pub attn_scale: f32,
    pub sliding_window: Option<SlidingWindow>,
    /// `c·tanh(logit/c)` on the output (`final_logit_softcapping`).
    pub logit_softcap: Option<f32>,
    /// `c·tanh(score/c)` on attention scores (`attn_logit_softcapping`: Gemma 2).
    pub attn_softcap: Option<f32>,
}

pub(crate) fn md_u32(md: &HashMap<String, Value>, key: &str) -> Result<u32> {
    let v = md
        .get(key)
        .ok_or_else(|| EngineError::BadModel(format!("metadata key {key} is missing")))?;
    match v {
        Value::U32(x) => Ok(*x),
        Value::I32(x) if *x >= 0 => Ok(*x as u32),
        Value::U64(x) => u32::try_from(*x).map_err(|_| bad_value(key)),
        Value::I64(x) => u32::try_from(*x).map_err(|_| bad_value(key)),
        Value::U16(x) => Ok(u32::from(*x)),
        Value::U8(x) => Ok(u32::from(*x)),
        _ => Err(bad_value(key)),
    }
}

pub(crate) fn md_f32(md: &HashMap<String, Value>, key: &str) -> Option<f32> {
    match md.get(key)? {
        Value::F32(x) => Some(*x),
        Value::F64(x) => Some(*x as f32),
        _ => None,
    }
}

pub(crate) fn md_str<'a>(md: &'a HashMap<String, Value>, key: &str) -> Option<&'a str> {
    match md.get(key)? {
        Value::String(s) => Some(s.as_str()),
        _ => None,
    }
}

fn bad_value(key: &str) -> EngineError {
    EngineError::BadModel(format!(
        "metadata key {key} has an unexpected type or value"
    ))
}

impl Hparams {
    pub fn from_metadata(md: &HashMap<String, Value>) -> Result<Self> {
        let arch = md_str(md, "general.architecture")
            .ok_or_else(|| EngineError::BadModel("general.architecture is missing".into()))?
            .to_string();
        let gemma3 = arch == "gemma3";
        let gemma2 = arch == "gemma2";
        let rope_style = match arch.as_str() {
            "llama" | "mistral" => RopeStyle::Interleaved,
            "qwen2" | "qwen3" | "gemma2" | "gemma3" | "phi3" => RopeStyle::Halves,
            other => {
                return Err(EngineError::Unsupported(format!(
                    "architecture {other:?} (supported: llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3)"
                )))
            }
        };
        let k = |s: &str| format!("{arch}.{s}");
        let n_head = md_u32(md, &k("attention.head_count"))? as usize;
        let n_head_kv = md_u32(md, &k("attention.head_count_kv")).unwrap_or(n_head as u32) as usize;
        let n_embd = md_u32(md, &k("embedding_length"))? as usize;
        if n_head == 0 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
            return Err(EngineError::BadModel(format!(
                "inconsistent head counts: {n_head} heads, {n_head_kv} kv heads"
            )));
        }
        // a head's width: `attention.key_length` where given (Gemma 3: 256 with 640 wide
        // embeddings over 4 heads), else the embedding shared out
        let key_length = md_u32(md, &k("attention.key_length"))
            .ok()
            .map(|d| d as usize);
        let value_length = md_u32(md, &k("attention.value_length"))
            .ok()
            .map(|d| d as usize);
        let head_dim = match key_length {
            Some(d) => d,
            None if n_embd.is_multiple_of(n_head) => n_embd / n_head,
            None => {
                return Err(EngineError::BadModel(format!(
                    "embedding {n_embd} is not a whole number of {n_head} heads"
                )))
            }
        };
        if value_length.is_some_and(|v| v != head_dim) || head_dim == 0 || head_dim % 2 != 0 {
            return Err(EngineError::Unsupported(format!(
                "heads of {head_dim} key and {value_length:?} value dimensions"
            )));
        }
        let rope_dims = md_u32(md, &k("rope.dimension_count"))
            .map(|d| d as usize)
            .unwrap_or(head_dim);
        if rope_dims != head_dim {
            return Err(EngineError::Unsupported(format!(
                "partial rotary embeddings (rope dims {rope_dims}, head dim {head_dim})"
            )));
        }
        let rope_linear_factor = match md_str(md, &k("rope.scaling.type")) {
            None | Some("none") => 1.0,
            Some("linear") => md_f32(md, &k("rope.scaling.factor")).unwrap_or(1.0),
            Some(other) => {
                return Err(EngineError::Unsupported(format!(
                    "rope scaling type {other:?}"
                )))
            }
        };
        let n_layer = md_u32(md, &k("block_count"))? as usize;
        let rope_base = md_f32(md, &k("rope.freq_base")).unwrap_or(10_000.0);
        let pattern = |default: usize| {
            md_u32(md, &k("attention.sliding_window_pattern")).map_or(default, |p| p as usize)
        };
        let sliding_window = match md_u32(md, &k("attention.sliding_window")) {
            Ok(w) if gemma3 && w > 0 => Some(SlidingWindow {
                window: w as usize,
                period: pattern(6),
                rope_base: md_f32(md, &k("rope.freq_base_swa")).unwrap_or(10_000.0),
            }),
            // Gemma 2: every other layer local, 4,096 positions, one RoPE base (llama.cpp's
            // defaults)
            w if gemma2 => Some(SlidingWindow {
                window: w.map_or(4096, |w| w as usize),
                period: pattern(2),
                rope_base: md_f32(md, &k("rope.freq_base_swa")).unwrap_or(rope_base),
            }),
            _ => None,
        };
        // Gemma 2 27B (46 layers) and 3 27B (62) scale by the embedding's share per head, the
        // others by the head width (llama.cpp, after gemma_pytorch)
        let attn_scale = if (gemma3 && n_layer == 62) || (gemma2 && n_layer == 46) {
            1.0 / ((n_embd / n_head) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        Ok(Self {
            n_layer,
            n_ff: md_u32(md, &k("feed_forward_length"))? as usize,
            n_head,
            n_head_kv,
            n_embd,
            head_dim,
            rms_eps: md_f32(md, &k("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            rope_base,
            rope_linear_factor,
            rope_style,
            ctx_train: md_u32(md, &k("context_length")).unwrap_or(2048) as usize,
            embed_scale: (gemma2 || gemma3).then(|| (n_embd as f32).sqrt()),
            activation: if gemma2 || gemma3 {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            attn_scale,
            sliding_window,
            // Gemma 2 caps both, 30 and 50 unless the file says (llama.cpp's defaults)
            logit_softcap: md_f32(md, &k("final_logit_softcapping"))
                .or(gemma2.then_some(30.0))
                .filter(|c| *c > 0.0),
            attn_softcap: md_f32(md, &k("attn_logit_softcapping"))
                .or(Some(50.0))
                .filter(|c| gemma2 && *c > 0.0),
            architecture: arch,
        })
    }

    /// Whether layer `layer` attends through the sliding window (and its RoPE base).
    pub fn is_local(&self, layer: usize) -> bool {
        self.sliding_window
            .is_some_and(|w| w.period == 0 || layer % w.period < w.period - 1)
    }

    /// Query heads per KV head (grouped-query attention).
    pub fn group_size(&self) -> usize {
        self.n_head / self.n_head_kv
    }
}
