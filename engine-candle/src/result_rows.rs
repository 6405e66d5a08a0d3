//! Where the CPU matmul kernels write: straight into each activation row's result (a
//! sequence's logits, a row of a layer's output), the columns of one job's chunk at a time.
//!
//! The kernels compute a tile of weight rows against each activation row; their results were
//! written weight row by weight row (`out[j · m + r]`) and transposed after, and the logits of
//! eight sequences (8 × 262,144 floats for Gemma 3) were zeroed, written, then copied element
//! by element into a vector a sequence — about 7 % of an eight-stream decode step. Now each
//! result goes where it is read from.

use std::marker::PhantomData;

/// Where activation row `r`'s results begin (its column 0): one per row.
#[derive(Clone, Copy)]
pub(crate) struct RowStart(*mut f32);

// SAFETY: a `RowStart` is only written through a `ResultRows`, whose constructor's caller
// promises that the columns it covers are its alone.
unsafe impl Send for RowStart {}
unsafe impl Sync for RowStart {}

impl RowStart {
    /// The start of `v`'s spare capacity from element `at` on (its elements are written, then
    /// the caller sets its length).
    pub(crate) fn spare(v: &mut Vec<f32>, at: usize) -> Self {
        assert!(at <= v.capacity(), "a row start past the buffer");
        // SAFETY: `at` is within the allocation (checked just above).
        Self(unsafe { v.as_mut_ptr().add(at) })
    }
}

/// Columns `j0..j0 + count` of `m` result rows, this view's alone while it lives.
pub(crate) struct ResultRows<'a> {
    rows: &'a [RowStart],
    j0: usize,
    count: usize,
    _rows: PhantomData<&'a mut [f32]>,
}

impl<'a> ResultRows<'a> {
    /// The view of columns `j0..j0 + count` of every row in `rows`.
    ///
    /// # Safety
    /// For every row start `p` in `rows`, `p + j0 .. p + j0 + count` must be valid for
    /// writes, and nothing else may read or write those elements while the view lives.
    pub(crate) unsafe fn new(rows: &'a [RowStart], j0: usize, count: usize) -> Self {
        Self {
            rows,
            j0,
            count,
            _rows: PhantomData,
        }
    }

    /// Activation rows.
    pub(crate) fn m(&self) -> usize {
        self.rows.len()
    }

    /// Columns.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Row `r`'s result in column `jj` (of this view's columns) is `v`.
    #[inline(always)]
    pub(crate) fn put(&mut self, r: usize, jj: usize, v: f32) {
        assert!(jj < self.count, "column {jj} of {}", self.count);
        // SAFETY: `r` is bounds-checked by the index, `jj` just above; the constructor's
        // caller gave this view those elements alone.
        unsafe { self.rows[r].0.add(self.j0 + jj).write(v) }
    }

    /// Adds `b[jj]` to every row's column `jj`, once the kernel has written them all (the
    /// bits of adding the bias after the matmul).
    pub(crate) fn add_to_every_row(&mut self, b: &[f32]) {
        assert!(
            b.len() == self.count,
            "{} biases for {} columns",
            b.len(),
            self.count
        );
        for r in 0..self.m() {
            // SAFETY: the row's columns are this view's alone and were written by the kernel
            // (`QuantRows::rows_into` writes every element it is given).
            let row =
                unsafe { std::slice::from_raw_parts_mut(self.rows[r].0.add(self.j0), self.count) };
            for (y, b) in row.iter_mut().zip(b) {
                *y += b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two views over the same rows' disjoint columns each write their own, and a bias
    /// lands on the view's columns only.
    #[test]
    fn views_write_their_columns_of_every_row() {
        let (m, n) = (3, 10);
        let mut rows: Vec<Vec<f32>> = (0..m).map(|_| Vec::with_capacity(n)).collect();
        let starts: Vec<RowStart> = rows.iter_mut().map(|v| RowStart::spare(v, 0)).collect();
        for (j0, count) in [(0, 4), (4, 6)] {
            // SAFETY: the two views cover disjoint columns of rows with capacity n.
            let mut view = unsafe { ResultRows::new(&starts, j0, count) };
            for r in 0..m {
                for jj in 0..count {
                    view.put(r, jj, (r * 100 + j0 + jj) as f32);
                }
            }
            if j0 == 4 {
                view.add_to_every_row(&[0.5; 6]);
            }
        }
        for (r, v) in rows.iter_mut().enumerate() {
            // SAFETY: every column 0..n was written above.
            unsafe { v.set_len(n) };
            let want: Vec<f32> = (0..n)
                .map(|j| (r * 100 + j) as f32 + if j >= 4 { 0.5 } else { 0.0 })
                .collect();
            assert_eq!(v, &want, "row {r}");
        }
    }

    #[test]
    #[should_panic(expected = "column 4 of 4")]
    fn a_column_past_the_view_is_refused() {
        let mut v: Vec<f32> = Vec::with_capacity(8);
        let starts = [RowStart::spare(&mut v, 0)];
        // SAFETY: columns 0..4 of a buffer of 8.
        let mut view = unsafe { ResultRows::new(&starts, 0, 4) };
        view.put(0, 4, 1.0);
    }
}
