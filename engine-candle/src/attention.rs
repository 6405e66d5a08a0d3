//! Causal attention on the CPU over a sequence's own cache row, one query at a time, with
//! llama.cpp's arithmetic (non-flash CPU path, f32 cache) reproduced lane for lane:
//! - scores `q·k` as `ggml_vec_dot_f32` (AVX-512: four 16-lane accumulators, then ggml's
//!   reduce), scaled by 1/√head_dim inside the softmax as `ggml_soft_max_ext` does;
//! - softmax with ggml's vectorized `expf` polynomial, per 16 lanes summed in f64;
//! - `p·V` as tinyBLAS (`llamafile_sgemm`: one 16-lane accumulator per output) for prompt
//!   tokens, and as `ggml_vec_dot_f32` for generated tokens (llama.cpp's single-token path).
//!
//! A query's result depends only on its vector, its kind (prompt or generated) and the keys
//! and values before it — not on the other tokens of the pass or on how a prompt was chunked.
//! So a prompt prefilled in pieces or resumed from a cached prefix gives the same bits as one
//! prefilled whole, and batched decoding the same bits as decoding alone.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod kept;
mod transposed;

use std::borrow::Cow;

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::cpu_parallel::par_chunks_mut;
pub(crate) use kept::{KeptTranspositions, SegmentUse};
use transposed::{Block, Transposed};

/// Shapes of one forward pass's attention.
pub(crate) struct Dims {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Positions per cache row.
    pub ctx: usize,
    /// The softmax scale (1/√head_dim).
    pub scale: f32,
    /// A local layer's window: a query at position p sees keys at positions > p − window.
    pub window: Option<usize>,
    /// `c·tanh(score/c)` on the scaled scores before the softmax (Gemma 2).
    pub softcap: Option<f32>,
}

/// One segment: `t` query tokens at pass offset `offset`, positions `start..start + t` of
/// cache `row`; `prompt` tells prompt tokens from generated ones.
pub(crate) struct Span {
    pub row: usize,
    pub start: usize,
    pub t: usize,
    pub offset: usize,
    pub prompt: bool,
}

/// Prompt segments with at least this many tokens take the transposed path: its transposition
/// is a pass over the head's keys and values, paid back when many queries share it.
const TRANSPOSE_MIN_QUERIES: usize = 16;
/// Queries per parallel task on the transposed path (tasks are taken from a shared counter,
/// so the costlier late queries of a long prompt spread over the cores).
const QUERY_BLOCK: usize = 16;
/// Lanes of ggml's AVX-512 vectors, which fix the order of its sums.
pub(crate) const LANES: usize = 16;

/// One layer's cache, `[slots, n_head_kv, ctx, head_dim]` keys and values, as stored.
pub(crate) enum Stored<'a> {
    F32 {
        k: &'a [f32],
        v: &'a [f32],
    },
    /// Read back as f32 (only the positions a segment attends to) before the kernels run.
    F16 {
        k: &'a [f16],
        v: &'a [f16],
    },
}

/// One kv head's keys and values, transposed (the transposed prompt path's input).
pub(crate) type HeadPair = (Transposed, Transposed);

/// `q` is `[n_head, n, head_dim]` (unscaled); `kv` is one layer's cache with the segments'
/// new keys and values written. `kept[s]`, where given, is span `s`'s transposition of this
/// layer's kv heads kept from earlier passes (positions `0..start` of its row, see `kept.rs`):
/// it is extended by the span's new positions and attended over, instead of transposing the
/// whole history again (only spans that take the transposed path use it). Returns
/// `[n, n_head · head_dim]`.
pub(crate) fn attend(
    q: &[f32],
    n: usize,
    d: &Dims,
    spans: &[Span],
    kv: Stored<'_>,
    kept: &mut [Option<&mut [HeadPair]>],
) -> Vec<f32> {
    let path = prompt_path();
    attend_with(q, n, d, spans, kv, kept, path)
}

/// Whether prompt tokens can take the transposed path on this machine (so a transposition
/// of their heads is worth keeping between passes).
pub(crate) fn transposes(prompt: bool, hd: usize) -> bool {
    prompt_path() != PromptPath::PerQuery && prompt && transposed::supports(hd)
}

fn prompt_path() -> PromptPath {
    if has_avx512() {
        PromptPath::TransposedAvx512
    } else if has_fma() {
        PromptPath::TransposedNative
    } else if cfg!(target_arch = "aarch64") {
        // NEON and FMA are baseline there: the portable loops vectorise
        PromptPath::Transposed
    } else {
        PromptPath::PerQuery
    }
}

/// How prompt segments of at least `TRANSPOSE_MIN_QUERIES` tokens are attended; every path
/// gives the same bits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PromptPath {
    /// One query at a time, as decode tokens are.
    PerQuery,
    /// Over transposed keys and values, portable code.
    Transposed,
    /// Over transposed keys and values, AVX2 + FMA intrinsics (detected at run time).
    TransposedNative,
    /// Over transposed keys and values, AVX-512 intrinsics (detected at run time; where they
    /// are missing, the AVX2 path).
    TransposedAvx512,
}

/// A parallel unit of work: queries `first..first + count` of head `h` of span `s`, on the
/// transposed path or (for decode tokens and short prompts) one query at a time.
#[derive(Clone, Copy)]
struct Task {
    s: usize,
    h: usize,
    first: usize,
    count: usize,
    transposed: bool,
}

/// One kv head's keys and values over a span's positions, as f32.
type HeadRows<'a> = (Cow<'a, [f32]>, Cow<'a, [f32]>);

/// The positions `from[s]..start + t` of each span's row, per kv head (`s · n_head_kv + kh`),
/// as f32: slices of an f32 cache, or converted from an f16 one (in parallel).
fn rows_of<'a>(kv: &Stored<'a>, d: &Dims, spans: &[Span], from: &[usize]) -> Vec<HeadRows<'a>> {
    let hd = d.head_dim;
    let range = |s: usize, kh: usize| {
        let sp = &spans[s];
        let base = (sp.row * d.n_head_kv + kh) * d.ctx * hd;
        base + from[s] * hd..base + (sp.start + sp.t) * hd
    };
    let heads = spans.len() * d.n_head_kv;
    match *kv {
        Stored::F32 { k, v } => (0..heads)
            .map(|i| {
                let r = range(i / d.n_head_kv, i % d.n_head_kv);
                (Cow::Borrowed(&k[r.clone()]), Cow::Borrowed(&v[r]))
            })
            .collect(),
        Stored::F16 { k, v } => {
            let mut out: Vec<HeadRows<'a>> = vec![(Cow::Borrowed(&[]), Cow::Borrowed(&[])); heads];
            par_chunks_mut(&mut out, 1, |i, slot| {
                let r = range(i / d.n_head_kv, i % d.n_head_kv);
                let widen = |src: &[f16]| {
                    let mut dst = vec![0f32; src.len()];
                    src.convert_to_f32_slice(&mut dst);
                    Cow::Owned(dst)
                };
                slot[0] = (widen(&k[r.clone()]), widen(&v[r]));
            });
            out
        }
    }
}

/// Where a transposed span's kv head comes from in this pass.
enum HeadSource<'k> {
    /// Transposed here, for this pass only.
    Fresh(Option<HeadPair>),
    /// Kept from earlier passes, extended here by the span's new positions.
    Kept(&'k mut HeadPair),
}

fn attend_with(
    q: &[f32],
    n: usize,
    d: &Dims,
    spans: &[Span],
    kv: Stored<'_>,
    kept: &mut [Option<&mut [HeadPair]>],
    path: PromptPath,
) -> Vec<f32> {
    let hd = d.head_dim;
    let group = d.n_head / d.n_head_kv;
    // a span of a few queries over a history it would transpose for them alone goes one query
    // at a time; over a kept transposition (only its own positions to add) it need not (a
    // local layer's window: the transposed kernels mask what is before it and leave out the
    // blocks wholly before it)
    let use_transposed = |sp: &Span, kept: bool| {
        path != PromptPath::PerQuery
            && sp.prompt
            && (sp.t >= TRANSPOSE_MIN_QUERIES || kept)
            && transposed::supports(hd)
            && d.softcap.is_none()
    };
    // the transposed heads, per span that uses them (`first[s]` indexes its first kv head):
    // kept ones need only the span's new positions from the cache, the others all of them
    let mut first = vec![usize::MAX; spans.len()];
    let mut from = vec![0usize; spans.len()];
    let mut sources: Vec<(usize, usize, HeadSource<'_>)> = Vec::new();
    let mut kept = kept.iter_mut();
    for (s, sp) in spans.iter().enumerate() {
        let mine = kept
            .next()
            .and_then(|k| k.as_deref_mut())
            .filter(|heads| heads.len() == d.n_head_kv && heads[0].0.len() <= sp.start);
        if !use_transposed(sp, mine.is_some()) {
            continue;
        }
        first[s] = sources.len();
        match mine {
            Some(heads) => {
                from[s] = heads[0].0.len();
                sources.extend(
                    heads
                        .iter_mut()
                        .enumerate()
                        .map(|(kh, pair)| (s, kh, HeadSource::Kept(pair))),
                );
            }
            _ => sources.extend((0..d.n_head_kv).map(|kh| (s, kh, HeadSource::Fresh(None)))),
        }
    }
    let rows = rows_of(&kv, d, spans, &from);
    let head_rows = |s: usize, kh: usize| -> (&[f32], &[f32]) {
        let (k, v) = &rows[s * d.n_head_kv + kh];
        (k, v)
    };
    par_chunks_mut(&mut sources, 1, |_, one| {
        let (s, kh, source) = &mut one[0];
        let (keys, vals) = head_rows(*s, *kh);
        match source {
            HeadSource::Fresh(slot) => {
                *slot = Some((Transposed::new(keys, hd), Transposed::new(vals, hd)))
            }
            HeadSource::Kept(pair) => {
                pair.0.extend(keys);
                pair.1.extend(vals);
            }
        }
    });
    let heads: Vec<Option<&HeadPair>> = sources
        .iter()
        .map(|(_, _, source)| match source {
            HeadSource::Fresh(slot) => slot.as_ref(),
            HeadSource::Kept(pair) => Some(&**pair),
        })
        .collect();
    let mut tasks = Vec::new();
    for (s, sp) in spans.iter().enumerate() {
        let transposed = first[s] != usize::MAX;
        let block = if transposed { QUERY_BLOCK } else { sp.t };
        for h in 0..d.n_head {
            for f in (0..sp.t).step_by(block) {
                tasks.push(Task {
                    s,
                    h,
                    first: f,
                    count: block.min(sp.t - f),
                    transposed,
                });
            }
        }
    }
    let (fma, avx512) = (has_fma(), has_avx512());
    let one = |t: Task| -> Vec<f32> {
        let sp = &spans[t.s];
        let qh = &q[(t.h * n + sp.offset) * hd..(t.h * n + sp.offset + sp.t) * hd];
        if t.transposed {
            let Some((keys, vals)) = heads[first[t.s] + t.h / group] else {
                unreachable!("every transposed span's heads were transposed");
            };
            let mut out = vec![0f32; t.count * hd];
            let block = Block {
                q: qh,
                start: sp.start,
                first: t.first,
                count: t.count,
                keys,
                vals,
                dims: d,
            };
            #[cfg(target_arch = "x86_64")]
            if path == PromptPath::TransposedAvx512 && avx512 {
                // SAFETY: AVX-512F was detected.
                unsafe { avx512::queries(&block, &mut out) };
                return out;
            }
            #[cfg(target_arch = "x86_64")]
            if matches!(
                path,
                PromptPath::TransposedNative | PromptPath::TransposedAvx512
            ) && fma
            {
                // SAFETY: AVX2 and FMA were detected.
                unsafe { avx2::queries(&block, &mut out) };
                return out;
            }
            transposed::queries(&block, &mut out);
            return out;
        }
        let (keys, vals) = head_rows(t.s, t.h / group);
        #[cfg(target_arch = "x86_64")]
        if fma {
            // SAFETY: AVX2 and FMA were detected.
            return unsafe { head_fma(qh, keys, vals, sp, d) };
        }
        head(qh, keys, vals, sp, d)
    };
    let mut parts: Vec<Vec<f32>> = vec![Vec::new(); tasks.len()];
    par_chunks_mut(&mut parts, 1, |i, part| part[0] = one(tasks[i]));
    let width = d.n_head * hd;
    let mut y = vec![0f32; n * width];
    for (t, part) in tasks.iter().zip(parts) {
        let sp = &spans[t.s];
        for i in 0..t.count {
            let dst = (sp.offset + t.first + i) * width + t.h * hd;
            y[dst..dst + hd].copy_from_slice(&part[i * hd..(i + 1) * hd]);
        }
    }
    y
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One head of one segment: its `t` queries in order. Compiled twice — plain, and with AVX2 +
/// FMA so `mul_add` is one instruction and the lane loops vectorize; both give the same bits
/// (`mul_add` is a correctly rounded fused multiply-add either way).
#[inline(always)]
fn head(q: &[f32], keys: &[f32], vals: &[f32], sp: &Span, d: &Dims) -> Vec<f32> {
    let hd = d.head_dim;
    let mut out = vec![0f32; sp.t * hd];
    let mut scratch = Scratch::default();
    for ti in 0..sp.t {
        let total = sp.start + ti + 1;
        attend_one(
            &q[ti * hd..(ti + 1) * hd],
            &keys[..total * hd],
            &vals[..total * hd],
            d.window.map_or(0, |w| total.saturating_sub(w)),
            d.scale,
            d.softcap,
            sp.prompt,
            &mut scratch,
            &mut out[ti * hd..(ti + 1) * hd],
        );
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_fma(q: &[f32], keys: &[f32], vals: &[f32], sp: &Span, d: &Dims) -> Vec<f32> {
    head(q, keys, vals, sp, d)
}

#[derive(Default)]
struct Scratch {
    probs: Vec<f32>,
    acc: Vec<f32>,
}

/// softmax(scale · q·Kᵀ)·V for one query over `keys.len() / hd` positions, the first `hidden`
/// masked out (−∞ before the softmax, as ggml masks a sliding window).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_one(
    q: &[f32],
    keys: &[f32],
    vals: &[f32],
    hidden: usize,
    scale: f32,
    softcap: Option<f32>,
    prompt: bool,
    s: &mut Scratch,
    out: &mut [f32],
) {
    let hd = q.len();
    let p = &mut s.probs;
    let npos = keys.len() / hd;
    p.clear();
    p.resize(npos, 0.0);
    // ggml_soft_max_ext: x·scale (+ a zero mask for visible positions); plain loops so all of
    // it inlines into the FMA-enabled caller
    let mut max = f32::NEG_INFINITY;
    for i in hidden.min(npos)..npos {
        let mut x = vec_dot_f32(q, &keys[i * hd..(i + 1) * hd]) * scale;
        if let Some(c) = softcap {
            x = c * (x / c).tanh();
        }
        p[i] = x;
        max = max.max(x);
    }
    for x in p.iter_mut().take(hidden) {
        *x = f32::NEG_INFINITY;
    }
    // ggml_vec_soft_max_f32: 16 lanes of ggml_v_expf, each chunk's reduce added in f64
    // (a chunk wholly hidden sums to zero: skipped, the same bits)
    let mut sum = 0f64;
    let (whole, rest) = p.as_chunks_mut::<16>();
    for chunk in whole.iter_mut().skip(hidden / 16) {
        // a fixed 16 lanes: the polynomial vectorises
        for x in chunk.iter_mut() {
            *x = v_expf(*x - max);
        }
        sum += reduce16(chunk) as f64;
    }
    if !rest.is_empty() {
        let mut lanes = [0f32; 16];
        for (l, x) in rest.iter_mut().enumerate() {
            *x = v_expf(*x - max);
            lanes[l] = *x;
        }
        sum += reduce16(&lanes) as f64;
    }
    let inv = (1.0 / sum) as f32;
    for x in p.iter_mut().skip(hidden) {
        *x *= inv;
    }
    // the hidden positions weigh exactly zero and come first, while every accumulator is
    // still +0: leaving them out of `p·V` gives the same bits (a window of 512 over a
    // 1,300-position history read every value row for each query before)
    if prompt {
        weighted_sum_tinyblas(p, vals, hd, hidden, &mut s.acc, out);
    } else {
        weighted_sum_vec_dot(p, vals, hd, hidden, &mut s.acc, out);
    }
}

/// `_mm512_reduce_add_ps` as GCC expands it: halves, quarters, then pairs.
#[inline(always)]
fn reduce16(a: &[f32; 16]) -> f32 {
    let mut t3 = [0f32; 8];
    for j in 0..8 {
        t3[j] = a[j + 8] + a[j];
    }
    let mut t6 = [0f32; 4];
    for j in 0..4 {
        t6[j] = t3[j + 4] + t3[j];
    }
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// `ggml_vec_dot_f32` (AVX-512): four 16-lane accumulators over 64-element steps, reduced
/// `(s0+s2) + (s1+s3)` then across lanes; leftovers added one by one.
#[inline(always)]
fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let y = &y[..n];
    let np = n & !63;
    let mut sum = [[0f32; 16]; 4];
    // whole 64-element steps as fixed arrays: no bounds checks, so the lanes vectorise
    for (xs, ys) in x.as_chunks::<64>().0.iter().zip(y.as_chunks::<64>().0) {
        for (j, acc) in sum.iter_mut().enumerate() {
            for l in 0..16 {
                acc[l] = xs[16 * j + l].mul_add(ys[16 * j + l], acc[l]);
            }
        }
    }
    let mut r = [0f32; 16];
    for l in 0..16 {
        r[l] = (sum[0][l] + sum[2][l]) + (sum[1][l] + sum[3][l]);
    }
    let mut s = reduce16(&r);
    for i in np..n {
        s += x[i] * y[i];
    }
    s
}

/// `out[d] = Σ_pos p[pos]·v[pos][d]` as tinyBLAS computes it for multi-token passes: per
/// output one 16-lane accumulator over 16-position chunks in order, then reduced. (Positions
/// beyond the last chunk's end contribute zeros in llama.cpp's padded cache.) The lanes are
/// kept as 16 rows of `hd` so every step vectorizes along `d`. Positions before `first`
/// (zero weights) are left out.
#[inline(always)]
fn weighted_sum_tinyblas(
    p: &[f32],
    vals: &[f32],
    hd: usize,
    first: usize,
    acc: &mut Vec<f32>,
    out: &mut [f32],
) {
    acc.clear();
    acc.resize(16 * hd, 0.0);
    for (pos, (pp, vrow)) in p.iter().zip(vals.chunks_exact(hd)).enumerate().skip(first) {
        let lane = &mut acc[(pos % 16) * hd..(pos % 16 + 1) * hd];
        for (a, x) in lane.iter_mut().zip(vrow) {
            *a = x.mul_add(*pp, *a);
        }
    }
    reduce16_rows(acc, hd, out);
}

/// The same sum as `ggml_vec_dot_f32` over positions (llama.cpp's single-token path): four
/// accumulators of 16 lanes, `(s0+s2) + (s1+s3)`, then across lanes; leftovers one by one.
/// Positions before `first` (zero weights) are left out.
#[inline(always)]
fn weighted_sum_vec_dot(
    p: &[f32],
    vals: &[f32],
    hd: usize,
    first: usize,
    acc: &mut Vec<f32>,
    out: &mut [f32],
) {
    let np = p.len() & !63;
    acc.clear();
    acc.resize(64 * hd + 16 * hd, 0.0);
    let (slots, lanes) = acc.split_at_mut(64 * hd);
    for (pos, (pp, vrow)) in p
        .iter()
        .zip(vals.chunks_exact(hd))
        .enumerate()
        .take(np)
        .skip(first)
    {
        let slot = pos % 64; // accumulator (pos / 16) % 4, lane pos % 16
        let row = &mut slots[slot * hd..(slot + 1) * hd];
        for (a, x) in row.iter_mut().zip(vrow) {
            *a = x.mul_add(*pp, *a);
        }
    }
    for l in 0..16 {
        let r = &mut lanes[l * hd..(l + 1) * hd];
        let (a0, a1, a2, a3) = (l * hd, (16 + l) * hd, (32 + l) * hd, (48 + l) * hd);
        for dd in 0..hd {
            r[dd] = (slots[a0 + dd] + slots[a2 + dd]) + (slots[a1 + dd] + slots[a3 + dd]);
        }
    }
    reduce16_rows(lanes, hd, out);
    for pos in np.max(first)..p.len() {
        let vrow = &vals[pos * hd..(pos + 1) * hd];
        for (o, x) in out.iter_mut().zip(vrow) {
            *o += x * p[pos];
        }
    }
}

/// `reduce16` applied to each column of 16 rows of `hd` (in place in `rows`).
#[inline(always)]
fn reduce16_rows(rows: &mut [f32], hd: usize, out: &mut [f32]) {
    // halves: row j += row j+8; quarters: row j += row j+4; then (0+2) + (1+3)
    for j in 0..8 {
        let (lo, hi) = rows.split_at_mut((j + 8) * hd);
        for dd in 0..hd {
            lo[j * hd + dd] += hi[dd];
        }
    }
    for j in 0..4 {
        let (lo, hi) = rows.split_at_mut((j + 4) * hd);
        for dd in 0..hd {
            lo[j * hd + dd] += hi[dd];
        }
    }
    for dd in 0..hd {
        out[dd] = (rows[dd] + rows[2 * hd + dd]) + (rows[hd + dd] + rows[3 * hd + dd]);
    }
}

/// ggml's `ggml_v_expf` (AVX-512) for one lane.
#[inline(always)]
pub(crate) fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // 0x1.715476p+0
    let n = z - r;
    // fnmadd(a, b, c) = c - a·b, one rounding
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),                  // 0x1.7f7d1cp-20
        (-n).mul_add(f32::from_bits(0x3f31_7200), x), // 0x1.62e4p-1
    );
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010) // 0x1.0e4020p-7
        .mul_add(b, f32::from_bits(0x3d2b_9f17)) // 0x1.573e2ep-5
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)), // 0x1.555e66p-3, 0x1.fffdb6p-2
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0)); // 0x1.ffffecp-1
                                                                  // _mm512_scalef_ps: j·2ⁿ, rounded once (2ⁿ is exact in f64 for |n| ≤ 192)
                                                                  // (branch-free, so that lanes of it vectorise: what lies outside ±192 is selected away)
    let two_n = f64::from_bits(((n as i32 as i64 + 1023) as u64) << 52);
    let scaled = (j as f64 * two_n) as f32;
    let saturated = if n <= 0.0 { 0.0 } else { f32::INFINITY };
    if n.abs() > 192.0 {
        saturated
    } else {
        scaled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(q: &[f32], keys: &[f32], vals: &[f32]) -> Vec<f32> {
        let hd = q.len();
        let s: Vec<f64> = keys
            .chunks_exact(hd)
            .map(|k| {
                q.iter()
                    .zip(k)
                    .map(|(a, b)| (*a as f64) * (*b as f64))
                    .sum()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..hd)
            .map(|d| {
                e.iter()
                    .zip(vals.chunks_exact(hd))
                    .map(|(p, v)| p / z * v[d] as f64)
                    .sum::<f64>() as f32
            })
            .collect()
    }

    /// ENG-BATCH-3: the one-query-at-a-time path gives the same bits compiled plain and for
    /// AVX2 + FMA (a decode token, a short prompt chunk, a softcap, a window).
    #[test]
    fn the_per_query_path_gives_the_same_bits_on_every_level() {
        let hd = 64;
        let total = 300;
        let keys: Vec<f32> = (0..total * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let vals: Vec<f32> = (0..total * hd).map(|i| (i as f32 * 0.11).cos()).collect();
        let q: Vec<f32> = (0..5 * hd).map(|i| (i as f32 * 0.53).sin() * 2.0).collect();
        for (t, prompt, softcap, window) in [
            (1, false, None, None),
            (5, true, None, None),
            (1, false, Some(50.0), Some(128)),
        ] {
            let d = Dims {
                n_head: 1,
                n_head_kv: 1,
                head_dim: hd,
                ctx: total,
                scale: 0.125,
                window,
                softcap,
            };
            let sp = Span {
                row: 0,
                start: total - t,
                t,
                offset: 0,
                prompt,
            };
            let plain = head(&q[..t * hd], &keys, &vals, &sp, &d);
            #[cfg(target_arch = "x86_64")]
            {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                if has_fma() {
                    // SAFETY: detected.
                    let fma = unsafe { head_fma(&q[..t * hd], &keys, &vals, &sp, &d) };
                    assert_eq!(bits(&fma), bits(&plain), "fma, {t} tokens");
                }
            }
        }
    }

    /// ENG-BATCH-3: a local layer's hidden positions (the zero weights before the window)
    /// left out of `p·V` give the bits of the sums over every position, both ways of summing,
    /// for windows that end inside and at the edge of a 16- and 64-position block.
    #[test]
    fn positions_before_the_window_are_left_out_with_the_same_bits() {
        let hd = 32;
        let total = 300;
        let vals: Vec<f32> = (0..total * hd).map(|i| (i as f32 * 0.11).cos()).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for hidden in [0, 1, 15, 16, 63, 64, 65, 200, 256, 299] {
            let mut p: Vec<f32> = (0..total)
                .map(|i| ((i as f32 * 0.7).sin() + 1.1) / total as f32)
                .collect();
            for x in &mut p[..hidden] {
                *x = 0.0;
            }
            let (mut acc, mut whole, mut skipped) = (Vec::new(), vec![0f32; hd], vec![0f32; hd]);
            weighted_sum_tinyblas(&p, &vals, hd, 0, &mut acc, &mut whole);
            weighted_sum_tinyblas(&p, &vals, hd, hidden, &mut acc, &mut skipped);
            assert_eq!(bits(&skipped), bits(&whole), "tinyBLAS, {hidden} hidden");
            let (mut whole, mut skipped) = (vec![0f32; hd], vec![0f32; hd]);
            weighted_sum_vec_dot(&p, &vals, hd, 0, &mut acc, &mut whole);
            weighted_sum_vec_dot(&p, &vals, hd, hidden, &mut acc, &mut skipped);
            assert_eq!(bits(&skipped), bits(&whole), "vec_dot, {hidden} hidden");
        }
    }

    /// ENG-BATCH-3: a query's result does not depend on the pass it is in.
    #[test]
    fn matches_naive_attention_and_is_independent_of_the_pass() {
        let d = Dims {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            ctx: 12,
            scale: 1.0,
            window: None,
            softcap: None,
        };
        let f = |i: usize| ((i * 2654435761) % 1000) as f32 / 500.0 - 1.0;
        let k: Vec<f32> = (0..2 * 2 * 12 * 16).map(f).collect();
        let v: Vec<f32> = (0..2 * 2 * 12 * 16).map(|i| f(i + 7)).collect();
        // row 1: 10 tokens in one pass
        let q: Vec<f32> = (0..4 * 10 * 16).map(|i| f(i + 3)).collect();
        let whole = attend(
            &q,
            10,
            &d,
            &[Span {
                row: 1,
                start: 0,
                t: 10,
                offset: 0,
                prompt: true,
            }],
            Stored::F32 { k: &k, v: &v },
            &mut [],
        );
        // the same queries as 4 + 6 tokens, the second part batched behind another segment
        let split_q = |from: usize, t: usize| -> Vec<f32> {
            (0..4)
                .flat_map(|h| q[(h * 10 + from) * 16..(h * 10 + from + t) * 16].to_vec())
                .collect()
        };
        let a = attend(
            &split_q(0, 4),
            4,
            &d,
            &[Span {
                row: 1,
                start: 0,
                t: 4,
                offset: 0,
                prompt: true,
            }],
            Stored::F32 { k: &k, v: &v },
            &mut [],
        );
        let mut q2 = Vec::new();
        let other = split_q(0, 1);
        for h in 0..4 {
            q2.extend_from_slice(&other[h * 16..(h + 1) * 16]);
            q2.extend_from_slice(&split_q(4, 6)[h * 6 * 16..(h + 1) * 6 * 16]);
        }
        let b = attend(
            &q2,
            7,
            &d,
            &[
                Span {
                    row: 0,
                    start: 3,
                    t: 1,
                    offset: 0,
                    prompt: false,
                },
                Span {
                    row: 1,
                    start: 4,
                    t: 6,
                    offset: 1,
                    prompt: true,
                },
            ],
            Stored::F32 { k: &k, v: &v },
            &mut [],
        );
        let width = 4 * 16;
        let mut joined = a.clone();
        joined.extend_from_slice(&b[width..]);
        assert_eq!(whole.len(), joined.len());
        assert!(whole
            .iter()
            .zip(&joined)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
        // and it is attention: compare one query against a float64 reference
        let (h, ti) = (3, 9);
        let kh = h / 2;
        let row = 1;
        let base = (row * 2 + kh) * 12 * 16;
        let want = naive(
            &q[(h * 10 + ti) * 16..][..16],
            &k[base..base + 10 * 16],
            &v[base..base + 10 * 16],
        );
        let got = &whole[ti * width + h * 16..][..16];
        for (w, g) in want.iter().zip(got) {
            assert!((w - g).abs() < 1e-5, "{w} vs {g}");
        }
    }

    /// ENG-BATCH-3, ENG-PREFILL-1: the transposed prompt path gives the per-query path's bits
    /// for every query, at any start, length and head size it takes, beside decode tokens,
    /// with and without a local layer's window (shorter than a block, a block, neither, and
    /// longer than the spans).
    #[test]
    fn the_transposed_path_gives_the_per_query_bits() {
        let f = |i: usize| (((i * 2654435761) >> 7) % 2000) as f32 / 997.0 - 1.0;
        let shapes = [(64, 9, 3), (128, 4, 2), (64, 2, 2)];
        let windows = [None, Some(7), Some(16), Some(40), Some(512)];
        for ((hd, n_head, n_head_kv), window) in shapes
            .into_iter()
            .flat_map(|s| windows.into_iter().map(move |w| (s, w)))
        {
            let ctx = 300;
            let slots = 3;
            let d = Dims {
                n_head,
                n_head_kv,
                head_dim: hd,
                ctx,
                scale: 1.0 / (hd as f32).sqrt(),
                window,
                softcap: None,
            };
            let cache = slots * n_head_kv * ctx * hd;
            // keys large enough that the softmax is far from uniform and some probabilities
            // underflow
            let k: Vec<f32> = (0..cache).map(|i| 6.0 * f(i + 11)).collect();
            let v: Vec<f32> = (0..cache).map(|i| f(i + 5)).collect();
            for (start, t) in [(0, 16), (0, 37), (5, 16), (100, 64), (131, 169)] {
                let spans = [
                    Span {
                        row: 0,
                        start: 17,
                        t: 1,
                        offset: 0,
                        prompt: false,
                    },
                    Span {
                        row: 2,
                        start,
                        t,
                        offset: 1,
                        prompt: true,
                    },
                    Span {
                        row: 1,
                        start: 3,
                        t: 2,
                        offset: 1 + t,
                        prompt: true,
                    },
                ];
                let n = t + 3;
                let q: Vec<f32> = (0..n_head * n * hd).map(|i| 3.0 * f(i + 1)).collect();
                let run = |path| {
                    attend_with(
                        &q,
                        n,
                        &d,
                        &spans,
                        Stored::F32 { k: &k, v: &v },
                        &mut [],
                        path,
                    )
                };
                let reference = run(PromptPath::PerQuery);
                for path in [
                    PromptPath::Transposed,
                    PromptPath::TransposedNative,
                    PromptPath::TransposedAvx512,
                ] {
                    let fast = run(path);
                    let differ = fast
                        .iter()
                        .zip(&reference)
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                        .count();
                    assert_eq!(
                        differ, 0,
                        "{path:?}: hd {hd}, start {start}, t {t}, window {window:?}"
                    );
                }
            }
        }
    }

    /// ENG-CHUNK-4: a prompt going through in chunks over a transposition kept between passes
    /// (extended by each chunk, a short one included) gets the bits of transposing its whole
    /// history every pass (or of one query at a time), on an f32 and an f16 cache.
    #[test]
    fn a_kept_transposition_gives_the_bits_of_a_fresh_one() {
        let f = |i: usize| (((i * 2654435761) >> 7) % 2000) as f32 / 997.0 - 1.0;
        let d = Dims {
            n_head: 9,
            n_head_kv: 3,
            head_dim: 64,
            ctx: 200,
            scale: 0.125,
            window: None,
            softcap: None,
        };
        let len = 2 * 3 * 200 * 64;
        let k: Vec<f32> = (0..len).map(|i| 6.0 * f(i + 11)).collect();
        let v: Vec<f32> = (0..len).map(|i| f(i + 5)).collect();
        let k16: Vec<f16> = k.iter().map(|x| f16::from_f32(*x)).collect();
        let v16: Vec<f16> = v.iter().map(|x| f16::from_f32(*x)).collect();
        for half in [false, true] {
            let stored = || {
                if half {
                    Stored::F16 { k: &k16, v: &v16 }
                } else {
                    Stored::F32 { k: &k, v: &v }
                }
            };
            let mut kept: Vec<HeadPair> = (0..3)
                .map(|_| (Transposed::empty(64), Transposed::empty(64)))
                .collect();
            // chunks of row 1 beside a decode token of row 0; the third is too short to be
            // worth a transposition of its own (alone it goes one query at a time)
            let mut start = 0;
            for (chunk, t) in [16, 37, 10, 16, 53].into_iter().enumerate() {
                let spans = [
                    Span {
                        row: 0,
                        start: 20 + chunk,
                        t: 1,
                        offset: 0,
                        prompt: false,
                    },
                    Span {
                        row: 1,
                        start,
                        t,
                        offset: 1,
                        prompt: true,
                    },
                ];
                let n = t + 1;
                let q: Vec<f32> = (0..9 * n * 64).map(|i| 3.0 * f(i + 7 * start)).collect();
                let path = PromptPath::TransposedNative;
                let fresh = attend_with(&q, n, &d, &spans, stored(), &mut [], path);
                let mut with = [None, Some(kept.as_mut_slice())];
                let reused = attend_with(&q, n, &d, &spans, stored(), &mut with, path);
                assert!(
                    fresh
                        .iter()
                        .zip(&reused)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "chunk {chunk}, f16 {half}"
                );
                // a chunk too short to transpose for goes over the kept one all the same
                assert!(kept
                    .iter()
                    .all(|(a, b)| a.len() == start + t && b.len() == start + t));
                start += t;
            }
        }
    }

    /// ENG-KV16-1: an f16 cache attends exactly as an f32 cache holding the same (f16-rounded)
    /// values: the conversion is the only difference, on every path.
    #[test]
    fn an_f16_cache_attends_as_its_values_widened() {
        let d = Dims {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 64,
            ctx: 80,
            scale: 0.125,
            window: None,
            softcap: None,
        };
        let f = |i: usize| ((i * 2654435761) % 1000) as f32 / 500.0 - 1.0;
        let len = 3 * 2 * 80 * 64;
        let k16: Vec<f16> = (0..len).map(|i| f16::from_f32(f(i))).collect();
        let v16: Vec<f16> = (0..len).map(|i| f16::from_f32(f(i + 5))).collect();
        let k: Vec<f32> = k16.iter().map(|x| x.to_f32()).collect();
        let v: Vec<f32> = v16.iter().map(|x| x.to_f32()).collect();
        let spans = [
            Span {
                row: 0,
                start: 30,
                t: 1,
                offset: 0,
                prompt: false,
            },
            Span {
                row: 2,
                start: 5,
                t: 40,
                offset: 1,
                prompt: true,
            },
        ];
        let q: Vec<f32> = (0..6 * 41 * 64).map(|i| 2.0 * f(i + 1)).collect();
        for path in [
            PromptPath::PerQuery,
            PromptPath::Transposed,
            PromptPath::TransposedNative,
            PromptPath::TransposedAvx512,
        ] {
            let wide = attend_with(
                &q,
                41,
                &d,
                &spans,
                Stored::F32 { k: &k, v: &v },
                &mut [],
                path,
            );
            let half = attend_with(
                &q,
                41,
                &d,
                &spans,
                Stored::F16 { k: &k16, v: &v16 },
                &mut [],
                path,
            );
            assert!(
                wide.iter()
                    .zip(&half)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{path:?}"
            );
        }
    }

    /// The ggml expf polynomial is within a few ulp of the true exponential and saturates
    /// like the vector code.
    #[test]
    fn v_expf_tracks_exp() {
        for i in -2000..=100 {
            let x = i as f32 * 0.05;
            let want = (x as f64).exp();
            let got = v_expf(x) as f64;
            assert!(
                (got - want).abs() <= want * 4e-7 + 1e-38,
                "{x}: {got} vs {want}"
            );
        }
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(-200.0), 0.0);
        assert_eq!(v_expf(0.0), 1.0);
    }
}
