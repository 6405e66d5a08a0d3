//! `orchd-soak --minutes 30 [--concurrency 8] [--model PATH] [--json F]`: the reliability
//! soak (see `orchestratord::soak`) against an orchestratord started in this process on the
//! real engine. Prints the report; exits 1 unless every failure count is 0 and every slot came
//! back.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use orchestratord::config::DEFAULT_MODEL_PATH;
use orchestratord::{process_stats, server, soak};

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
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scratch = std::env::temp_dir().join(format!("orchd-soak-{}", std::process::id()));
    let cfg = soak::server_config(&args.model, &scratch);
    let state = server::build_state(cfg, Arc::new(pool_manager::candle::CandleFactory))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let bg = server::start_background(&state).await;
    let st = state.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        server::serve(st, listener, async {
            let _ = stopped.await;
        })
        .await
    });
    let hyperswarm = bg.hyperswarm.as_ref().map(|h| h.listen);
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    eprintln!(
        "soak: {base}, {} clients, {:.1} min",
        args.concurrency, args.minutes
    );
    let spec = soak::spec_for(base, &args.model, hyperswarm, duration, args.concurrency);
    let report = soak::run(spec, process_stats::resident_bytes).await;
    let _ = stop.send(());
    let _ = serving.await;
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
