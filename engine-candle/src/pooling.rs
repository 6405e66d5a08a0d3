//! Pooling a sequence's last hidden states into one vector, as llama.cpp names the kinds
//! (`{arch}.pooling_type`: 0 none, 1 mean, 2 cls, 3 last, 4 rank), and the L2 normalization
//! embeddings are given with by default.

pub use engine_port::Pooling;

/// Pools `hidden` (`t` rows of `width`, row-major) as `pooling` says, for the kinds that need
/// no head (`Rank`'s first step is `Cls`); `None` gives the rows as they are.
pub fn pool(hidden: &[f32], width: usize, pooling: Pooling) -> Vec<Vec<f32>> {
    let rows: Vec<&[f32]> = hidden.chunks_exact(width).collect();
    match pooling {
        Pooling::None => rows.iter().map(|r| r.to_vec()).collect(),
        Pooling::Cls | Pooling::Rank => rows.first().map(|r| r.to_vec()).into_iter().collect(),
        Pooling::Last => rows.last().map(|r| r.to_vec()).into_iter().collect(),
        Pooling::Mean => {
            let mut sum = vec![0f64; width];
            for r in &rows {
                for (s, v) in sum.iter_mut().zip(r.iter()) {
                    *s += f64::from(*v);
                }
            }
            let n = rows.len().max(1) as f64;
            vec![sum.into_iter().map(|s| (s / n) as f32).collect()]
        }
    }
}

/// `v` scaled to unit L2 length (a zero vector stays zero), as llama-server and
/// sentence-transformers give embeddings.
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for x in v.iter_mut() {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ENG-EMB-2: each pooling takes the rows it names; mean is the mean; normalized vectors
    /// have unit length, a zero vector stays zero; llama.cpp's numbers map to the kinds.
    #[test]
    fn each_pooling_takes_what_it_names() {
        let h = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(pool(&h, 2, Pooling::Mean), vec![vec![3.0, 4.0]]);
        assert_eq!(pool(&h, 2, Pooling::Cls), vec![vec![1.0, 2.0]]);
        assert_eq!(pool(&h, 2, Pooling::Last), vec![vec![5.0, 6.0]]);
        assert_eq!(pool(&h, 2, Pooling::None).len(), 3);
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0, 0.0];
        normalize(&mut z);
        assert_eq!(z, vec![0.0, 0.0]);
        assert_eq!(Pooling::from_gguf(1), Some(Pooling::Mean));
        assert_eq!(Pooling::from_gguf(4), Some(Pooling::Rank));
        assert_eq!(Pooling::from_gguf(9), None);
        assert_eq!("cls".parse::<Pooling>().unwrap(), Pooling::Cls);
    }
}
