//! What the benches share beside the tests' processes (`tests/support/procs.rs`): the wait for
//! a server's pools, the figures' medians and the env knobs.

#![allow(dead_code)] // each bench uses its part

use std::time::Duration;

/// Waits until `base` has at least `pools` ready pools (a minute at most).
pub async fn wait_ready(client: &reqwest::Client, base: &str, pools: usize) {
    for _ in 0..1200 {
        if let Ok(r) = client.get(format!("{base}/v1/pools")).send().await {
            if let Ok(v) = r.json::<serde_json::Value>().await {
                let ready = v["pools"]
                    .as_array()
                    .map_or(0, |a| a.iter().filter(|p| p["ready"] == true).count());
                if ready >= pools {
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{base} never had {pools} ready pools");
}

pub fn median(v: &mut [f64]) -> f64 {
    orchd_tools::loadgen::percentile(v, 0.5)
}

pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
