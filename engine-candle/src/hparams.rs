//! Hyperparameters of a llama-family model, read from GGUF metadata.

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

fn md_f32(md: &HashMap<String, Value>, key: &str) -> Option<f32> {
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
        let rope_style = match arch.as_str() {
            "llama" | "mistral" => RopeStyle::Interleaved,
            "qwen2" => RopeStyle::Halves,
            other => {
                return Err(EngineError::Unsupported(format!(
                    "architecture {other:?} (supported: llama, mistral, qwen2)"
                )))
            }
        };
        let k = |s: &str| format!("{arch}.{s}");
        let n_head = md_u32(md, &k("attention.head_count"))? as usize;
        let n_head_kv = md_u32(md, &k("attention.head_count_kv")).unwrap_or(n_head as u32) as usize;
        let n_embd = md_u32(md, &k("embedding_length"))? as usize;
        if n_head == 0
            || n_head_kv == 0
            || !n_head.is_multiple_of(n_head_kv)
            || !n_embd.is_multiple_of(n_head)
        {
            return Err(EngineError::BadModel(format!(
                "inconsistent head counts: {n_head} heads, {n_head_kv} kv heads, embedding {n_embd}"
            )));
        }
        let head_dim = md_u32(md, &k("rope.dimension_count"))
            .map(|d| d as usize)
            .unwrap_or(n_embd / n_head);
        if head_dim != n_embd / n_head {
            return Err(EngineError::Unsupported(format!(
                "partial rotary embeddings (rope dims {head_dim}, head dim {})",
                n_embd / n_head
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
        Ok(Self {
            n_layer: md_u32(md, &k("block_count"))? as usize,
            n_ff: md_u32(md, &k("feed_forward_length"))? as usize,
            n_head,
            n_head_kv,
            n_embd,
            head_dim,
            rms_eps: md_f32(md, &k("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            rope_base: md_f32(md, &k("rope.freq_base")).unwrap_or(10_000.0),
            rope_linear_factor,
            rope_style,
            ctx_train: md_u32(md, &k("context_length")).unwrap_or(2048) as usize,
            architecture: arch,
        })
    }

    /// Query heads per KV head (grouped-query attention).
    pub fn group_size(&self) -> usize {
        self.n_head / self.n_head_kv
    }
}
