//! Rotary position embedding with ggml's arithmetic, shared by the decoders (`model.rs`) and
//! the rotary encoders (`bert.rs`, nomic-bert): the angles as ggml's rope cache builds them
//! and the rotation of each pair as GCC contracts ggml's `rotate_pairs`.

/// `[ctx, head_dim/2]` angles: θ starts at the position and is multiplied by
/// base^(-2/head_dim) once per pair, in f32 (the rounding of that running product is part of
/// llama.cpp's numerics); each divided by its frequency factor, when the model has them, and
/// scaled by `freq_scale` (linear RoPE scaling).
pub(crate) fn angles(
    head_dim: usize,
    base: f32,
    freq_scale: f32,
    freq_factors: Option<&[f32]>,
    ctx: usize,
) -> Vec<f32> {
    let half = head_dim / 2;
    let theta_scale = base.powf(-2.0 / head_dim as f32);
    let mut angles = Vec::with_capacity(ctx * half);
    for p in 0..ctx {
        let mut theta = p as f32;
        for i in 0..half {
            let ff = freq_factors.map_or(1.0, |f| f[i]);
            angles.push(freq_scale * (theta / ff));
            theta *= theta_scale;
        }
    }
    angles
}

/// The cos and sin tables (`[ctx, head_dim/2]`) and the pairing of a model.
pub(crate) struct Rotary<'a> {
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    /// Pairs `(2i, 2i+1)` (GPT-J, llama.cpp's "norm"), else `(i, i + half)` (GPT-NeoX).
    pub interleaved: bool,
}

impl Rotary<'_> {
    /// Rotates `[heads, n, hd]` in place, row `(h, t)` by the angles of `positions[t]`.
    pub fn rotate(&self, v: &mut [f32], heads: usize, n: usize, hd: usize, positions: &[u32]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA were detected.
            unsafe { rotate_fma(self, v, heads, n, hd, positions) };
            return;
        }
        rotate(self, v, heads, n, hd, positions);
    }
}

/// `x0·c − x1·s` with the first product fused and `x0·s + x1·c` with the second fused.
#[inline(always)]
fn rotate(r: &Rotary<'_>, v: &mut [f32], heads: usize, n: usize, hd: usize, positions: &[u32]) {
    let half = hd / 2;
    for h in 0..heads {
        for (t, &p) in positions.iter().enumerate() {
            let row = &mut v[(h * n + t) * hd..(h * n + t + 1) * hd];
            let p = p as usize;
            let cs = &r.cos[p * half..(p + 1) * half];
            let sn = &r.sin[p * half..(p + 1) * half];
            for i in 0..half {
                let (a, b) = if r.interleaved {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + half)
                };
                let (x0, x1, c, s) = (row[a], row[b], cs[i], sn[i]);
                row[a] = x0.mul_add(c, -(x1 * s));
                row[b] = x1.mul_add(c, x0 * s);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rotate_fma(
    r: &Rotary<'_>,
    v: &mut [f32],
    heads: usize,
    n: usize,
    hd: usize,
    positions: &[u32],
) {
    rotate(r, v, heads, n, hd, positions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_neox_pair_turns_by_its_positions_angle() {
        // head_dim 4: pairs (0, 2) and (1, 3); base 100: the second pair's angle is p/10
        let a = angles(4, 100.0, 1.0, None, 3);
        assert_eq!(a.len(), 6);
        assert!(
            (a[4] - 2.0).abs() < 1e-6 && (a[5] - 0.2).abs() < 1e-6,
            "{a:?}"
        );
        let cos: Vec<f32> = a.iter().map(|x| x.cos()).collect();
        let sin: Vec<f32> = a.iter().map(|x| x.sin()).collect();
        let r = Rotary {
            cos: &cos,
            sin: &sin,
            interleaved: false,
        };
        // one head, two tokens at positions 0 and 2
        let mut v = vec![1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0];
        r.rotate(&mut v, 1, 2, 4, &[0, 2]);
        assert_eq!(&v[..4], &[1.0, 1.0, 0.0, 0.0]);
        let want = [2f32.cos(), 0.2f32.cos(), 2f32.sin(), 0.2f32.sin()];
        for (g, w) in v[4..].iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{v:?}");
        }
    }
}
