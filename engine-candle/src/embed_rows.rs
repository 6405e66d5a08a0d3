//! A decoder's embedding jobs in its scheduler (issue 51): an input goes through a cache row
//! as a prompt does — in chunks beside the decoding sequences, within the pass's prompt
//! budget — and its tokens' last hidden states (after the final norm) are pooled as they
//! come; when its last chunk went through, the row takes the job's next input. A job runs in
//! its own slot's row and borrows more while the engine has slots nobody holds (taken from
//! the engine's one count, so they show as busy), one input a row, given back with the job.

use engine_port::{PortError, SlotPermit};

use crate::embed_job::{EmbedRequest, Pooled};

/// A row running one input of a job.
pub(crate) struct RowWork {
    pub row: usize,
    /// The input it runs.
    pub input: usize,
    /// Its tokens already through.
    pub done: usize,
    pooled: Pooled,
}

/// What became of a row after a chunk of its input went through.
pub(crate) enum After {
    /// More of an input to run.
    Busy,
    /// The job has no input left for it: it is free, holding `cached` (its last input's
    /// tokens, computed as a prompt's).
    Free { row: usize, cached: Vec<u32> },
}

/// An embedding job and its rows.
pub(crate) struct EmbedRun {
    pub req: EmbedRequest,
    /// Slots borrowed beyond the job's own, one per extra row.
    extra: Vec<SlotPermit>,
    pub rows: Vec<RowWork>,
    /// The next input not yet started.
    next: usize,
    out: Vec<Option<Vec<Vec<f32>>>>,
    width: usize,
}

impl EmbedRun {
    pub fn new(req: EmbedRequest, width: usize) -> Self {
        let n = req.inputs.len();
        Self {
            req,
            extra: Vec::new(),
            rows: Vec::new(),
            next: 0,
            out: vec![None; n],
            width,
        }
    }

    /// Inputs no row runs yet.
    pub fn unstarted(&self) -> usize {
        self.req.inputs.len() - self.next
    }

    /// Starts the next input in `row` (its own slot's when `permit` is `None`, else a
    /// borrowed one's).
    pub fn start(&mut self, row: usize, permit: Option<SlotPermit>) {
        self.extra.extend(permit);
        let input = self.next;
        self.next += 1;
        self.rows.push(RowWork {
            row,
            input,
            done: 0,
            pooled: Pooled::new(self.req.pooling, self.width),
        });
    }

    /// The tokens of row `k` not yet through.
    pub fn left(&self, k: usize) -> &[u32] {
        let r = &self.rows[k];
        &self.req.inputs[r.input][r.done..]
    }

    /// `hidden` holds the hidden states of row `k`'s next `n` tokens.
    pub fn absorb(&mut self, k: usize, n: usize, hidden: &[f32]) -> After {
        let unit = self.req.normalize;
        let r = &mut self.rows[k];
        r.pooled.feed(hidden);
        r.done += n;
        let len = self.req.inputs[r.input].len();
        if r.done < len {
            return After::Busy;
        }
        let finished = std::mem::replace(&mut r.pooled, Pooled::new(self.req.pooling, self.width));
        let input = r.input;
        self.out[input] = Some(finished.finish(unit));
        if self.next < self.req.inputs.len() {
            r.input = self.next;
            r.done = 0;
            self.next += 1;
            return After::Busy;
        }
        let row = r.row;
        self.rows.remove(k);
        After::Free {
            row,
            cached: self.req.inputs[input].clone(),
        }
    }

    /// Whether every input has its vectors.
    pub fn is_done(&self) -> bool {
        self.rows.is_empty() && self.out.iter().all(Option::is_some)
    }

    /// Answers the job: its slots back first (a client that reads the answer may send the
    /// next at once), then the vectors — or `why` it has none.
    pub fn end(self, why: Option<PortError>) {
        let EmbedRun {
            req, extra, out, ..
        } = self;
        drop(extra);
        let EmbedRequest { permit, reply, .. } = req;
        drop(permit);
        let answer = match (why, out.into_iter().collect::<Option<Vec<_>>>()) {
            (None, Some(v)) => Ok(v),
            (Some(e), _) => Err(e),
            (None, None) => Err(PortError::Dead("the job ended without every vector".into())),
        };
        let _ = reply.send(answer);
    }

    /// The rows it holds (to free when it ends early).
    pub fn held_rows(&self) -> Vec<usize> {
        self.rows.iter().map(|r| r.row).collect()
    }
}
