//! The server's command line for the first pool and the listener — its own flags and
//! llama-server's (LLS-CLI-1..3), so `orchestratord -m model.gguf -c 4096 -np 2 --port 8080`
//! means what it means to llama-server. Flags with no meaning here are accepted with one log
//! line saying so, never silently different; a flag whose meaning this server cannot give is
//! an error saying why.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use crate::config::{Config, ConfigError, FirstPool};

/// llama-server's flags of several letters after one dash, as this command line's long names
/// (clap reads `-np` as `-n -p`).
const SEVERAL_LETTERS: &[(&str, &str)] = &[
    ("-np", "--parallel"),
    ("-ngl", "--n-gpu-layers"),
    ("-ub", "--ubatch-size"),
    ("-fa", "--flash-attn"),
    ("-cb", "--cont-batching"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-hf", "--hf-repo"),
    ("-hfr", "--hf-repo"),
];

/// The arguments with llama-server's several-letter flags (`-np 4`, `-np=4`) written as their
/// long names; everything after `--` is left as it is.
pub fn expand_llama_server_flags(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut rest = false;
    for a in args {
        if rest {
            out.push(a);
            continue;
        }
        let Some(text) = a.to_str() else {
            out.push(a);
            continue;
        };
        if text == "--" {
            rest = true;
            out.push(a);
            continue;
        }
        let long = SEVERAL_LETTERS.iter().find_map(|(short, long)| {
            if text == *short {
                Some(long.to_string())
            } else {
                text.strip_prefix(short)
                    .and_then(|v| v.strip_prefix('='))
                    .map(|v| format!("{long}={v}"))
            }
        });
        out.push(long.map_or(a, OsString::from));
    }
    out
}

/// The first pool's and the listener's flags.
#[derive(Debug, Default, Args)]
pub struct ServeFlags {
    /// The first pool's model file (a GGUF), as llama-server's `-m` (beside ORCHD_MODEL and
    /// the config file; this wins).
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// The first pool's slots: sequences decoded together (llama-server's `-np`).
    #[arg(long, visible_alias = "parallel")]
    pub slots: Option<usize>,
    /// The first pool's context per slot in tokens (0 = the model's trained context as far as
    /// the KV cache budget holds it).
    #[arg(long, conflicts_with = "ctx_size")]
    pub ctx: Option<usize>,
    /// llama-server's `-c`: the context of all slots together, divided among them (4096 with
    /// `-np 2`: 2048 tokens per slot); 0 = `--ctx 0`.
    #[arg(long = "ctx-size", short = 'c')]
    pub ctx_size: Option<usize>,
    /// The first pool's compute threads (0 = the whole compute pool).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Address to listen on (llama-server's `--host`: replaces the host of `--bind`).
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on (llama-server's `--port`: replaces the port of `--bind`).
    #[arg(long)]
    pub port: Option<u16>,
    /// The name clients send as `model` for the first pool (llama-server's `--alias`).
    #[arg(long, short = 'a')]
    pub alias: Option<String>,
    /// The first pool's chat template over the model's own: a built-in name (chatml, llama3,
    /// gemma, mistral-v7, phi3, …) or Jinja text.
    #[arg(long)]
    pub chat_template: Option<String>,
    /// A Jinja file whose text is the first pool's chat template.
    #[arg(long, conflicts_with = "chat_template")]
    pub chat_template_file: Option<String>,
    /// llama-server's switch to Jinja templates: templates are always Jinja here.
    #[arg(long)]
    pub jinja: bool,
    /// A folder of GGUF files served on demand: listed in /v1/models, loaded when asked for
    /// (llama-server's router mode). May be given more than once.
    #[arg(long)]
    pub models_dir: Vec<String>,
    /// An API key every request must carry (as admin; comma-separated for several). A flag
    /// shows in the process list: prefer ORCHD_API_KEYS or auth.key_file.
    #[arg(long, value_delimiter = ',')]
    pub api_key: Vec<String>,
    /// A file of API keys, one per line (llama-server's `--api-key-file`).
    #[arg(long)]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Serve no console page at `/`.
    #[arg(long)]
    pub no_webui: bool,
    /// How keys and values are stored: f32 or f16 (llama-server's `-ctk`; one type for both).
    #[arg(long)]
    pub cache_type_k: Option<String>,
    /// The same for values (`-ctv`): must match `-ctk` when both are given.
    #[arg(long)]
    pub cache_type_v: Option<String>,
    /// llama-server's layers on the GPU: a pool runs whole on its `device` here.
    #[arg(long, visible_alias = "gpu-layers")]
    pub n_gpu_layers: Option<String>,
    /// llama-server's batch sizes: prompt chunks are sized per pass here
    /// (`step_prompt_tokens`, `step_ms`).
    #[arg(long, short = 'b')]
    pub batch_size: Option<usize>,
    /// See `--batch-size`.
    #[arg(long)]
    pub ubatch_size: Option<usize>,
    /// llama-server's flash attention switch: the engine picks its attention kernel.
    #[arg(long, num_args = 0..=1, default_missing_value = "on")]
    pub flash_attn: Option<String>,
    /// Continuous batching: always on here.
    #[arg(long)]
    pub cont_batching: bool,
    /// llama-server's memory locking: not done here.
    #[arg(long)]
    pub mlock: bool,
    /// llama-server's switch from memory-mapped weights: weights are read into memory here.
    #[arg(long)]
    pub no_mmap: bool,
    /// llama-server's switch for `/metrics`: always served here.
    #[arg(long)]
    pub metrics: bool,
    /// llama-server's warm-up switch: a pool here measures its pace as it loads.
    #[arg(long)]
    pub no_warmup: bool,
    /// A model on Hugging Face (`OWNER/REPO[:QUANT]`, the hub at `HF_ENDPOINT`): pulled into
    /// the first `--models-dir` (or `.cache/models`) unless it is there, then served.
    #[arg(long)]
    pub hf_repo: Option<String>,
}

impl ServeFlags {
    /// Applies the flags to `cfg` (over its file and environment) and validates it again.
    pub fn apply(self, cfg: &mut Config) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        self.say_what_does_not_apply(cfg);
        // a command line written for llama-server: its clients' /health too (unless configured)
        let llama_server_spelling = self.ctx_size.is_some()
            || self.host.is_some()
            || self.port.is_some()
            || self.hf_repo.is_some()
            || self.jinja
            || self.no_webui;
        if llama_server_spelling && cfg.http.health_shape.is_none() {
            tracing::info!("started with llama-server's flags: /health answers as llama-server's does ({{\"status\":\"ok\"}}; http.health_shape = \"kolosal\" for Kolosal's)");
            cfg.http.health_shape = Some(crate::config::HealthShape::LlamaServer);
        }
        let mut model = self.model;
        if let Some(repo) = &self.hf_repo {
            if model.is_some() {
                return bad("-m and -hf both name the model: give one".into());
            }
            let dir = self
                .models_dir
                .first()
                .or(cfg.models.dirs.first())
                .map_or_else(|| PathBuf::from(MODEL_CACHE), PathBuf::from);
            let budget =
                (cfg.models.disk_budget_mib > 0).then_some(cfg.models.disk_budget_mib << 20);
            model = Some(pull_at_start(repo, dir, budget)?.display().to_string());
        }
        let slots = self
            .slots
            .or_else(|| cfg.pools.first().map(|p| p.slots))
            .unwrap_or(1)
            .max(1);
        let ctx = match self.ctx_size {
            None => self.ctx,
            Some(0) => {
                tracing::info!("-c 0: each slot gets the model's trained context, as far as the key/value cache budget (kv_cache_mib) holds it for every slot");
                Some(0)
            }
            Some(total) if total < slots => {
                return bad(format!(
                    "-c {total} over {slots} slots leaves no context to a slot: llama-server's -c is the context of all slots together"
                ))
            }
            Some(total) => {
                tracing::info!(
                    "-c {total} over {slots} slots: {} tokens of context per slot",
                    total / slots
                );
                Some(total / slots)
            }
        };
        let kv_cache = match (&self.cache_type_k, &self.cache_type_v) {
            (Some(k), Some(v)) if !k.eq_ignore_ascii_case(v) => {
                return bad(format!(
                    "-ctk {k} -ctv {v}: keys and values are stored in one type here (f32 or f16)"
                ))
            }
            (Some(t), _) | (None, Some(t)) => match t.to_ascii_lowercase().as_str() {
                "f32" | "f16" => Some(t.to_ascii_lowercase()),
                _ => {
                    return bad(format!(
                        "cache type {t}: this engine stores keys and values as f32 or f16"
                    ))
                }
            },
            (None, None) => None,
        };
        cfg.apply_first_pool(FirstPool {
            model,
            slots: self.slots,
            ctx,
            threads: self.threads,
            alias: self.alias,
            chat_template: self.chat_template,
            chat_template_file: self.chat_template_file,
            kv_cache,
        })?;
        if self.host.is_some() || self.port.is_some() {
            cfg.bind = bind_of(&cfg.bind, self.host.as_deref(), self.port);
        }
        if !self.models_dir.is_empty() {
            cfg.models.dirs.extend(self.models_dir);
            cfg.models.on_demand = true;
        }
        let mut keys: Vec<String> = self.api_key;
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_string),
            );
        }
        if !keys.is_empty() {
            cfg.auth.keys.extend(
                keys.iter()
                    .filter(|k| !k.trim().is_empty())
                    .map(|k| format!("default:admin:{}", k.trim())),
            );
        }
        if self.no_webui {
            cfg.http.console = false;
        }
        cfg.validate()
    }

    /// One log line for each llama-server flag that changes nothing here, saying why.
    fn say_what_does_not_apply(&self, cfg: &Config) {
        if self.jinja {
            tracing::info!("--jinja: chat templates are always rendered as Jinja here");
        }
        if let Some(n) = &self.n_gpu_layers {
            let device = cfg.pools.first().map_or("cpu", |p| p.device.as_str());
            tracing::info!(
                "-ngl {n}: a pool runs whole on its device here (the first pool's: {device}); set device = \"cuda\" in the pool's config to run it on a GPU"
            );
        }
        if self.batch_size.is_some() || self.ubatch_size.is_some() {
            tracing::info!("-b/-ub: prompt chunks are sized per pass here (the pool's step_prompt_tokens and step_ms); the batch sizes are not used");
        }
        if let Some(fa) = &self.flash_attn {
            tracing::info!(
                "-fa {fa}: the engine picks its attention kernel; the switch is not used"
            );
        }
        if self.cont_batching {
            tracing::info!("-cb: continuous batching is always on here");
        }
        if self.mlock {
            tracing::info!("--mlock: weights are not locked in memory here");
        }
        if self.no_mmap {
            tracing::info!("--no-mmap: weights are read into memory here, never mapped");
        }
        if self.metrics {
            tracing::info!("--metrics: /metrics is always served here");
        }
        if self.no_warmup {
            tracing::info!(
                "--no-warmup: a pool measures its pace as it loads here; the switch is not used"
            );
        }
        if !self.api_key.is_empty() {
            tracing::warn!("--api-key: a key on the command line shows in the process list; prefer ORCHD_API_KEYS or --api-key-file");
        }
    }
}

/// Where `-hf` puts its model without a `--models-dir`.
const MODEL_CACHE: &str = ".cache/models";

/// Pulls `repo` into `dir` before the server starts, saying how far it got in the log.
fn pull_at_start(repo: &str, dir: PathBuf, budget: Option<u64>) -> Result<PathBuf, ConfigError> {
    use crate::models_folder::pull::{HubRef, Progress, PullError, Puller};
    let fail = |e: PullError| ConfigError::Invalid(format!("-hf {repo}: {e}"));
    let hub = HubRef::parse(repo, true).map_err(fail)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ConfigError::Invalid(format!("-hf {repo}: {e}")))?;
    let mut last_tenth = None;
    let mut say = |p: Progress| match p {
        Progress::Status(s) => tracing::info!(model = repo, "{s}"),
        Progress::Bytes {
            total, completed, ..
        } if total > 0 => {
            let tenth = completed * 10 / total;
            if last_tenth != Some(tenth) {
                last_tenth = Some(tenth);
                tracing::info!(model = repo, "{} of {} MiB", completed >> 20, total >> 20);
            }
        }
        Progress::Bytes { .. } => {}
    };
    rt.block_on(async {
        Puller::new(dir, budget)
            .map_err(fail)?
            .pull(&hub, &mut say)
            .await
            .map_err(fail)
    })
}

/// `bind` with its host and/or port replaced (an IPv6 host in brackets).
fn bind_of(bind: &str, host: Option<&str>, port: Option<u16>) -> String {
    let (old_host, old_port) = bind
        .rsplit_once(':')
        .map_or((bind, "8080"), |(h, p)| (h, p));
    let host = match host {
        Some(h) if h.contains(':') && !h.starts_with('[') => format!("[{h}]"),
        Some(h) => h.to_string(),
        None => old_host.to_string(),
    };
    let port = port.map_or_else(|| old_port.to_string(), |p| p.to_string());
    format!("{host}:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    /// LLS-CLI-1: llama-server's several-letter flags become long names; values and what
    /// follows `--` are left alone.
    #[test]
    fn several_letter_flags_become_long_names() {
        let got = expand_llama_server_flags(os(&[
            "orchestratord",
            "-np",
            "4",
            "-ngl=99",
            "-c",
            "4096",
            "--",
            "-np",
        ]));
        assert_eq!(
            got,
            os(&[
                "orchestratord",
                "--parallel",
                "4",
                "--n-gpu-layers=99",
                "-c",
                "4096",
                "--",
                "-np"
            ])
        );
    }

    #[test]
    fn host_and_port_replace_their_part_of_the_bind() {
        assert_eq!(
            bind_of("127.0.0.1:8080", None, Some(9000)),
            "127.0.0.1:9000"
        );
        assert_eq!(
            bind_of("127.0.0.1:8080", Some("0.0.0.0"), None),
            "0.0.0.0:8080"
        );
        assert_eq!(bind_of("127.0.0.1:8080", Some("::1"), Some(1)), "[::1]:1");
    }

    fn cfg() -> Config {
        Config {
            pools: vec![crate::config::PoolConfig::new("default", "/m/a.gguf")],
            ..Config::default()
        }
    }

    /// LLS-CLI-2: `-c` is the context of all slots together, divided among `-np` of them;
    /// cache types other than f32/f16, and `-ctk`/`-ctv` that differ, are refused.
    #[test]
    fn ctx_size_is_divided_among_the_slots() {
        let mut c = cfg();
        ServeFlags {
            ctx_size: Some(4096),
            slots: Some(2),
            ..Default::default()
        }
        .apply(&mut c)
        .unwrap();
        assert_eq!((c.pools[0].slots, c.pools[0].ctx), (2, 2048));
        let mut c = cfg();
        let err = ServeFlags {
            cache_type_k: Some("q8_0".into()),
            ..Default::default()
        }
        .apply(&mut c)
        .unwrap_err();
        assert!(err.to_string().contains("f32 or f16"), "{err}");
        let err = ServeFlags {
            cache_type_k: Some("f16".into()),
            cache_type_v: Some("f32".into()),
            ..Default::default()
        }
        .apply(&mut cfg())
        .unwrap_err();
        assert!(err.to_string().contains("one type"), "{err}");
    }

    /// LLS-TMPL-2: an unknown template name is refused at start with the names there are; a
    /// template that does not compile is refused too.
    #[test]
    fn a_template_is_a_known_name_or_jinja_that_renders() {
        let err = ServeFlags {
            chat_template: Some("chatmll".into()),
            ..Default::default()
        }
        .apply(&mut cfg())
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("chatml, ") && msg.contains("llama3"), "{msg}");
        let err = ServeFlags {
            chat_template: Some("{% for m in messages %}".into()),
            ..Default::default()
        }
        .apply(&mut cfg())
        .unwrap_err();
        assert!(err.to_string().contains("chat template"), "{err}");
        let mut c = cfg();
        ServeFlags {
            chat_template: Some("llama3".into()),
            ..Default::default()
        }
        .apply(&mut c)
        .unwrap();
        assert_eq!(c.pools[0].chat_template.as_deref(), Some("llama3"));
    }

    /// LLS-CLI-2: `--api-key` (comma-separated) and `--api-key-file` (a key a line, `#`
    /// comments) become admin keys the key store takes; `--models-dir` serves its folder on
    /// demand; `--no-webui` turns the console off.
    #[test]
    fn keys_folders_and_the_console_from_llama_servers_flags() {
        let file = std::env::temp_dir().join(format!("orchd-keys-{}", std::process::id()));
        std::fs::write(&file, "# ops\nk2-0123456789abcdef\n\n").unwrap();
        let mut c = cfg();
        ServeFlags {
            api_key: vec!["k1-0123456789abcdef".into()],
            api_key_file: Some(file.clone()),
            models_dir: vec!["/srv/models".into()],
            no_webui: true,
            ..Default::default()
        }
        .apply(&mut c)
        .unwrap();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(
            c.auth.keys,
            vec![
                "default:admin:k1-0123456789abcdef".to_string(),
                "default:admin:k2-0123456789abcdef".to_string()
            ]
        );
        let auth = crate::auth::Auth::load(&c.auth, &c.http).unwrap();
        assert!(auth.enabled());
        assert_eq!(c.models.dirs, vec!["/srv/models".to_string()]);
        assert!(c.models.on_demand);
        assert!(!c.http.console);
    }
}
