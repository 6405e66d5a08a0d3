//! `orchd-soak --minutes 30 [--concurrency 8] [--model PATH] [--orchd BIN] [--json F]`: the
//! reliability soak (see `orchd_tools::soak`) against an orchestratord process it starts on
//! the real engine (the `orchestratord` binary beside this one unless `--orchd` says). Prints
//! the report; exits 1 unless every failure count is 0 and every slot came back.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clap::Parser;
use orchd_tools::soak;

/// Where `ci/fetch-model.sh` puts the default model.
const DEFAULT_MODEL_PATH: &str = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Debug, Parser)]
#[command(
    name = "orchd-soak",
    version,
    about = "Reliability soak on the real engine"
)]
struct Args {
    /// How long clients keep starting tasks.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Clients at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// The GGUF both pools serve.
    #[arg(long, default_value = DEFAULT_MODEL_PATH)]
    model: String,
    /// The server binary (default: `orchestratord` beside this one).
    #[arg(long)]
    orchd: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback address that was free a moment ago.
fn free_addr() -> anyhow::Result<String> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string())
}

/// Resident set size of process `pid` in bytes (`VmRSS` of its `/proc` status; Linux).
fn resident_bytes_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn server_binary(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let bin = match given {
        Some(b) => b,
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("orchestratord"))
            .ok_or_else(|| anyhow::anyhow!("no folder beside this binary"))?,
    };
    anyhow::ensure!(
        bin.exists(),
        "no server binary at {} (build it: cargo build --release -p orchestratord, or pass --orchd)",
        bin.display()
    );
    Ok(bin)
}

/// Starts the server on `bind` with `config` and waits until it answers.
async fn start(bin: &Path, config: &Path, bind: &str, log: &Path) -> anyhow::Result<Server> {
    let out = std::fs::File::create(log)?;
    let child = Command::new(bin)
        .arg("--config")
        .arg(config)
        .arg("--bind")
        .arg(bind)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?;
    let server = Server(child);
    let client = reqwest::Client::new();
    for _ in 0..1200 {
        if client
            .get(format!("http://{bind}/metrics"))
            .send()
            .await
            .is_ok()
        {
            return Ok(server);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!(
        "the server did not answer in 60 s; its log: {}",
        log.display()
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin = server_binary(args.orchd)?;
    let scratch = std::env::temp_dir().join(format!("orchd-soak-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let model = std::fs::canonicalize(&args.model)?.display().to_string();
    let (bind, hyperswarm) = (free_addr()?, free_addr()?);
    let config = scratch.join("config.toml");
    std::fs::write(&config, soak::server_toml(&model, &scratch, &hyperswarm))?;
    let server = start(&bin, &config, &bind, &scratch.join("server.log")).await?;
    let base = format!("http://{bind}");
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    eprintln!(
        "soak: {base} ({}), {} clients, {:.1} min",
        bin.display(),
        args.concurrency,
        args.minutes
    );
    let spec = soak::spec_for(
        base,
        &model,
        hyperswarm.parse().ok(),
        duration,
        args.concurrency,
    );
    let pid = server.0.id();
    let report = soak::run(spec, move || resident_bytes_of(pid)).await;
    drop(server);
    let _ = std::fs::remove_dir_all(scratch);
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(path) = args.json {
        std::fs::write(path, &text)?;
    }
    if !report.clean() {
        std::process::exit(1);
    }
    Ok(())
}
