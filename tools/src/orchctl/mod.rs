//! `orchctl`: the operators' command line for one orchestratord (pools, drain/reload with
//! `--wait`, engines, workers, tasks, capabilities, a metrics summary). People get tables and
//! progress on stderr; scripts get `--json` on stdout and the exit codes of [`error::exit`].

pub mod client;
pub mod embed;
pub mod error;
pub mod metrics_summary;
pub mod pools;
pub mod progress;
pub mod table;
pub mod tasks;
pub mod tenants;
pub mod workers;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use contracts::{Capabilities, Priority, TaskRequest};
use serde_json::{json, Value};

use self::client::{Ctl, CALL_TIMEOUT};
use self::error::CtlError;

/// What a command prints: a text for people, a JSON value for `--json`.
#[derive(Debug)]
pub struct Output {
    pub human: String,
    pub json: Value,
}

const EXIT_CODES: &str = "Exit codes: 0 done; 1 failed (server error, unreadable answer, a task \
that ended in error); 2 refused by the server (4xx: bad request, unknown pool, conflict, busy, \
missing or wrong key); 3 a deadline passed (drain still busy at its deadline, no answer in time); \
4 server unreachable; 64 bad command line.";

#[derive(Debug, Parser)]
#[command(name = "orchctl", version, about = "Operate an orchestratord server", after_help = EXIT_CODES)]
pub struct Cli {
    /// The server's base URL.
    #[arg(
        long,
        env = "ORCHD_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,
    /// A file whose first line is the API key (else the `ORCHD_API_KEY` environment variable;
    /// the key is never taken from a flag and never printed).
    #[arg(long, global = true)]
    pub api_key_file: Option<PathBuf>,
    /// Print the result as JSON on stdout (errors as JSON on stderr); no progress display.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every pool: id, kind, model, state, busy/total slots, queue.
    Pools,
    /// One pool's health.
    Health {
        /// The pool's id (`orchctl pools`).
        pool: String,
    },
    /// Stop placing work on a pool (or every pool with --all); running tasks get until the
    /// deadline.
    Drain {
        /// The pool's id (`orchctl pools`).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        pool: Option<String>,
        /// Every pool not drained yet, at once (the Kubernetes preStop hook); pools whose state
        /// does not allow a drain are skipped. No progress display.
        #[arg(long)]
        all: bool,
        /// Time running tasks get to finish (e.g. 30s, 500ms, 2m).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        deadline: Duration,
        /// Wait until the pool is drained (exit 3 when tasks were still running at the
        /// deadline and the server ended them).
        #[arg(long)]
        wait: bool,
    },
    /// Put a draining or drained pool back into service.
    Resume {
        /// The pool's id (`orchctl pools`).
        pool: String,
    },
    /// Load MODEL beside the pool's current model, self-test it and switch (the old model keeps
    /// serving if it fails: exit 2 with the server's reason).
    Reload {
        /// The pool's id (`orchctl pools`).
        pool: String,
        /// The new model's GGUF path, inside the server's model folders.
        model: String,
        /// Wait until the new model serves or was rolled back (else return once it started).
        #[arg(long)]
        wait: bool,
        /// Longest time to wait for the server's answer.
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Engines of the Kolosal engine API.
    #[command(subcommand)]
    Engines(EnginesCmd),
    /// Connected remote workers (a list without a subcommand); drain one, or have it report
    /// its models again.
    Workers {
        #[command(subcommand)]
        cmd: Option<WorkersCmd>,
    },
    /// Tenants: weight, tasks queued and running, share of the queue, tokens served (divided
    /// by the weight, what the fair order compares), quotas.
    Tenants,
    /// Submit, follow, cancel and inspect tasks.
    #[command(subcommand)]
    Tasks(TasksCmd),
    /// Embed texts (each argument, or each line of --file): each one's vector (`/v1/embeddings`).
    Embed {
        /// The texts to embed, one vector each.
        texts: Vec<String>,
        /// One text per line of this file (`-` for stdin).
        #[arg(long)]
        file: Option<PathBuf>,
        /// The model (default: the first pool whose model embeds).
        #[arg(long)]
        model: Option<String>,
        /// Keep the first N dimensions of each vector.
        #[arg(long)]
        dimensions: Option<u32>,
    },
    /// Rank documents (each argument, or each line of --file) by relevance to a query
    /// (`/v1/rerank`, a reranker model).
    Rerank {
        /// The query.
        #[arg(long)]
        query: String,
        /// The documents to rank.
        documents: Vec<String>,
        /// One document per line of this file (`-` for stdin).
        #[arg(long)]
        file: Option<PathBuf>,
        /// The reranker model.
        #[arg(long)]
        model: Option<String>,
        /// The best N only.
        #[arg(long)]
        top_n: Option<usize>,
    },
    /// What the pools serve and the admission limits.
    Capabilities,
    /// A short summary of `/metrics`.
    Metrics,
}

#[derive(Debug, Subcommand)]
pub enum WorkersCmd {
    /// Every connected worker: id, name, models, busy/capacity, state.
    List,
    /// No new work for a worker; its requests get until the deadline, then its socket closes.
    Drain {
        /// The worker's id (`orchctl workers`).
        id: String,
        /// Time its requests in flight get to finish (e.g. 30s).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        deadline: Duration,
    },
    /// Ask a worker to report the models it serves again (after it loaded or removed one).
    ModelsRefresh {
        /// The worker's id (`orchctl workers`).
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum EnginesCmd {
    /// Every engine (= pool).
    List,
    /// Load a GGUF as a new engine (a pool named ID).
    Add {
        /// The new engine's id (its pool's).
        id: String,
        /// The GGUF to load, inside the server's model folders.
        model_path: String,
        /// Context per slot, in tokens (the server's default when absent).
        #[arg(long)]
        n_ctx: Option<u32>,
    },
    /// Drain an engine and remove it.
    Rm {
        /// The engine's id.
        id: String,
        /// Drain deadline (the server's default when absent).
        #[arg(long, value_parser = humantime::parse_duration)]
        deadline: Option<Duration>,
    },
}

#[derive(Debug, Subcommand)]
pub enum TasksCmd {
    /// Submit a task; prints its id (or follows it with --follow).
    Submit(Box<SubmitArgs>),
    /// Follow a task's events: its text on stdout (one JSON object per event with --json).
    Stream {
        /// The task's id.
        id: String,
        /// Resume after this event id.
        #[arg(long)]
        last_event_id: Option<u64>,
    },
    /// Cancel a queued or running task (exit 2 when it had already ended).
    Cancel {
        /// The task's id.
        id: String,
    },
    /// A task's state, placement, tokens and timings.
    Show {
        /// The task's id.
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The user's message (with --raw: the text to continue).
    #[arg(
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    pub prompt: Option<String>,
    /// Read the prompt from this file (`-` for stdin).
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// A system message before the user's (chat only).
    #[arg(long, conflicts_with = "raw")]
    pub system: Option<String>,
    /// Send the prompt as raw text to continue, not as a chat through the model's template.
    #[arg(long)]
    pub raw: bool,
    /// The model to run (its name in `/v1/models`; default: the first pool's).
    #[arg(long)]
    pub model: Option<String>,
    /// Run on this pool only.
    #[arg(long)]
    pub pool: Option<String>,
    /// Most tokens to generate (default: the server's).
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// interactive or batch.
    #[arg(long)]
    pub priority: Option<String>,
    /// Sampling seed (the server picks and records one when absent).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Sampling temperature (0 = greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Nucleus sampling: keep the likeliest tokens up to this probability mass (0-1].
    #[arg(long)]
    pub top_p: Option<f32>,
    /// End the answer at this text (repeat for several). The escapes users type mean what they
    /// say, as llama.cpp's `-e`: `\n`, `\t`, `\r`, `\\`, `\"`, `\'` and `\xHH`.
    #[arg(long, value_parser = unescape)]
    pub stop: Vec<String>,
    /// The session whose token and time budget the task draws on.
    #[arg(long)]
    pub session: Option<String>,
    /// The task must finish within this time of submission.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub deadline: Option<Duration>,
    /// Follow the task's events after submitting.
    #[arg(long)]
    pub follow: bool,
}

/// The key from `--api-key-file` or `ORCHD_API_KEY`.
fn read_key(file: Option<&PathBuf>) -> Result<Option<String>, CtlError> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CtlError::Failed(format!("cannot read the key file {}: {e}", path.display()))
        })?;
        let key = text.lines().map(str::trim).find(|l| !l.is_empty());
        return key
            .map(|k| Some(k.to_string()))
            .ok_or_else(|| CtlError::Failed(format!("the key file {} is empty", path.display())));
    }
    Ok(std::env::var("ORCHD_API_KEY")
        .ok()
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty()))
}

/// A value as one URL path segment (percent-encoding all but unreserved characters and `:`).
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn read_prompt(a: &SubmitArgs) -> Result<String, CtlError> {
    if let Some(p) = &a.prompt {
        return Ok(p.clone());
    }
    let Some(path) = &a.prompt_file else {
        return Err(CtlError::Failed("give --prompt or --prompt-file".into()));
    };
    let read = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    };
    read.map_err(|e| CtlError::Failed(format!("cannot read {}: {e}", path.display())))
}

fn task_request(a: &SubmitArgs) -> Result<TaskRequest, CtlError> {
    let priority = match a.priority.as_deref() {
        None => None,
        Some("interactive") => Some(Priority::Interactive),
        Some("batch") => Some(Priority::Batch),
        Some(other) => {
            return Err(CtlError::Failed(format!(
                "--priority is interactive or batch, not {other}"
            )))
        }
    };
    let text = read_prompt(a)?;
    let (prompt, messages) = if a.raw {
        (Some(text), None)
    } else {
        let turns = a
            .system
            .iter()
            .map(|s| contracts::ChatTurn {
                role: "system".into(),
                content: s.clone(),
            })
            .chain([contracts::ChatTurn {
                role: "user".into(),
                content: text,
            }])
            .collect();
        (None, Some(turns))
    };
    Ok(TaskRequest {
        prompt,
        messages,
        top_p: a.top_p,
        stop: (!a.stop.is_empty()).then(|| contracts::StopField::Many(a.stop.clone())),
        model: a.model.clone(),
        pool_id: a.pool.clone(),
        max_tokens: a.max_tokens,
        priority,
        seed: a.seed,
        temperature: a.temperature,
        session_id: a.session.clone(),
        deadline_ms: a
            .deadline
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        ..TaskRequest::default()
    })
}

fn print(out: &Output, json: bool) {
    if json {
        println!("{}", out.json);
    } else {
        print!("{}", out.human);
    }
}

/// Runs one command; the caller turns the error into its exit code.
pub async fn run(cli: Cli) -> Result<(), CtlError> {
    let key = read_key(cli.api_key_file.as_ref())?;
    let ctl = Ctl::new(&cli.url, key.as_deref())?;
    let json = cli.json;
    let out = match &cli.command {
        Command::Pools => pools::list(&ctl).await?,
        Command::Health { pool } => pools::health(&ctl, pool).await?,
        Command::Drain {
            pool: Some(pool),
            deadline,
            wait,
            ..
        } => pools::drain(&ctl, pool, *deadline, *wait, json).await?,
        Command::Drain {
            pool: None,
            deadline,
            wait,
            ..
        } => {
            let (out, failure) = pools::drain_all(&ctl, *deadline, *wait).await?;
            print(&out, json);
            return failure.map_or(Ok(()), Err);
        }
        Command::Resume { pool } => pools::resume(&ctl, pool).await?,
        Command::Reload {
            pool,
            model,
            wait,
            timeout,
        } => pools::reload(&ctl, pool, model, *wait, json, *timeout).await?,
        Command::Engines(cmd) => engines(&ctl, cmd).await?,
        Command::Workers { cmd } => workers::run(&ctl, cmd.as_ref()).await?,
        Command::Tenants => tenants::list(&ctl).await?,
        Command::Tasks(TasksCmd::Submit(a)) => {
            let admitted = tasks::submit(&ctl, &task_request(a)?).await?;
            if !a.follow {
                tasks::admitted(&admitted)
            } else {
                if !json {
                    eprintln!("task {}", admitted.task_id);
                }
                return tasks::stream(&ctl, &admitted.task_id, None, json).await;
            }
        }
        Command::Tasks(TasksCmd::Stream { id, last_event_id }) => {
            return tasks::stream(&ctl, id, *last_event_id, json).await
        }
        Command::Tasks(TasksCmd::Cancel { id }) => tasks::cancel(&ctl, id).await?,
        Command::Tasks(TasksCmd::Show { id }) => tasks::show(&ctl, id).await?,
        Command::Embed {
            texts,
            file,
            model,
            dimensions,
        } => {
            let inputs = embed::inputs(texts, file.as_deref())?;
            embed::embed(&ctl, inputs, model.as_deref(), *dimensions).await?
        }
        Command::Rerank {
            query,
            documents,
            file,
            model,
            top_n,
        } => {
            let docs = embed::inputs(documents, file.as_deref())?;
            embed::rerank(&ctl, query, docs, model.as_deref(), *top_n).await?
        }
        Command::Capabilities => capabilities(&ctl).await?,
        Command::Metrics => metrics_summary::summarise(&ctl.text("/metrics").await?),
    };
    print(&out, json);
    Ok(())
}

async fn engines(ctl: &Ctl, cmd: &EnginesCmd) -> Result<Output, CtlError> {
    match cmd {
        EnginesCmd::List => {
            let v: Value = ctl.get("/engines").await?;
            let field = |e: &Value, k: &str| e[k].as_str().unwrap_or("").to_string();
            let rows: Vec<Vec<String>> = v["engines"]
                .as_array()
                .map(|a| a.as_slice())
                .unwrap_or_default()
                .iter()
                .map(|e| {
                    vec![
                        field(e, "engine_id"),
                        field(e, "status"),
                        field(e, "model_path"),
                    ]
                })
                .collect();
            Ok(Output {
                human: table::render(&["ENGINE", "STATUS", "MODEL"], &rows),
                json: v,
            })
        }
        EnginesCmd::Add {
            id,
            model_path,
            n_ctx,
        } => {
            let mut body = json!({"engine_id": id, "model_path": model_path});
            if let Some(n) = n_ctx {
                body["n_ctx"] = json!(n);
            }
            let v: Value = ctl
                .post("/engines", Some(&body), Duration::from_secs(600))
                .await?;
            Ok(Output {
                human: format!(
                    "engine {id}: {} ({})\n",
                    v["status"].as_str().unwrap_or("?"),
                    v["model_path"].as_str().unwrap_or(model_path)
                ),
                json: v,
            })
        }
        EnginesCmd::Rm { id, deadline } => {
            let mut path = format!("/engines/{}", path_segment(id));
            let wait = match deadline {
                Some(d) => {
                    path.push_str(&format!("?deadline_ms={}", d.as_millis()));
                    *d + CALL_TIMEOUT
                }
                None => Duration::from_secs(600),
            };
            let v: Value = ctl.delete(&path, wait).await?;
            Ok(Output {
                human: format!("engine {id}: {}\n", v["status"].as_str().unwrap_or("?")),
                json: v,
            })
        }
    }
}

async fn capabilities(ctl: &Ctl) -> Result<Output, CtlError> {
    let c: Capabilities = ctl.get("/v1/capabilities").await?;
    let rows: Vec<Vec<String>> = c
        .pools
        .iter()
        .map(|p| {
            vec![
                p.pool_id.clone(),
                p.state.clone(),
                p.ctx_max.to_string(),
                p.max_tokens_out.to_string(),
                p.slots.to_string(),
                p.supported_workloads.join(","),
            ]
        })
        .collect();
    let mut human = format!(
        "api {}; queue capacity {} ({}); features: {}\n\n",
        c.api_version,
        c.queue.capacity,
        c.queue.policy,
        c.features.join(", ")
    );
    human.push_str(&table::render(
        &["POOL", "STATE", "CTX", "MAX OUT", "SLOTS", "WORKLOADS"],
        &rows,
    ));
    Ok(Output {
        human,
        json: json!(c),
    })
}

/// `s` with the escapes a shell user types for control characters turned into them (issue
/// 49: `--stop "\n\n"` sent a backslash and an n): `\n`, `\t`, `\r`, `\0`, `\\`, `\"`, `\'`,
/// `\xHH`. Any other backslash is kept as it is.
fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.peek().copied() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('0') => out.push('\0'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('\'') => out.push('\''),
            Some('x') => {
                chars.next();
                let hex: String = chars.by_ref().take(2).collect();
                let byte = u8::from_str_radix(&hex, 16)
                    .ok()
                    .filter(|b| b.is_ascii() && hex.len() == 2)
                    .ok_or_else(|| {
                        format!("\\x{hex}: want two hex digits of an ASCII character")
                    })?;
                out.push(byte as char);
                continue;
            }
            _ => {
                out.push('\\');
                continue;
            }
        }
        chars.next();
    }
    if out.is_empty() {
        return Err("a stop sequence is not empty".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::unescape;

    /// Issue 49: the escapes users type in `--stop` mean what they say.
    #[test]
    fn stop_escapes_mean_what_they_say() {
        assert_eq!(unescape("\\n\\n").unwrap(), "\n\n");
        assert_eq!(unescape("a\\tb\\\\c\\x41").unwrap(), "a\tb\\cA");
        assert_eq!(unescape("\\q").unwrap(), "\\q");
        assert_eq!(unescape("END").unwrap(), "END");
        assert!(unescape("\\xZZ").is_err());
        assert!(unescape("").is_err());
    }

    /// FC-CTL-1: every command and every flag or argument of orchctl says what it is for.
    #[test]
    fn every_flag_has_help() {
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let here = format!("{path} {}", c.get_name());
            if c.get_about().is_none() && !path.is_empty() {
                missing.push(here.clone());
            }
            for a in c.get_arguments() {
                let id = a.get_id().as_str();
                if id != "help" && id != "version" && a.get_help().is_none() {
                    missing.push(format!("{here} {id}"));
                }
            }
            for s in c.get_subcommands() {
                walk(s, &here, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:?}");
    }
}
