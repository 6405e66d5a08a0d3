//! A request body must arrive whole within `http.body_read_timeout_ms` of its request head: a
//! total deadline, not one per read, so a client that sends a byte now and then cannot hold a
//! connection (and the handler waiting on it) for ever.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use tokio::time::Sleep;

/// The error a body yields once its deadline has passed.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyDeadlineElapsed(pub Duration);

/// Middleware: every request's body gets the deadline (`State`), counted from now.
pub async fn limit(State(within): State<Duration>, req: Request, next: Next) -> Response {
    let req = req.map(|body| {
        Body::new(DeadlineBody {
            body,
            within,
            sleep: Box::pin(tokio::time::sleep(within)),
        })
    });
    next.run(req).await
}

/// Whether `err` (a body read's failure, as an extractor reports it) is this deadline's.
pub fn elapsed_in(err: &(dyn std::error::Error + 'static)) -> Option<Duration> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(d) = e.downcast_ref::<BodyDeadlineElapsed>() {
            return Some(d.0);
        }
        cur = e.source();
    }
    None
}

struct DeadlineBody {
    body: Body,
    within: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl hyper::body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyDeadlineElapsed(
                self.within,
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::FromRequest;

    /// SEC-CONN-3: a body that keeps trickling is cut at the total deadline, and the
    /// extractor's failure is recognised as that deadline's.
    #[tokio::test]
    async fn a_trickling_body_is_cut_at_the_total_deadline() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let trickle = tokio::spawn(async move {
            for _ in 0..100 {
                if tx.send(Ok(Bytes::from_static(b"x"))).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let within = Duration::from_millis(150);
        let body = Body::new(DeadlineBody {
            body,
            within,
            sleep: Box::pin(tokio::time::sleep(within)),
        });
        let started = std::time::Instant::now();
        let req = Request::builder().body(body).unwrap();
        let err = Bytes::from_request(req, &()).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(1000));
        assert_eq!(elapsed_in(&err), Some(within), "{err:?}");
        trickle.abort();
    }
}
