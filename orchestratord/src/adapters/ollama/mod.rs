//! Ollama's native API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/ps`, `/api/show`,
//! `/api/version`, `/api/pull`, `/api/copy`, `/api/create`, `/api/delete`) on the task spine, errors in Ollama's `{"error": "…"}` shape.

mod answer;
mod create;
mod models;
mod pull;
mod request;
mod tools;
pub mod types;

pub use answer::{__path_chat, __path_generate, chat, generate};
pub use create::{__path_create, create, CreateRequest};
pub use models::{__path_ps, __path_show, __path_tags, __path_version, ps, show, tags, version};
pub use pull::{
    __path_copy, __path_delete, __path_pull, copy, delete, pull, CopyRequest, DeleteRequest,
    PullLine, PullRequest,
};
