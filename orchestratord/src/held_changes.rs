//! What pools hold, said as a stream of changes (PLACE-6, PLACE-8): per key — a pool of a
//! replica, or a model of a remote worker — the block hashes (`engine_port::prefix`) added and
//! evicted since the key's previous message, numbered; the whole set when the key is new, on
//! request, and every so often. A reader applies changes in order and takes a whole set as
//! the truth; a message missed (a gap in the numbers) leaves the key counting for nothing until
//! its next whole set. Block hashes travel as base64 of little-endian `u64`s.
//!
//! The writer is [`Publisher`], the reader [`Followed`]; the cluster (`cluster/held_prefixes.rs`)
//! and the worker protocol (`worker/held.rs`, `remote_workers/link.rs`) put them in their own
//! messages.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use pool_manager::CachedPrefixes;

/// Block hashes in one message at most (a whole set goes in several: 64 KiB of hashes each).
pub const HASHES_PER_MESSAGE: usize = 8192;

/// One message's worth: a key's changes, or (`full`) the first part of its whole set (the rest
/// follow as changes), or (`gone`) the key's end.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub key: String,
    /// One more than the key's previous message.
    pub seq: u64,
    pub full: bool,
    pub gone: bool,
    pub added: Vec<u64>,
    pub evicted: Vec<u64>,
}

/// What was said last of one key.
struct Said {
    held: Arc<CachedPrefixes>,
    seq: u64,
    full_at: Instant,
}

/// The writer's side: what it said of each key.
#[derive(Default)]
pub struct Publisher {
    said: HashMap<String, Said>,
}

impl Publisher {
    /// The messages that say what each key of `now` holds, given what was said before: nothing
    /// for a key that did not change; its whole set when it is new, when `whole` asks, or when
    /// `full_every` passed since its last one; the end of every key said before and missing
    /// from `now`.
    pub fn changes(
        &mut self,
        now: Vec<(String, Arc<CachedPrefixes>)>,
        whole: bool,
        full_every: Duration,
    ) -> Vec<Change> {
        let mut out = Vec::new();
        let mut seen = Vec::with_capacity(now.len());
        for (key, held) in now {
            seen.push(key.clone());
            let msg = |seq: u64, full: bool, added: &[u64], evicted: Vec<u64>| Change {
                key: key.clone(),
                seq,
                full,
                gone: false,
                added: added.to_vec(),
                evicted,
            };
            let (seq, full_at) = match self.said.get(&key) {
                Some(p) if !whole && p.full_at.elapsed() < full_every => {
                    if Arc::ptr_eq(&p.held, &held) || *p.held == *held {
                        continue;
                    }
                    let (added, evicted) = held.changes_from(&p.held);
                    let mut seq = p.seq;
                    let mut evicted = Some(evicted);
                    // only evictions: one message
                    for chunk in added
                        .chunks(HASHES_PER_MESSAGE)
                        .chain(added.is_empty().then_some(&[][..]))
                    {
                        seq += 1;
                        out.push(msg(seq, false, chunk, evicted.take().unwrap_or_default()));
                    }
                    (seq, p.full_at)
                }
                prev => {
                    let hashes: Vec<u64> = held.hashes().collect();
                    let mut seq = prev.map_or(0, |p| p.seq);
                    for (i, chunk) in hashes
                        .chunks(HASHES_PER_MESSAGE)
                        .chain(hashes.is_empty().then_some(&[][..]))
                        .enumerate()
                    {
                        seq += 1;
                        out.push(msg(seq, i == 0, chunk, Vec::new()));
                    }
                    (seq, Instant::now())
                }
            };
            self.said.insert(key, Said { held, seq, full_at });
        }
        let gone: Vec<String> = self
            .said
            .keys()
            .filter(|k| !seen.contains(k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(p) = self.said.remove(&key) {
                out.push(Change {
                    key,
                    seq: p.seq + 1,
                    full: false,
                    gone: true,
                    added: Vec::new(),
                    evicted: Vec::new(),
                });
            }
        }
        out
    }
}

/// The reader's side of one key.
#[derive(Default)]
pub struct Followed {
    blocks: Arc<CachedPrefixes>,
    seq: u64,
    /// Every message since its last whole set arrived (else it counts for nothing).
    complete: bool,
}

impl Followed {
    /// Takes message `seq` in (at most `room` blocks held in all); says whether the key counts
    /// now (false: a message was missed, or none but changes came yet).
    pub fn take(
        &mut self,
        seq: u64,
        full: bool,
        added: &[u64],
        evicted: &[u64],
        room: usize,
    ) -> bool {
        if full {
            self.blocks = Arc::new(CachedPrefixes::from_blocks(
                added.iter().copied().take(room),
            ));
            self.complete = true;
        } else if self.complete && seq == self.seq + 1 {
            let fits = room.saturating_sub(self.blocks.blocks());
            Arc::make_mut(&mut self.blocks).apply(&added[..added.len().min(fits)], evicted);
        } else {
            self.complete = false;
        }
        self.seq = seq;
        self.complete
    }

    /// What the key holds, while every message since its last whole set arrived.
    pub fn held(&self) -> Option<&Arc<CachedPrefixes>> {
        self.complete.then_some(&self.blocks)
    }

    /// Blocks held now (counted against a reader's bound whether complete or not).
    pub fn blocks(&self) -> usize {
        self.blocks.blocks()
    }
}

/// Block hashes on the wire: base64 of little-endian `u64`s.
pub fn encode(hashes: &[u64]) -> String {
    let bytes: Vec<u8> = hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// [`encode`]'s text back to hashes; `None` when it is not whole hashes.
pub fn decode(text: &str) -> Option<Vec<u64>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    if bytes.len() % 8 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = pool_manager::PREFIX_BLOCK_TOKENS;

    fn set(hashes: &[u64]) -> Arc<CachedPrefixes> {
        Arc::new(CachedPrefixes::from_blocks(hashes.iter().copied()))
    }

    /// A reader fed every message a publisher writes holds what the publisher's keys hold:
    /// the whole set first, then changes (big ones in several messages), nothing for a key
    /// that did not change, the end of a key that went.
    #[test]
    fn a_reader_of_every_message_holds_what_was_published() {
        let mut p = Publisher::default();
        let mut r: HashMap<String, Followed> = HashMap::new();
        let feed = |changes: Vec<Change>, r: &mut HashMap<String, Followed>| {
            for c in changes {
                if c.gone {
                    r.remove(&c.key);
                    continue;
                }
                let f = r.entry(c.key.clone()).or_default();
                assert!(f.take(c.seq, c.full, &c.added, &c.evicted, usize::MAX));
            }
        };
        let every = Duration::from_secs(60);
        let big: Vec<u64> = (100..100 + 2 * HASHES_PER_MESSAGE as u64 + 5).collect();
        let first = p.changes(
            vec![("a".into(), set(&[1, 2])), ("b".into(), set(&big))],
            false,
            every,
        );
        assert_eq!(first.iter().filter(|c| c.key == "b").count(), 3);
        assert_eq!(first.iter().filter(|c| c.full).count(), 2);
        feed(first, &mut r);
        assert_eq!(r["a"].held().unwrap().held_tokens(&[1, 2, 3]), 2 * B);
        assert_eq!(r["b"].blocks(), big.len());
        // unchanged: nothing to say
        assert!(p
            .changes(
                vec![("a".into(), set(&[1, 2])), ("b".into(), set(&big))],
                false,
                every
            )
            .is_empty());
        // a change to a, b gone
        let next = p.changes(vec![("a".into(), set(&[1, 3]))], false, every);
        assert_eq!(next.len(), 2, "{next:?}");
        feed(next, &mut r);
        assert_eq!(r["a"].held().unwrap().held_tokens(&[1, 3]), 2 * B);
        assert_eq!(r["a"].held().unwrap().held_tokens(&[1, 2]), B);
        assert!(!r.contains_key("b"));
        // asked for: the whole set again, though nothing changed
        let again = p.changes(vec![("a".into(), set(&[1, 3]))], true, every);
        assert!(again.len() == 1 && again[0].full, "{again:?}");
    }

    /// A missed message leaves the key counting for nothing until its next whole set; the
    /// reader's bound holds.
    #[test]
    fn a_gap_waits_for_the_next_whole_set_and_the_bound_holds() {
        let mut f = Followed::default();
        assert!(
            !f.take(1, false, &[1], &[], 10),
            "changes before any whole set"
        );
        assert!(f.held().is_none());
        assert!(f.take(2, true, &[1, 2], &[], 10));
        assert!(f.take(3, false, &[3], &[2], 10));
        assert_eq!(f.held().unwrap().held_tokens(&[1, 3]), 2 * B);
        assert!(!f.take(5, false, &[4], &[], 10), "4 missed");
        assert!(f.held().is_none());
        assert!(f.take(6, true, &[7, 8, 9], &[], 2));
        assert_eq!(f.blocks(), 2, "room for two");
        assert!(f.take(7, false, &[10, 11], &[], 3));
        assert_eq!(f.blocks(), 3);
    }

    /// The wire form round-trips, and a payload that is not whole hashes is refused.
    #[test]
    fn hashes_round_trip() {
        let h = [0u64, 1, u64::MAX, 0x0123_4567_89ab_cdef];
        assert_eq!(decode(&encode(&h)).as_deref(), Some(&h[..]));
        assert_eq!(decode("AAAA"), None);
        assert_eq!(decode("not base64!"), None);
    }
}
