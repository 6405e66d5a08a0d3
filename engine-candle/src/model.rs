//! The llama-family forward pass over per-sequence KV cache rows, batched across sequences.
//!
//! candle's stock `quantized_llama` keeps one cache inside the model and one position for the
//! whole batch. Here the cache is a preallocated `[slots, kv_heads, ctx, head_dim]` tensor per
//! layer; each running sequence owns one row and has its own position, so sequences of any
//! length decode together in one batched pass and join or leave between steps.

use candle_core::{DType, Device, Tensor};

use crate::error::{EngineError, Result};
use crate::hparams::{Hparams, RopeStyle};
use crate::weights::Weights;

/// Largest number of prompt tokens pushed through one prefill pass (bounds attention memory).
pub const PREFILL_CHUNK: usize = 256;

/// One sequence's part of a forward pass.
pub(crate) struct Segment<'a> {
    /// Its KV cache row.
    pub row: usize,
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub start: usize,
}

pub(crate) struct Model {
    pub hp: Hparams,
    w: Weights,
    pub device: Device,
    cos: Tensor,
    sin: Tensor,
    ctx: usize,
}

/// Preallocated key/value storage for `slots` sequences of up to `ctx` tokens.
pub(crate) struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl KvCache {
    pub fn new(hp: &Hparams, slots: usize, ctx: usize, device: &Device) -> Result<Self> {
        let shape = (slots, hp.n_head_kv, ctx, hp.head_dim);
        let mut k = Vec::with_capacity(hp.n_layer);
        let mut v = Vec::with_capacity(hp.n_layer);
        for _ in 0..hp.n_layer {
            k.push(Tensor::zeros(shape, DType::F32, device)?);
            v.push(Tensor::zeros(shape, DType::F32, device)?);
        }
        Ok(Self { k, v })
    }

    /// Bytes the cache holds for `slots` x `ctx` tokens.
    pub fn bytes(hp: &Hparams, slots: usize, ctx: usize) -> usize {
        2 * hp.n_layer * slots * hp.n_head_kv * ctx * hp.head_dim * std::mem::size_of::<f32>()
    }

    /// Copies the first `len` positions of row `from` into row `to`.
    pub fn move_row(&self, from: usize, to: usize, len: usize) -> Result<()> {
        if from == to || len == 0 {
            return Ok(());
        }
        for cache in self.k.iter().chain(self.v.iter()) {
            let src = cache.narrow(0, from, 1)?.narrow(2, 0, len)?.contiguous()?;
            cache.narrow(0, to, 1)?.slice_set(&src, 2, 0)?;
        }
        Ok(())
    }
}

impl Model {
    pub fn new(hp: Hparams, w: Weights, device: Device, ctx: usize) -> Result<Self> {
        let half = hp.head_dim / 2;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / hp.rope_base.powf(2.0 * i as f32 / hp.head_dim as f32))
            .collect();
        if let Some(f) = &w.rope_freqs {
            if f.len() != half {
                return Err(EngineError::BadModel(format!(
                    "rope_freqs has {} entries, expected {half}",
                    f.len()
                )));
            }
            for (x, d) in inv_freq.iter_mut().zip(f) {
                *x /= *d;
            }
        }
        let mut angles = Vec::with_capacity(ctx * half);
        for p in 0..ctx {
            let pos = p as f32 / hp.rope_linear_factor;
            angles.extend(inv_freq.iter().map(|f| pos * f));
        }
        let angles = Tensor::from_vec(angles, (ctx, half), &device)?;
        Ok(Self {
            cos: angles.cos()?,
            sin: angles.sin()?,
            hp,
            w,
            device,
            ctx,
        })
    }

    pub fn ctx(&self) -> usize {
        self.ctx
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        Ok(match self.hp.rope_style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(x, cos, sin)?,
            RopeStyle::Halves => candle_nn::rotary_emb::rope(x, cos, sin)?,
        })
    }

    fn qkv(&self, li: usize, h: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let l = &self.w.layers[li];
        let add = |t: Tensor, b: &Option<Tensor>| -> Result<Tensor> {
            Ok(match b {
                Some(b) => t.broadcast_add(b)?,
                None => t,
            })
        };
        let q = add(l.wq.forward(h)?, &l.bq)?;
        let k = add(l.wk.forward(h)?, &l.bk)?;
        let v = add(l.wv.forward(h)?, &l.bv)?;
        Ok((q, k, v))
    }

    fn mlp_and_output(&self, li: usize, x: &Tensor, attn: &Tensor) -> Result<Tensor> {
        let l = &self.w.layers[li];
        let x = (x + l.wo.forward(attn)?)?;
        let h = candle_nn::ops::rms_norm(&x, &l.ffn_norm, self.hp.rms_eps)?;
        let gate = candle_nn::ops::silu(&l.w_gate.forward(&h)?)?;
        let up = l.w_up.forward(&h)?;
        Ok((&x + l.w_down.forward(&(gate * up)?)?)?)
    }

    fn logits(&self, x: &Tensor) -> Result<Tensor> {
        let x = candle_nn::ops::rms_norm(x, &self.w.out_norm, self.hp.rms_eps)?;
        Ok(self.w.output.forward(&x)?)
    }

    fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        let ids = Tensor::new(tokens, &self.device)?;
        Ok(self.w.tok_embd.embedding(&ids)?)
    }

    /// Runs `tokens` (positions `start..start+len`) of the sequence in cache `row`, in chunks
    /// of `PREFILL_CHUNK`, and returns the logits `[vocab]` of the last token.
    pub fn prefill(
        &self,
        cache: &KvCache,
        row: usize,
        tokens: &[u32],
        start: usize,
    ) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidParams("empty prompt".into()));
        }
        let mut last = Vec::new();
        let mut pos = start;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            let seg = Segment {
                row,
                tokens: chunk,
                start: pos,
            };
            last = self
                .forward(cache, std::slice::from_ref(&seg))?
                .pop()
                .unwrap_or_default();
            pos += chunk.len();
        }
        Ok(last)
    }

    /// One forward pass over several sequences at once: each segment feeds its tokens at its
    /// own positions into its own cache row (a prompt chunk, or one token while decoding).
    /// Matmuls run over all tokens together; attention runs per segment over exactly that
    /// sequence's length, so no sequence's result depends on the others. Returns the logits
    /// of each segment's last token.
    pub fn forward(&self, cache: &KvCache, segs: &[Segment<'_>]) -> Result<Vec<Vec<f32>>> {
        let hp = &self.hp;
        let (nh, nkv, hd, g) = (hp.n_head, hp.n_head_kv, hp.head_dim, hp.group_size());
        if segs.is_empty() || segs.iter().any(|s| s.tokens.is_empty()) {
            return Err(EngineError::InvalidParams("empty forward batch".into()));
        }
        if let Some(s) = segs.iter().find(|s| s.start + s.tokens.len() > self.ctx) {
            return Err(EngineError::ContextOverflow {
                prompt_tokens: s.start + s.tokens.len(),
                max_tokens: 0,
                ctx: self.ctx,
            });
        }
        let n: usize = segs.iter().map(|s| s.tokens.len()).sum();
        let mut tokens = Vec::with_capacity(n);
        let mut positions = Vec::with_capacity(n);
        let mut offsets = Vec::with_capacity(segs.len());
        let mut masks = Vec::with_capacity(segs.len());
        for s in segs {
            offsets.push(tokens.len());
            tokens.extend_from_slice(s.tokens);
            positions.extend((s.start..s.start + s.tokens.len()).map(|p| p as u32));
            // causal mask over [g*t, total]: row gi*t + ti may see columns <= start + ti
            let (t, total) = (s.tokens.len(), s.start + s.tokens.len());
            masks.push(if t > 1 {
                let mut m = Vec::with_capacity(g * t * total);
                for _ in 0..g {
                    for ti in 0..t {
                        m.extend((0..total).map(|c| {
                            if c <= s.start + ti {
                                0f32
                            } else {
                                f32::NEG_INFINITY
                            }
                        }));
                    }
                }
                Some(Tensor::from_vec(m, (g * t, total), &self.device)?)
            } else {
                None
            });
        }
        let pos_t = Tensor::new(positions.as_slice(), &self.device)?;
        let cos = self.cos.index_select(&pos_t, 0)?;
        let sin = self.sin.index_select(&pos_t, 0)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut x = self.embed(&tokens)?;
        for li in 0..hp.n_layer {
            let l = &self.w.layers[li];
            let h = candle_nn::ops::rms_norm(&x, &l.attn_norm, hp.rms_eps)?;
            let (q, k, v) = self.qkv(li, &h)?;
            let q = q.reshape((1, n, nh, hd))?.transpose(1, 2)?.contiguous()?;
            let q = (self.rope(&q, &cos, &sin)? * scale)?;
            let k = k.reshape((1, n, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            let k = self.rope(&k, &cos, &sin)?;
            let v = v.reshape((1, n, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            let mut outs = Vec::with_capacity(segs.len());
            for ((s, &o), mask) in segs.iter().zip(&offsets).zip(&masks) {
                let t = s.tokens.len();
                let total = s.start + t;
                let kc = cache.k[li].narrow(0, s.row, 1)?;
                let vc = cache.v[li].narrow(0, s.row, 1)?;
                kc.slice_set(&k.narrow(2, o, t)?.contiguous()?, 2, s.start)?;
                vc.slice_set(&v.narrow(2, o, t)?.contiguous()?, 2, s.start)?;
                let keys = kc.narrow(2, 0, total)?;
                let vals = vc.narrow(2, 0, total)?;
                let qs = q
                    .narrow(2, o, t)?
                    .contiguous()?
                    .reshape((1, nkv, g * t, hd))?;
                let mut att = qs.matmul(&keys.t()?)?;
                if let Some(m) = mask {
                    att = att.broadcast_add(m)?;
                }
                let att = candle_nn::ops::softmax_last_dim(&att)?;
                let out = att
                    .matmul(&vals)?
                    .reshape((1, nh, t, hd))?
                    .transpose(1, 2)?
                    .contiguous()?
                    .reshape((t, nh * hd))?;
                outs.push(out);
            }
            let attn = if outs.len() == 1 {
                outs.swap_remove(0)
            } else {
                Tensor::cat(&outs, 0)?
            };
            x = self.mlp_and_output(li, &x, &attn)?;
        }
        let last: Vec<u32> = segs
            .iter()
            .zip(&offsets)
            .map(|(s, &o)| (o + s.tokens.len() - 1) as u32)
            .collect();
        let last = Tensor::new(last.as_slice(), &self.device)?;
        let logits = self.logits(&x.index_select(&last, 0)?)?;
        Ok(logits.to_dtype(DType::F32)?.to_vec2::<f32>()?)
    }

    /// Vocabulary size of the output layer.
    pub fn vocab(&self) -> Result<usize> {
        Ok(self.w.tok_embd.shape().dims2()?.0)
    }
}
