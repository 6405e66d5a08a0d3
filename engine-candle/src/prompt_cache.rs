//! Host-memory prompt cache: the keys and values of prompts whose cache rows were taken by
//! other prompts, so a prompt seen before starts after its cached prefix even when no row
//! holds it any more (llama-server's `--cache-ram` does the same for its slots).
//!
//! Bounded by bytes; the least recently used entries go first. An entry holds the prompt
//! positions of one row: per layer, keys and values `[1, kv_heads, len, head_dim]`.

use std::collections::VecDeque;

use candle_core::Tensor;

/// One saved prompt prefix.
pub(crate) struct Entry {
    pub tokens: Vec<u32>,
    /// Per layer: (keys, values) of positions `0..tokens.len()`.
    pub kv: Vec<(Tensor, Tensor)>,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.kv
            .iter()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum()
    }
}

pub(crate) struct PromptCache {
    /// Least recently used first.
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
    limit: usize,
    /// Changes with every insert (and the evictions it makes): what it holds is published
    /// again when this moves.
    generation: u64,
}

/// Length of the common prefix of two token lists.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCache {
    /// A cache holding at most `limit` bytes (0: disabled).
    pub fn new(limit: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            bytes: 0,
            limit,
            generation: 0,
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The token lists it holds, most recently used first.
    pub fn sequences(&self) -> impl Iterator<Item = &[u32]> {
        self.entries.iter().rev().map(|(e, _)| e.tokens.as_slice())
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether saving `tokens` would add anything: the cache is on and no entry already
    /// starts with all of them.
    pub fn wants(&self, tokens: &[u32], bytes: usize) -> bool {
        !tokens.is_empty()
            && bytes <= self.limit
            && !self
                .entries
                .iter()
                .any(|(e, _)| common_prefix(&e.tokens, tokens) == tokens.len())
    }

    /// Stores `entry` (call `wants` first): entries it contains entirely are dropped, then
    /// the least recently used ones until it fits.
    pub fn insert(&mut self, entry: Entry) {
        let size = entry.bytes();
        if size > self.limit {
            return;
        }
        let mut kept = VecDeque::with_capacity(self.entries.len() + 1);
        for (e, b) in self.entries.drain(..) {
            if common_prefix(&e.tokens, &entry.tokens) == e.tokens.len() {
                self.bytes -= b;
            } else {
                kept.push_back((e, b));
            }
        }
        self.entries = kept;
        while self.bytes + size > self.limit {
            match self.entries.pop_front() {
                Some((_, b)) => self.bytes -= b,
                None => break,
            }
        }
        self.bytes += size;
        self.entries.push_back((entry, size));
        self.generation += 1;
    }

    /// The entry sharing the longest prefix with `prompt`, if that prefix is longer than
    /// `than`; it becomes the most recently used. Returns its keys and values and the prefix
    /// length.
    pub fn best(&mut self, prompt: &[u32], than: usize) -> Option<(&Entry, usize)> {
        let (i, lcp) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, (e, _))| (i, common_prefix(&e.tokens, prompt)))
            .max_by_key(|&(i, l)| (l, i))?;
        if lcp <= than {
            return None;
        }
        let hit = self.entries.remove(i)?;
        self.entries.push_back(hit);
        self.entries.back().map(|(e, _)| (e, lcp))
    }

    /// The longest prefix of `prompt` any entry holds.
    pub fn longest(&self, prompt: &[u32]) -> usize {
        self.entries
            .iter()
            .map(|(e, _)| common_prefix(&e.tokens, prompt))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn entry(tokens: &[u32]) -> Entry {
        let t = Tensor::zeros((1, 1, tokens.len(), 2), DType::F32, &Device::Cpu).unwrap();
        Entry {
            tokens: tokens.to_vec(),
            kv: vec![(t.clone(), t)],
        }
    }

    const TOKEN: usize = 2 * 2 * 4; // keys + values of one token: 2 × 2 floats

    #[test]
    fn the_longest_prefix_wins_and_least_recently_used_go_first() {
        let mut c = PromptCache::new(10 * TOKEN);
        c.insert(entry(&[1, 2, 3]));
        c.insert(entry(&[1, 2, 4, 5]));
        assert_eq!(c.bytes(), 7 * TOKEN);
        let (e, lcp) = c.best(&[1, 2, 4, 9], 0).unwrap();
        assert_eq!((e.tokens.as_slice(), lcp), (&[1, 2, 4, 5][..], 3));
        assert!(c.best(&[1, 2, 4, 9], 3).is_none(), "no longer than 3");
        // [1,2,3] is now the least recently used: a 4-token entry pushes it out
        c.insert(entry(&[7, 7, 7, 7]));
        assert_eq!(c.bytes(), 8 * TOKEN);
        assert_eq!(c.best(&[1, 2, 3], 0).map(|(_, l)| l), Some(2));
    }

    #[test]
    fn contained_prompts_are_not_stored_twice() {
        let mut c = PromptCache::new(100 * TOKEN);
        c.insert(entry(&[1, 2]));
        assert!(!c.wants(&[1, 2], 2 * TOKEN), "already there");
        assert!(!c.wants(&[1], TOKEN), "a prefix of an entry");
        assert!(c.wants(&[1, 2, 3], 3 * TOKEN));
        c.insert(entry(&[1, 2, 3]));
        assert_eq!(c.bytes(), 3 * TOKEN, "[1,2] was replaced by [1,2,3]");
        assert!(!c.wants(&[5; 200], 200 * TOKEN), "larger than the cache");
        assert!(!PromptCache::new(0).wants(&[1], TOKEN), "disabled");
    }
}
