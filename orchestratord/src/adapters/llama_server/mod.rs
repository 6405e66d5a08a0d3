//! llama-server's native routes (issue 50, LLS-API-1..4): `POST /completion`, `GET /props`,
//! `GET /slots`, `GET /health` (where configured, `health.rs`), in the shapes llama-server answers (checked field by field against its own
//! responses, recorded in `tests/fixtures/llama_server/`). Each completion is a task like any
//! other adapter's: admission, the queue, 429 with `Retry-After`, the tenant's quota.
//!
//! What llama-server gives that is not given here, and why: slot numbers (`id_slot`; slots
//! are counted, not numbered: `/slots` numbers the running tasks by start), token ids in the
//! answer (`tokens`, `completion_probabilities[].id`: the stream carries text),
//! `tokens_cached`/`cache_n` and a slot's prompt progress (the prompt cache is the engine's,
//! not counted per task), a running task's `params.stream` in `/slots` (the client's
//! connection's, not the task's), llama-server's samplers this engine lacks (accepted at their
//! neutral values only), GBNF grammars (Lark grammars are taken), text in a prompt parsed for
//! special tokens (a client's text never makes control tokens here: give their ids), the
//! text of control tokens in an answer's `prompt`, and the error's numeric `code` (errors are OpenAI's shape with this server's
//! stable codes). `/completion` samples with llama-server's defaults (temperature 0.8, top-k
//! 40, top-p 0.95, min-p 0.05) where a request names none.

pub mod completion;
pub mod health;
pub mod prompt;
pub mod props;
pub mod settings;

pub use completion::{__path_completion, completion};
pub use props::{__path_props, __path_slots, props, slots};
