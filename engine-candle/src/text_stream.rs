//! Incremental detokenization: bytes in, whole UTF-8 characters out, stop sequences held back.

/// What one token added to the visible text.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Text that is now final (may be empty while a character or a stop prefix is incomplete).
    pub text: String,
    /// The stop sequence completed, when one was; the stop text itself is not in `text`.
    pub stopped: Option<String>,
}

/// Turns token bytes into text, never splitting a UTF-8 character, and cuts at stop sequences
/// even when they span token boundaries.
#[derive(Debug, Default)]
pub struct TextStream {
    bytes: Vec<u8>,
    held: String,
    stops: Vec<String>,
}

impl TextStream {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            bytes: Vec::new(),
            held: String::new(),
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
        }
    }

    fn decode_complete(&mut self) {
        loop {
            match std::str::from_utf8(&self.bytes) {
                Ok(s) => {
                    self.held.push_str(s);
                    self.bytes.clear();
                    return;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: the prefix up to `valid` is checked UTF-8.
                    self.held
                        .push_str(&String::from_utf8_lossy(&self.bytes[..valid]));
                    match e.error_len() {
                        // Invalid bytes: replace them and go on.
                        Some(n) => {
                            self.held.push('\u{FFFD}');
                            self.bytes.drain(..valid + n);
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            self.bytes.drain(..valid);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop sequence.
    fn stop_prefix_len(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(self.held.len());
            for len in (best + 1..=max).rev() {
                let start = self.held.len() - len;
                if self.held.is_char_boundary(start) && stop.starts_with(&self.held[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }

    /// Adds one token's bytes.
    pub fn push(&mut self, token_bytes: &[u8]) -> Pushed {
        self.bytes.extend_from_slice(token_bytes);
        self.decode_complete();
        if !self.stops.is_empty() {
            let first = self
                .stops
                .iter()
                .filter_map(|s| self.held.find(s.as_str()).map(|pos| (pos, s)))
                .min_by_key(|(pos, _)| *pos);
            if let Some((pos, stop)) = first {
                let stopped = Some(stop.clone());
                let text = self.held[..pos].to_string();
                self.held.clear();
                self.bytes.clear();
                return Pushed { text, stopped };
            }
        }
        let keep = self.stop_prefix_len();
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        Pushed {
            text,
            stopped: None,
        }
    }

    /// Text still held at the end of generation (a partial stop prefix, or an incomplete
    /// character, which is replaced).
    pub fn finish(&mut self) -> String {
        let mut out = std::mem::take(&mut self.held);
        if !self.bytes.is_empty() {
            out.push_str(&String::from_utf8_lossy(&self.bytes));
            self.bytes.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multibyte_characters_are_never_split() {
        let mut s = TextStream::new(vec![]);
        let bytes = "é🙂".as_bytes();
        let mut out = String::new();
        for b in bytes {
            let p = s.push(&[*b]);
            assert!(p.stopped.is_none());
            out.push_str(&p.text);
        }
        assert_eq!(out, "é🙂");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn stop_across_token_boundaries_is_cut_and_not_emitted() {
        let mut s = TextStream::new(vec!["END".into()]);
        let mut out = String::new();
        for piece in ["Hello E", "N", "D tail"] {
            let p = s.push(piece.as_bytes());
            out.push_str(&p.text);
            if p.stopped.is_some() {
                break;
            }
        }
        assert_eq!(out, "Hello ");
    }

    /// The stop sequence reported is the one that occurs first in the text.
    #[test]
    fn the_first_stop_in_the_text_is_the_one_reported() {
        let mut s = TextStream::new(vec!["tail".into(), "D".into(), ",".into()]);
        let p = s.push(b"one, two D tail");
        assert_eq!(p.text, "one");
        assert_eq!(p.stopped.as_deref(), Some(","));
    }

    #[test]
    fn a_false_stop_prefix_is_released() {
        let mut s = TextStream::new(vec!["\n\n".into()]);
        let a = s.push(b"line\n");
        assert_eq!(a.text, "line");
        let b = s.push(b"next");
        assert_eq!(b.text, "\nnext");
        assert!(b.stopped.is_none());
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut s = TextStream::new(vec![]);
        assert_eq!(s.push(&[b'a', 0xff, b'b']).text, "a\u{FFFD}b");
        s.push(&[0xe2, 0x82]);
        assert_eq!(s.finish(), "\u{FFFD}");
    }
}
