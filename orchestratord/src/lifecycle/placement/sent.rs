//! What placement sent where, for pools whose engines do not say what they hold (PLACE-6): a
//! remote worker forwards to a backend (another orchestratord, vLLM, llama-server) whose cache
//! it cannot see, so the server remembers the prefix blocks of the tasks it placed on each such
//! pool, as SGLang's router and llm-d's approximate scorer do, and counts those as held. Per
//! pool at most `placement.sent_blocks` blocks (the least recently sent go first: a backend's
//! cache evicts too), each forgotten `placement.sent_idle_ms` after it was last sent. Pools no
//! longer registered are dropped when another pool is first sent to.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hashlink::LruCache;
use pool_manager::PREFIX_BLOCK_TOKENS;

pub struct SentPrefixes {
    pools: Mutex<HashMap<String, LruCache<u64, Instant>>>,
    blocks_per_pool: usize,
    idle: Duration,
}

impl SentPrefixes {
    pub fn new(blocks_per_pool: usize, idle: Duration) -> Self {
        Self {
            pools: Mutex::new(HashMap::new()),
            blocks_per_pool: blocks_per_pool.max(1),
            idle,
        }
    }

    /// Prompt tokens of `chain` (a task's prefix blocks) last sent to `pool` within the idle
    /// time: its longest such prefix.
    pub fn held_tokens(&self, pool: &str, chain: &[u64]) -> usize {
        let mut g = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let Some(sent) = g.get_mut(pool) else {
            return 0;
        };
        let mut held = 0;
        for h in chain {
            match sent.peek(h) {
                Some(at) if at.elapsed() <= self.idle => held += 1,
                Some(_) => {
                    sent.remove(h);
                    break;
                }
                None => break,
            }
        }
        held * PREFIX_BLOCK_TOKENS
    }

    /// `chain` was sent to `pool` now. A pool new to the map first drops the pools that
    /// `is_registered` no longer knows: the map holds the registered pools and this one.
    pub fn sent(&self, pool: &str, chain: &[u64], is_registered: impl Fn(&str) -> bool) {
        if chain.is_empty() {
            return;
        }
        let mut g = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if !g.contains_key(pool) {
            g.retain(|id, _| is_registered(id));
        }
        let sent = g
            .entry(pool.to_string())
            .or_insert_with(|| LruCache::new(self.blocks_per_pool));
        let now = Instant::now();
        // the longest prefix last: its blocks are the first to go when the pool's share is full
        for h in chain.iter().rev() {
            sent.insert(*h, now);
        }
    }

    /// Blocks remembered for `pool`.
    pub fn blocks(&self, pool: &str) -> usize {
        let g = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        g.get(pool).map_or(0, |s| s.len())
    }

    /// Pools with blocks remembered.
    pub fn pools(&self) -> usize {
        self.pools.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = PREFIX_BLOCK_TOKENS;

    /// PLACE-6: what was sent counts as held, its longest prefix only, per pool; bounded per
    /// pool (the least recently sent go) and by the pools registered; forgotten when idle.
    #[test]
    fn what_was_sent_is_held_bounded_and_forgotten() {
        let s = SentPrefixes::new(4, Duration::from_secs(60));
        s.sent("w1", &[1, 2, 3], |_| true);
        assert_eq!(s.held_tokens("w1", &[1, 2, 3, 4]), 3 * B);
        assert_eq!(s.held_tokens("w1", &[1, 9, 3]), B);
        assert_eq!(s.held_tokens("w2", &[1, 2, 3]), 0);
        // a fifth block pushes out the least recently sent one: the longest prefix's last
        s.sent("w1", &[7, 8], |_| true);
        assert_eq!(s.blocks("w1"), 4);
        assert_eq!(s.held_tokens("w1", &[1, 2, 3]), 2 * B);
        assert_eq!(s.held_tokens("w1", &[7, 8]), 2 * B);
        // w1 is gone: a new pool's blocks replace it
        s.sent("w2", &[5], |id| id == "w2");
        assert_eq!(s.pools(), 1);
        assert_eq!(s.held_tokens("w1", &[7, 8]), 0);
        assert_eq!(s.held_tokens("w2", &[5]), B);
        let idle = SentPrefixes::new(4, Duration::ZERO);
        idle.sent("w1", &[1, 2], |_| true);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(idle.held_tokens("w1", &[1, 2]), 0);
    }
}
