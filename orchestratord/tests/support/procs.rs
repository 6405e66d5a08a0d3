//! Real processes of the `orchestratord` binary (servers and workers) on loopback, killed when
//! dropped, with their logs in a temp folder.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static N: AtomicUsize = AtomicUsize::new(0);

pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill {sig} failed");
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A fresh temp folder for one process's files: empty, whatever an earlier run left (process
/// ids come round again, and a record store left by a run with this one's id made a test see
/// its artifacts as already stored).
pub fn scratch(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let d = std::env::temp_dir().join(format!(
        "orchd-{tag}-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The server binary: cargo's for the server crate's own tests; for the tools' tests (which
/// share this support) the one beside them in the target folder, which a workspace test run
/// builds.
pub fn orchestratord_binary() -> PathBuf {
    if let Some(bin) = option_env!("CARGO_BIN_EXE_orchestratord") {
        return bin.into();
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("orchestratord"))
        .unwrap();
    assert!(
        bin.exists(),
        "build the server first (cargo build -p orchestratord): {}",
        bin.display()
    );
    bin
}

fn spawn(tag: &str, args: &[String], config: &str) -> Proc {
    spawn_env(tag, args, config, &[])
}

/// A process of the binary with `config`, `args` and extra environment (`RUST_LOG` may be
/// overridden there); keys and secrets come only from `env`.
pub fn spawn_env(tag: &str, args: &[String], config: &str, env: &[(&str, &str)]) -> Proc {
    let dir = scratch(tag);
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, config).unwrap();
    let log = dir.join("log.txt");
    let out = std::fs::File::create(&log).unwrap();
    // each process its own record store, unless the test names one
    let records = dir.join("records.sqlite3");
    let child = Command::new(orchestratord_binary())
        .arg("--config")
        .arg(&cfg)
        .args(args)
        .env("RUST_LOG", "info,orchestratord::cluster=debug")
        .env_remove("ORCHD_WORKER_SECRET")
        .env_remove("ORCHD_WORKER_SECRET_FILE")
        .env_remove("ORCHD_API_KEYS")
        .env("ORCHD_RECORDS_PATH", &records)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawn orchestratord");
    Proc { child, log }
}

/// A server from `config` (its `bind` is set here); returns it and its base URL once its
/// pools have loaded (or failed to).
pub async fn server(config: &str) -> (Proc, String) {
    server_env(config, &[]).await
}

/// [`server`] with extra environment.
pub async fn server_env(config: &str, env: &[(&str, &str)]) -> (Proc, String) {
    let (p, base) = server_env_answering(config, env).await;
    let client = reqwest::Client::new();
    // it answers at once; its pools load behind it: wait until they did (or failed)
    for _ in 0..1200 {
        if let Ok(r) = client.get(format!("{base}/readyz")).send().await {
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            if v["status"] != "loading" {
                return (p, base);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server's pools did not load: {}", p.log_text());
}

/// The server process answering HTTP, its pools maybe still loading.
pub async fn server_env_answering(config: &str, env: &[(&str, &str)]) -> (Proc, String) {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let p = spawn_env(
        "server",
        &["--bind".into(), format!("127.0.0.1:{port}")],
        config,
        env,
    );
    let client = reqwest::Client::new();
    // a replica joins its cluster (streams and buckets opened) before it answers
    for _ in 0..3000 {
        if client.get(format!("{base}/livez")).send().await.is_ok() {
            return (p, base);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("server did not start: {}", p.log_text());
}

/// A worker serving `config`'s pools (or `extra` args such as `--backend-url`).
pub fn worker(server_base: &str, secret: &str, name: &str, config: &str, extra: &[&str]) -> Proc {
    worker_env(server_base, secret, name, config, extra, &[])
}

/// [`worker`] with extra environment.
pub fn worker_env(
    server_base: &str,
    secret: &str,
    name: &str,
    config: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Proc {
    let mut args: Vec<String> = vec![
        "worker".into(),
        "--server".into(),
        server_base.into(),
        "--secret".into(),
        secret.into(),
        "--name".into(),
        name.into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    spawn_env(&format!("worker-{name}"), &args, config, env)
}

/// The config of a worker serving the default model with `slots` slots.
pub fn worker_config(model: &str, slots: usize) -> String {
    format!(
        "[[pools]]\nid = \"local\"\nmodel = \"{model}\"\nalias = \"smol\"\nslots = {slots}\nctx = 1024\nthreads = 1\n"
    )
}

/// Polls `f` every 50 ms until it is true or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = std::time::Instant::now() + limit;
    while std::time::Instant::now() < until {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// GETs `url` and reads its JSON body, whatever the status (the caller asserts on it).
pub async fn get_json(url: &str) -> serde_json::Value {
    let r = reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    r.json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"))
}

/// POSTs `body` to `url` and reads the JSON answer, whatever the status.
pub async fn post_json(url: &str, body: &serde_json::Value) -> serde_json::Value {
    let r = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    r.json()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: not JSON: {e}"))
}

/// Whether `base`'s `/v1/pools` lists `n` pools within `within` (in a cluster: every
/// replica's, once their announcements arrived).
pub async fn lists_pools(base: &str, n: usize, within: Duration) -> bool {
    eventually(within, || async {
        let v: serde_json::Value = match reqwest::get(format!("{base}/v1/pools")).await {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => return false,
        };
        v["pools"].as_array().map_or(0, |a| a.len()) == n
    })
    .await
}
