//! `orchctl`'s connection to one server: the base URL, the key (sent, never shown), and the
//! mapping of every answer onto [`CtlError`].

use std::time::Duration;

use reqwest::header::{HeaderValue, AUTHORIZATION};
use reqwest::{Method, RequestBuilder, Response};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::CtlError;

/// How long a plain control call may take (a reload gets its own, longer limit).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Error bodies longer than this are cut when shown.
const MAX_ERROR_CHARS: usize = 500;

/// One server.
pub struct Ctl {
    http: reqwest::Client,
    base: String,
    auth: Option<HeaderValue>,
}

impl std::fmt::Debug for Ctl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctl")
            .field("base", &self.base)
            .field("key", &self.auth.as_ref().map(|_| "[set]"))
            .finish()
    }
}

impl Ctl {
    /// `key`: the API key, already read from `ORCHD_API_KEY` or the key file.
    pub fn new(base: &str, key: Option<&str>) -> Result<Self, CtlError> {
        let auth = match key {
            Some(k) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {k}")).map_err(|_| {
                    CtlError::Failed("the API key holds characters a header cannot carry".into())
                })?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| CtlError::Failed(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            auth,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(a) = &self.auth {
            r = r.header(AUTHORIZATION, a.clone());
        }
        r
    }

    /// Sends and maps transport failures and non-2xx answers; the 2xx response is returned.
    async fn send(&self, r: RequestBuilder) -> Result<Response, CtlError> {
        let resp = r.send().await.map_err(|e| self.transport(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(answer_error(resp).await)
    }

    fn transport(&self, e: reqwest::Error) -> CtlError {
        if e.is_timeout() {
            CtlError::Deadline(format!("no answer from {} in time", self.base))
        } else if e.is_connect() || e.is_request() {
            CtlError::Unreachable {
                url: self.base.clone(),
                reason: root_cause(&e),
            }
        } else {
            CtlError::Failed(format!("talking to {}: {}", self.base, root_cause(&e)))
        }
    }

    async fn json<T: DeserializeOwned>(&self, r: RequestBuilder) -> Result<T, CtlError> {
        let resp = self.send(r).await?;
        let bytes = resp.bytes().await.map_err(|e| self.transport(e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| CtlError::Failed(format!("unexpected answer from the server: {e}")))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CtlError> {
        self.json(self.request(Method::GET, path).timeout(CALL_TIMEOUT))
            .await
    }

    /// POST with a JSON body (or none), waiting at most `timeout` for the answer.
    pub async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<T, CtlError> {
        let mut r = self.request(Method::POST, path).timeout(timeout);
        if let Some(b) = body {
            r = r.json(b);
        }
        self.json(r).await
    }

    /// POST whose success has no body (204).
    pub async fn post_empty(&self, path: &str) -> Result<(), CtlError> {
        self.send(self.request(Method::POST, path).timeout(CALL_TIMEOUT))
            .await
            .map(|_| ())
    }

    pub async fn delete<T: DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<T, CtlError> {
        self.json(self.request(Method::DELETE, path).timeout(timeout))
            .await
    }

    pub async fn text(&self, path: &str) -> Result<String, CtlError> {
        let resp = self
            .send(self.request(Method::GET, path).timeout(CALL_TIMEOUT))
            .await?;
        resp.text().await.map_err(|e| self.transport(e))
    }

    /// Opens an event stream (no overall timeout: it lasts as long as the task).
    pub async fn stream(
        &self,
        path: &str,
        last_event_id: Option<u64>,
    ) -> Result<Response, CtlError> {
        let mut r = self
            .request(Method::GET, path)
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            r = r.header("last-event-id", id.to_string());
        }
        self.send(r).await
    }
}

/// The innermost cause (reqwest's top message says only "error sending request").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// A non-2xx answer as an error, reading the envelope `{code, message}` or the OpenAI shape
/// `{"error": {code|type, message}}` the server answers in.
async fn answer_error(resp: Response) -> CtlError {
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap_or_default();
    let (code, message) = match serde_json::from_str::<Value>(&body) {
        Ok(v) => {
            let e = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
            let code = e
                .get("code")
                .and_then(Value::as_str)
                .or_else(|| e.get("type").and_then(Value::as_str))
                .unwrap_or("UNKNOWN")
                .to_string();
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or(&body)
                .to_string();
            (code, message)
        }
        Err(_) => ("UNKNOWN".to_string(), body),
    };
    let message: String = message.chars().take(MAX_ERROR_CHARS).collect();
    if status >= 500 {
        CtlError::Server {
            status,
            code,
            message,
        }
    } else {
        CtlError::Refused {
            status,
            code,
            message,
        }
    }
}
