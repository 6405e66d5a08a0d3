//! OPS-LOG-1: the real binary's logs. `--log-format json` (here through `ORCHD_LOG_FORMAT`)
//! writes one JSON object per line with timestamp, level, target and message; the request log
//! has method, route template, status and latency under the request's correlation id; a task's
//! lines carry its id and pool; the prompt is never written. Text logs to a file carry no ANSI
//! colour codes.

mod support;

use serde_json::{json, Value};
use support::default_model_path;
use support::procs::server_env;

const PROMPT: &str = "Zebra-quartz-nebula is the secret prompt";

fn config() -> String {
    format!(
        "[[pools]]\nid = \"p1\"\nmodel = \"{}\"\nslots = 1\nctx = 512\nthreads = 1\n",
        default_model_path()
    )
}

/// Submits one task (correlation id `corr-logs-1`), reads it to the end, and one unknown route.
async fn traffic(base: &str) -> String {
    let c = reqwest::Client::new();
    let r = c
        .post(format!("{base}/v1/tasks"))
        .header("x-correlation-id", "corr-logs-1")
        .json(&json!({"prompt": PROMPT, "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let id = r.json::<Value>().await.unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_string();
    let text = c
        .get(format!("{base}/v1/tasks/{id}/stream"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("event: end"), "{text}");
    assert_eq!(
        c.get(format!("{base}/nope")).send().await.unwrap().status(),
        404
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_with_request_and_task_fields() {
    let (p, base) = server_env(&config(), &[("ORCHD_LOG_FORMAT", "json")]).await;
    let id = traffic(&base).await;
    let log = p.log_text();
    assert!(!log.contains("Zebra-quartz"), "the prompt reached the log");
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for l in &lines {
        for k in ["timestamp", "level", "target", "message"] {
            assert!(l.get(k).is_some(), "{k} missing: {l}");
        }
    }
    let request = lines
        .iter()
        .find(|l| l["message"] == "request" && l["route"] == "/v1/tasks")
        .expect("the submit's request line");
    assert_eq!(request["target"], "orchestratord::access");
    assert_eq!(request["method"], "POST");
    assert_eq!(request["status"], 202);
    assert!(request["latency_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(request["span"]["correlation_id"], "corr-logs-1");
    let stream = lines
        .iter()
        .find(|l| l["route"] == "/v1/tasks/{id}/stream")
        .expect("the stream's request line: the route template, not the task id");
    assert_eq!(stream["status"], 200);
    assert!(lines
        .iter()
        .any(|l| l["route"] == "unmatched" && l["status"] == 404));
    let ended = lines
        .iter()
        .find(|l| l["message"] == "task ended")
        .expect("the task's end");
    assert_eq!(ended["span"]["task_id"], id.as_str());
    assert_eq!(ended["span"]["pool"], "p1");
    assert_eq!(ended["span"]["correlation_id"], "corr-logs-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_to_a_file_have_no_colour_codes() {
    let (p, base) = server_env(&config(), &[]).await;
    traffic(&base).await;
    let log = p.log_text();
    assert!(log.contains("route=\"/v1/tasks\" status=202"), "{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escapes in a file: {log:?}");
    assert!(!log.contains("Zebra-quartz"));
}
