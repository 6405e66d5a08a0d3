//! Transpositions kept between passes for a prompt that goes through in chunks.
//!
//! The transposed prompt path reads a head's keys and values transposed (`transposed.rs`).
//! Beside running streams a long prompt goes through in chunks of 16 tokens, and each pass
//! transposed the row's whole history again, per layer and kv head: at 1,300 positions a
//! fifth of the pass's attention time, ~80 times for one prompt. Instead the row keeps its
//! transposition, per layer and kv head, and each pass appends only its chunk's positions.
//!
//! A kept transposition equals the row's cache at positions `0..len`. It stays so because
//! every forward pass takes out the transposition of each row it writes (a row is written
//! only by passes and by prompt-cache restores, which forget it), and only a prompt chunk
//! that starts where the transposition ends and continues in a later pass gets it back,
//! extended by what the pass wrote. A pass that fails drops what it took.
//!
//! Memory: at most `MAX_ROWS` rows keep one (the scheduler prefills one prompt at a time; a
//! new one pushes out the least recently used), in f32 whatever the cache's type, with room
//! for the whole prompt reserved when it is made (the pages are touched only as chunks fill
//! them). Buffers that grew by doubling copied the whole history in one pass: at 256, 512
//! and 1,024 positions a stream beside the prompt waited ~20–28 ms longer for that token.

use super::transposed::Transposed;
use super::HeadPair;

/// Rows that keep a transposition at once.
const MAX_ROWS: usize = 1;

/// One row's kept transposition: per layer, per kv head, keys and values.
pub(crate) struct RowTransposition {
    /// Positions held (the same in every layer and head).
    len: usize,
    pub layers: Vec<Vec<HeadPair>>,
    /// When it was last used (`KeptTranspositions::clock`).
    used: u64,
}

impl RowTransposition {
    /// Nothing yet, with room for `positions`.
    fn empty(layers: usize, kv_heads: usize, hd: usize, positions: usize) -> Self {
        let room = || Transposed::with_room(hd, positions);
        Self {
            len: 0,
            layers: (0..layers)
                .map(|_| (0..kv_heads).map(|_| (room(), room())).collect())
                .collect(),
            used: 0,
        }
    }
}

/// What a forward pass's segment does to its row, for `KeptTranspositions::take`.
pub(crate) struct SegmentUse {
    pub row: usize,
    pub start: usize,
    /// It is a prompt chunk that can take the transposed path.
    pub transposes: bool,
    /// More of its prompt follows in a later pass.
    pub continues: bool,
    /// Where its prompt ends: the positions a new transposition has room for.
    pub ends_at: usize,
}

/// The kept transpositions of one cache, per row.
pub(crate) struct KeptTranspositions {
    rows: Vec<Option<RowTransposition>>,
    clock: u64,
}

impl KeptTranspositions {
    pub fn new(slots: usize) -> Self {
        Self {
            rows: (0..slots).map(|_| None).collect(),
            clock: 0,
        }
    }

    /// Takes out the transposition of every segment's row (the pass writes those rows). A
    /// segment gets its row's one when it transposes and the kept one ends where it starts;
    /// a transposing segment that continues and has none gets a new, empty one (it is filled
    /// from the cache in this pass).
    pub fn take(
        &mut self,
        segs: &[SegmentUse],
        layers: usize,
        kv_heads: usize,
        hd: usize,
    ) -> Vec<Option<RowTransposition>> {
        self.clock += 1;
        let taken: Vec<Option<RowTransposition>> = segs
            .iter()
            .map(|s| self.rows.get_mut(s.row).and_then(Option::take))
            .collect();
        let mut created = 0;
        segs.iter()
            .zip(taken)
            .map(|(s, old)| match old {
                Some(t) if s.transposes && t.len == s.start => Some(t),
                _ if s.transposes && s.continues => {
                    // room for it: push out the least recently used of the other rows
                    while self.held() + created >= MAX_ROWS && self.forget_oldest() {}
                    if self.held() + created >= MAX_ROWS {
                        return None;
                    }
                    created += 1;
                    Some(RowTransposition::empty(layers, kv_heads, hd, s.ends_at))
                }
                _ => None,
            })
            .collect()
    }

    /// Keeps `t` for `row` after a pass that wrote positions up to `len`.
    pub fn put_back(&mut self, row: usize, mut t: RowTransposition, len: usize) {
        t.len = len;
        t.used = self.clock;
        if let Some(slot) = self.rows.get_mut(row) {
            *slot = Some(t);
        }
    }

    /// Drops `row`'s transposition (its cache was written another way).
    pub fn forget(&mut self, row: usize) {
        if let Some(slot) = self.rows.get_mut(row) {
            *slot = None;
        }
    }

    fn held(&self) -> usize {
        self.rows.iter().filter(|r| r.is_some()).count()
    }

    fn forget_oldest(&mut self) -> bool {
        let oldest = self
            .rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().map(|t| (t.used, i)))
            .min();
        match oldest {
            Some((_, i)) => {
                self.rows[i] = None;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(row: usize, start: usize, transposes: bool, continues: bool) -> SegmentUse {
        SegmentUse {
            row,
            start,
            transposes,
            continues,
            ends_at: start + 64,
        }
    }

    /// A prompt's first chunk on `row` takes a new transposition and keeps it up to `upto`.
    fn keep(k: &mut KeptTranspositions, row: usize, upto: usize) {
        let t = k
            .take(&[seg(row, 0, true, true)], 1, 1, 64)
            .remove(0)
            .unwrap();
        k.put_back(row, t, upto);
    }

    #[test]
    fn a_row_gets_its_transposition_back_only_where_it_ended() {
        let mut k = KeptTranspositions::new(4);
        let t = k.take(&[seg(2, 0, true, true)], 3, 2, 64);
        let t = t.into_iter().next().flatten().expect("a new one");
        assert_eq!(t.layers.len(), 3);
        assert_eq!(t.layers[0].len(), 2);
        k.put_back(2, t, 16);
        // a chunk that starts elsewhere (the row was reused): not the kept one
        let again = k.take(&[seg(2, 8, true, false)], 3, 2, 64);
        assert!(again[0].is_none());
        // and it is gone: a later chunk at 16 gets a new, empty one
        let fresh = k.take(&[seg(2, 16, true, true)], 3, 2, 64);
        assert_eq!(fresh[0].as_ref().map(|t| t.len), Some(0));
    }

    #[test]
    fn a_decode_step_or_a_restore_drops_it() {
        let mut k = KeptTranspositions::new(2);
        keep(&mut k, 0, 32);
        // a decode token at 32 writes the row: it is taken and not given back
        assert!(k.take(&[seg(0, 32, false, false)], 1, 1, 64)[0].is_none());
        assert_eq!(k.held(), 0);
        keep(&mut k, 1, 32);
        k.forget(1);
        assert!(k.take(&[seg(1, 32, true, true)], 1, 1, 64)[0]
            .as_ref()
            .is_some_and(|t| t.len == 0));
    }

    #[test]
    fn one_row_keeps_one_at_a_time() {
        let mut k = KeptTranspositions::new(3);
        keep(&mut k, 0, 16);
        // another prompt starts: the first one's is pushed out
        let t = k
            .take(&[seg(1, 0, true, true)], 1, 1, 64)
            .remove(0)
            .unwrap();
        assert_eq!(k.held(), 0);
        k.put_back(1, t, 16);
        assert!(k.take(&[seg(0, 16, true, true)], 1, 1, 64)[0]
            .as_ref()
            .is_some_and(|t| t.len == 0));
        // two transposing segments in one pass: only one gets one
        let mut k = KeptTranspositions::new(3);
        let both = k.take(&[seg(0, 0, true, true), seg(1, 0, true, true)], 1, 1, 64);
        assert_eq!(both.iter().filter(|t| t.is_some()).count(), 1);
    }
}
