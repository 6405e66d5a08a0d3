//! The Kolosal engine API: `/engines` (add, list, status, remove — an engine is a pool seen
//! another way) and `/v1/health`. Its chat endpoints are the OpenAI adapter's.

mod engines;
mod health;
pub mod types;

pub use engines::{
    __path_add, __path_list, __path_remove, __path_status, add, list, remove, status,
};
pub use health::{__path_health, health, server_status};
