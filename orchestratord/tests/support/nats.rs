//! A real NATS JetStream cluster on loopback for the cluster tests: `nodes` `nats-server`
//! processes (release 2.15.1, installed by `ci/install-nats.sh` into `.cache/bin`, or the one
//! `ORCHD_NATS_SERVER` names), routed to each other, each with its own store; killed when
//! dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::procs::{free_port, scratch};

pub struct NatsCluster {
    nodes: Vec<Option<Child>>,
    /// One cluster at a time in a test binary: the tests' leader elections and kills do not
    /// compete for the cores, and their ports cannot meet.
    _serial: Option<tokio::sync::MutexGuard<'static, ()>>,
    pub client_ports: Vec<u16>,
    /// The nodes' monitoring ports (`/healthz`).
    pub http_ports: Vec<u16>,
    pub dir: PathBuf,
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for n in self.nodes.iter_mut().flatten() {
            let _ = n.kill();
            let _ = n.wait();
        }
    }
}

fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("ORCHD_NATS_SERVER") {
        return p.into();
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/bin/nats-server");
    assert!(
        p.exists(),
        "nats-server missing at {}: run ci/install-nats.sh first",
        p.display()
    );
    p
}

impl NatsCluster {
    /// Starts the nodes and waits until the cluster has elected its JetStream meta leader.
    /// The ports are free when picked, but another test's process may take one before a node
    /// binds it: a node that exits for a port in use starts the cluster again on new ports.
    pub async fn start(nodes: usize) -> Self {
        static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let mut serial = Some(SERIAL.lock().await);
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let mut c = Self::spawn(nodes, serial.take());
            match c.wait_for_jetstream().await {
                Ok(()) => return c,
                Err(why) if attempt < ATTEMPTS && why.contains("address already in use") => {
                    eprintln!("nats cluster, attempt {attempt}: a port was taken; again");
                    serial = c._serial.take();
                }
                Err(why) => panic!("{why}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    fn spawn(nodes: usize, serial: Option<tokio::sync::MutexGuard<'static, ()>>) -> Self {
        let dir = scratch("nats");
        let client_ports: Vec<u16> = (0..nodes).map(|_| free_port()).collect();
        let http_ports: Vec<u16> = (0..nodes).map(|_| free_port()).collect();
        let route_ports: Vec<u16> = (0..nodes).map(|_| free_port()).collect();
        let routes: Vec<String> = route_ports
            .iter()
            .map(|p| format!("\"nats-route://127.0.0.1:{p}\""))
            .collect();
        let mut children = Vec::new();
        for i in 0..nodes {
            let store = dir.join(format!("store{i}"));
            let conf = dir.join(format!("n{i}.conf"));
            let cluster = match nodes {
                1 => String::new(),
                _ => format!(
                    "cluster {{\n  name: orchd\n  listen: 127.0.0.1:{}\n  routes: [{}]\n}}\n",
                    route_ports[i],
                    routes.join(", ")
                ),
            };
            std::fs::write(
                &conf,
                format!(
                    "server_name: n{i}\nlisten: 127.0.0.1:{}\nhttp: 127.0.0.1:{}\njetstream {{\n  store_dir: \"{}\"\n  max_memory_store: 64MB\n  max_file_store: 4GB\n}}\n{cluster}",
                    client_ports[i],
                    http_ports[i],
                    store.display()
                ),
            )
            .unwrap();
            let log = std::fs::File::create(dir.join(format!("n{i}.log"))).unwrap();
            let child = Command::new(binary())
                .arg("-c")
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("spawn nats-server");
            children.push(Some(child));
        }
        Self {
            nodes: children,
            _serial: serial,
            client_ports,
            http_ports,
            dir,
        }
    }

    /// Every node's client URL, comma-separated (what `ORCHD_CLUSTER_NATS` takes).
    pub fn urls(&self) -> String {
        self.client_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The running nodes' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().flatten().map(Child::id).collect()
    }

    /// `kill -9` of node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut n) = self.nodes[i].take() {
            let _ = n.kill();
            let _ = n.wait();
        }
    }

    /// Sends `sig` (`-STOP`, `-CONT`) to node `i`.
    pub fn signal(&self, i: usize, sig: &str) {
        if let Some(n) = &self.nodes[i] {
            let _ = std::process::Command::new("kill")
                .arg(sig)
                .arg(n.id().to_string())
                .status();
        }
    }

    /// A node's log, for failure messages.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("n{i}.log"))).unwrap_or_default()
    }

    /// Waits for every node's JetStream; `Err`: the nodes' logs' ends, when one did not come
    /// up in a minute or exited.
    async fn wait_for_jetstream(&mut self) -> Result<(), String> {
        // `/healthz` answers 200 once the node's JetStream is up and, in a cluster, its meta
        // leader elected
        for i in 0..self.http_ports.len() {
            let url = format!("http://127.0.0.1:{}/healthz", self.http_ports[i]);
            let mut up = false;
            let mut exited = false;
            for _ in 0..600 {
                if self
                    .nodes
                    .iter_mut()
                    .flatten()
                    .any(|n| matches!(n.try_wait(), Ok(Some(_))))
                {
                    exited = true;
                    break;
                }
                if let Ok(r) = reqwest::get(&url).await {
                    if r.status().is_success() {
                        up = true;
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if !up {
                let tails: Vec<String> = (0..self.nodes.len())
                    .map(|n| {
                        let log = self.log(n);
                        let lines: Vec<&str> = log.lines().collect();
                        format!(
                            "node {n}:\n{}",
                            lines[lines.len().saturating_sub(15)..].join("\n")
                        )
                    })
                    .collect();
                let what = if exited { "a node exited" } else { "no answer" };
                return Err(format!(
                    "JetStream did not come up on node {i} ({what}):\n{}",
                    tails.join("\n")
                ));
            }
        }
        Ok(())
    }
}
