//! One embedding request as the engines take it (an encoder's thread, a decoder's
//! scheduler): its inputs tokenized, how to pool them, where the answer goes — and how one
//! input's hidden states become its vectors as they come, a chunk at a time.

use engine_port::{Embeddings, Pooling, PortError, SlotPermit};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::pooling::normalize;

/// One request's inputs, tokenized, to embed in its slot.
pub struct EmbedRequest {
    pub permit: SlotPermit,
    pub inputs: Vec<Vec<u32>>,
    pub pooling: Pooling,
    pub normalize: bool,
    pub cancel: CancellationToken,
    /// Every input's vectors; `Dead` when the job was cancelled, `Load` when a pass failed.
    pub reply: oneshot::Sender<Result<Embeddings, PortError>>,
}

/// One input's pooling so far, fed its hidden states a chunk of tokens at a time.
pub(crate) struct Pooled {
    pooling: Pooling,
    width: usize,
    sum: Vec<f64>,
    rows: Vec<Vec<f32>>,
    seen: usize,
}

impl Pooled {
    pub fn new(pooling: Pooling, width: usize) -> Self {
        Self {
            pooling,
            width,
            sum: Vec::new(),
            rows: Vec::new(),
            seen: 0,
        }
    }

    /// The next `t` tokens' hidden states (`t` rows of `width`).
    pub fn feed(&mut self, hidden: &[f32]) {
        let w = self.width;
        for row in hidden.chunks_exact(w) {
            match self.pooling {
                Pooling::Mean => {
                    if self.sum.is_empty() {
                        self.sum = vec![0.0; w];
                    }
                    for (s, v) in self.sum.iter_mut().zip(row) {
                        *s += f64::from(*v);
                    }
                }
                Pooling::Cls | Pooling::Rank if self.seen == 0 => self.rows = vec![row.to_vec()],
                Pooling::Cls | Pooling::Rank => {}
                Pooling::Last => self.rows = vec![row.to_vec()],
                Pooling::None => self.rows.push(row.to_vec()),
            }
            self.seen += 1;
        }
    }

    /// The input's vectors, each at unit length when `unit`.
    pub fn finish(self, unit: bool) -> Vec<Vec<f32>> {
        let mut out = match self.pooling {
            Pooling::Mean => {
                let n = self.seen.max(1) as f64;
                vec![self.sum.into_iter().map(|s| (s / n) as f32).collect()]
            }
            _ => self.rows,
        };
        if unit {
            out.iter_mut().for_each(|v| normalize(v));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ENG-EMB-2: fed in chunks, each pooling gives what the whole would: the mean of every
    /// row, the first, the last, all of them.
    #[test]
    fn pooling_fed_in_chunks_is_the_pooling_of_the_whole() {
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let run = |p: Pooling| {
            let mut pooled = Pooled::new(p, 2);
            pooled.feed(&rows[..2]);
            pooled.feed(&rows[2..6]);
            pooled.feed(&rows[6..]);
            pooled.finish(false)
        };
        assert_eq!(run(Pooling::Mean), vec![vec![4.0, 5.0]]);
        assert_eq!(run(Pooling::Cls), vec![vec![1.0, 2.0]]);
        assert_eq!(run(Pooling::Last), vec![vec![7.0, 8.0]]);
        assert_eq!(run(Pooling::None).len(), 4);
    }
}
