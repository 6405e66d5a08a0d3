//! `orchestratord run MODEL [PROMPT]`'s side of the conversation (Ollama's `ollama run`): a
//! server's `/api/chat`, streamed into the terminal. With PROMPT one answer is printed and the
//! command ends; without, a conversation: each answer streams as it comes, the turns so far go
//! with each question (the last [`MAX_TURNS`]), `/bye` or Ctrl-D ends it, `/clear` forgets
//! the turns, Ctrl-C stops the answer being written (the server cancels its task), not the
//! conversation. An `hf.co/…` model is pulled first (`/api/pull`), with a progress bar.

use std::io::Write;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

/// Turns kept and sent with each question (older ones are dropped first).
pub const MAX_TURNS: usize = 64;
/// The longest line read from the terminal.
const MAX_LINE_BYTES: usize = 1 << 20;

pub struct TerminalChat {
    client: reqwest::Client,
    base: String,
    key: Option<String>,
    model: String,
    turns: Vec<Value>,
}

/// How an answer ended.
enum Answered {
    Whole(String),
    /// Ctrl-C: what had come.
    Stopped(String),
}

impl TerminalChat {
    pub fn new(base: &str, key: Option<String>, model: &str) -> Self {
        Self {
            client: reqwest::Client::new(),
            base: base.trim_end_matches('/').to_string(),
            key,
            model: model.to_string(),
            turns: Vec::new(),
        }
    }

    fn post(&self, path: &str, body: &Value) -> reqwest::RequestBuilder {
        let r = self.client.post(format!("{}{path}", self.base)).json(body);
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// Pulls an `hf.co/…` model through the server (a progress bar while its bytes come); the
    /// name it is served by. Other names are served as they are.
    pub async fn pull_if_named(&mut self) -> anyhow::Result<()> {
        if !self.model.starts_with("hf.co/") && !self.model.starts_with("huggingface.co/") {
            return Ok(());
        }
        let resp = self
            .post("/api/pull", &json!({ "model": self.model }))
            .send()
            .await?;
        if !resp.status().is_success() {
            anyhow::bail!("pulling {}: {}", self.model, error_text(resp).await);
        }
        let bar = progress_bar();
        let mut lines = ndjson(resp);
        while let Some(line) = lines.next().await {
            let v = line?;
            if let Some(e) = v["error"].as_str() {
                bar.abandon();
                anyhow::bail!("pulling {}: {e}", self.model);
            }
            if let (Some(total), Some(done)) = (v["total"].as_u64(), v["completed"].as_u64()) {
                bar.set_length(total);
                bar.set_position(done);
            }
            if let Some(status) = v["status"].as_str() {
                bar.set_message(status.to_string());
            }
            if v["status"] == "success" {
                if let Some(name) = v["model"].as_str() {
                    self.model = name.to_string();
                }
            }
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// Pulls an `hf.co/…` model into `dir` here (no server answers yet), with a progress bar:
    /// the file.
    pub async fn pull_locally(
        &mut self,
        dir: &std::path::Path,
    ) -> anyhow::Result<std::path::PathBuf> {
        use crate::models_folder::pull::{HubRef, Progress, Puller};
        let hub = HubRef::parse(&self.model, false)?;
        let bar = progress_bar();
        let mut say = |p: Progress| match p {
            Progress::Status(s) => bar.set_message(s),
            Progress::Bytes {
                total, completed, ..
            } => {
                bar.set_length(total);
                bar.set_position(completed);
            }
        };
        let path = Puller::new(dir.to_path_buf(), None)?
            .pull(&hub, &mut say)
            .await?;
        bar.finish_and_clear();
        Ok(path)
    }

    /// One question and its answer, printed as it comes (the turns so far go with it).
    async fn ask(&mut self, question: &str, ctrl_c: &mut Interrupts) -> anyhow::Result<Answered> {
        self.turns
            .push(json!({"role": "user", "content": question}));
        let keep_from = self.turns.len().saturating_sub(MAX_TURNS);
        self.turns.drain(..keep_from);
        let resp = self
            .post(
                "/api/chat",
                &json!({"model": self.model, "messages": self.turns, "stream": true}),
            )
            .send()
            .await?;
        if !resp.status().is_success() {
            self.turns.pop();
            anyhow::bail!("{}", error_text(resp).await);
        }
        let mut lines = ndjson(resp);
        let mut text = String::new();
        let mut out = std::io::stdout();
        let interrupted = ctrl_c.next();
        tokio::pin!(interrupted);
        let answered = loop {
            tokio::select! {
                line = lines.next() => {
                    let Some(line) = line else { break Answered::Whole(text) };
                    let v = line?;
                    if let Some(e) = v["error"].as_str() {
                        anyhow::bail!("{e}");
                    }
                    if let Some(piece) = v["message"]["content"].as_str() {
                        text.push_str(piece);
                        let _ = out.write_all(piece.as_bytes());
                        let _ = out.flush();
                    }
                    if v["done"] == true {
                        break Answered::Whole(text);
                    }
                }
                _ = &mut interrupted => break Answered::Stopped(text),
            }
        };
        // dropping the stream closes the connection: the server cancels the task
        drop(lines);
        let said = match &answered {
            Answered::Whole(t) | Answered::Stopped(t) => t.clone(),
        };
        self.turns
            .push(json!({"role": "assistant", "content": said}));
        Ok(answered)
    }

    /// One answer to `prompt`, printed; the command's whole work with a PROMPT.
    pub async fn once(&mut self, prompt: &str) -> anyhow::Result<()> {
        self.ask(prompt, &mut Interrupts::new()?).await?;
        println!();
        Ok(())
    }

    /// The conversation, until `/bye` or the end of input.
    pub async fn converse(&mut self) -> anyhow::Result<()> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
        // the terminal is read on a thread of its own: a read blocks
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            loop {
                let mut line = String::new();
                match std::io::BufRead::read_line(&mut stdin.lock(), &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let mut cut = line.len().min(MAX_LINE_BYTES);
                        while !line.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        line.truncate(cut);
                        if tx.blocking_send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let mut ctrl_c = Interrupts::new()?;
        loop {
            print!(">>> ");
            let _ = std::io::stdout().flush();
            let line = tokio::select! {
                line = rx.recv() => line,
                _ = ctrl_c.next() => {
                    println!("\nUse Ctrl + d or /bye to exit.");
                    continue;
                }
            };
            let Some(line) = line else {
                println!();
                return Ok(());
            };
            let question = line.trim();
            match question {
                "" => continue,
                "/bye" => return Ok(()),
                "/clear" => {
                    self.turns.clear();
                    println!("Cleared the conversation.");
                    continue;
                }
                "/?" | "/help" => {
                    println!("/bye or Ctrl-D ends; /clear forgets the conversation; Ctrl-C stops an answer.");
                    continue;
                }
                _ => {}
            }
            match self.ask(question, &mut ctrl_c).await {
                Ok(Answered::Whole(_)) => println!("\n"),
                Ok(Answered::Stopped(_)) => println!("\n[stopped]\n"),
                Err(e) => println!("\nerror: {e}\n"),
            }
        }
    }
}

fn progress_bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} {bar:40} {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Whether a server answers at `base` (its liveness route, within a second).
pub async fn answers(base: &str) -> bool {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build();
    match client {
        Ok(c) => c
            .get(format!("{base}/livez"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success()),
        Err(_) => false,
    }
}

async fn error_text(resp: reqwest::Response) -> String {
    let status = resp.status();
    let v: Value = resp.json().await.unwrap_or_default();
    v["error"]
        .as_str()
        .map(str::to_string)
        .or_else(|| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| status.to_string())
}

/// The JSON lines of a response as they come (a line longer than [`MAX_LINE_BYTES`] ends it
/// with an error).
fn ndjson(resp: reqwest::Response) -> futures::stream::BoxStream<'static, anyhow::Result<Value>> {
    let state = (resp.bytes_stream().boxed(), Vec::<u8>::new(), false);
    futures::stream::unfold(state, |(mut bytes, mut buf, mut ended)| async move {
        loop {
            if let Some(i) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=i).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let item = serde_json::from_slice::<Value>(&line).map_err(anyhow::Error::from);
                return Some((item, (bytes, buf, ended)));
            }
            if ended {
                if buf.iter().all(u8::is_ascii_whitespace) {
                    return None;
                }
                let rest = std::mem::take(&mut buf);
                let item = serde_json::from_slice::<Value>(&rest).map_err(anyhow::Error::from);
                return Some((item, (bytes, buf, ended)));
            }
            match bytes.next().await {
                Some(Ok(chunk)) if buf.len() + chunk.len() <= MAX_LINE_BYTES => {
                    buf.extend_from_slice(&chunk)
                }
                Some(Ok(_)) => {
                    let e = anyhow::anyhow!(
                        "the server sent a line longer than {MAX_LINE_BYTES} bytes"
                    );
                    return Some((Err(e), (bytes, Vec::new(), true)));
                }
                Some(Err(e)) => return Some((Err(e.into()), (bytes, Vec::new(), true))),
                None => ended = true,
            }
        }
    })
    .boxed()
}

/// Ctrl-C presses, heard by one listener for the whole command: a press between two waits
/// (say right after the prompt is printed) is kept for the next wait, where a new `ctrl_c()`
/// listener, registered only when first polled, would miss it.
struct Interrupts {
    #[cfg(unix)]
    sigint: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            #[cfg(unix)]
            sigint: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?,
        })
    }

    /// The next press (one made since the last call included).
    async fn next(&mut self) {
        #[cfg(unix)]
        self.sigint.recv().await;
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
