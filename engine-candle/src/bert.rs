//! BERT encoders as llama.cpp stores them (`general.architecture = bert`: all-MiniLM, BGE,
//! E5, rerankers): absolute positions, bidirectional attention, a post-norm block (attention,
//! add, LayerNorm; GELU feed-forward, add, LayerNorm), weights with biases. Token types are
//! all 0, as llama.cpp feeds them. The matmuls are the decoders' (`weights.rs`: every weight
//! format, own CPU kernels where there are), over every token of a batch together; attention
//! runs per sequence over exactly its tokens, so no sequence's result depends on the others
//! (on the CPU one job per sequence and head on the compute pool: `encoder_attention.rs`).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use candle_core::{Device, Tensor};

use crate::error::{EngineError, Result};
use crate::hparams::{md_f32, md_str, md_u32};
use crate::pooling::Pooling;
use crate::weights::{GgufFile, Linear, WeightFormat};

/// What a BERT's GGUF says of its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct BertHparams {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    /// Positions the model was trained for (its position embeddings' rows).
    pub ctx_train: usize,
    pub eps: f32,
    /// `bert.pooling_type`; mean when the file names none.
    pub pooling: Pooling,
}

impl BertHparams {
    pub fn from_metadata(md: &HashMap<String, Value>) -> Result<Self> {
        let arch = md_str(md, "general.architecture").unwrap_or("");
        if arch != "bert" {
            return Err(EngineError::Unsupported(format!(
                "encoder architecture {arch:?} (supported: bert)"
            )));
        }
        let u = |k: &str| md_u32(md, &format!("bert.{k}")).map(|v| v as usize);
        let hp = Self {
            n_embd: u("embedding_length")?,
            n_head: u("attention.head_count")?,
            n_layer: u("block_count")?,
            n_ff: u("feed_forward_length")?,
            ctx_train: u("context_length")?,
            eps: md_f32(md, "bert.attention.layer_norm_epsilon").unwrap_or(1e-12),
            pooling: match md_u32(md, "bert.pooling_type") {
                Ok(n) => Pooling::from_gguf(n).ok_or_else(|| {
                    EngineError::Unsupported(format!(
                        "bert.pooling_type {n} (0 none, 1 mean, 2 cls, 3 last, 4 rank)"
                    ))
                })?,
                Err(_) => Pooling::Mean,
            },
        };
        if hp.n_head == 0 || !hp.n_embd.is_multiple_of(hp.n_head) || hp.n_layer == 0 {
            return Err(EngineError::BadModel(format!(
                "bert: {} wide over {} heads, {} layers",
                hp.n_embd, hp.n_head, hp.n_layer
            )));
        }
        Ok(hp)
    }
}

/// A matmul weight and its bias.
struct Affine {
    w: Linear,
    b: Option<Tensor>,
}

impl Affine {
    fn load(f: &mut GgufFile, name: &str, device: &Device, format: WeightFormat) -> Result<Self> {
        let w = f.encoder_matmul(&format!("{name}.weight"), device, format)?;
        let bias = format!("{name}.bias");
        let b = if f.has(&bias) {
            Some(f.dense(&bias, device)?)
        } else {
            None
        };
        Ok(Self { w, b })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.w.forward(x)?;
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// A LayerNorm's weight and bias.
struct Norm {
    w: Tensor,
    b: Tensor,
}

impl Norm {
    fn load(f: &mut GgufFile, name: &str, device: &Device) -> Result<Self> {
        Ok(Self {
            w: f.dense(&format!("{name}.weight"), device)?,
            b: f.dense(&format!("{name}.bias"), device)?,
        })
    }

    fn forward(&self, x: &Tensor, eps: f32) -> Result<Tensor> {
        Ok(candle_nn::ops::layer_norm(x, &self.w, &self.b, eps)?)
    }
}

struct Block {
    q: Affine,
    k: Affine,
    v: Affine,
    out: Affine,
    attn_norm: Norm,
    up: Affine,
    down: Affine,
    out_norm: Norm,
}

/// A loaded BERT.
pub(crate) struct Bert {
    pub hp: BertHparams,
    tok_embd: Tensor,
    pos_embd: Tensor,
    /// The embedding of token type 0, when the model has token types.
    type0: Option<Tensor>,
    embd_norm: Norm,
    blocks: Vec<Block>,
    /// The classification head of a reranker (`cls`: dense then tanh; `cls.output`: the
    /// scores), when the file has one.
    cls: Option<Affine>,
    cls_out: Option<Affine>,
    device: Device,
}

impl Bert {
    pub fn load(
        f: &mut GgufFile,
        hp: BertHparams,
        device: &Device,
        format: WeightFormat,
    ) -> Result<Self> {
        let tok_embd = f.dense("token_embd.weight", device)?;
        let pos_embd = f.dense("position_embd.weight", device)?;
        let type0 = if f.has("token_types.weight") {
            Some(f.dense("token_types.weight", device)?.narrow(0, 0, 1)?)
        } else {
            None
        };
        let embd_norm = Norm::load(f, "token_embd_norm", device)?;
        let mut blocks = Vec::with_capacity(hp.n_layer);
        for i in 0..hp.n_layer {
            let p = format!("blk.{i}");
            blocks.push(Block {
                q: Affine::load(f, &format!("{p}.attn_q"), device, format)?,
                k: Affine::load(f, &format!("{p}.attn_k"), device, format)?,
                v: Affine::load(f, &format!("{p}.attn_v"), device, format)?,
                out: Affine::load(f, &format!("{p}.attn_output"), device, format)?,
                attn_norm: Norm::load(f, &format!("{p}.attn_output_norm"), device)?,
                up: Affine::load(f, &format!("{p}.ffn_up"), device, format)?,
                down: Affine::load(f, &format!("{p}.ffn_down"), device, format)?,
                out_norm: Norm::load(f, &format!("{p}.layer_output_norm"), device)?,
            });
        }
        let head = |f: &mut GgufFile, name: &str| -> Result<Option<Affine>> {
            if f.has(&format!("{name}.weight")) {
                Ok(Some(Affine::load(f, name, device, format)?))
            } else {
                Ok(None)
            }
        };
        let cls = head(f, "cls")?;
        let cls_out = head(f, "cls.output")?;
        if hp.pooling == Pooling::Rank && cls.is_none() && cls_out.is_none() {
            return Err(EngineError::BadModel(
                "bert: pooling rank without a classification head (cls, cls.output)".into(),
            ));
        }
        let (rows, width) = pos_embd.dims2()?;
        if width != hp.n_embd || rows < hp.ctx_train {
            return Err(EngineError::BadModel(format!(
                "bert: position embeddings {rows}x{width} for {} positions of {}",
                hp.ctx_train, hp.n_embd
            )));
        }
        Ok(Self {
            hp,
            tok_embd,
            pos_embd,
            type0,
            embd_norm,
            blocks,
            cls,
            cls_out,
            device: device.clone(),
        })
    }

    /// The last hidden states of each sequence (`t` rows of `n_embd`, row-major): every
    /// token of every sequence through the matmuls together, attention per sequence.
    pub fn forward(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let hp = &self.hp;
        if seqs.is_empty() || seqs.iter().any(|s| s.is_empty()) {
            return Err(EngineError::InvalidParams("empty encoder batch".into()));
        }
        if let Some(s) = seqs.iter().find(|s| s.len() > hp.ctx_train) {
            return Err(EngineError::ContextOverflow {
                prompt_tokens: s.len(),
                max_tokens: 0,
                ctx: hp.ctx_train,
            });
        }
        let ids: Vec<u32> = seqs.iter().flat_map(|s| s.iter().copied()).collect();
        let ids_len = ids.len();
        let positions: Vec<u32> = seqs.iter().flat_map(|s| 0..s.len() as u32).collect();
        let ids = Tensor::new(ids.as_slice(), &self.device)?;
        let positions = Tensor::new(positions.as_slice(), &self.device)?;
        let mut x = self
            .tok_embd
            .index_select(&ids, 0)?
            .add(&self.pos_embd.index_select(&positions, 0)?)?;
        if let Some(t) = &self.type0 {
            x = x.broadcast_add(t)?;
        }
        x = self.embd_norm.forward(&x, hp.eps)?;
        let (nh, hd) = (hp.n_head, hp.n_embd / hp.n_head);
        let scale = 1.0 / (hd as f64).sqrt();
        let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        for b in &self.blocks {
            let [q, k, v] = self.qkv(b, &x)?;
            let attn = if self.device.is_cpu() {
                let flat =
                    |m: &Tensor| -> Result<Vec<f32>> { Ok(m.flatten_all()?.to_vec1::<f32>()?) };
                let out = crate::encoder_attention::attend(
                    &flat(&q)?,
                    &flat(&k)?,
                    &flat(&v)?,
                    &lens,
                    nh,
                    hp.n_embd,
                    scale as f32,
                );
                Tensor::from_vec(out, (ids_len, hp.n_embd), &self.device)?
            } else {
                self.attend_per_sequence(seqs, [&q, &k, &v], scale)?
            };
            let h = b
                .attn_norm
                .forward(&(&x + b.out.forward(&attn)?)?, hp.eps)?;
            let ff = b.down.forward(&crate::geglu::gelu(&b.up.forward(&h)?)?)?;
            x = b.out_norm.forward(&(&h + ff)?, hp.eps)?;
        }
        let all = x
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for s in seqs {
            let n = s.len() * hp.n_embd;
            out.push(all[at..at + n].to_vec());
            at += n;
        }
        Ok(out)
    }

    /// Attention on an accelerator: candle's ops, sequence after sequence.
    fn attend_per_sequence(
        &self,
        seqs: &[&[u32]],
        [q, k, v]: [&Tensor; 3],
        scale: f64,
    ) -> Result<Tensor> {
        let (nh, hd) = (self.hp.n_head, self.hp.n_embd / self.hp.n_head);
        let mut outs = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for s in seqs {
            let t = s.len();
            let heads = |m: &Tensor| -> Result<Tensor> {
                Ok(m.narrow(0, at, t)?
                    .reshape((t, nh, hd))?
                    .transpose(0, 1)?
                    .contiguous()?)
            };
            let (qs, ks, vs) = (heads(q)?, heads(k)?, heads(v)?);
            let scores = (qs.matmul(&ks.t()?)? * scale)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let o = probs
                .matmul(&vs)?
                .transpose(0, 1)?
                .contiguous()?
                .reshape((t, self.hp.n_embd))?;
            outs.push(o);
            at += t;
        }
        Ok(if outs.len() == 1 {
            outs.swap_remove(0)
        } else {
            Tensor::cat(&outs, 0)?
        })
    }

    fn qkv(&self, b: &Block, x: &Tensor) -> Result<[Tensor; 3]> {
        let [q, k, v] = Linear::forward_all([&b.q.w, &b.k.w, &b.v.w], x)?;
        let add = |t: Tensor, bias: &Option<Tensor>| -> Result<Tensor> {
            Ok(match bias {
                Some(bias) => t.broadcast_add(bias)?,
                None => t,
            })
        };
        Ok([add(q, &b.q.b)?, add(k, &b.k.b)?, add(v, &b.v.b)?])
    }

    /// A reranker's scores of a pooled first token (`cls` then tanh, then `cls.output`, as
    /// llama.cpp's rank pooling and RoBERTa's classification head).
    pub fn rank(&self, first: &[f32]) -> Result<Vec<f32>> {
        let mut x = Tensor::from_slice(first, (1, first.len()), &self.device)?;
        if let Some(c) = &self.cls {
            x = c.forward(&x)?.tanh()?;
        }
        if let Some(c) = &self.cls_out {
            x = c.forward(&x)?;
        }
        Ok(x.flatten_all()?.to_vec1::<f32>()?)
    }

    /// Whether the model has a classification head (it can rank).
    pub fn has_rank_head(&self) -> bool {
        self.cls.is_some() || self.cls_out.is_some()
    }

    pub fn n_embd(&self) -> usize {
        self.hp.n_embd
    }
}
