//! Prompt attention over a transposed copy of a head's keys and values: the same arithmetic
//! as the per-query path in `attention.rs`, lane for lane, vectorised across positions
//! instead of within one dot product.
//!
//! The per-query path spends most of a long prompt's time in horizontal reductions (one
//! `ggml_vec_dot_f32` per query and key, reduced across 16 lanes each time), in a scalar `expf`
//! and in spilled `p·V` accumulators. Here one pass transposes the head's keys and values to
//! `[head_dim][positions]` (a cost linear in the length, shared by every query of the prompt
//! chunk and by the heads of a group), and then
//! - the scores of 16 positions at once are 16 independent `ggml_vec_dot_f32`s: the same
//!   fused products into four 16-lane accumulators and the same reduce tree, each step a
//!   vertical operation over the 16 positions;
//! - the softmax computes ggml's `expf` polynomial branch-free, so 16 lanes vectorise;
//! - `p·V` is tinyBLAS's 16-lane dot over positions for four outputs at a time, its
//!   accumulators in registers.
//!
//! Each query's result is bit-identical to the per-query path (the tests compare them), so a
//! prompt still gives the same bits whether prefilled whole, in chunks, beside other
//! sequences or resumed from a cached prefix.

use super::{reduce16, v_expf, Dims, LANES};

/// One head's keys (or values), transposed: `data[c · stride + d][l]` is element `d` of
/// position `16·c + l`, positions padded with zeros to whole blocks of 16. A block's `hd`
/// rows are contiguous (the scores read them together); `stride` is one row more than `hd`,
/// so the rows of successive blocks do not all fall into one cache set (with `hd` rows of
/// 64 bytes a block is 4 KiB, and a walk over the blocks of one row evicted itself).
///
/// It grows by positions appended at its end (`extend`): a prompt going through in chunks
/// keeps its heads' transpositions between passes (`kept.rs`) and adds each chunk's keys and
/// values, instead of transposing its whole history again every pass.
pub(crate) struct Transposed {
    data: Vec<[f32; LANES]>,
    blocks: usize,
    stride: usize,
    /// Positions held.
    len: usize,
}

impl Transposed {
    /// Nothing yet, for rows of `hd` elements.
    pub fn empty(hd: usize) -> Self {
        Self {
            data: Vec::new(),
            blocks: 0,
            stride: hd + 1,
            len: 0,
        }
    }

    /// Nothing yet, with room for `positions` (extended up to them without moving).
    pub fn with_room(hd: usize, positions: usize) -> Self {
        let mut t = Self::empty(hd);
        t.data.reserve_exact(positions.div_ceil(LANES) * t.stride);
        t
    }

    /// `rows` is `[len][hd]` (one cache row's head, positions `0..len`).
    pub fn new(rows: &[f32], hd: usize) -> Self {
        let mut t = Self::empty(hd);
        t.extend(rows);
        t
    }

    /// Appends `rows` (`[n][hd]`: the positions `len..len + n` of the head).
    pub fn extend(&mut self, rows: &[f32]) {
        let hd = self.stride - 1;
        let len = self.len + rows.len() / hd;
        let blocks = len.div_ceil(LANES);
        if blocks > self.blocks {
            // the padding of a new block is zeros, as a fresh transposition's
            self.data.resize(blocks * self.stride, [0f32; LANES]);
            self.blocks = blocks;
        }
        for (i, row) in rows.chunks_exact(hd).enumerate() {
            let p = self.len + i;
            let block = &mut self.data[(p / LANES) * self.stride..][..hd];
            let l = p % LANES;
            for (dst, x) in block.iter_mut().zip(row) {
                dst[l] = *x;
            }
        }
        self.len = len;
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Blocks of 16 positions.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Element `d` of the 16 positions of block `c`.
    #[inline(always)]
    pub fn block(&self, d: usize, c: usize) -> &[f32; LANES] {
        &self.data[c * self.stride + d]
    }
}

/// Whether the transposed path computes the same arithmetic for this head size: whole
/// 64-element steps of `ggml_vec_dot_f32` (no leftovers) and whole 4-output groups.
pub(super) fn supports(hd: usize) -> bool {
    hd > 0 && hd.is_multiple_of(64)
}

/// Queries `first..first + count` of one head of a prompt segment whose first query is at
/// position `start`.
pub(super) struct Block<'a> {
    /// The segment's queries for this head, `[t][hd]`.
    pub q: &'a [f32],
    pub start: usize,
    pub first: usize,
    pub count: usize,
    /// The head's keys and values, transposed.
    pub keys: &'a Transposed,
    pub vals: &'a Transposed,
    pub dims: &'a Dims,
}

/// Attention of the block's queries: `[count][hd]` into `out`.
#[inline(always)]
pub(super) fn queries(b: &Block<'_>, out: &mut [f32]) {
    let hd = b.dims.head_dim;
    let mut probs = vec![[0f32; LANES]; b.keys.blocks];
    for i in 0..b.count {
        let ti = b.first + i;
        let total = b.start + ti + 1;
        let hidden = hidden_before(b.dims, total);
        // blocks wholly before a local layer's window weigh zero everywhere: left out
        let lo = hidden / LANES;
        let p = &mut probs[lo..total.div_ceil(LANES)];
        scores(
            &b.q[ti * hd..(ti + 1) * hd],
            b.keys,
            lo,
            hidden..total,
            b.dims.scale,
            p,
        );
        softmax(p);
        weighted_sum(p, b.vals, hd, lo, &mut out[i * hd..(i + 1) * hd]);
    }
}

/// Positions a query whose history is `total` positions long does not see: those before a
/// local layer's window (masked as ggml masks them: −∞ before the softmax, so they weigh
/// exactly zero and, all coming first, leave every sum over positions as it was).
#[inline(always)]
pub(super) fn hidden_before(d: &Dims, total: usize) -> usize {
    d.window.map_or(0, |w| total.saturating_sub(w))
}

/// `p[c][l] = ggml_vec_dot_f32(q, k[pos]) · scale` for position `pos = 16·(lo + c) + l` in
/// `seen`, −∞ for the others (hidden, or padding).
#[inline(always)]
fn scores(
    q: &[f32],
    keys: &Transposed,
    lo: usize,
    seen: std::ops::Range<usize>,
    scale: f32,
    p: &mut [[f32; LANES]],
) {
    for (c, chunk) in p.iter_mut().enumerate() {
        let c = lo + c;
        let p0 = c * LANES;
        // reduce16 over the lanes r[l] of 16 positions at once: t3[j] = r[j+8] + r[j],
        // t6[j] = t3[j+4] + t3[j], s = (t6[0] + t6[2]) + (t6[1] + t6[3])
        let (u0, u2) = (t6(q, keys, c, 0), t6(q, keys, c, 2));
        let (u1, u3) = (t6(q, keys, c, 1), t6(q, keys, c, 3));
        for k in 0..LANES {
            let s = (u0[k] + u2[k]) + (u1[k] + u3[k]);
            chunk[k] = if seen.contains(&(p0 + k)) {
                s * scale
            } else {
                f32::NEG_INFINITY
            };
        }
    }
}

/// `t6[j] = (r[j+12] + r[j+4]) + (r[j+8] + r[j])` of `reduce16`, for 16 positions.
#[inline(always)]
fn t6(q: &[f32], keys: &Transposed, block: usize, j: usize) -> [f32; LANES] {
    let (a, b) = (lane(q, keys, block, j), lane(q, keys, block, j + 4));
    let (c, e) = (lane(q, keys, block, j + 8), lane(q, keys, block, j + 12));
    let mut t = [0f32; LANES];
    for k in 0..LANES {
        t[k] = (e[k] + b[k]) + (c[k] + a[k]);
    }
    t
}

/// Lane `l` of `ggml_vec_dot_f32` before its reduce, `(acc0 + acc2) + (acc1 + acc3)`, where
/// accumulator `j` sums the fused products of elements `64·b + 16·j + l`; for 16 positions.
#[inline(always)]
fn lane(q: &[f32], keys: &Transposed, block: usize, l: usize) -> [f32; LANES] {
    let mut acc = [[0f32; LANES]; 4];
    for b in (0..q.len()).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            let dd = b + 16 * j + l;
            let x = q[dd];
            let row = keys.block(dd, block);
            for k in 0..LANES {
                a[k] = x.mul_add(row[k], a[k]);
            }
        }
    }
    let mut r = [0f32; LANES];
    for k in 0..LANES {
        r[k] = (acc[0][k] + acc[2][k]) + (acc[1][k] + acc[3][k]);
    }
    r
}

/// ggml_vec_soft_max_f32 over the scores in place: 16 lanes of `expf(x − max)`, each
/// chunk's reduce added in f64, then scaled by the inverse sum. Padding gives zeros.
#[inline(always)]
fn softmax(p: &mut [[f32; LANES]]) {
    let mut max = f32::NEG_INFINITY;
    for x in p.as_flattened() {
        max = max.max(*x);
    }
    let mut sum = 0f64;
    for chunk in p.iter_mut() {
        for x in chunk.iter_mut() {
            *x = v_expf(*x - max);
        }
        sum += reduce16(chunk) as f64;
    }
    let inv = (1.0 / sum) as f32;
    for x in p.as_flattened_mut() {
        *x *= inv;
    }
}

/// tinyBLAS's `p·V`: per output one 16-lane accumulator over the positions in 16-position
/// chunks, in order, then `reduce16`; four outputs at a time. `p[c]` weighs block `lo + c`.
#[inline(always)]
fn weighted_sum(p: &[[f32; LANES]], vals: &Transposed, hd: usize, lo: usize, out: &mut [f32]) {
    for d0 in (0..hd).step_by(4) {
        let mut acc = [[0f32; LANES]; 4];
        for (c, pc) in p.iter().enumerate() {
            for (dd, a) in acc.iter_mut().enumerate() {
                let row = vals.block(d0 + dd, lo + c);
                for l in 0..LANES {
                    a[l] = row[l].mul_add(pc[l], a[l]);
                }
            }
        }
        for (dd, a) in acc.iter().enumerate() {
            out[d0 + dd] = reduce16(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ENG-CHUNK-4: a prompt's transposition made with room for the prompt is extended chunk
    /// by chunk up to its end without moving (no pass copies the history), and holds what a
    /// transposition of the whole history holds.
    #[test]
    fn a_prompts_transposition_fills_its_room_without_moving() {
        let (hd, positions) = (64, 1_000);
        let rows: Vec<f32> = (0..positions * hd)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let mut t = Transposed::with_room(hd, positions);
        let at = t.data.as_ptr();
        for chunk in rows.chunks(16 * hd) {
            t.extend(chunk);
            assert_eq!(t.data.as_ptr(), at, "moved at {} positions", t.len());
        }
        let whole = Transposed::new(&rows, hd);
        assert_eq!((t.len(), t.blocks()), (whole.len(), whole.blocks()));
        for c in 0..t.blocks() {
            for d in 0..hd {
                assert_eq!(t.block(d, c), whole.block(d, c));
            }
        }
    }
}
