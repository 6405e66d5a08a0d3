//! The client side of `text/event-stream`: splits a byte stream into frames (id, event, data)
//! the way an `EventSource` does, for the tools that read our streams (`orchctl`, the soak).
//! Bytes are kept until a frame is whole, so a UTF-8 character split across two chunks is
//! decoded once, whole.

/// One event: its `id:`, `event:` name (empty when the frame named none) and `data:` lines
/// joined with `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseFrame {
    pub id: Option<u64>,
    pub event: String,
    pub data: String,
}

/// Accumulates chunks and hands out whole frames. Bounded by the caller's frame size: a
/// frame longer than `max_frame` bytes is an error, not a growing buffer.
#[derive(Debug)]
pub struct SseReader {
    buf: Vec<u8>,
    max_frame: usize,
}

/// A frame grew past the reader's bound.
#[derive(Debug, thiserror::Error)]
#[error("an event of the stream exceeds {0} bytes")]
pub struct FrameTooLong(pub usize);

impl SseReader {
    pub fn new(max_frame: usize) -> Self {
        Self {
            buf: Vec::new(),
            max_frame,
        }
    }

    /// Adds `chunk` and returns the frames it completed, in order.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<SseFrame>, FrameTooLong> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(end) = frame_end(&self.buf) {
            let raw: Vec<u8> = self.buf.drain(..end).collect();
            if let Some(f) = parse(&String::from_utf8_lossy(&raw)) {
                out.push(f);
            }
        }
        if self.buf.len() > self.max_frame {
            return Err(FrameTooLong(self.max_frame));
        }
        Ok(out)
    }
}

/// The index just past the blank line that ends the first frame, if one is whole.
fn frame_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One frame's fields; `None` for a frame of comments or `retry:` only.
fn parse(raw: &str) -> Option<SseFrame> {
    let mut f = SseFrame {
        id: None,
        event: String::new(),
        data: String::new(),
    };
    let mut has_data = false;
    for line in raw.lines() {
        let (name, value) = match line.split_once(':') {
            Some((n, v)) => (n, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match name {
            "id" => f.id = value.parse().ok(),
            "event" => f.event = value.to_string(),
            "data" => {
                if has_data {
                    f.data.push('\n');
                }
                f.data.push_str(value);
                has_data = true;
            }
            _ => {}
        }
    }
    (has_data || !f.event.is_empty()).then_some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_anywhere_come_out_whole() {
        let text = "retry: 1000\n\nid: 0\nevent: started\ndata: {}\n\n: keep-alive\n\nid: 1\nevent: token\ndata: {\"t\":\"é\"}\n\n";
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            let mut r = SseReader::new(1024);
            let mut got = r.feed(&bytes[..cut]).unwrap();
            got.extend(r.feed(&bytes[cut..]).unwrap());
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(got[0].event, "started");
            assert_eq!(got[1].id, Some(1));
            assert_eq!(got[1].data, "{\"t\":\"é\"}", "cut at {cut}");
        }
    }

    #[test]
    fn multi_line_data_and_crlf() {
        let mut r = SseReader::new(1024);
        let got = r.feed(b"data: a\r\ndata: b\r\n\r\n").unwrap();
        assert_eq!(got[0].data, "a\nb");
    }

    #[test]
    fn an_endless_frame_is_refused() {
        let mut r = SseReader::new(16);
        assert!(r.feed(&[b'x'; 17]).is_err());
    }
}
