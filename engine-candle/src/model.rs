//! The llama-family forward pass over per-sequence KV cache rows, batched across sequences.
//!
//! candle's stock `quantized_llama` keeps one cache inside the model and one position for the
//! whole batch. Here the cache is a preallocated `[slots, kv_heads, ctx, head_dim]` tensor per
//! layer; each running sequence owns one row and has its own position, so sequences of any
//! length decode together in one batched pass and join or leave between steps.

use candle_core::{DType, Device, Tensor};

use half::f16;

use std::sync::Mutex;

use crate::attention::{
    attend, transposes, Dims, HeadPair, KeptTranspositions, SegmentUse, Span, Stored,
};
use crate::cpu_parallel::par_chunks_mut;
use crate::error::{EngineError, Result};
use crate::hparams::{Activation, Hparams, RopeStyle};
use crate::kv_type::KvType;
use crate::rotary::Rotary;
use crate::weights::{Linear, Weights};

/// Most prompt tokens of one sequence in one forward pass (bounds attention memory).
pub const PREFILL_CHUNK: usize = 256;

/// One sequence's part of a forward pass.
pub(crate) struct Segment<'a> {
    /// Its KV cache row.
    pub row: usize,
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub start: usize,
    /// Prompt tokens (else generated ones): picks llama.cpp's arithmetic for `p·V`.
    pub prompt: bool,
    /// Where its prompt ends (a position): more of it follows in a later pass when this is
    /// past the segment's end (its attention keeps what it can reuse, with room for the rest).
    pub prompt_end: usize,
    /// Its tokens' last hidden states (after the final norm: what embeddings pool) are
    /// wanted instead of the last token's logits.
    pub hidden: bool,
    /// The logits of every one of its tokens are wanted, row after row (a decode token with
    /// the guesses after it: each guess is checked against the model's choice before it).
    pub all_logits: bool,
}

impl Segment<'_> {
    /// More of this prompt follows in a later pass.
    pub fn continues(&self) -> bool {
        self.start + self.tokens.len() < self.prompt_end
    }
}

pub(crate) struct Model {
    pub hp: Hparams,
    w: Weights,
    pub device: Device,
    /// The rotary angles of the global layers, and of the local ones where their base differs.
    rope: RopeTables,
    rope_local: Option<RopeTables>,
    ctx: usize,
}

/// `[ctx, head_dim/2]` cos and sin of one RoPE base's angles: as vectors (the CPU path's
/// rotation) and as tensors (the accelerator path's).
struct RopeTables {
    cos_table: Vec<f32>,
    sin_table: Vec<f32>,
    cos: Tensor,
    sin: Tensor,
}

impl RopeTables {
    /// The angles as ggml's rope cache computes them: θ starts at the position and is
    /// multiplied by base^(-2/d) once per pair, in f32 (the rounding of that running product
    /// is part of llama.cpp's numerics).
    fn new(
        hp: &Hparams,
        base: f32,
        freq_factors: Option<&Vec<f32>>,
        ctx: usize,
        device: &Device,
    ) -> Result<Self> {
        let half = hp.head_dim / 2;
        let angles = crate::rotary::angles(
            hp.head_dim,
            base,
            1.0 / hp.rope_linear_factor,
            freq_factors.map(|f| f.as_slice()),
            ctx,
        );
        let cos_table: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin_table: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        let angles = Tensor::from_vec(angles, (ctx, half), device)?;
        Ok(Self {
            cos_table,
            sin_table,
            cos: angles.cos()?,
            sin: angles.sin()?,
        })
    }
}

/// Preallocated key/value storage for `slots` sequences of up to `ctx` tokens.
pub(crate) struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    kv: KvType,
    /// Transpositions of rows whose prompts go through in chunks (CPU attention).
    kept: Mutex<KeptTranspositions>,
}

impl KvCache {
    pub fn new(
        hp: &Hparams,
        slots: usize,
        ctx: usize,
        kv: KvType,
        device: &Device,
    ) -> Result<Self> {
        let shape = (slots, hp.n_head_kv, ctx, hp.head_dim);
        let mut k = Vec::with_capacity(hp.n_layer);
        let mut v = Vec::with_capacity(hp.n_layer);
        for _ in 0..hp.n_layer {
            k.push(Tensor::zeros(shape, kv.dtype(), device)?);
            v.push(Tensor::zeros(shape, kv.dtype(), device)?);
        }
        Ok(Self {
            k,
            v,
            kv,
            kept: Mutex::new(KeptTranspositions::new(slots)),
        })
    }

    /// How keys and values are stored.
    pub fn kv_type(&self) -> KvType {
        self.kv
    }

    /// A copy, in host memory, of the keys and values of positions `0..len` of `row`: per
    /// layer `[1, kv_heads, len, head_dim]`.
    pub fn read_prefix(&self, row: usize, len: usize) -> Result<Vec<(Tensor, Tensor)>> {
        if self.k.first().is_some_and(|t| t.device().is_cpu()) {
            return match self.kv {
                KvType::F32 => self.read_prefix_cpu::<f32>(row, len),
                KvType::F16 => self.read_prefix_cpu::<f16>(row, len),
            };
        }
        let host = |t: &Tensor| -> Result<Tensor> {
            // a copy even where the slice is contiguous: the entry must not alias the row
            Ok(t.narrow(0, row, 1)?
                .narrow(2, 0, len)?
                .force_contiguous()?
                .to_device(&Device::Cpu)?)
        };
        self.k
            .iter()
            .zip(&self.v)
            .map(|(k, v)| Ok((host(k)?, host(v)?)))
            .collect()
    }

    /// `read_prefix` on the CPU: the layers' copies are spread over the compute pool. It runs
    /// between two passes of the running streams (a prompt's row is being taken), and one
    /// thread copying a 1,300-token row (60 MB in f32) held them up ~50 ms.
    fn read_prefix_cpu<T: candle_core::WithDType>(
        &self,
        row: usize,
        len: usize,
    ) -> Result<Vec<(Tensor, Tensor)>> {
        let tensors: Vec<&Tensor> = self
            .k
            .iter()
            .zip(&self.v)
            .flat_map(|(k, v)| [k, v])
            .collect();
        let guards: Vec<_> = tensors.iter().map(|t| t.storage_and_layout()).collect();
        let mut sources: Vec<&[T]> = Vec::with_capacity(guards.len());
        for (storage, layout) in &guards {
            match &**storage {
                candle_core::Storage::Cpu(c) => {
                    sources.push(&c.as_slice::<T>()?[layout.start_offset()..])
                }
                _ => return Err(EngineError::Device("expected a CPU tensor".into())),
            }
        }
        let (_, nkv, ctx, hd) = self.k[0].dims4()?;
        if len > ctx {
            return Err(EngineError::InvalidParams(format!(
                "a prefix of {len} positions in a row of {ctx}"
            )));
        }
        let mut copies: Vec<Vec<T>> = vec![Vec::new(); sources.len()];
        par_chunks_mut(&mut copies, 1, |i, out| {
            let mut copy = Vec::with_capacity(nkv * len * hd);
            for kh in 0..nkv {
                let base = (row * nkv + kh) * ctx * hd;
                copy.extend_from_slice(&sources[i][base..base + len * hd]);
            }
            out[0] = copy;
        });
        drop(sources);
        drop(guards);
        let mut tensors = copies
            .into_iter()
            .map(|c| Tensor::from_vec(c, (1, nkv, len, hd), &Device::Cpu));
        let mut out = Vec::with_capacity(self.k.len());
        while let (Some(k), Some(v)) = (tensors.next(), tensors.next()) {
            out.push((k?, v?));
        }
        Ok(out)
    }

    /// Writes positions `0..len` of keys and values from `read_prefix` into `row`.
    pub fn write_prefix(&self, row: usize, kv: &[(Tensor, Tensor)], len: usize) -> Result<()> {
        self.kept().forget(row);
        for ((k, v), (sk, sv)) in self.k.iter().zip(&self.v).zip(kv) {
            for (dst, src) in [(k, sk), (v, sv)] {
                let src = src
                    .narrow(2, 0, len)?
                    .contiguous()?
                    .to_device(dst.device())?;
                dst.narrow(0, row, 1)?.slice_set(&src, 2, 0)?;
            }
        }
        Ok(())
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, KeptTranspositions> {
        // what it holds is dropped or replaced whole: a panic elsewhere leaves nothing half-done
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes the cache holds for `slots` x `ctx` tokens stored as `kv`.
    pub fn bytes(hp: &Hparams, slots: usize, ctx: usize, kv: KvType) -> usize {
        2 * hp.n_layer * slots * hp.n_head_kv * ctx * hp.head_dim * kv.elem_bytes()
    }
}

impl Model {
    pub fn new(hp: Hparams, w: Weights, device: Device, ctx: usize) -> Result<Self> {
        let half = hp.head_dim / 2;
        let freq_factors: Option<&Vec<f32>> = w.rope_freqs.as_ref();
        if let Some(f) = freq_factors {
            if f.len() != half {
                return Err(EngineError::BadModel(format!(
                    "rope_freqs has {} entries, expected {half}",
                    f.len()
                )));
            }
        }
        let rope = RopeTables::new(&hp, hp.rope_base, freq_factors, ctx, &device)?;
        let rope_local = match hp.sliding_window {
            Some(w) if w.rope_base != hp.rope_base => Some(RopeTables::new(
                &hp,
                w.rope_base,
                freq_factors,
                ctx,
                &device,
            )?),
            _ => None,
        };
        Ok(Self {
            rope,
            rope_local,
            hp,
            w,
            device,
            ctx,
        })
    }

    /// The rotary angles of layer `li`.
    fn rope_of(&self, li: usize) -> &RopeTables {
        match &self.rope_local {
            Some(local) if self.hp.is_local(li) => local,
            _ => &self.rope,
        }
    }

    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Rotary embedding on the CPU with ggml's arithmetic: `x0·c − x1·s` and `x0·s + x1·c`
    /// with the first product fused (what GCC contracts `rotate_pairs` to). `x` is
    /// `[1, heads, n, head_dim]` contiguous; `positions` has the n positions.
    fn rope_cpu(&self, x: &Tensor, positions: &[u32], tables: &RopeTables) -> Result<Tensor> {
        let (_, heads, n, hd) = x.dims4()?;
        let mut v = x.flatten_all()?.to_vec1::<f32>()?;
        let r = Rotary {
            cos: &tables.cos_table,
            sin: &tables.sin_table,
            interleaved: matches!(self.hp.rope_style, RopeStyle::Interleaved),
        };
        r.rotate(&mut v, heads, n, hd, positions);
        Ok(Tensor::from_vec(v, (1, heads, n, hd), &self.device)?)
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        Ok(match self.hp.rope_style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(x, cos, sin)?,
            RopeStyle::Halves => candle_nn::rotary_emb::rope(x, cos, sin)?,
        })
    }

    /// Queries, keys and values of `h` (`[n, width]` each), with their biases and the
    /// per-head norms of queries and keys where the model has them.
    fn qkv(&self, li: usize, h: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let l = &self.w.layers[li];
        let hd = self.hp.head_dim;
        let add = |t: Tensor, b: &Option<Tensor>| -> Result<Tensor> {
            Ok(match b {
                Some(b) => t.broadcast_add(b)?,
                None => t,
            })
        };
        let head_norm = |t: Tensor, w: &Option<Tensor>| -> Result<Tensor> {
            Ok(match w {
                Some(w) => {
                    let (n, width) = t.dims2()?;
                    crate::rms_norm::rms_norm(&t.reshape((n, width / hd, hd))?, w, self.hp.rms_eps)?
                        .reshape((n, width))?
                }
                None => t,
            })
        };
        let [q, k, v] = Linear::forward_all([&l.wq, &l.wk, &l.wv], h)?;
        Ok((
            head_norm(add(q, &l.bq)?, &l.q_norm)?,
            head_norm(add(k, &l.bk)?, &l.k_norm)?,
            add(v, &l.bv)?,
        ))
    }

    fn mlp_and_output(&self, li: usize, x: &Tensor, attn: &Tensor) -> Result<Tensor> {
        let l = &self.w.layers[li];
        let eps = self.hp.rms_eps;
        let post = |t: Tensor, w: &Option<Tensor>| -> Result<Tensor> {
            Ok(match w {
                Some(w) => crate::rms_norm::rms_norm(&t, w, eps)?,
                None => t,
            })
        };
        let x = (x + post(l.wo.forward(attn)?, &l.post_attn_norm)?)?;
        let h = crate::rms_norm::rms_norm(&x, &l.ffn_norm, eps)?;
        let [gate, up] = Linear::forward_all([&l.w_gate, &l.w_up], &h)?;
        let act = match self.hp.activation {
            Activation::Silu => crate::swiglu::swiglu(&gate, &up)?,
            Activation::GeluTanh => crate::geglu::geglu(&gate, &up)?,
        };
        let out = post(l.w_down.forward(&act)?, &l.post_ffw_norm)?;
        Ok((&x + out)?)
    }

    /// The logits of each row of `x` (`[m, n_embd]`), a vector of the vocabulary's size each.
    fn logits(&self, x: &Tensor) -> Result<Vec<Vec<f32>>> {
        let x = crate::rms_norm::rms_norm(x, &self.w.out_norm, self.hp.rms_eps)?;
        Ok(match self.hp.logit_softcap {
            Some(c) => {
                let logits = self.w.output.forward(&x)?;
                ((logits / f64::from(c))?.tanh()? * f64::from(c))?
                    .to_dtype(DType::F32)?
                    .to_vec2::<f32>()?
            }
            // the kernels' rows as they are (no tensor, no copy: a vocabulary of 262,144
            // copied twice and zeroed once a row was ~4 % of a decode step, on one thread)
            None => self.w.output.forward_rows(&x)?,
        })
    }

    fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        let ids = Tensor::new(tokens, &self.device)?;
        let x = self.w.tok_embd.embedding(&ids)?;
        Ok(match self.hp.embed_scale {
            Some(s) => (x * f64::from(s))?,
            None => x,
        })
    }

    /// One forward pass over several sequences at once: each segment feeds its tokens at its
    /// own positions into its own cache row (a prompt chunk, or one token while decoding).
    /// Matmuls run over all tokens together; attention runs per segment over exactly that
    /// sequence's length, so no sequence's result depends on the others. Returns, per
    /// segment, the logits of its last token — of every token for an `all_logits` one (`t`
    /// rows of the vocabulary, row-major) — or, for a `hidden` segment, its tokens' last
    /// hidden states after the final norm (`t` rows of the model's width, row-major).
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
        for s in segs {
            offsets.push(tokens.len());
            tokens.extend_from_slice(s.tokens);
            positions.extend((s.start..s.start + s.tokens.len()).map(|p| p as u32));
        }
        let cpu = self.device.is_cpu();
        // the tensor path (accelerators) needs explicit causal masks: for the global layers,
        // and for the local ones where a window hides some positions
        let window = hp.sliding_window.map(|w| w.window);
        let masks_of = |window: Option<usize>| -> Result<Vec<Option<Tensor>>> {
            segs.iter()
                .map(|s| causal_mask(s, g, window, &self.device))
                .collect()
        };
        let (masks, local_masks) = if cpu {
            (Vec::new(), Vec::new())
        } else {
            (
                masks_of(None)?,
                if window.is_some() {
                    masks_of(window)?
                } else {
                    Vec::new()
                },
            )
        };
        let spans: Vec<Span> = segs
            .iter()
            .zip(&offsets)
            .map(|(s, &o)| Span {
                row: s.row,
                start: s.start,
                t: s.tokens.len(),
                offset: o,
                prompt: s.prompt,
            })
            .collect();
        let scale = f64::from(hp.attn_scale);
        let dims_of = |window: Option<usize>| Dims {
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
            ctx: self.ctx,
            scale: hp.attn_scale,
            window,
            softcap: hp.attn_softcap,
        };
        let pos_t = Tensor::new(positions.as_slice(), &self.device)?;
        let angles = |t: &RopeTables| -> Result<(Tensor, Tensor)> {
            Ok((
                t.cos.index_select(&pos_t, 0)?,
                t.sin.index_select(&pos_t, 0)?,
            ))
        };
        let (cos, sin) = if cpu {
            (None, None)
        } else {
            let (c, s) = angles(&self.rope)?;
            (Some(c), Some(s))
        };
        let local_angles = match (&self.rope_local, cpu) {
            (Some(t), false) => Some(angles(t)?),
            _ => None,
        };
        // the kept transpositions of the rows this pass writes (a failed pass drops them)
        let mut kept = if cpu {
            let uses: Vec<SegmentUse> = segs
                .iter()
                .map(|s| SegmentUse {
                    row: s.row,
                    start: s.start,
                    transposes: transposes(s.prompt, hd),
                    continues: s.continues(),
                    ends_at: s.prompt_end,
                })
                .collect();
            cache.kept().take(&uses, hp.n_layer, nkv, hd)
        } else {
            Vec::new()
        };
        let mut x = self.embed(&tokens)?;
        for li in 0..hp.n_layer {
            let l = &self.w.layers[li];
            let local = hp.is_local(li);
            let dims = dims_of(window.filter(|_| local));
            let h = crate::rms_norm::rms_norm(&x, &l.attn_norm, hp.rms_eps)?;
            let (q, k, v) = self.qkv(li, &h)?;
            let q = q.reshape((1, n, nh, hd))?.transpose(1, 2)?.contiguous()?;
            // the CPU path scales scores inside its softmax, as llama.cpp does
            let k = k.reshape((1, n, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            let (q, k) = match (&cos, &sin) {
                (Some(cos), Some(sin)) => {
                    let (cos, sin) = match &local_angles {
                        Some((c, s)) if local => (c, s),
                        _ => (cos, sin),
                    };
                    (self.rope(&q, cos, sin)?, self.rope(&k, cos, sin)?)
                }
                _ => {
                    let tables = self.rope_of(li);
                    (
                        self.rope_cpu(&q, &positions, tables)?,
                        self.rope_cpu(&k, &positions, tables)?,
                    )
                }
            };
            let v = v.reshape((1, n, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            for (s, &o) in segs.iter().zip(&offsets) {
                let t = s.tokens.len();
                let kc = cache.k[li].narrow(0, s.row, 1)?;
                let vc = cache.v[li].narrow(0, s.row, 1)?;
                let stored = |x: &Tensor| x.narrow(2, o, t)?.contiguous()?.to_dtype(kc.dtype());
                kc.slice_set(&stored(&k)?, 2, s.start)?;
                vc.slice_set(&stored(&v)?, 2, s.start)?;
            }
            let attn = if cpu {
                let qv = q.flatten_all()?.to_vec1::<f32>()?;
                let mut layer: Vec<Option<&mut [HeadPair]>> = kept
                    .iter_mut()
                    .map(|t| t.as_mut().map(|t| t.layers[li].as_mut_slice()))
                    .collect();
                let y = match cache.kv {
                    KvType::F32 => with_cpu::<f32, _>(&cache.k[li], |k| {
                        with_cpu::<f32, _>(&cache.v[li], |v| {
                            attend(&qv, n, &dims, &spans, Stored::F32 { k, v }, &mut layer)
                        })
                    })??,
                    KvType::F16 => with_cpu::<f16, _>(&cache.k[li], |k| {
                        with_cpu::<f16, _>(&cache.v[li], |v| {
                            attend(&qv, n, &dims, &spans, Stored::F16 { k, v }, &mut layer)
                        })
                    })??,
                };
                Tensor::from_vec(y, (n, nh * hd), &self.device)?
            } else {
                let masks = if local && !local_masks.is_empty() {
                    &local_masks
                } else {
                    &masks
                };
                self.attend_tensors(cache, li, segs, &offsets, masks, &(q * scale)?)?
            };
            x = self.mlp_and_output(li, &x, &attn)?;
        }
        if !kept.is_empty() {
            let mut store = cache.kept();
            for (s, t) in segs.iter().zip(kept) {
                if let Some(t) = t.filter(|_| s.continues()) {
                    store.put_back(s.row, t, s.start + s.tokens.len());
                }
            }
        }
        let last: Vec<u32> = segs
            .iter()
            .zip(&offsets)
            .filter(|(s, _)| !s.hidden)
            .flat_map(|(s, &o)| {
                let end = o + s.tokens.len();
                let first = if s.all_logits { o } else { end - 1 };
                (first..end).map(|p| p as u32)
            })
            .collect();
        let mut logits = if last.is_empty() {
            Vec::new()
        } else {
            let last = Tensor::new(last.as_slice(), &self.device)?;
            self.logits(&x.index_select(&last, 0)?)?
        }
        .into_iter();
        let mut out = Vec::with_capacity(segs.len());
        for (s, &o) in segs.iter().zip(&offsets) {
            if s.hidden {
                let rows = x.narrow(0, o, s.tokens.len())?;
                let normed = crate::rms_norm::rms_norm(&rows, &self.w.out_norm, hp.rms_eps)?;
                out.push(
                    normed
                        .to_dtype(DType::F32)?
                        .flatten_all()?
                        .to_vec1::<f32>()?,
                );
            } else if s.all_logits {
                out.push(logits.by_ref().take(s.tokens.len()).flatten().collect());
            } else {
                out.push(logits.next().unwrap_or_default());
            }
        }
        Ok(out)
    }

    /// The width of the hidden states (`n_embd`).
    pub fn width(&self) -> usize {
        self.hp.n_embd
    }

    /// Attention with candle tensor ops (accelerators): per segment, masked, over its row.
    fn attend_tensors(
        &self,
        cache: &KvCache,
        li: usize,
        segs: &[Segment<'_>],
        offsets: &[usize],
        masks: &[Option<Tensor>],
        q: &Tensor,
    ) -> Result<Tensor> {
        let hp = &self.hp;
        let (nh, nkv, hd, g) = (hp.n_head, hp.n_head_kv, hp.head_dim, hp.group_size());
        let mut outs = Vec::with_capacity(segs.len());
        for ((s, &o), mask) in segs.iter().zip(offsets).zip(masks) {
            let t = s.tokens.len();
            let total = s.start + t;
            let keys = cache.k[li]
                .narrow(0, s.row, 1)?
                .narrow(2, 0, total)?
                .to_dtype(q.dtype())?;
            let vals = cache.v[li]
                .narrow(0, s.row, 1)?
                .narrow(2, 0, total)?
                .to_dtype(q.dtype())?;
            let qs = q
                .narrow(2, o, t)?
                .contiguous()?
                .reshape((1, nkv, g * t, hd))?;
            let mut att = qs.matmul(&keys.t()?)?;
            if let Some(c) = self.hp.attn_softcap {
                att = ((att / f64::from(c))?.tanh()? * f64::from(c))?;
            }
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
        Ok(if outs.len() == 1 {
            outs.swap_remove(0)
        } else {
            Tensor::cat(&outs, 0)?
        })
    }

    /// Vocabulary size of the output layer.
    pub fn vocab(&self) -> Result<usize> {
        Ok(self.w.tok_embd.shape().dims2()?.0)
    }
}

/// The causal mask of a segment over `[g·t, start + t]` (row gi·t + ti sees columns
/// ≤ start + ti, and with a window only those > start + ti − window); none where it would
/// hide nothing (a single token that sees its whole history).
fn causal_mask(
    s: &Segment<'_>,
    g: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let (t, total) = (s.tokens.len(), s.start + s.tokens.len());
    if t == 1 && window.is_none_or(|w| total <= w) {
        return Ok(None);
    }
    let mut m = Vec::with_capacity(g * t * total);
    for _ in 0..g {
        for ti in 0..t {
            let p = s.start + ti;
            m.extend((0..total).map(|c| {
                if c <= p && window.is_none_or(|w| c + w > p) {
                    0f32
                } else {
                    f32::NEG_INFINITY
                }
            }));
        }
    }
    Ok(Some(Tensor::from_vec(m, (g * t, total), device)?))
}

/// Runs `f` on the f32 contents of a CPU tensor (from its first element).
fn with_cpu<T: candle_core::WithDType, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(c) => {
            let all = c.as_slice::<T>()?;
            Ok(f(&all[layout.start_offset()..]))
        }
        _ => Err(EngineError::Device("expected a CPU tensor".into())),
    }
}
