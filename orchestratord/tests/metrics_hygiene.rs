//! OC-CTRL-2053: `/metrics` passes `promtool check metrics` (and the same rules checked here),
//! fixed label sets exist before their first event, and a removed pool's series go away once
//! the upkeep stops refreshing them. Every test of this binary shares one recorder, installed
//! with the short idle timeout of `cfg()`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use support::*;

fn cfg() -> orchestratord::config::Config {
    let mut c = config(vec![pool("p1", 2)]);
    c.metrics.upkeep_interval_ms = 100;
    c.metrics.idle_timeout_ms = 1000;
    c
}

/// `promtool`: `$PROMTOOL`, else on `PATH`.
fn promtool() -> String {
    std::env::var("PROMTOOL").unwrap_or_else(|_| {
        let on_path = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join("promtool").is_file()))
            .unwrap_or(false);
        assert!(
            on_path,
            "no promtool: run ci/install-debs.sh (Debian's prometheus) or set PROMTOOL"
        );
        "promtool".into()
    })
}

/// The text format's families: name → (type, help present).
fn families(text: &str) -> BTreeMap<String, (String, bool)> {
    let mut out: BTreeMap<String, (String, bool)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (name, kind) = (it.next().unwrap(), it.next().unwrap());
            out.entry(name.into()).or_default().0 = kind.into();
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let mut it = rest.splitn(2, ' ');
            let name = it.next().unwrap();
            let help = it.next().unwrap_or("").trim();
            out.entry(name.into()).or_default().1 = !help.is_empty();
        }
    }
    out
}

/// `promtool check metrics` on `text`: its findings, one per line.
fn promtool_findings(text: &str) -> Vec<String> {
    let out = std::process::Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().unwrap().write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .expect("run promtool");
    let says = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let findings: Vec<String> = says.lines().map(str::to_string).collect();
    assert_eq!(
        out.status.success(),
        findings.is_empty(),
        "promtool: {says}"
    );
    findings
}

/// OPS-MET-1: the vLLM-named gauges are served by default (promtool's only findings are their
/// `:`), and left out with `metrics.vllm_names = false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_and_name_rules() {
    let mut c = cfg();
    c.metrics.vllm_names = false;
    let s = start(c, Duration::from_millis(1)).await;
    let id = s.submit_ok(json!({"prompt": "x", "max_tokens": 3})).await;
    s.stream_all(&id).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let text = s.metrics().await;
    // promtool, as an operator would run it
    assert_eq!(promtool_findings(&text), Vec::<String>::new());
    assert!(!text.contains("vllm:"));
    let with_vllm = start(cfg(), Duration::from_millis(1)).await;
    let vtext = with_vllm.metrics().await;
    let findings = promtool_findings(&vtext);
    assert_eq!(findings.len(), 3, "{findings:?}");
    for f in &findings {
        assert!(
            f.starts_with("vllm:") && f.ends_with("metric names should not contain ':'"),
            "{f}"
        );
    }
    for name in [
        "vllm:num_requests_waiting{pool=\"p1\",model_name=\"scripted-model\"} 0",
        "vllm:num_requests_running{pool=\"p1\",model_name=\"scripted-model\"} 0",
        "vllm:kv_cache_usage_perc{pool=\"p1\",model_name=\"scripted-model\"} 0",
    ] {
        assert!(vtext.contains(name), "{name} in {vtext}");
    }
    // the same rules, checked here
    let fams = families(&text);
    assert!(fams.len() > 20, "{fams:?}");
    for (name, (kind, help)) in &fams {
        assert!(*help, "{name} has no help text");
        assert!(
            name.starts_with("orchd_") || name.starts_with("process_"),
            "{name}"
        );
        assert_eq!(
            kind == "counter",
            name.ends_with("_total"),
            "{name} is a {kind}"
        );
        if kind == "histogram" {
            assert!(
                name.ends_with("_seconds"),
                "{name}: histograms are in seconds"
            );
        }
    }
    // fixed label sets exist before their first event
    for series in [
        "orchd_errors_total{code=\"BUDGET_EXCEEDED\"} 0",
        "orchd_tasks_rejected_total{reason=\"ADMISSION_REJECT\"} 0",
        "orchd_tasks_cancelled_total{reason=\"disconnect\"} 0",
    ] {
        assert!(text.contains(series), "{series} missing");
    }
}

fn pool_ids(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split("pool=\"").nth(1))
        .filter_map(|r| r.split('"').next())
        .map(str::to_string)
        .collect()
}

fn fake_gguf(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("orchd-{}-{name}.gguf", std::process::id()));
    std::fs::write(&p, b"GGUF\x03\x00\x00\x00rest").unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_pools_series_go_away() {
    let s = start(cfg(), Duration::from_millis(1)).await;
    let model = fake_gguf("gone");
    let r = s
        .post(
            "/engines",
            &json!({"engine_id": "gone", "model_path": model, "n_ctx": 256, "n_gpu_layers": 0}),
        )
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    let id = s
        .submit_ok(json!({"model": "gone", "prompt": "x", "max_tokens": 2}))
        .await;
    s.stream_all(&id).await;
    assert!(pool_ids(&s.metrics().await).contains("gone"));
    let r = s
        .client
        .delete(s.url("/engines/gone"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut waited = 0;
    while pool_ids(&s.metrics().await).contains("gone") && waited < 60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    let left = s.metrics().await;
    assert!(!pool_ids(&left).contains("gone"), "{left}");
    assert!(pool_ids(&left).contains("p1"), "live pools stay: {left}");
    let _ = std::fs::remove_file(model);
}
