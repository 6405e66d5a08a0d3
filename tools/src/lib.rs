//! orchd-tools: what drives orchestratord from outside, over its HTTP API only — `orchctl`
//! (the operator's CLI), `orchd-load` (the load generator) and `orchd-soak` (the reliability
//! soak, on a server process it starts). It depends on the wire types (`contracts`) and an
//! HTTP client, never on the server.

pub mod loadgen;
pub mod orchctl;
pub mod soak;
pub mod sse_reader;
