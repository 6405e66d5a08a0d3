//! What one more token in a pass costs, learned from the engine's own passes: a pass of `t`
//! tokens takes about `fixed + t · per_token` (the weights stream through once; beyond one
//! row the matmuls are bound by compute on a CPU, hardly at all on a GPU). A guess
//! (speculation) is worth feeding when the chance it is kept pays for its `per_token` against
//! what a token of the pass costs on average (`(fixed + t · per_token) / t`), so the chance a
//! guess needs grows with the pass: alone a guess pays above ~0.45 on the 2-core CPU, beside
//! three other streams above ~0.75.
//!
//! The fit is a least-squares line over the passes that decode only (prompt chunks have their
//! own budget), their weights halving every [`HALF_LIFE`] passes; until the passes vary
//! enough in size to fit it, the 2-core CPU's measured ratio stands in.

/// Passes after which an observation counts half.
const HALF_LIFE: f64 = 64.0;
/// `per_token / fixed` before the passes say: measured on the 2-core CPU with the default model
/// (a one-token pass 5.5 ms, seven tokens 3.6 times that).
const DEFAULT_RATIO: f64 = 0.77;

#[derive(Debug, Default)]
pub(crate) struct PassCost {
    n: f64,
    t: f64,
    tt: f64,
    y: f64,
    ty: f64,
}

impl PassCost {
    /// A decode-only pass of `tokens` tokens took `seconds`.
    pub fn observe(&mut self, tokens: usize, seconds: f64) {
        let keep = 0.5f64.powf(1.0 / HALF_LIFE);
        let t = tokens as f64;
        self.n = self.n * keep + 1.0;
        self.t = self.t * keep + t;
        self.tt = self.tt * keep + t * t;
        self.y = self.y * keep + seconds;
        self.ty = self.ty * keep + t * seconds;
    }

    /// `per_token / fixed`, from the fit where the passes varied enough, else the default.
    fn ratio(&self) -> f64 {
        let var = self.n * self.tt - self.t * self.t;
        // sizes that hardly varied (all one-token passes): no slope to read
        if self.n < 8.0 || var < 0.5 * self.n * self.n {
            return DEFAULT_RATIO;
        }
        let per_token = (self.n * self.ty - self.t * self.y) / var;
        let fixed = (self.y - per_token * self.t) / self.n;
        if !(per_token.is_finite() && fixed.is_finite()) || fixed <= 0.0 {
            return DEFAULT_RATIO;
        }
        (per_token / fixed).clamp(0.0, 100.0)
    }

    /// The chance of being kept a guess needs in a pass of `tokens` tokens besides the guesses.
    pub fn chance_needed(&self, tokens: usize) -> f64 {
        let r = self.ratio();
        let t = tokens.max(1) as f64;
        // a guess's cost over a token's average cost in the pass: per_token / ((fixed + t·per_token) / t)
        (t * r / (1.0 + t * r)).clamp(0.05, 0.95)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chance_needed_grows_with_the_pass_and_follows_the_fit() {
        let fresh = PassCost::default();
        let alone = fresh.chance_needed(1);
        assert!((alone - 0.77 / 1.77).abs() < 1e-9, "{alone}");
        assert!(fresh.chance_needed(4) > alone);
        assert!(fresh.chance_needed(8) > fresh.chance_needed(4));
        // passes where a token costs a tenth of the fixed part (a GPU-like machine)
        let mut cheap = PassCost::default();
        for k in 0..200 {
            let t = 1 + k % 7;
            cheap.observe(t, 0.010 + 0.001 * t as f64);
        }
        assert!((cheap.ratio() - 0.1).abs() < 1e-6, "{}", cheap.ratio());
        assert!(cheap.chance_needed(1) < 0.1);
        // one-token passes only: nothing to fit, the default stands
        let mut flat = PassCost::default();
        for _ in 0..100 {
            flat.observe(1, 0.005);
        }
        assert_eq!(flat.ratio(), DEFAULT_RATIO);
    }
}
