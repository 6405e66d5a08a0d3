//! The process's log output: `text` (human lines; ANSI colour only when stdout is a terminal)
//! or `json` (one object per line: `timestamp`, `level`, `target`, the event's fields with its
//! `message` flattened in, and `span` — the innermost span's fields: `correlation_id` for a
//! request, `task_id`, `correlation_id` and `pool` for a running task). `RUST_LOG` filters.
//! Request bodies and prompts are never logged; the request log (target
//! [`ACCESS_TARGET`]) has the method, route template, status and latency.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The target of the one-line-per-request log (`RUST_LOG=info,orchestratord::access=off`
/// silences it).
pub const ACCESS_TARGET: &str = "orchestratord::access";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The subscriber of `orchestratord run`: warnings and errors only (unless `RUST_LOG` says
/// otherwise), on stderr, so the terminal's conversation is not interleaved with the
/// in-process server's lines.
pub fn init_quiet() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();
}

/// Installs the global subscriber (once, at start).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_ansi(std::io::stdout().is_terminal())
            .with_env_filter(filter)
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_env_filter(filter)
            .init(),
    }
}
