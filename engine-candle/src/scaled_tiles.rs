//! Weights in tiles of eight rows whose 32-element blocks carry one f16 scale a row (Q8_0 and
//! Q4_0 in `q8_0_cpu.rs`, Q5_0 in `q5_0_cpu.rs`): a tile's blocks (the format's values, the
//! eight rows side by side) in one array and their scales, eight f16 lanes a block, in
//! another — the values' vectors stay 32-byte aligned and the scales cost what the file
//! spends on them. Each format says how a stored block goes into its tile block and how a
//! tile meets the activation rows.

use crate::cpu_quant::{rows_by_tiles, Acts, BlockQ81, QuantRows, ResultRows, Simd, QK, TILE_ROWS};

/// A tile's blocks and their scales (f16 bits, one lane a row).
pub(crate) struct Tile<'a, B> {
    pub blocks: &'a [B],
    pub scales: &'a [[u16; TILE_ROWS]],
}

impl<B> Clone for Tile<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Tile<'_, B> {}

/// A tile block of one format.
pub(crate) trait TileFormat: Copy + Sync {
    /// A block of zero rows.
    const ZERO: Self;
    /// The eight rows of `tile` times `R` activation rows: `[R][8]`.
    fn dot<const R: usize>(
        a: [&[BlockQ81]; R],
        tile: Tile<'_, Self>,
        simd: Simd,
    ) -> [[f32; TILE_ROWS]; R];
}

/// A `[n, k]` weight matrix in tiles of eight rows (the last tile padded with zero rows).
pub(crate) struct ScaledTiles<B> {
    n: usize,
    k: usize,
    /// `blocks[t · nb + b]`: block `b` of tile `t`.
    pub(crate) blocks: Vec<B>,
    /// `scales[t · nb + b]`: the eight rows' scales of that block.
    scales: Vec<[u16; TILE_ROWS]>,
}

impl<B: TileFormat> ScaledTiles<B> {
    /// The tiles of `n` rows of `k` elements stored as `data`, `stored` bytes a block (its
    /// f16 scale first), `put(block, lane, c)` putting stored block `c` of one row into lane
    /// `lane` of a tile block; `None` when the sizes do not fit.
    pub(crate) fn from_blocks(
        n: usize,
        k: usize,
        data: &[u8],
        stored: usize,
        put: impl Fn(&mut B, usize, &[u8]),
    ) -> Option<Self> {
        if !k.is_multiple_of(QK) || stored < 2 {
            return None;
        }
        let nb = k / QK;
        if data.len() != n * nb * stored {
            return None;
        }
        let tiles = n.div_ceil(TILE_ROWS);
        let mut blocks = vec![B::ZERO; tiles * nb];
        let mut scales = vec![[0u16; TILE_ROWS]; tiles * nb];
        for (j, row) in data.chunks_exact(nb * stored).enumerate() {
            let (t, lane) = (j / TILE_ROWS, j % TILE_ROWS);
            for (b, c) in row.chunks_exact(stored).enumerate() {
                scales[t * nb + b][lane] = u16::from_le_bytes([c[0], c[1]]);
                put(&mut blocks[t * nb + b], lane, c);
            }
        }
        Some(Self {
            n,
            k,
            blocks,
            scales,
        })
    }

    pub(crate) fn tile(&self, t: usize) -> Tile<'_, B> {
        let nb = self.k / QK;
        Tile {
            blocks: &self.blocks[t * nb..(t + 1) * nb],
            scales: &self.scales[t * nb..(t + 1) * nb],
        }
    }
}

impl<B: TileFormat> QuantRows for ScaledTiles<B> {
    fn n(&self) -> usize {
        self.n
    }

    fn k(&self) -> usize {
        self.k
    }

    fn rows_into(
        &self,
        j0: usize,
        count: usize,
        a: Acts<'_>,
        simd: Simd,
        out: &mut ResultRows<'_>,
    ) {
        rows_by_tiles(
            j0,
            count,
            a,
            out,
            |t, rows| B::dot(rows, self.tile(t), simd),
            |t, row| B::dot([row], self.tile(t), simd)[0],
        );
    }
}
