//! A headless Chromium (Debian's `chromium-headless-shell`, installed by `ci/install-debs.sh`)
//! and one page, driven over the DevTools protocol (a WebSocket): navigate, run scripts, and
//! read what the page logged.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

/// The browser binary: `$CHROMIUM`, else the first of Debian's names on `PATH`.
pub fn chromium() -> String {
    if let Ok(p) = std::env::var("CHROMIUM") {
        return p;
    }
    for name in ["chromium-headless-shell", "chromium", "chromium-browser"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
            .unwrap_or(false);
        if found {
            return name.to_string();
        }
    }
    panic!("no Chromium found: run ci/install-debs.sh (Debian's chromium-headless-shell) or set CHROMIUM")
}

/// A headless browser and one page, driven over the DevTools protocol.
pub struct Browser {
    child: tokio::process::Child,
    page: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>,
    next_id: u64,
    _profile: tempdir::Dir,
    /// The page's events so far (DevTools messages with a `method`).
    pub events: Vec<Value>,
}

mod tempdir {
    /// A directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("{tag}-{}", uuid_like()));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn uuid_like() -> String {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        format!("{}-{t}", std::process::id())
    }
}

impl Browser {
    pub async fn launch() -> Browser {
        use tokio::io::AsyncBufReadExt;
        let profile = tempdir::Dir::new("orchd-chromium");
        let mut child = tokio::process::Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                &format!("--user-data-dir={}", profile.0.display()),
                "about:blank",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            // its own process group: the renderers and helpers it starts go with it on drop
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("start chromium");
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let ws = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.split("DevTools listening on ").nth(1) {
                    return url.trim().to_string();
                }
            }
            panic!("chromium exited without a DevTools address");
        })
        .await
        .expect("chromium started");
        // keep draining its log so it never blocks on a full pipe
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let port = ws
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let targets: Value = reqwest::get(format!("http://{port}/json/list"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let page_ws = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_string();
        let (page, _) = tokio_tungstenite::connect_async(page_ws).await.unwrap();
        Browser {
            child,
            page,
            next_id: 0,
            _profile: profile,
            events: Vec::new(),
        }
    }

    /// Sends a DevTools command and waits for its answer.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.page.send(Message::Text(msg.into())).await.unwrap();
        loop {
            let frame = self
                .page
                .next()
                .await
                .expect("devtools socket open")
                .unwrap();
            let Message::Text(text) = frame else { continue };
            let v: Value = serde_json::from_str(&text).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
            if v.get("method").is_some() && self.events.len() < 10_000 {
                self.events.push(v);
            }
        }
    }

    pub async fn goto(&mut self, url: &str) {
        self.call("Page.enable", json!({})).await;
        self.call("Runtime.enable", json!({})).await;
        self.call("Log.enable", json!({})).await;
        self.call("Page.navigate", json!({"url": url})).await;
        // the page is ours once its document answers
        for _ in 0..100 {
            let r = self
                .call(
                    "Runtime.evaluate",
                    json!({"expression": "document.readyState", "returnByValue": true}),
                )
                .await;
            if r["result"]["value"] == "complete" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("page {url} did not load");
    }

    /// Runs `script` (an expression whose value is a promise) and returns what it resolves to.
    pub async fn eval(&mut self, script: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": script, "awaitPromise": true, "returnByValue": true}),
            )
            .await;
        assert!(r.get("exceptionDetails").is_none(), "script failed: {r}");
        r["result"]["value"].clone()
    }
}

impl Browser {
    /// What the page reported as errors: uncaught exceptions, `console.error`, and the
    /// browser's own error log entries (a failed load, a refused script).
    pub fn errors(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| match e["method"].as_str()? {
                "Runtime.exceptionThrown" => Some(e["params"]["exceptionDetails"].to_string()),
                "Runtime.consoleAPICalled" if e["params"]["type"] == "error" => {
                    Some(e["params"]["args"].to_string())
                }
                // an API answering 401/403/429 is logged by the browser as a failed load: the
                // page expects those (a refusal is something it shows), not an error of its own
                "Log.entryAdded"
                    if e["params"]["entry"]["level"] == "error"
                        && !(e["params"]["entry"]["source"] == "network"
                            && e["params"]["entry"]["text"]
                                .as_str()
                                .is_some_and(|t| t.contains("status of 4"))) =>
                {
                    Some(e["params"]["entry"].to_string())
                }
                _ => None,
            })
            .collect()
    }

    /// A PNG of the page as it is now, base64-encoded (as DevTools sends it).
    pub async fn screenshot_base64(&mut self) -> String {
        let r = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        r["data"].as_str().expect("screenshot data").to_string()
    }
}

impl Drop for Browser {
    /// The whole process group: killing the browser alone left its renderer, GPU and network
    /// helpers running after the tests.
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(std::process::Stdio::null())
                .status();
        }
        let _ = self.child.start_kill();
    }
}
