//! `orchctl`: operate an orchestratord server from scripts and terminals (see
//! `orchd_tools::orchctl`; `orchctl --help` lists commands and exit codes).

use clap::Parser;
use orchd_tools::orchctl::{error::exit, run, Cli};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let json = cli.json;
    if let Err(e) = run(cli).await {
        if json {
            eprintln!("{}", e.to_json());
        } else {
            eprintln!("orchctl: {e}");
        }
        std::process::exit(e.exit_code());
    }
}
