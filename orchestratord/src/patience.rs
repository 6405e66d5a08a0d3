//! What a client tells us about its own patience: how long it will wait for an answer, and
//! whether this request is a retry. Read from request headers once, carried in the `Caller`.
//!
//! - `X-Request-Deadline-Ms` (ours): milliseconds from arrival within which the answer must
//!   begin (a stream: its first token; a whole response: its end). Malformed is a 400.
//! - `x-stainless-read-timeout` (the `openai` SDKs) and `x-stainless-timeout` (the `anthropic`
//!   SDKs): the client's timeout in seconds. Malformed ones are ignored (not ours to refuse).
//! - `x-stainless-retry-count` (both SDKs) or `X-Retry-Count`: how many times this request was
//!   tried before; a retry may take back the place in line a refusal kept for it (queue.rs).
//!
//! The earliest of the timeouts applies.

use std::time::Duration;

use axum::http::HeaderMap;

use crate::error::ApiError;

pub const DEADLINE_HEADER: &str = "x-request-deadline-ms";
const SDK_TIMEOUT_HEADERS: [&str; 2] = ["x-stainless-read-timeout", "x-stainless-timeout"];
const RETRY_HEADERS: [&str; 2] = ["x-stainless-retry-count", "x-retry-count"];

/// Longest timeout taken from a header (a day): beyond it the client has no deadline to speak of.
const LONGEST: Duration = Duration::from_secs(86_400);

/// Where a client's timeout came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatienceSource {
    /// `X-Request-Deadline-Ms`.
    Header,
    /// An SDK's timeout header.
    SdkTimeout,
}

impl PatienceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Header => DEADLINE_HEADER,
            Self::SdkTimeout => "sdk timeout",
        }
    }
}

/// A client's stated patience.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Patience {
    /// How long the client waits for its answer to begin, and what said so.
    pub timeout: Option<(Duration, PatienceSource)>,
    /// Earlier tries of this request (0 = first).
    pub retry_count: u32,
    /// The client counts its tries (sent a retry-count header, 0 included): its retry will
    /// say so and can take back a place in line kept for it.
    pub counts_tries: bool,
}

impl Patience {
    /// Reads the headers; only a malformed `X-Request-Deadline-Ms` is an error.
    pub fn from_headers(h: &HeaderMap) -> Result<Self, ApiError> {
        let mut timeout: Option<(Duration, PatienceSource)> = None;
        let mut take = |d: Duration, src: PatienceSource| {
            let d = d.min(LONGEST);
            if timeout.is_none_or(|(t, _)| d < t) {
                timeout = Some((d, src));
            }
        };
        if let Some(v) = h.get(DEADLINE_HEADER) {
            let ms = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .filter(|ms| *ms > 0)
                .ok_or_else(|| {
                    ApiError::invalid(
                        DEADLINE_HEADER,
                        "X-Request-Deadline-Ms must be a whole number of milliseconds >= 1",
                    )
                })?;
            take(Duration::from_millis(ms), PatienceSource::Header);
        }
        for name in SDK_TIMEOUT_HEADERS {
            let secs = h
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0);
            if let Some(s) = secs {
                take(
                    Duration::from_secs_f64(s.min(LONGEST.as_secs_f64())),
                    PatienceSource::SdkTimeout,
                );
            }
        }
        let counts: Vec<u32> = RETRY_HEADERS
            .iter()
            .filter_map(|n| h.get(*n))
            .filter_map(|v| v.to_str().ok()?.trim().parse::<u32>().ok())
            .collect();
        Ok(Self {
            timeout,
            retry_count: counts.iter().copied().max().unwrap_or(0),
            counts_tries: !counts.is_empty(),
        })
    }

    pub fn is_retry(&self) -> bool {
        self.retry_count > 0
    }

    /// Whether this is the client's last attempt by the SDKs' default (`openai` and
    /// `anthropic` retry twice): a refusal now loses the client for good.
    pub fn is_last_attempt(&self) -> bool {
        self.retry_count >= SDK_DEFAULT_RETRIES
    }
}

/// How many times the `openai` and `anthropic` SDKs retry a refused request by default.
pub const SDK_DEFAULT_RETRIES: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    /// ORCH-ADM-DL-1: the earliest stated timeout applies, whichever header said it.
    #[test]
    fn the_earliest_timeout_wins() {
        let p = Patience::from_headers(&headers(&[
            ("x-stainless-read-timeout", "15.0"),
            ("x-request-deadline-ms", "20000"),
        ]))
        .unwrap();
        assert_eq!(
            p.timeout,
            Some((Duration::from_secs(15), PatienceSource::SdkTimeout))
        );
        let p = Patience::from_headers(&headers(&[
            ("x-stainless-timeout", "600"),
            ("x-request-deadline-ms", "2500"),
        ]))
        .unwrap();
        assert_eq!(
            p.timeout,
            Some((Duration::from_millis(2500), PatienceSource::Header))
        );
        assert_eq!(
            Patience::from_headers(&HeaderMap::new()).unwrap(),
            Patience::default()
        );
    }

    #[test]
    fn a_malformed_deadline_header_is_a_400_and_sdk_noise_is_ignored() {
        for bad in ["0", "-5", "1.5", "soon", ""] {
            let h = headers(&[("x-request-deadline-ms", bad)]);
            let e = Patience::from_headers(&h).unwrap_err();
            assert_eq!(e.envelope.field.as_deref(), Some(DEADLINE_HEADER), "{bad}");
        }
        let p = Patience::from_headers(&headers(&[
            ("x-stainless-read-timeout", "NaN"),
            ("x-stainless-timeout", "-1"),
            ("x-stainless-retry-count", "many"),
        ]))
        .unwrap();
        assert_eq!(p, Patience::default());
    }

    #[test]
    fn retry_count_from_either_header() {
        let p = Patience::from_headers(&headers(&[("x-stainless-retry-count", "2")])).unwrap();
        assert_eq!(p.retry_count, 2);
        assert!(p.is_retry());
        let p = Patience::from_headers(&headers(&[("x-retry-count", "0")])).unwrap();
        assert!(!p.is_retry());
        assert!(p.counts_tries);
        assert!(
            !Patience::from_headers(&HeaderMap::new())
                .unwrap()
                .counts_tries
        );
    }
}
