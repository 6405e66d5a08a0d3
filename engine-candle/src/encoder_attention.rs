//! An encoder pass's bidirectional attention on the CPU: one job per sequence and head on the
//! process's compute pool (gemm for the two products, the softmax between), each over exactly
//! its sequence's tokens — so no sequence's result depends on the others, and the pool's
//! workers share the attention instead of spinning while one thread runs it sequence after
//! sequence (measured before: 15 % of an encoder pass's samples on 2 cores).

use crate::cpu_parallel::par_chunks_mut;

/// The attention output (`Σ t × width`, row-major) of sequences of `lens` tokens whose
/// queries, keys and values are `q`, `k`, `v` (each `Σ t × width`, the sequences one after
/// another), `n_head` heads of `width / n_head` columns, scores scaled by `scale`.
pub(crate) fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    lens: &[usize],
    n_head: usize,
    width: usize,
    scale: f32,
) -> Vec<f32> {
    let hd = width / n_head;
    let total: usize = lens.iter().sum();
    assert!(
        hd * n_head == width && [q.len(), k.len(), v.len()] == [total * width; 3],
        "attention of {total} tokens, {n_head} heads of width {width}"
    );
    let starts: Vec<usize> = lens
        .iter()
        .scan(0, |at, &t| {
            let s = *at;
            *at += t;
            Some(s)
        })
        .collect();
    // one output buffer per (sequence, head): its `t × hd` rows
    let mut heads: Vec<Vec<f32>> = (0..lens.len() * n_head)
        .map(|j| vec![0f32; lens[j / n_head] * hd])
        .collect();
    par_chunks_mut(&mut heads, 1, |j, out| {
        let (s, h) = (j / n_head, j % n_head);
        let (t, at) = (lens[s], starts[s]);
        let base = at * width + h * hd;
        if t <= SHORT {
            short(
                &q[base..],
                &k[base..],
                &v[base..],
                t,
                hd,
                width,
                scale,
                &mut out[0],
            );
            return;
        }
        let mut scores = vec![0f32; t * t];
        // SAFETY: every pointer and stride stays within the sequence's rows of `q`, `k`, `v`
        // (t rows of `width` from `at`, columns h·hd.. h·hd + hd) and the buffers made here.
        unsafe {
            // scores[i, j] = scale · q_i · k_j: q's rows (row stride width) times k's transpose
            gemm::gemm(
                t,
                t,
                hd,
                scores.as_mut_ptr(),
                1,
                t as isize,
                false,
                q[base..].as_ptr(),
                1,
                width as isize,
                k[base..].as_ptr(),
                width as isize,
                1,
                0.0,
                scale,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        for row in scores.chunks_exact_mut(t) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for x in row.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            for x in row.iter_mut() {
                *x /= sum;
            }
        }
        let dst = &mut out[0];
        // SAFETY: as above; `dst` holds t × hd.
        unsafe {
            gemm::gemm(
                t,
                hd,
                t,
                dst.as_mut_ptr(),
                1,
                hd as isize,
                false,
                scores.as_ptr(),
                1,
                t as isize,
                v[base..].as_ptr(),
                1,
                width as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    });
    let mut out = vec![0f32; total * width];
    for (j, head) in heads.iter().enumerate() {
        let (s, h) = (j / n_head, j % n_head);
        for (i, row) in head.chunks_exact(hd).enumerate() {
            let at = (starts[s] + i) * width + h * hd;
            out[at..at + hd].copy_from_slice(row);
        }
    }
    out
}

/// Sequences up to this long take plain loops: two gemm calls per sequence and head cost
/// more than their products (32 short queries of ~9 tokens, 12 heads: 768 calls a layer,
/// ~1 ms of a 6-layer pass's ~6 ms of attention on 2 cores).
const SHORT: usize = 32;

/// One short sequence's head: `q`, `k`, `v` start at its first row's head columns (rows
/// `width` apart); `out` is its `t × hd` rows. Sums in lanes of eight, then across them.
#[allow(clippy::too_many_arguments)]
fn short(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    t: usize,
    hd: usize,
    width: usize,
    scale: f32,
    out: &mut [f32],
) {
    fn row(m: &[f32], i: usize, width: usize, hd: usize) -> &[f32] {
        &m[i * width..i * width + hd]
    }
    let mut p = vec![0f32; t];
    for i in 0..t {
        let qi = row(q, i, width, hd);
        for (j, pj) in p.iter_mut().enumerate() {
            *pj = dot(qi, row(k, j, width, hd)) * scale;
        }
        let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for x in p.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        let o = &mut out[i * hd..(i + 1) * hd];
        o.fill(0.0);
        for (j, pj) in p.iter().enumerate() {
            let w = pj / sum;
            for (a, b) in o.iter_mut().zip(row(v, j, width, hd)) {
                *a += w * b;
            }
        }
    }
}

/// `a · b` summed in eight lanes (they vectorise), then across them.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ac, ar) = a.as_chunks::<8>();
    let (bc, br) = b.as_chunks::<8>();
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain formula, sequence by sequence and head by head.
    fn reference(q: &[f32], k: &[f32], v: &[f32], lens: &[usize], nh: usize, w: usize) -> Vec<f32> {
        let (hd, scale) = (w / nh, 1.0 / ((w / nh) as f32).sqrt());
        let mut out = vec![0f32; q.len()];
        let mut at = 0;
        for &t in lens {
            for h in 0..nh {
                for i in 0..t {
                    let s: Vec<f32> = (0..t)
                        .map(|j| {
                            (0..hd)
                                .map(|d| {
                                    q[(at + i) * w + h * hd + d] * k[(at + j) * w + h * hd + d]
                                })
                                .sum::<f32>()
                                * scale
                        })
                        .collect();
                    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
                    let sum: f32 = e.iter().sum();
                    for d in 0..hd {
                        out[(at + i) * w + h * hd + d] = (0..t)
                            .map(|j| e[j] / sum * v[(at + j) * w + h * hd + d])
                            .sum();
                    }
                }
            }
            at += t;
        }
        out
    }

    /// Each sequence attends over its own tokens only, as the formula says, whatever its
    /// neighbours in the pass, short or long.
    #[test]
    fn sequences_attend_over_their_own_tokens() {
        let (nh, w) = (4, 32);
        // short ones (plain loops) and one past `SHORT` (gemm)
        let lens = [3usize, 17, 1, 9, SHORT + 8];
        let n: usize = lens.iter().sum::<usize>() * w;
        let val = |seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i * 31 + seed * 7) % 23) as f32 - 11.0) / 9.0)
                .collect()
        };
        let (q, k, v) = (val(1), val(2), val(3));
        let got = attend(&q, &k, &v, &lens, nh, w, 1.0 / ((w / nh) as f32).sqrt());
        let want = reference(&q, &k, &v, &lens, nh, w);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-4, "[{i}]: {a} vs {b}");
        }
        // the second sequence alone gives the same rows
        let (s, e) = (3 * w, 20 * w);
        let alone = attend(
            &q[s..e],
            &k[s..e],
            &v[s..e],
            &[17],
            nh,
            w,
            1.0 / 8f32.sqrt(),
        );
        assert_eq!(&alone[..], &got[s..e]);
    }
}
