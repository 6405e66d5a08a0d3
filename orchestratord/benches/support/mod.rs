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

/// CPU time (user + system, ms) process `pid` has used so far; 0 when it cannot be read.
pub fn cpu_ms(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // the fields after the command (which may hold spaces) in parentheses
    let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime (fields 14 and 15 of the line; 11 and 12 after the state), in clock
    // ticks of 1/100 s (USER_HZ on Linux)
    (ticks(11) + ticks(12)) * 10.0
}

/// [`cpu_ms`] of every process of `pids`, summed.
pub fn cpu_ms_of(pids: &[u32]) -> f64 {
    pids.iter().map(|&p| cpu_ms(p)).sum()
}
