//! A remote worker's model behind the Engine port. It takes text, not token ids: each job is
//! sent as an OpenAI-shaped `request`, the worker's streamed chunks come back as `Token`
//! events, and `token_counts` gives the usage. When the worker is lost the event channel closes
//! without a terminal event, which the runner answers with a requeue.

use std::sync::Arc;

use contracts::worker::{CancelReason, ServerToWorker, TokenCounts};
use pool_manager::{
    Engine, EngineDescriptor, EngineJob, FailureNote, Finish, FinishReason, OnLoss,
    OutputConstraint, PortError, PromptInput, SeqEvent, SlotPermit, StepLogprobs, StopCause,
    EVENT_CHANNEL_CAPACITY,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::link::{RequestEvent, WorkerLink};
use super::openai_wire::{
    backend_prompt, error_message, read_object, refused_field, request_body, StreamItem,
    StreamReader,
};
use crate::correlation::HEADER as CORRELATION_HEADER;

pub const ENGINE_NAME: &str = "remote-worker";

/// A worker's error codes for a request it did not start: no slot free there (its slots hold
/// other servers' work), or it is draining. Such a request is run elsewhere, not failed.
const NO_SLOT_CODES: [&str; 2] = ["busy", "draining"];

pub struct RemoteEngine {
    link: Arc<WorkerLink>,
    model: String,
    /// Context assumed at admission (0 = unknown here; the backend checks).
    ctx: usize,
}

impl RemoteEngine {
    pub fn new(link: Arc<WorkerLink>, model: String, ctx: usize) -> Self {
        Self { link, model, ctx }
    }

    /// Sends request `request_id` (already open on the link) to the worker for its backend's
    /// `path`; the request is closed again when the socket cannot take it.
    fn send_request(
        &self,
        request_id: &str,
        path: &str,
        is_streaming: bool,
        body: String,
        headers: std::collections::BTreeMap<String, String>,
    ) -> Result<(), PortError> {
        let sent = self.link.send(ServerToWorker::Request {
            request_id: request_id.to_string(),
            model: self.model.clone(),
            endpoint_path: path.to_string(),
            is_streaming,
            body,
            headers,
        });
        if !sent {
            self.link.close_request(request_id);
            return Err(PortError::Dead(
                "the worker's socket is not writable".into(),
            ));
        }
        Ok(())
    }
}

impl Engine for RemoteEngine {
    fn descriptor(&self) -> EngineDescriptor {
        EngineDescriptor {
            engine: ENGINE_NAME.to_string(),
            engine_version: format!(
                "protocol {}",
                self.link.protocol_version.as_deref().unwrap_or("1")
            ),
            model_ref: format!("worker:{}/{}", self.link.name, self.model),
            model_name: self.model.clone(),
            ctx_max: self.ctx,
            slots: self.link.max_concurrent,
            weights_bytes: 0,
            kv_cache_bytes: 0,
            layers: 0,
            layers_on_accelerator: 0,
            // nothing here can bring a worker back: its tasks go on elsewhere
            on_loss: OnLoss::ContinueElsewhere,
            facts: None,
            generates: true,
            // the backend's model: what it embeds is for it to say (width, pooling, length)
            embedding: Some(pool_manager::EmbedInfo {
                dims: 0,
                pooling: pool_manager::Pooling::Mean,
                max_tokens: self.ctx,
                ranks: true,
            }),
        }
    }

    /// Text is counted by the backend; a prompt of token ids alone is its own count (and goes
    /// to the backend as ids); other prompts with ids are refused (`backend_prompt`).
    fn tokenize(
        &self,
        prompt: &PromptInput,
        continuation: &str,
    ) -> Result<Option<Vec<u32>>, PortError> {
        backend_prompt(prompt, continuation)
    }

    /// Asked of the backend (`logprobs`/`top_logprobs`, which vLLM, llama.cpp's server and
    /// orchestratord serve) and read back from its chunks; a backend that answers without
    /// them ends the task with a 400 naming `logprobs`.
    fn gives_logprobs(&self) -> bool {
        true
    }

    /// A JSON Schema goes to the backend as `response_format` (vLLM, llama.cpp's server and
    /// orchestratord take it; a backend that refuses it answers a 400 naming it); a Lark
    /// grammar has no common spelling across backends.
    fn prepare_constraint(&self, constraint: &OutputConstraint) -> Result<(), PortError> {
        match constraint {
            OutputConstraint::JsonSchema(_) => Ok(()),
            OutputConstraint::Grammar(_) => Err(PortError::InvalidInput(
                "grammar: a remote worker's backend takes JSON Schemas only (response_format)"
                    .into(),
            )),
        }
    }

    fn start(&self, job: EngineJob) -> Result<mpsc::Receiver<SeqEvent>, PortError> {
        if !self.link.owns(&job.permit) {
            return Err(PortError::InvalidInput(
                "the slot permit belongs to another engine".into(),
            ));
        }
        backend_prompt(&job.prompt, &job.continuation)?;
        let request_id = format!("r-{}", uuid::Uuid::new_v4().simple());
        let Some(events) = self.link.open_request(&request_id) else {
            return Err(PortError::Dead("the worker disconnected".into()));
        };
        let (endpoint_path, body) = request_body(&self.model, &job);
        let mut headers = std::collections::BTreeMap::new();
        // only what the backend needs: never the client's credentials or hop-by-hop headers
        headers.insert("content-type".to_string(), "application/json".to_string());
        headers.insert("accept".to_string(), "text/event-stream".to_string());
        if !job.correlation_id.is_empty() {
            headers.insert(CORRELATION_HEADER.to_string(), job.correlation_id.clone());
        }
        // always streaming: the server needs the tokens as they are made (WRK-REQ-4)
        self.send_request(&request_id, endpoint_path, true, body.to_string(), headers)?;
        let (tx, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
        let progress = Progress {
            scored: job.logprobs.is_some(),
            ..Progress::default()
        };
        tokio::spawn(relay(
            self.link.clone(),
            request_id,
            progress,
            Ends {
                cancel: job.cancel,
                cause: job.stop_cause,
                failure: job.failure,
                permit: job.permit,
            },
            events,
            tx,
        ));
        Ok(rx)
    }

    /// Texts are counted by the backend; token ids are their own count.
    fn embed_tokens(
        &self,
        input: &pool_manager::EmbedInput,
        _truncate: bool,
    ) -> Result<Option<Vec<u32>>, PortError> {
        Ok(match input {
            pool_manager::EmbedInput::Tokens(ids) => Some(ids.clone()),
            _ => None,
        })
    }

    fn embed(&self, job: pool_manager::EmbedJob) -> Result<pool_manager::EmbedReply, PortError> {
        if !self.link.owns(&job.permit) {
            return Err(PortError::InvalidInput(
                "the slot permit belongs to another engine".into(),
            ));
        }
        let (path, body) = super::embed::request(&self.model, &job)?;
        let request_id = format!("r-{}", uuid::Uuid::new_v4().simple());
        let Some(events) = self.link.open_request(&request_id) else {
            return Err(PortError::Dead("the worker disconnected".into()));
        };
        let mut headers = std::collections::BTreeMap::new();
        headers.insert("content-type".to_string(), "application/json".to_string());
        self.send_request(&request_id, path, false, body.to_string(), headers)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        tokio::spawn(super::embed::relay(
            self.link.clone(),
            request_id,
            path,
            job,
            events,
            reply,
        ));
        Ok(answer)
    }

    fn is_alive(&self) -> bool {
        !self.link.closed.is_cancelled()
    }

    fn try_acquire(&self) -> Option<SlotPermit> {
        self.link.try_acquire()
    }

    fn slots_in_use(&self) -> usize {
        self.link.in_flight()
    }

    fn current_load(&self) -> Option<usize> {
        Some(self.link.load())
    }

    fn cached_prefixes(&self) -> Option<Arc<pool_manager::CachedPrefixes>> {
        self.link.held(&self.model)
    }
}

/// What a relay has seen of its request so far.
#[derive(Default)]
struct Progress {
    /// The job asked for log-probabilities: text without them is the backend ignoring it.
    scored: bool,
    reader: StreamReader,
    tokens_out: usize,
    finish: Option<String>,
    stop_sequence: Option<String>,
    usage: Option<TokenCounts>,
}

impl Progress {
    /// Turns stream items into events; an error item ends the request.
    async fn apply(
        &mut self,
        items: Vec<StreamItem>,
        tx: &mpsc::Sender<SeqEvent>,
    ) -> Result<(), Ended> {
        for item in items {
            match item {
                StreamItem::Text(_) if self.scored => {
                    return Err(Ended::Refused {
                        field: "logprobs".into(),
                        message: "the worker's backend gave no log-probabilities".into(),
                    })
                }
                StreamItem::Text(text) => self.token(text, None, tx).await?,
                StreamItem::Scored(text, steps) => {
                    // one token event per scored token when they spell the text, else the
                    // text with its first token's (a token split inside a character)
                    let pieces: Vec<String> = steps
                        .iter()
                        .map(|s| String::from_utf8_lossy(&s.chosen.bytes).into_owned())
                        .collect();
                    if steps.len() > 1 && pieces.concat() == text {
                        for (piece, step) in pieces.into_iter().zip(steps) {
                            self.token(piece, Some(step), tx).await?;
                        }
                    } else {
                        self.token(text, steps.into_iter().next(), tx).await?;
                    }
                }
                StreamItem::Finish(f) => self.finish = Some(f),
                StreamItem::StopSequence(s) => self.stop_sequence = Some(s),
                StreamItem::Usage(u) => self.usage = Some(u),
                StreamItem::Error(m) => return Err(Ended::Failed(m)),
            }
        }
        Ok(())
    }

    /// One token event (a worker streams text: it has no token id to give).
    async fn token(
        &mut self,
        text: String,
        logprobs: Option<StepLogprobs>,
        tx: &mpsc::Sender<SeqEvent>,
    ) -> Result<(), Ended> {
        let ev = SeqEvent::Token {
            text,
            index: self.tokens_out,
            id: None,
            logprobs: logprobs.map(Box::new),
        };
        self.tokens_out += 1;
        tx.send(ev).await.map_err(|_| Ended::ReceiverGone)
    }

    fn done(&self, counts: Option<TokenCounts>) -> SeqEvent {
        let usage = counts.or(self.usage);
        let reason = match self.finish.as_deref() {
            Some("length") => FinishReason::Length,
            _ => FinishReason::Stop,
        };
        SeqEvent::Done(Finish {
            stop_sequence: self
                .stop_sequence
                .clone()
                .filter(|_| reason == FinishReason::Stop),
            reason,
            prompt_tokens: usage.map_or(0, |u| u.prompt_tokens as usize),
            cached_tokens: usage.map_or(0, |u| u.cached_tokens as usize),
            tokens_out: self.tokens_out,
            prefill_ms: 0,
            decode_ms: 0,
            guessed_tokens: 0,
            guesses_kept: 0,
        })
    }
}

enum Ended {
    ReceiverGone,
    Failed(String),
    /// The backend did not honour a field of the request: the client's 400 names it.
    Refused {
        field: String,
        message: String,
    },
}

/// How a job can end early, and how its failure is read.
struct Ends {
    cancel: CancellationToken,
    cause: StopCause,
    failure: FailureNote,
    /// The worker slot, given back when the relay ends (the request is over or the worker
    /// was told to stop it).
    permit: SlotPermit,
}

/// Carries one request's frames to its task until it ends; tells the worker to stop it when
/// the task ends first.
async fn relay(
    link: Arc<WorkerLink>,
    request_id: String,
    mut progress: Progress,
    ends: Ends,
    mut events: mpsc::Receiver<RequestEvent>,
    tx: mpsc::Sender<SeqEvent>,
) {
    let Ends {
        cancel,
        cause,
        failure,
        permit: slot,
    } = ends;
    let stop = |reason: CancelReason| {
        link.close_request(&request_id);
        link.send(ServerToWorker::Cancel {
            request_id: request_id.clone(),
            reason,
        });
    };
    loop {
        let ev = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                stop(cause.get());
                let _ = tx.send(SeqEvent::Done(Finish {
                    reason: FinishReason::Cancelled,
                    stop_sequence: None,
                    prompt_tokens: 0,
                    cached_tokens: 0,
                    tokens_out: progress.tokens_out,
                    prefill_ms: 0,
                    decode_ms: 0,
                    guessed_tokens: 0,
                    guesses_kept: 0,
                })).await;
                return;
            }
            ev = events.recv() => ev,
        };
        let outcome = match ev {
            // the worker was lost: close without a terminal event
            None => return,
            Some(RequestEvent::Chunk(c)) => {
                let items = progress.reader.feed(&c);
                progress.apply(items, &tx).await
            }
            Some(RequestEvent::Complete {
                status_code,
                body,
                token_counts,
            }) => {
                link.close_request(&request_id);
                if status_code != 200 {
                    let msg = body.as_deref().map(error_message).unwrap_or_default();
                    let msg = format!("the worker's backend answered {status_code}: {msg}");
                    // a refused input (not a timeout or a rate limit) is the client's mistake
                    if (400..500).contains(&status_code) && ![408, 429].contains(&status_code) {
                        let field = body.as_deref().and_then(refused_field);
                        failure.set(match field {
                            Some(field) => PortError::Refused {
                                field,
                                message: msg.clone(),
                            },
                            None => PortError::InvalidInput(msg.clone()),
                        });
                    }
                    let _ = tx.send(SeqEvent::Failed(msg)).await;
                    return;
                }
                let mut items = progress.reader.feed("\n");
                if let Some(v) = body.and_then(|b| serde_json::from_str(&b).ok()) {
                    read_object(&v, &mut items);
                }
                match progress.apply(items, &tx).await {
                    Ok(()) => {
                        let _ = tx.send(progress.done(token_counts)).await;
                    }
                    Err(Ended::Failed(m)) => {
                        let _ = tx.send(SeqEvent::Failed(m)).await;
                    }
                    Err(Ended::Refused { field, message }) => {
                        failure.set(PortError::Refused {
                            field,
                            message: message.clone(),
                        });
                        let _ = tx.send(SeqEvent::Failed(message)).await;
                    }
                    Err(Ended::ReceiverGone) => {}
                }
                return;
            }
            Some(RequestEvent::Error { code, message }) => {
                link.close_request(&request_id);
                if progress.tokens_out == 0 && NO_SLOT_CODES.contains(&code.as_str()) {
                    // the worker never started it: the task goes back to the queue (closed
                    // without a terminal event) and the worker counts as full until it reports.
                    // The worker's own words stay in the log: the reason can reach a client.
                    tracing::info!(worker_id = %link.id, %request_id, %code, %message, "worker took no request");
                    failure.set(PortError::Dead(format!(
                        "the worker had no slot for the task ({code})"
                    )));
                    drop(slot);
                    if code == "draining" {
                        link.start_drain();
                    } else {
                        link.note_full();
                    }
                    return;
                }
                let _ = tx
                    .send(SeqEvent::Failed(format!("worker error {code}: {message}")))
                    .await;
                return;
            }
        };
        match outcome {
            Ok(()) => {}
            Err(Ended::ReceiverGone) => {
                stop(cause.get());
                return;
            }
            Err(Ended::Failed(m)) => {
                stop(CancelReason::ClientDisconnect);
                let _ = tx.send(SeqEvent::Failed(m)).await;
                return;
            }
            Err(Ended::Refused { field, message }) => {
                stop(CancelReason::ClientDisconnect);
                failure.set(PortError::Refused {
                    field,
                    message: message.clone(),
                });
                let _ = tx.send(SeqEvent::Failed(message)).await;
                return;
            }
        }
    }
}
