//! What travels between replicas about one task: the handoff a replica admits into a pool's
//! queue (what another needs to run it or to follow it), and each event on the relay.
//!
//! Event positions: a task's events are numbered by their order on the relay — 0 is the
//! admitting replica's `started`, which carries the handoff; the replica running the task
//! appends the rest. Every replica following the task keeps them in that order, so an event's
//! id (its position, as the SSE routes give it) is the same on every replica.
//!
//! A relay message holds one event or several in order (a JSON object, or an array of them):
//! a run appends at once what it has pending when its previous append is answered, so a burst
//! of events (a short task's last token, `metrics` and `end`; tokens faster than the relay's
//! round trip) is one replicated write, not one per event. Positions count events, not
//! messages.

use bytes::Bytes;
use contracts::{SseEnd, SseError, SseMetrics, SseStarted, SseToken, TaskRequest};
use serde::{Deserialize, Serialize};

use crate::lifecycle::task::{Placed, TaskEvent};

/// A task admitted on one replica, as any other needs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Handoff {
    pub task_id: String,
    /// The tenant that submitted it (who may see it).
    pub owner: String,
    pub correlation_id: String,
    /// The request as the admitting replica checked it.
    pub request: TaskRequest,
    /// Its prompt tokens as the admitting replica counted them.
    pub prompt_tokens: u32,
    /// When it was admitted (ms since the Unix epoch): its deadline counts from there.
    pub admitted_unix_ms: u64,
    /// The pool it is left to for a moment (PLACE-8), as it went into its queue: a replica
    /// whose admission's take brings it gives it back to that pool rather than run it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_start: Option<HeadStart>,
}

/// The pool of the cluster a queued task is left to for a moment (PLACE-8).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HeadStart {
    pub replica: String,
    pub pool: String,
    /// Until when (Unix ms) the other pools leave the task to this one.
    pub until_unix_ms: u64,
}

/// One event of a task on the relay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireEvent {
    pub event: String,
    pub data: serde_json::Value,
    /// On the task's first event (`started`) only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Box<Handoff>>,
    /// On the first event a replica that took the task appends: where it runs (what the
    /// replicas following it put in its record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed: Option<Placed>,
}

impl WireEvent {
    pub fn of(ev: &TaskEvent) -> Self {
        let t = ev.to_transcript();
        Self {
            event: t.event,
            data: t.data,
            handoff: None,
            placed: None,
        }
    }

    pub fn encode(&self) -> Bytes {
        // a struct of strings and JSON values always serializes
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    /// `None` for a payload that is not an event (nothing this server wrote).
    pub fn decode(payload: &[u8]) -> Option<Self> {
        serde_json::from_slice(payload).ok()
    }

    /// One relay message holding events already encoded (each [`Self::encode`]), in order:
    /// the event itself when it is one, else their JSON array.
    pub fn join_encoded(events: &[Bytes]) -> Bytes {
        match events {
            [one] => one.clone(),
            more => {
                let len = more.iter().map(Bytes::len).sum::<usize>() + more.len() + 1;
                let mut out = Vec::with_capacity(len);
                out.push(b'[');
                for (i, e) in more.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(e);
                }
                out.push(b']');
                Bytes::from(out)
            }
        }
    }

    /// The events one relay message holds, in order; none for a payload that is not events.
    pub fn decode_all(payload: &[u8]) -> Vec<Self> {
        match payload.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'[') => serde_json::from_slice(payload).unwrap_or_default(),
            _ => Self::decode(payload).into_iter().collect(),
        }
    }

    /// Whether the relay message `payload` ends its task (its last event is terminal).
    pub fn ends_task(payload: &[u8]) -> bool {
        Self::decode_all(payload)
            .last()
            .is_some_and(WireEvent::is_terminal)
    }

    /// The event it carries; `None` for a name or payload this server does not know.
    pub fn to_event(&self) -> Option<TaskEvent> {
        fn p<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Option<T> {
            serde_json::from_value(v.clone()).ok()
        }
        Some(match self.event.as_str() {
            "started" => TaskEvent::Started(p::<SseStarted>(&self.data)?),
            "token" => TaskEvent::Token(p::<SseToken>(&self.data)?),
            "metrics" => TaskEvent::Metrics(p::<SseMetrics>(&self.data)?),
            "end" => TaskEvent::End(p::<SseEnd>(&self.data)?),
            "error" => TaskEvent::Error(p::<SseError>(&self.data)?),
            _ => return None,
        })
    }

    /// Whether it ends the task (`end` or `error`).
    pub fn is_terminal(&self) -> bool {
        matches!(self.event.as_str(), "end" | "error")
    }
}

/// Milliseconds since the Unix epoch now.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_crosses_the_relay_unchanged() {
        let events = [
            TaskEvent::Started(SseStarted {
                queue_position: 2,
                predicted_start_ms: 40,
                prediction: contracts::Prediction::Estimated,
                tenant_queue_share: None,
            }),
            TaskEvent::Token(SseToken {
                t: "héllo \"x\"\n".into(),
                i: 3,
                logprobs: None,
            }),
            TaskEvent::End(SseEnd {
                tokens_out: 4,
                decode_time_ms: 9,
                decode_ms: 9,
                finish_reason: "stop".into(),
                stop_sequence: Some("\n\n".into()),
                cached_tokens: 3,
                embeddings: None,
                prompt_tokens: None,
            }),
            TaskEvent::Error(SseError {
                code: contracts::ErrorCode::ReplicaExhausted,
                message: "m".into(),
                retriable: true,
                retry_after_ms: Some(1000),
                field: None,
            }),
        ];
        for ev in events {
            let wire = WireEvent::decode(&WireEvent::of(&ev).encode()).unwrap();
            assert_eq!(wire.to_event(), Some(ev.clone()));
            assert_eq!(
                wire.is_terminal(),
                matches!(ev, TaskEvent::End(_) | TaskEvent::Error(_))
            );
        }
        assert!(WireEvent::decode(b"not json").is_none());
        let odd = WireEvent {
            event: "token".into(),
            data: serde_json::json!({"nope": 1}),
            handoff: None,
            placed: None,
        };
        assert!(odd.to_event().is_none());
    }

    /// CLU-EV-2: events appended together come back in order; positions count events.
    #[test]
    fn several_events_in_one_relay_message_keep_their_order() {
        let token = |i: u32| {
            WireEvent::of(&TaskEvent::Token(SseToken {
                t: format!("t{i}"),
                i,
                logprobs: None,
            }))
        };
        let end = WireEvent::of(&TaskEvent::End(SseEnd {
            tokens_out: 2,
            decode_time_ms: 1,
            decode_ms: 1,
            finish_reason: "length".into(),
            stop_sequence: None,
            cached_tokens: 0,
            embeddings: None,
            prompt_tokens: None,
        }));
        let batch = [token(0), token(1), end];
        let encoded: Vec<Bytes> = batch.iter().map(WireEvent::encode).collect();
        let payload = WireEvent::join_encoded(&encoded);
        let back = WireEvent::decode_all(&payload);
        let names: Vec<_> = back.iter().map(|w| w.event.as_str()).collect();
        assert_eq!(names, ["token", "token", "end"]);
        assert_eq!(back[1].to_event(), batch[1].to_event());
        assert!(WireEvent::ends_task(&payload));
        // one event is written as before: a lone object
        let one = WireEvent::join_encoded(&encoded[..1]);
        assert_eq!(one, batch[0].encode());
        assert_eq!(WireEvent::decode_all(&one).len(), 1);
        assert!(!WireEvent::ends_task(&one));
        assert!(!WireEvent::ends_task(&WireEvent::join_encoded(
            &encoded[..2]
        )));
        assert!(WireEvent::decode_all(b"[1, 2]").is_empty());
        assert!(WireEvent::decode_all(b"nope").is_empty());
    }
}
