//! How a `--wait` shows that it is still waiting: a spinner line on a terminal (indicatif), one
//! plain line per change when stderr is piped, nothing with `--json`. Always on stderr, so
//! stdout carries only the result.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    mode: Mode,
}

enum Mode {
    Terminal(ProgressBar),
    /// Prints a status only when it differs from the last one printed.
    Lines {
        last: String,
    },
    Quiet,
}

impl Progress {
    pub fn new(json: bool) -> Self {
        let mode = if json {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            Mode::Terminal(bar)
        } else {
            Mode::Lines {
                last: String::new(),
            }
        };
        Self { mode }
    }

    /// `live` changes every poll (a countdown) and is shown on a terminal only; `status` is
    /// what a log line reports when it changes.
    pub fn update(&mut self, status: &str, live: &str) {
        match &mut self.mode {
            Mode::Terminal(bar) => bar.set_message(format!("{status}{live}")),
            Mode::Lines { last } => {
                if last != status {
                    eprintln!("{status}");
                    *last = status.to_string();
                }
            }
            Mode::Quiet => {}
        }
    }

    /// Ends the display (the caller prints the result).
    pub fn finish(self) {
        if let Mode::Terminal(bar) = self.mode {
            bar.finish_and_clear();
        }
    }
}
