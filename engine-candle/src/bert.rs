//! BERT encoders as llama.cpp stores them: `bert` (all-MiniLM, BGE, E5, rerankers: absolute
//! positions, GELU feed-forward, weights with biases) and `nomic-bert` (nomic-embed-text:
//! rotary positions with NeoX pairs, fused `attn_qkv`, a SwiGLU feed-forward without biases).
//! Both are bidirectional with a post-norm block (attention, add, LayerNorm; feed-forward,
//! add, LayerNorm). Token types are all 0, as llama.cpp feeds them. The matmuls are the
//! decoders' (`weights.rs`: every weight format, own CPU kernels where there are), over every
//! token of a batch together; positions count from 0 in each sequence and attention runs per
//! sequence over exactly its tokens, so no sequence's result depends on the others (on the
//! CPU one job per sequence and head on the compute pool: `encoder_attention.rs`).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use candle_core::{Device, Tensor};

use crate::error::{EngineError, Result};
use crate::hparams::{md_f32, md_str, md_u32};
use crate::pooling::Pooling;
use crate::rotary::{angles, Rotary};
use crate::weights::{GgufFile, Linear, WeightFormat};

/// The encoder architectures (`general.architecture`) this module loads.
pub const ENCODER_ARCHITECTURES: [&str; 2] = ["bert", "nomic-bert"];

/// How an encoder's blocks tell positions apart, and their feed-forward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EncoderKind {
    /// `bert`: learned absolute position embeddings; `up`, GELU, `down`.
    Bert,
    /// `nomic-bert`: rotary positions (NeoX pairs over the whole head, this base);
    /// `down(silu(gate) · up)`.
    NomicBert { rope_base: f32 },
}

/// What a BERT's GGUF says of its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct BertHparams {
    /// `general.architecture`: one of [`ENCODER_ARCHITECTURES`].
    pub architecture: String,
    pub kind: EncoderKind,
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
        let kind = match arch {
            "bert" => EncoderKind::Bert,
            "nomic-bert" => EncoderKind::NomicBert {
                rope_base: md_f32(md, "nomic-bert.rope.freq_base").unwrap_or(10_000.0),
            },
            _ => {
                return Err(EngineError::Unsupported(format!(
                    "encoder architecture {arch:?} (supported: {})",
                    ENCODER_ARCHITECTURES.join(", ")
                )))
            }
        };
        let u = |k: &str| md_u32(md, &format!("{arch}.{k}")).map(|v| v as usize);
        let hp = Self {
            architecture: arch.to_string(),
            kind,
            n_embd: u("embedding_length")?,
            n_head: u("attention.head_count")?,
            n_layer: u("block_count")?,
            n_ff: u("feed_forward_length")?,
            ctx_train: u("context_length")?,
            eps: md_f32(md, &format!("{arch}.attention.layer_norm_epsilon")).unwrap_or(1e-12),
            pooling: match md_u32(md, &format!("{arch}.pooling_type")) {
                Ok(n) => Pooling::from_gguf(n).ok_or_else(|| {
                    EngineError::Unsupported(format!(
                        "{arch}.pooling_type {n} (0 none, 1 mean, 2 cls, 3 last, 4 rank)"
                    ))
                })?,
                Err(_) => Pooling::Mean,
            },
        };
        let n_head = hp.n_head.max(1);
        if hp.n_head == 0 || !hp.n_embd.is_multiple_of(hp.n_head) || hp.n_layer == 0 {
            return Err(EngineError::BadModel(format!(
                "{arch}: {} wide over {} heads, {} layers",
                hp.n_embd, hp.n_head, hp.n_layer
            )));
        }
        if let EncoderKind::NomicBert { .. } = kind {
            let head_dim = hp.n_embd / n_head;
            match md_u32(md, &format!("{arch}.rope.dimension_count")) {
                Ok(d) if d as usize != head_dim => {
                    return Err(EngineError::Unsupported(format!(
                        "{arch}: rotary embedding over {d} of a head's {head_dim} dimensions"
                    )))
                }
                _ if !head_dim.is_multiple_of(2) => {
                    return Err(EngineError::BadModel(format!(
                        "{arch}: rotary embedding over an odd head width {head_dim}"
                    )))
                }
                _ => {}
            }
        }
        Ok(hp)
    }
}

/// A matmul weight and its bias.
struct Affine {
    w: Linear,
    b: Option<Bias>,
}

/// A bias: the tensor, and its values for the own CPU kernels (added as they write).
struct Bias {
    t: Tensor,
    values: Vec<f32>,
}

impl Bias {
    fn new(t: Tensor) -> Result<Self> {
        let values = t
            .flatten_all()?
            .to_dtype(candle_core::DType::F32)?
            .to_vec1()?;
        Ok(Self { t, values })
    }

    fn pair(b: &Option<Bias>) -> Option<(&Tensor, &[f32])> {
        b.as_ref().map(|b| (&b.t, b.values.as_slice()))
    }
}

impl Affine {
    fn load(f: &mut GgufFile, name: &str, device: &Device, format: WeightFormat) -> Result<Self> {
        let w = f.encoder_matmul(&format!("{name}.weight"), device, format)?;
        let bias = format!("{name}.bias");
        let b = if f.has(&bias) {
            Some(Bias::new(f.dense(&bias, device)?)?)
        } else {
            None
        };
        Ok(Self { w, b })
    }

    /// A weight whose bias, if the file has one, llama.cpp does not add (nomic-bert's
    /// feed-forward).
    fn load_unbiased(
        f: &mut GgufFile,
        name: &str,
        device: &Device,
        format: WeightFormat,
    ) -> Result<Self> {
        let w = f.encoder_matmul(&format!("{name}.weight"), device, format)?;
        Ok(Self { w, b: None })
    }

    /// A fused `{name}` (queries, keys, values by rows, `width` each) and its fused bias.
    fn load_fused_qkv(
        f: &mut GgufFile,
        name: &str,
        width: usize,
        device: &Device,
        format: WeightFormat,
    ) -> Result<[Self; 3]> {
        let parts = f.encoder_split(&format!("{name}.weight"), &[width; 3], device, format)?;
        let [q, k, v] = <[Linear; 3]>::try_from(parts)
            .map_err(|_| EngineError::BadModel(format!("{name}: three parts")))?;
        let bias = format!("{name}.bias");
        let b = if f.has(&bias) {
            let b = f.dense(&bias, device)?;
            if b.elem_count() != 3 * width {
                return Err(EngineError::BadModel(format!(
                    "{bias}: {} values for 3 x {width}",
                    b.elem_count()
                )));
            }
            let b = b.flatten_all()?;
            Some([
                b.narrow(0, 0, width)?,
                b.narrow(0, width, width)?,
                b.narrow(0, 2 * width, width)?,
            ])
        } else {
            None
        };
        let [bq, bk, bv] = match b {
            Some([q, k, v]) => [
                Some(Bias::new(q)?),
                Some(Bias::new(k)?),
                Some(Bias::new(v)?),
            ],
            None => [None, None, None],
        };
        Ok([
            Self { w: q, b: bq },
            Self { w: k, b: bk },
            Self { w: v, b: bv },
        ])
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [y] = Linear::forward_all_biased([&self.w], [Bias::pair(&self.b)], x)?;
        Ok(y)
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
        Ok(crate::layer_norm::layer_norm(x, &self.w, &self.b, eps)?)
    }

    /// The norm of the residual sum `x + y`.
    fn forward_sum(&self, x: &Tensor, y: &Tensor, eps: f32) -> Result<Tensor> {
        Ok(crate::layer_norm::add_layer_norm(
            x, y, &self.w, &self.b, eps,
        )?)
    }
}

struct Block {
    q: Affine,
    k: Affine,
    v: Affine,
    out: Affine,
    attn_norm: Norm,
    up: Affine,
    /// SwiGLU's gate (nomic-bert); none for GELU.
    gate: Option<Linear>,
    down: Affine,
    out_norm: Norm,
}

/// A rotary encoder's angles: as vectors (the CPU path) and as tensors (an accelerator's).
struct RopeTables {
    cos: Vec<f32>,
    sin: Vec<f32>,
    cos_t: Tensor,
    sin_t: Tensor,
}

/// A loaded BERT.
pub(crate) struct Bert {
    pub hp: BertHparams,
    tok_embd: Tensor,
    /// Learned absolute positions (`bert`), or rotary angles (`nomic-bert`).
    pos_embd: Option<Tensor>,
    rope: Option<RopeTables>,
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
        let head_dim = hp.n_embd / hp.n_head;
        let (pos_embd, rope) = match hp.kind {
            EncoderKind::Bert => {
                let pos_embd = f.dense("position_embd.weight", device)?;
                let (rows, width) = pos_embd.dims2()?;
                if width != hp.n_embd || rows < hp.ctx_train {
                    return Err(EngineError::BadModel(format!(
                        "bert: position embeddings {rows}x{width} for {} positions of {}",
                        hp.ctx_train, hp.n_embd
                    )));
                }
                (Some(pos_embd), None)
            }
            EncoderKind::NomicBert { rope_base } => {
                let a = angles(head_dim, rope_base, 1.0, None, hp.ctx_train);
                let cos: Vec<f32> = a.iter().map(|x| x.cos()).collect();
                let sin: Vec<f32> = a.iter().map(|x| x.sin()).collect();
                let shape = (hp.ctx_train, head_dim / 2);
                let cos_t = Tensor::from_slice(&cos, shape, device)?;
                let sin_t = Tensor::from_slice(&sin, shape, device)?;
                (
                    None,
                    Some(RopeTables {
                        cos,
                        sin,
                        cos_t,
                        sin_t,
                    }),
                )
            }
        };
        let type0 = if f.has("token_types.weight") {
            Some(f.dense("token_types.weight", device)?.narrow(0, 0, 1)?)
        } else {
            None
        };
        let embd_norm = Norm::load(f, "token_embd_norm", device)?;
        let mut blocks = Vec::with_capacity(hp.n_layer);
        for i in 0..hp.n_layer {
            let p = format!("blk.{i}");
            let fused = format!("{p}.attn_qkv");
            let [q, k, v] = if f.has(&format!("{fused}.weight")) {
                Affine::load_fused_qkv(f, &fused, hp.n_embd, device, format)?
            } else {
                [
                    Affine::load(f, &format!("{p}.attn_q"), device, format)?,
                    Affine::load(f, &format!("{p}.attn_k"), device, format)?,
                    Affine::load(f, &format!("{p}.attn_v"), device, format)?,
                ]
            };
            let (up, gate, down) = match hp.kind {
                EncoderKind::Bert => (
                    Affine::load(f, &format!("{p}.ffn_up"), device, format)?,
                    None,
                    Affine::load(f, &format!("{p}.ffn_down"), device, format)?,
                ),
                EncoderKind::NomicBert { .. } => (
                    Affine::load_unbiased(f, &format!("{p}.ffn_up"), device, format)?,
                    Some(f.encoder_matmul(&format!("{p}.ffn_gate.weight"), device, format)?),
                    Affine::load_unbiased(f, &format!("{p}.ffn_down"), device, format)?,
                ),
            };
            blocks.push(Block {
                q,
                k,
                v,
                out: Affine::load(f, &format!("{p}.attn_output"), device, format)?,
                attn_norm: Norm::load(f, &format!("{p}.attn_output_norm"), device)?,
                up,
                gate,
                down,
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
            return Err(EngineError::BadModel(format!(
                "{}: pooling rank without a classification head (cls, cls.output)",
                hp.architecture
            )));
        }
        Ok(Self {
            hp,
            tok_embd,
            pos_embd,
            rope,
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
        let mut x = self.tok_embd.index_select(&ids, 0)?;
        if let Some(pos_embd) = &self.pos_embd {
            let at = Tensor::new(positions.as_slice(), &self.device)?;
            x = x.add(&pos_embd.index_select(&at, 0)?)?;
        }
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
                let (mut q, mut k) = (flat(&q)?, flat(&k)?);
                if let Some(r) = &self.rope {
                    // `[tokens, heads, hd]` is `[1, tokens·heads, hd]`: each row turns by its
                    // token's position
                    let at: Vec<u32> = positions
                        .iter()
                        .flat_map(|&p| std::iter::repeat_n(p, nh))
                        .collect();
                    let rot = Rotary {
                        cos: &r.cos,
                        sin: &r.sin,
                        interleaved: false,
                    };
                    rot.rotate(&mut q, 1, ids_len * nh, hd, &at);
                    rot.rotate(&mut k, 1, ids_len * nh, hd, &at);
                }
                let out = crate::encoder_attention::attend(
                    &q,
                    &k,
                    &flat(&v)?,
                    &lens,
                    nh,
                    hp.n_embd,
                    scale as f32,
                );
                Tensor::from_vec(out, (ids_len, hp.n_embd), &self.device)?
            } else {
                let (q, k) = match &self.rope {
                    Some(r) => {
                        let at = Tensor::new(positions.as_slice(), &self.device)?;
                        let (cos, sin) =
                            (r.cos_t.index_select(&at, 0)?, r.sin_t.index_select(&at, 0)?);
                        let turn = |m: &Tensor| -> Result<Tensor> {
                            let m = m.reshape((1, ids_len, nh, hd))?;
                            Ok(candle_nn::rotary_emb::rope_thd(&m, &cos, &sin)?
                                .reshape((ids_len, hp.n_embd))?)
                        };
                        (turn(&q)?, turn(&k)?)
                    }
                    None => (q, k),
                };
                self.attend_per_sequence(seqs, [&q, &k, &v], scale)?
            };
            let h = b
                .attn_norm
                .forward_sum(&x, &b.out.forward(&attn)?, hp.eps)?;
            let ff = match &b.gate {
                Some(gate) => {
                    let [g, u] = Linear::forward_all([gate, &b.up.w], &h)?;
                    b.down.forward(&crate::swiglu::swiglu(&g, &u)?)?
                }
                None => b.down.forward(&crate::geglu::gelu(&b.up.forward(&h)?)?)?,
            };
            x = b.out_norm.forward_sum(&h, &ff, hp.eps)?;
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
        Ok(Linear::forward_all_biased(
            [&b.q.w, &b.k.w, &b.v.w],
            [Bias::pair(&b.q.b), Bias::pair(&b.k.b), Bias::pair(&b.v.b)],
            x,
        )?)
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
