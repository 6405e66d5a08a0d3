//! OPS-DASH-1, OPS-ALERT-1, OPS-MET-2: the Grafana dashboard and the Prometheus alert rules
//! in `deploy/` name only metrics a live server serves; the rules pass `promtool check rules`
//! and their unit tests (`promtool test rules`); the vLLM-named gauges follow the queue and
//! the slots.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn deploy(path: &str) -> std::path::PathBuf {
    repo_root().join("deploy").join(path)
}

/// Every metric name (ours: `orchd_`, `process_`, `vllm:`) written anywhere in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for prefix in ["orchd_", "process_", "vllm:"] {
        let mut rest = text;
        while let Some(i) = rest.find(prefix) {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            out.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    out
}

/// Family names and their types from the `# TYPE` lines of an exposition.
fn families(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|r| {
            let mut it = r.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.to_string()))
        })
        .collect()
}

/// Whether `name` is served: a family, or a histogram family's `_bucket`/`_sum`/`_count`.
fn served(name: &str, fams: &[(String, String)]) -> bool {
    fams.iter().any(|(f, kind)| {
        f == name
            || (kind == "histogram"
                && ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(f.as_str())))
    })
}

fn promtool() -> String {
    std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into())
}

/// OPS-DASH-1 / OPS-ALERT-1: after one task ran (so histograms have samples), every metric the
/// dashboard and the alert rules name is in `/metrics`; every dashboard query names one of ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_name_only_served_metrics() {
    // with a model folder (its metrics are on the dashboard too)
    let folder = std::env::temp_dir().join(format!("orchd-dash-folder-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).unwrap();
    std::os::unix::fs::symlink(default_model_path(), folder.join("listed.gguf")).unwrap();
    let mut cfg = config(vec![pool("p1", 2)]);
    cfg.models.dirs.push(folder.display().to_string());
    cfg.models.on_demand = true;
    let s = start(cfg, Duration::from_millis(2)).await;
    let id = s.submit_ok(json!({"prompt": "x", "max_tokens": 4})).await;
    s.stream_all(&id).await;
    let dashboard_text = std::fs::read_to_string(deploy("grafana/orchestratord.json")).unwrap();
    let alerts_text = std::fs::read_to_string(deploy("prometheus/alerts.yml")).unwrap();
    // the model folder's series appear with its first scan, a background tick: wait for it
    // (bounded) rather than a fixed time
    let wanted: BTreeSet<String> = names_in(&dashboard_text)
        .into_iter()
        .chain(names_in(&alerts_text))
        .collect();
    let mut fams = families(&s.metrics().await);
    for _ in 0..50 {
        if wanted.iter().all(|n| served(n, &fams)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        fams = families(&s.metrics().await);
    }
    assert!(fams.len() > 20, "{fams:?}");

    let dashboard: Value = serde_json::from_str(&dashboard_text).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 12, "{} panels", panels.len());
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate panel id");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            assert!(
                !names_in(expr).is_empty(),
                "{expr}: names none of our metrics"
            );
        }
    }
    for (file, text) in [("dashboard", &dashboard_text), ("alerts", &alerts_text)] {
        let names = names_in(text);
        assert!(names.len() >= 8, "{file}: {names:?}");
        for n in &names {
            assert!(
                served(n, &fams),
                "{file} uses {n}, which /metrics does not serve"
            );
        }
    }
    // the dashboard answers the questions the operators ask
    for needed in [
        "orchd_queue_depth",
        "orchd_queue_wait_seconds_bucket",
        "orchd_tasks_rejected_total",
        "orchd_time_to_first_token_seconds_bucket",
        "orchd_token_latency_seconds_bucket",
        "orchd_tokens_in_total",
        "orchd_tokens_out_total",
        "orchd_pool_slots_busy",
        "orchd_pool_state",
        "orchd_pool_reloads_total",
        "orchd_pool_restarts_total",
        "orchd_errors_total",
        "orchd_pool_prompt_tokens_reused_total",
        "process_resident_memory_bytes",
        "orchd_model_loads_total",
        "orchd_model_unloads_total",
        "orchd_models_resident_bytes",
    ] {
        assert!(names_in(&dashboard_text).contains(needed), "{needed}");
    }
    let _ = std::fs::remove_dir_all(folder);
}

/// OPS-ALERT-1: `promtool check rules` and the rules' unit tests pass.
#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["test", "rules", "alerts_test.yml"],
    ] {
        let out = std::process::Command::new(promtool())
            .args(&args)
            .current_dir(deploy("prometheus"))
            .output()
            .expect("promtool runs (ci/install-debs.sh installs Debian's prometheus)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The value of the series that starts with `series` (name and labels).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} not in {text}"))
}

/// OPS-MET-2: with one slot busy and two tasks queued for the pool, the vLLM-named gauges say
/// 2 waiting, 1 running, KV cache fully used; they fall back to 0 when the tasks are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_named_gauges_follow_the_queue_and_the_slots() {
    let mut c = config(vec![pool("p1", 1)]);
    c.admission.max_queue_wait_ms = 600_000;
    let s = start(c, Duration::from_millis(40)).await;
    let ids = [
        s.submit_ok(json!({"prompt": "x", "max_tokens": 20})).await,
        s.submit_ok(json!({"prompt": "x", "max_tokens": 5})).await,
        s.submit_ok(json!({"prompt": "x", "max_tokens": 5})).await,
    ];
    tokio::time::sleep(Duration::from_millis(200)).await;
    let labels = "{pool=\"p1\",model_name=\"scripted-model\"}";
    let text = s.metrics().await;
    assert_eq!(
        value(&text, &format!("vllm:num_requests_waiting{labels}")),
        2.0
    );
    assert_eq!(
        value(&text, &format!("vllm:num_requests_running{labels}")),
        1.0
    );
    assert_eq!(
        value(&text, &format!("vllm:kv_cache_usage_perc{labels}")),
        1.0
    );
    assert_eq!(value(&text, "orchd_queue_capacity"), 64.0);
    for id in &ids {
        s.stream_all(id).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let text = s.metrics().await;
    assert_eq!(
        value(&text, &format!("vllm:num_requests_waiting{labels}")),
        0.0
    );
    assert_eq!(
        value(&text, &format!("vllm:num_requests_running{labels}")),
        0.0
    );
    assert!(value(&text, "process_resident_memory_bytes") > 1e6);
    // the queue wait is kept by priority (the dashboard splits it so)
    assert!(
        text.contains("orchd_queue_wait_seconds_count{priority=\"interactive\"}"),
        "{text}"
    );
}

/// The `config.toml: |` block of a manifest (the lines indented under it).
/// Validates `files` against the Kubernetes schemas (strict); how many resources passed.
fn validated_resources(files: &[std::path::PathBuf]) -> usize {
    let out = std::process::Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(files)
        .env("PYTHONPATH", sdk_pythonpath())
        .output()
        .expect("python3 runs");
    let says = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate: {says}");
    says.matches(" passed for resource ").count()
}

fn embedded_config(manifest: &str) -> String {
    let mut lines = manifest
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("config.toml: |"));
    let key = lines.next().expect("a config.toml block");
    let key_indent = key.len() - key.trim_start().len();
    lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > key_indent)
        .map(|l| l.get(key_indent + 2..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// OPS-DEPLOY-1: the Kubernetes manifests validate against the API's schemas offline
/// (`kubernetes-validate --strict`), their configs are valid server configs, and the pod's grace
/// period covers the preStop drain's deadline plus the server's shutdown grace.
#[test]
fn kubernetes_manifests_validate_and_agree_with_the_server() {
    let dir = deploy("k8s");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    assert_eq!(validated_resources(&files), 8);

    let server = std::fs::read_to_string(dir.join("configmap.yaml")).unwrap();
    let cfg = orchestratord::config::Config::from_toml(&embedded_config(&server))
        .expect("the server's config parses");
    cfg.validate().expect("the server's config is valid");
    assert_eq!(cfg.bind, "0.0.0.0:8080");
    let worker = std::fs::read_to_string(dir.join("worker.yaml")).unwrap();
    let wcfg = orchestratord::config::Config::from_toml(&embedded_config(&worker))
        .expect("the worker's config parses");
    wcfg.validate().expect("the worker's config is valid");

    let deployment = std::fs::read_to_string(dir.join("deployment.yaml")).unwrap();
    // the root filesystem is read-only: the record store must sit on a mounted volume
    let mounts: Vec<&str> = deployment
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mountPath: "))
        .collect();
    assert!(
        mounts
            .iter()
            .any(|m| cfg.records.path.starts_with(&format!("{m}/"))),
        "records.path {} is on none of the mounts {mounts:?}",
        cfg.records.path
    );
    let grace: u64 = deployment
        .lines()
        .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("terminationGracePeriodSeconds");
    let pre_stop = deployment
        .lines()
        .find(|l| l.contains("\"orchctl\", \"drain\", \"--all\""))
        .expect("a preStop drain of every pool");
    let drain_s: u64 = pre_stop
        .split("\"--deadline\", \"")
        .nth(1)
        .and_then(|r| r.split("s\"").next())
        .and_then(|v| v.parse().ok())
        .expect("the drain deadline in seconds");
    assert!(
        grace >= drain_s + cfg.shutdown_grace_ms / 1000,
        "terminationGracePeriodSeconds {grace} < drain {drain_s} s + shutdown grace {} ms",
        cfg.shutdown_grace_ms
    );
}

/// CLU-DEPLOY-1: the replicas' manifests (`deploy/k8s/cluster/`) validate, the replicas'
/// config is a valid cluster config naming every node of the NATS StatefulSet, each pod is a
/// replica named after itself, both sides have a PodDisruptionBudget, and the NATS config
/// passes `nats-server -t` with every write flushed before it is acknowledged.
#[test]
fn cluster_manifests_validate_and_agree_with_the_server() {
    let dir = deploy("k8s/cluster");
    let files = [dir.join("nats.yaml"), dir.join("orchestratord.yaml")];
    assert_eq!(validated_resources(&files), 8);

    let replicas = std::fs::read_to_string(dir.join("orchestratord.yaml")).unwrap();
    let mut cfg = orchestratord::config::Config::from_toml(&embedded_config(&replicas))
        .expect("the replicas' config parses");
    assert!(cfg.cluster.enabled());
    cfg.cluster.replica_id = "orchestratord-cluster-5d9c-x2x4q".into();
    cfg.validate().expect("the replicas' config is valid");
    assert!(
        replicas.contains("name: ORCHD_REPLICA_ID")
            && replicas.contains("fieldPath: metadata.name")
    );
    assert!(replicas.contains("replicas: 3") && replicas.contains("kind: PodDisruptionBudget"));

    let nats = std::fs::read_to_string(dir.join("nats.yaml")).unwrap();
    assert!(nats.contains("replicas: 3") && nats.contains("kind: PodDisruptionBudget"));
    let urls: Vec<String> = (0..3)
        .map(|i| format!("nats://nats-{i}.nats:4222"))
        .collect();
    assert_eq!(cfg.cluster.nats_urls, urls);
    assert_eq!(cfg.cluster.stream_replicas, 3);
    // the NATS config as nats-server reads it
    let conf: String = nats
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("nats.conf: |"))
        .skip(1)
        .take_while(|l| l.starts_with("    ") || l.trim().is_empty())
        .map(|l| l.get(4..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(conf.contains("sync_interval: always"), "{conf}");
    for i in 0..3 {
        assert!(
            conf.contains(&format!("nats-route://nats-{i}.nats:6222")),
            "{conf}"
        );
    }
    let bin = repo_root().join(".cache/bin/nats-server");
    let tmp = std::env::temp_dir().join(format!("orchd-nats-conf-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let path = tmp.join("nats.conf");
    std::fs::write(
        &path,
        conf.replace("/data", &tmp.join("data").display().to_string()),
    )
    .unwrap();
    let checked = std::process::Command::new(&bin)
        .args(["-t", "-c"])
        .arg(&path)
        .env("POD_NAME", "nats-0")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (ci/install-nats.sh)", bin.display()));
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(
        checked.status.success(),
        "nats-server -t: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// OPS-DEPLOY-2: `/livez` answers while the server runs; `/readyz` is 200 while a pool takes
/// work and 503 (`shutting_down`) once shutdown began; both need no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_follow_readiness_and_shutdown() {
    let mut c = config(vec![pool("p1", 1)]);
    c.auth.keys = vec!["ops:admin:k-probe-0123456789abcdef".into()];
    let mut s = start(c, Duration::from_millis(5)).await;
    let live = s.client.get(s.url("/livez")).send().await.unwrap();
    assert_eq!(live.status(), 200);
    assert_eq!(live.text().await.unwrap(), "ok");
    let ready = s.client.get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let r: Value = ready.json().await.unwrap();
    assert_eq!(
        r,
        json!({"ready": true, "status": "ready", "pools_ready": 1, "pools": 1, "shutting_down": false,
               "pool_states": [{"pool_id": "p1", "state": "ready"}]})
    );
    // a long task keeps the server answering while it shuts down
    let task = s
        .client
        .post(s.url("/v1/tasks"))
        .bearer_auth("k-probe-0123456789abcdef")
        .json(&json!({"prompt": "x", "max_tokens": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(task.status(), 202);
    s.begin_shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ready = s.client.get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let r: Value = ready.json().await.unwrap();
    assert_eq!(r["shutting_down"], true);
    assert_eq!(r["status"], "shutting_down");
    assert_eq!(
        s.client.get(s.url("/livez")).send().await.unwrap().status(),
        200
    );
}
