//! HS-E2E-1, HS-SIDECAR-1: a local DHT testnet (`@hyperswarm/testnet`, loopback only),
//! orchestratord with the real default model supervising the Node sidecar, and stock npm
//! `hyperswarm` clients (`orchestratord/hyperswarm-sidecar/test/e2e.js`) that find the host by
//! its Server ID. Then the sidecar is killed and must come back by itself.
//! `ci/install-sidecar.sh` (run by `ci/test.sh`) installs the npm packages.

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

fn sidecar_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("hyperswarm-sidecar")
}

async fn node(args: &[&str], timeout: Duration) -> (bool, String) {
    let run = Command::new("node")
        .args(args)
        .current_dir(sidecar_dir())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(timeout, run)
        .await
        .expect("node finished in time")
        .expect("node runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_chat_over_a_local_hyperswarm_testnet() {
    assert!(
        sidecar_dir().join("node_modules/hyperswarm").exists(),
        "npm packages missing: run ci/install-sidecar.sh (ci/test.sh does)"
    );
    // the testnet prints its bootstrap nodes, and lives while its stdin is open
    let mut testnet = Command::new("node")
        .arg("test/testnet.js")
        .current_dir(sidecar_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let mut out = BufReader::new(testnet.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), out.next_line())
        .await
        .expect("testnet up in time")
        .unwrap()
        .expect("bootstrap line");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let bootstrap: Vec<String> = v["bootstrap"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap().to_string())
        .collect();

    let mut cfg = config(vec![real_pool("default", 2, 1024)]);
    cfg.timeouts.idle_ms = 30_000;
    let hs = &mut cfg.hyperswarm;
    hs.enabled = true;
    hs.max_clients = 5;
    hs.max_tokens = 64;
    hs.identity_path = std::env::temp_dir()
        .join(format!("orchd-hs-e2e-{}.json", std::process::id()))
        .display()
        .to_string();
    hs.sidecar.script = sidecar_dir().join("sidecar.js").display().to_string();
    hs.sidecar.bootstrap = bootstrap.clone();
    hs.sidecar.dht_host = Some("127.0.0.1".into());
    // loopback: no NAT to punch through (holepunching between processes on one loopback
    // address times out in hyperdht)
    hs.sidecar.dht_open = true;
    hs.sidecar.max_restart_backoff_ms = 1000;
    let s = start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await;
    let host = s
        .background
        .hyperswarm
        .clone()
        .expect("hyperswarm host started");
    let status = host.sidecar.clone().expect("sidecar supervised");
    let announced = || async {
        let caps = s.get_json("/v1/capabilities").await;
        caps["hyperswarm"]["announced"] == true
    };
    let mut waited = 0;
    while !announced().await && waited < 300 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    assert!(announced().await, "the sidecar announced the topic");
    let caps = s.get_json("/v1/capabilities").await;
    assert_eq!(caps["hyperswarm"]["server_id"], host.server_id);

    let (ok, text) = node(
        &[
            "test/e2e.js",
            "--server-id",
            &host.server_id,
            "--bootstrap",
            &bootstrap.join(","),
            "--max-clients",
            "5",
        ],
        Duration::from_secs(240),
    )
    .await;
    println!("{text}");
    assert!(ok, "end-to-end checks failed:\n{text}");
    assert!(text.contains("all hyperswarm checks passed"));

    // kill the sidecar: the supervisor restarts it and peers reach the host again
    let pid = status.pid.load(Ordering::SeqCst);
    assert!(pid > 0);
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut waited = 0;
    loop {
        let caps = s.get_json("/v1/capabilities").await;
        if caps["hyperswarm"]["sidecar_restarts"].as_u64() >= Some(1)
            && caps["hyperswarm"]["announced"] == true
        {
            break;
        }
        waited += 1;
        assert!(waited < 300, "sidecar came back: {caps}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(status.pid.load(Ordering::SeqCst), pid);
    let (ok, text) = node(
        &[
            "peer-chat.js",
            &host.server_id,
            "What is the capital of France?",
            "--bootstrap",
            &bootstrap.join(","),
            "--host",
            "127.0.0.1",
        ],
        Duration::from_secs(120),
    )
    .await;
    assert!(
        ok && text.contains("Paris") && text.contains("[stop]"),
        "{text}"
    );
    drop(s);
    drop(testnet.stdin.take());
    let _ = tokio::time::timeout(Duration::from_secs(10), testnet.wait()).await;
}
