//! Reading NDJSON lines with a bounded size: a longer line is skipped to its newline and
//! reported once, and reading goes on — one bad line never ends the connection.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;

/// One line read from the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Text(String),
    /// A line of this many bytes was over the limit and was skipped.
    TooLong(usize),
    NotUtf8,
}

/// Reads lines until EOF or an I/O error, sending each to `tx` (which bounds what is buffered:
/// reading pauses while the receiver is behind). Blank lines are skipped; `\r\n` is accepted.
pub async fn read_lines<R: AsyncRead + Unpin>(reader: R, max: usize, tx: mpsc::Sender<Line>) {
    let mut r = BufReader::with_capacity(16 * 1024, reader);
    let mut line: Vec<u8> = Vec::new();
    let mut over: Option<usize> = None;
    loop {
        let buf = match r.fill_buf().await {
            Ok(b) => b,
            Err(_) => return,
        };
        if buf.is_empty() {
            // EOF: a last line without its newline still counts
            if let Some(l) = finish(&mut line, &mut over) {
                let _ = tx.send(l).await;
            }
            return;
        }
        let (chunk, ends_line) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], true),
            None => (buf, false),
        };
        let n = chunk.len();
        match over.as_mut() {
            Some(total) => *total += n,
            None if line.len() + n > max => {
                over = Some(line.len() + n);
                line.clear();
            }
            None => line.extend_from_slice(chunk),
        }
        r.consume(n + usize::from(ends_line));
        if ends_line {
            if let Some(l) = finish(&mut line, &mut over) {
                if tx.send(l).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn finish(line: &mut Vec<u8>, over: &mut Option<usize>) -> Option<Line> {
    if let Some(total) = over.take() {
        line.clear();
        return Some(Line::TooLong(total));
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        line.clear();
        return None;
    }
    let bytes = std::mem::take(line);
    Some(match String::from_utf8(bytes) {
        Ok(s) => Line::Text(s),
        Err(_) => Line::NotUtf8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines_of(input: Vec<u8>, max: usize) -> Vec<Line> {
        let (tx, mut rx) = mpsc::channel(4);
        let reader = tokio::spawn(read_lines(std::io::Cursor::new(input), max, tx));
        let mut out = Vec::new();
        while let Some(l) = rx.recv().await {
            out.push(l);
        }
        reader.await.unwrap();
        out
    }

    /// HS-PROTO-3: a 100 KB line is reported once and the next line still arrives.
    #[tokio::test]
    async fn oversized_lines_are_skipped_and_reading_goes_on() {
        let mut input = b"{\"a\":1}\r\n\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100 * 1024));
        input.extend_from_slice(b"\n\xff\xfe\n{\"b\":2}");
        let got = lines_of(input, 64 * 1024).await;
        assert_eq!(
            got,
            vec![
                Line::Text("{\"a\":1}".into()),
                Line::TooLong(100 * 1024),
                Line::NotUtf8,
                Line::Text("{\"b\":2}".into()),
            ]
        );
        // exactly at the limit passes
        let got = lines_of([vec![b'y'; 10], b"\n".to_vec()].concat(), 10).await;
        assert_eq!(got, vec![Line::Text("y".repeat(10))]);
    }
}
