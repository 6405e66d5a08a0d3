//! MOD-PULL-1..5 (issue 50): models pulled by name as Ollama's and llama-server's users do —
//! `/api/pull hf.co/OWNER/REPO:QUANT` and `-hf OWNER/REPO:QUANT` — from a local HTTP server
//! laid out like the Hugging Face hub (`HF_ENDPOINT`: `/api/models/OWNER/REPO` lists the files,
//! `/OWNER/REPO/resolve/main/FILE` serves them with `Range`). A download cut off half way is
//! resumed from where it stopped; a file whose SHA-256 differs from the hub's is refused and
//! nothing is left behind; the pulled model is listed in `/api/tags` and answers a chat at once;
//! it answers by the name it was pulled as too (MOD-PULL-6); `/api/copy` names it twice and
//! `/api/delete` takes it away. A real server process, the real model's file, real sockets.

mod support;
#[path = "support/tls.rs"]
mod tls;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use support::procs::*;

/// The hub's file (the real default model), and what it was asked.
struct Hub {
    file: Bytes,
    sha256: String,
    /// The next download of the file is cut off half way (once).
    cut_next: AtomicBool,
    /// Every `Range` header a download came with.
    ranges: Mutex<Vec<String>>,
}

async fn listing(
    State(hub): State<Arc<Hub>>,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
) -> Response {
    let size = hub.file.len();
    let sha = match (owner.as_str(), repo.as_str()) {
        ("test", "smol-GGUF") => hub.sha256.clone(),
        // a hub whose digest is not the file's
        ("test", "wrong-GGUF") => "0".repeat(64),
        _ => return (StatusCode::NOT_FOUND, "Repository not found").into_response(),
    };
    Json(json!({"id": format!("{owner}/{repo}"), "siblings": [
        {"rfilename": "README.md"},
        {"rfilename": "smol-Q4_1.gguf", "size": size, "lfs": {"sha256": sha, "size": size}},
        {"rfilename": "smol-Q8_0.gguf", "size": size, "lfs": {"sha256": sha, "size": size}},
    ]}))
    .into_response()
}

async fn resolve(
    State(hub): State<Arc<Hub>>,
    UrlPath((_owner, _repo, file)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if !file.ends_with(".gguf") {
        return StatusCode::NOT_FOUND.into_response();
    }
    let total = hub.file.len();
    let from = match headers.get("range").and_then(|v| v.to_str().ok()) {
        Some(r) => {
            hub.ranges.lock().unwrap().push(r.to_string());
            r.trim_start_matches("bytes=")
                .trim_end_matches('-')
                .parse::<usize>()
                .unwrap()
        }
        None => 0,
    };
    let rest = hub.file.slice(from..);
    let body = if hub.cut_next.swap(false, Ordering::SeqCst) {
        // half of it, then the connection breaks
        let half = rest.slice(..rest.len() / 2);
        Body::from_stream(futures::stream::iter(vec![
            Ok(half),
            Err(std::io::Error::other("cut")),
        ]))
    } else {
        Body::from(rest.clone())
    };
    let mut resp = Response::new(body);
    resp.headers_mut()
        .insert("content-length", rest.len().to_string().parse().unwrap());
    if from > 0 {
        *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
        resp.headers_mut().insert(
            "content-range",
            format!("bytes {from}-{}/{total}", total - 1)
                .parse()
                .unwrap(),
        );
    }
    resp
}

fn hub_app() -> (Arc<Hub>, Router) {
    let file = Bytes::from(std::fs::read(support::default_model_path()).unwrap());
    let sha256 = format!("{:x}", Sha256::digest(&file));
    let hub = Arc::new(Hub {
        file,
        sha256,
        cut_next: AtomicBool::new(false),
        ranges: Mutex::new(Vec::new()),
    });
    let app = Router::new()
        .route("/api/models/{owner}/{repo}", get(listing))
        .route("/{owner}/{repo}/resolve/main/{file}", get(resolve))
        .with_state(hub.clone());
    (hub, app)
}

async fn start_hub() -> (Arc<Hub>, String) {
    let (hub, app) = hub_app();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (hub, format!("http://{addr}"))
}

/// The hub over https, its certificate for 127.0.0.1 signed by a CA of the test's own;
/// returns the endpoint and the CA's certificate file.
async fn start_tls_hub() -> (String, PathBuf) {
    let (acceptor, ca_file) = tls::acceptor("hub-ca");
    let (_hub, app) = hub_app();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // a client that does not trust the CA ends the handshake: nothing to serve
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("https://127.0.0.1:{}", addr.port()), ca_file)
}

/// The NDJSON lines of a streamed pull.
async fn pull(base: &str, model: &str) -> Vec<Value> {
    let r = reqwest::Client::new()
        .post(format!("{base}/api/pull"))
        .body(json!({ "model": model }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{model}");
    r.text()
        .await
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|f| f.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

async fn tags(base: &str) -> Vec<String> {
    let v: Value = reqwest::get(format!("{base}/api/tags"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn models_are_pulled_by_name_resumed_checked_served_and_deleted() {
    let (hub, endpoint) = start_hub().await;
    let dir: PathBuf = scratch("pulled");
    std::fs::create_dir_all(&dir).unwrap();
    let (_p, base) = server_env(
        &format!(
            "[models]\ndirs = [\"{}\"]\non_demand = true\nslots = 1\nctx = 512\n",
            dir.display()
        ),
        &[("HF_ENDPOINT", endpoint.as_str())],
    )
    .await;

    // cut off half way: an error line saying to pull again, the bytes so far kept aside
    hub.cut_next.store(true, Ordering::SeqCst);
    let lines = pull(&base, "hf.co/test/smol-GGUF:Q4_1").await;
    let last = lines.last().unwrap();
    assert!(
        last["error"]
            .as_str()
            .unwrap()
            .contains("pull again to resume"),
        "{lines:?}"
    );
    assert_eq!(names_in(&dir), vec![".smol-Q4_1.gguf.partial"]);
    let kept = std::fs::metadata(dir.join(".smol-Q4_1.gguf.partial"))
        .unwrap()
        .len();
    assert!(kept > 0 && kept < hub.file.len() as u64, "{kept}");
    assert!(!tags(&base).await.contains(&"smol-Q4_1".to_string()));

    // again: resumed from there, its digest checked, put in place
    let lines = pull(&base, "hf.co/test/smol-GGUF:Q4_1").await;
    assert_eq!(lines.last().unwrap()["status"], "success", "{lines:?}");
    assert_eq!(lines.last().unwrap()["model"], "smol-Q4_1", "{lines:?}");
    assert_eq!(*hub.ranges.lock().unwrap(), vec![format!("bytes={kept}-")]);
    let statuses: Vec<&str> = lines.iter().filter_map(|l| l["status"].as_str()).collect();
    assert_eq!(statuses[0], "pulling manifest");
    assert!(
        statuses.contains(&"verifying sha256 digest"),
        "{statuses:?}"
    );
    let bytes = lines
        .iter()
        .find(|l| l["completed"].is_u64())
        .expect("a progress line");
    assert_eq!(bytes["digest"], format!("sha256:{}", hub.sha256));
    assert_eq!(bytes["total"], hub.file.len() as u64);
    // its hub name kept beside it (its recipe), so that the name it was pulled as serves it
    assert_eq!(
        names_in(&dir),
        vec!["smol-Q4_1.gguf", "smol-Q4_1.recipe.json"]
    );
    let on_disk = std::fs::read(dir.join("smol-Q4_1.gguf")).unwrap();
    assert_eq!(format!("{:x}", Sha256::digest(&on_disk)), hub.sha256);

    // listed and served at once
    assert!(tags(&base).await.contains(&"smol-Q4_1".to_string()));
    let r: Value = reqwest::Client::new()
        .post(format!("{base}/api/chat"))
        .body(
            json!({"model": "smol-Q4_1", "stream": false, "options": {"num_predict": 4},
                "messages": [{"role": "user", "content": "Hi"}]})
            .to_string(),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["done"], true, "{r}");
    // and by the name it was pulled as, as Ollama's users run it: the same pool, not a second
    let by_hub_name: Value = reqwest::Client::new()
        .post(format!("{base}/api/chat"))
        .body(
            json!({"model": "hf.co/test/smol-GGUF:Q4_1", "stream": false,
                "options": {"num_predict": 4}, "messages": [{"role": "user", "content": "Hi"}]})
            .to_string(),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(by_hub_name["done"], true, "{by_hub_name}");
    let ps = get_json(&format!("{base}/api/ps")).await;
    let loaded: Vec<&str> = ps["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .filter(|n| !n.starts_with("SmolLM2"))
        .collect();
    assert_eq!(loaded, vec!["smol-Q4_1"], "{ps}");

    // a digest that is not the hub's: refused, nothing left
    let lines = pull(&base, "hf.co/test/wrong-GGUF:Q4_1").await;
    assert!(
        lines.last().unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("sha256 mismatch"),
        "{lines:?}"
    );
    assert_eq!(
        names_in(&dir),
        vec!["smol-Q4_1.gguf", "smol-Q4_1.recipe.json"]
    );

    // names the hub or the client got wrong
    let c = reqwest::Client::new();
    for (model, status) in [
        ("hf.co/test/missing-GGUF", 404),
        ("hf.co/test/smol-GGUF", 400), // two quantizations and neither is Q4_K_M
        ("hf.co/test/smol-GGUF:Q2_K", 400),
        ("llama3", 400),
    ] {
        let r = c
            .post(format!("{base}/api/pull"))
            .body(json!({"model": model, "stream": false}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{model}");
        let e: Value = r.json().await.unwrap();
        assert!(e["error"].is_string(), "{e}");
    }

    // copied under another name: both listed; a name taken or a source missing refused
    let copy = |source: &str, destination: &str| {
        c.post(format!("{base}/api/copy"))
            .body(json!({"source": source, "destination": destination}).to_string())
            .send()
    };
    assert_eq!(copy("smol-Q4_1", "my-smol").await.unwrap().status(), 200);
    let listed = tags(&base).await;
    assert!(
        listed.contains(&"my-smol".to_string()) && listed.contains(&"smol-Q4_1".to_string()),
        "{listed:?}"
    );
    assert_eq!(copy("smol-Q4_1", "my-smol").await.unwrap().status(), 409);
    assert_eq!(copy("nope", "other").await.unwrap().status(), 404);
    assert_eq!(copy("smol-Q4_1", "../x").await.unwrap().status(), 400);

    // deleted: unloaded, no longer listed, its file gone
    let delete = |model: &str| {
        c.delete(format!("{base}/api/delete"))
            .body(json!({ "model": model }).to_string())
            .send()
    };
    assert_eq!(delete("smol-Q4_1").await.unwrap().status(), 200);
    assert!(!tags(&base).await.contains(&"smol-Q4_1".to_string()));
    // its recipe with it; the copy keeps no hub name (that names the original)
    assert_eq!(names_in(&dir), vec!["my-smol.gguf"]);
    assert_eq!(delete("smol-Q4_1").await.unwrap().status(), 404);

    // llama-server's -hf: pulled before the server starts, then served
    let dir2 = scratch("hf-flag");
    let port = free_port();
    let p = spawn_env(
        "hf-flag",
        &[
            "--port".into(),
            port.to_string(),
            "-hf".into(),
            "test/smol-GGUF:Q4_1".into(),
            "--models-dir".into(),
            dir2.display().to_string(),
            "--slots".into(),
            "1".into(),
            "--ctx".into(),
            "512".into(),
        ],
        "",
        &[("HF_ENDPOINT", endpoint.as_str())],
    );
    let ready = eventually(Duration::from_secs(60), || async {
        reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    assert!(ready, "{}", p.log_text());
    let models = get_json(&format!("http://127.0.0.1:{port}/v1/models")).await;
    assert_eq!(models["data"][0]["id"], "smol-Q4_1", "{models}");
    assert!(dir2.join("smol-Q4_1.gguf").exists());
}

/// MOD-PULL-7: the hub is reached over https as the public one is (`HF_ENDPOINT` defaults to
/// https://huggingface.co), its certificate checked against the machine's trusted roots
/// (`SSL_CERT_FILE` honoured) and Mozilla's: a hub whose CA is trusted is pulled from; the same
/// hub without that trust is refused at the handshake, saying so, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_hub_is_pulled_from_over_https_with_its_certificate_checked() {
    let (endpoint, ca_file) = start_tls_hub().await;
    let config = |dir: &Path| {
        format!(
            "[models]\ndirs = [\"{}\"]\non_demand = true\nslots = 1\nctx = 512\n",
            dir.display()
        )
    };
    let trusting = scratch("pulled-tls");
    std::fs::create_dir_all(&trusting).unwrap();
    let ca = ca_file.to_string_lossy().to_string();
    let (_p, base) = server_env(
        &config(&trusting),
        &[
            ("HF_ENDPOINT", endpoint.as_str()),
            ("SSL_CERT_FILE", ca.as_str()),
        ],
    )
    .await;
    let lines = pull(&base, "hf.co/test/smol-GGUF:Q4_1").await;
    assert_eq!(lines.last().unwrap()["status"], "success", "{lines:?}");
    assert!(tags(&base).await.contains(&"smol-Q4_1".to_string()));

    let untrusting = scratch("pulled-tls-untrusted");
    std::fs::create_dir_all(&untrusting).unwrap();
    let (_q, base) = server_env(&config(&untrusting), &[("HF_ENDPOINT", endpoint.as_str())]).await;
    let lines = pull(&base, "hf.co/test/smol-GGUF:Q4_1").await;
    let error = lines.last().unwrap()["error"]
        .as_str()
        .unwrap_or("")
        .to_lowercase();
    assert!(error.contains("certificate"), "{lines:?}");
    assert!(
        names_in(&untrusting).is_empty(),
        "{:?}",
        names_in(&untrusting)
    );
}
