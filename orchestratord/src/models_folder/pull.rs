//! Pulling a GGUF from a Hugging Face–style hub into the first model folder (Ollama's
//! `/api/pull hf.co/OWNER/REPO[:QUANT]`, llama-server's `-hf OWNER/REPO[:QUANT]`), as the
//! hub's own API lays it out: `GET {endpoint}/api/models/OWNER/REPO?blobs=true` lists the files
//! (`siblings[].rfilename`, with `size` and `lfs.sha256` where the hub gives them), `GET
//! {endpoint}/OWNER/REPO/resolve/main/FILE` downloads one. The endpoint is `HF_ENDPOINT`, by
//! default the public hub.
//!
//! A download goes to a hidden `.FILE.partial` beside its place and is resumed from there with
//! `Range` (the bytes already there hashed first); the SHA-256 is checked where the hub gives
//! it (a mismatch removes the partial file: nothing is left behind); then the file is renamed
//! into place, so the folder never lists half a model. The folder's disk budget
//! (`models.disk_budget_mib`) bounds what it holds with the new file.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// The public hub, when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// How often a download says how far it got, at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);
/// The largest file listing read from a hub.
const MAX_LISTING_BYTES: usize = 4 << 20;
/// A quantization picked when a repository has several and the name says none (Ollama's).
const PREFERRED_QUANT: &str = "Q4_K_M";

/// A model on a hub: `hf.co/OWNER/REPO[:QUANT]` (also `huggingface.co/…`, or `OWNER/REPO` as
/// llama-server's `-hf` takes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRef {
    pub owner: String,
    pub repo: String,
    pub quant: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0}")]
    BadName(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Choice(String),
    #[error("{0}")]
    Hub(String),
    #[error("sha256 mismatch: the hub says {expected}, the download is {got}; nothing was kept")]
    Digest { expected: String, got: String },
    #[error("{0}")]
    Budget(String),
    #[error("{0}")]
    Io(String),
}

impl PullError {
    /// The API error of this failure: the client's name or choice (400, 404), the folder's
    /// budget (409), the hub (502), this machine's disk (500).
    pub fn into_api(self) -> crate::error::ApiError {
        use crate::error::ApiError;
        use contracts::ErrorCode;
        let message = self.to_string();
        match self {
            Self::BadName(_) | Self::Choice(_) => ApiError::invalid("model", message),
            Self::NotFound(_) => {
                ApiError::new(ErrorCode::NotFound, message, false).with_field("model")
            }
            Self::Budget(_) => ApiError::conflict(message),
            Self::Hub(_) | Self::Digest { .. } => {
                ApiError::new(ErrorCode::HubUnavailable, message, true)
            }
            Self::Io(_) => ApiError::internal(message),
        }
    }
}

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

impl HubRef {
    /// Its name as Ollama lists a pulled model: `hf.co/OWNER/REPO[:QUANT]`.
    pub fn name(&self) -> String {
        match &self.quant {
            Some(q) => format!("hf.co/{}/{}:{q}", self.owner, self.repo),
            None => format!("hf.co/{}/{}", self.owner, self.repo),
        }
    }

    /// Remembers that the model file at `path` was pulled as this name (its recipe's
    /// `pulled_as`): requests may name it so.
    pub fn remember(&self, path: &Path) -> Result<(), PullError> {
        let mut r = match super::recipe::read(path) {
            Some(Ok(r)) => r,
            _ => super::recipe::Recipe::default(),
        };
        r.pulled_as = Some(self.name());
        super::recipe::write(path, &r).map_err(|e| {
            PullError::Io(format!(
                "cannot write the recipe of {}: {e}",
                path.display()
            ))
        })
    }

    /// Parses `hf.co/OWNER/REPO[:QUANT]`; with `bare`, `OWNER/REPO[:QUANT]` too.
    pub fn parse(name: &str, bare: bool) -> Result<Self, PullError> {
        let rest = name
            .strip_prefix("hf.co/")
            .or_else(|| name.strip_prefix("huggingface.co/"))
            .or_else(|| name.strip_prefix("https://huggingface.co/"))
            .or(bare.then_some(name))
            .ok_or_else(|| {
                PullError::BadName(format!(
                    "{name:?}: models are pulled from a Hugging Face hub, named hf.co/OWNER/REPO[:QUANT]"
                ))
            })?;
        let (path, quant) = match rest.rsplit_once(':') {
            Some((p, q)) => (p, Some(q.to_string())),
            None => (rest, None),
        };
        let Some((owner, repo)) = path.split_once('/') else {
            return Err(PullError::BadName(format!(
                "{name:?}: a hub model is OWNER/REPO[:QUANT]"
            )));
        };
        if !name_ok(owner) || !name_ok(repo) || quant.as_deref().is_some_and(|q| !name_ok(q)) {
            return Err(PullError::BadName(format!(
                "{name:?}: OWNER, REPO and QUANT are letters, digits, '-', '_' and '.'"
            )));
        }
        Ok(Self {
            owner: owner.into(),
            repo: repo.into(),
            quant,
        })
    }
}

/// Ollama's status line for the bytes of `digest`: `pulling sha256:0123456789a` (its first 19
/// characters).
pub fn pulling(digest: &str) -> String {
    format!("pulling {}", digest.chars().take(19).collect::<String>())
}

/// What a pull is doing, in the steps Ollama reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    Status(String),
    /// `completed` of `total` bytes of the file with this digest (`sha256:…`, or the file's
    /// name where the hub gives no digest).
    Bytes {
        digest: String,
        total: u64,
        completed: u64,
    },
}

/// A hub file chosen for a pull.
#[derive(Debug, Clone)]
struct HubFile {
    path: String,
    size: Option<u64>,
    sha256: Option<String>,
}

/// An HTTP client's error with what caused it (reqwest's own text says only "error sending
/// request"; the cause says which: refused, a certificate not trusted, a timeout).
fn with_causes(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.contains(&c_text) {
            text.push_str(": ");
            text.push_str(&c_text);
        }
        cause = c.source();
    }
    text
}

pub struct Puller {
    endpoint: String,
    client: reqwest::Client,
    dir: PathBuf,
    /// The most the folder's GGUFs may take together with the new one (None: no bound).
    budget: Option<u64>,
}

impl Puller {
    /// Pulls into `dir` from `HF_ENDPOINT` (or the public hub).
    pub fn new(dir: PathBuf, budget: Option<u64>) -> Result<Self, PullError> {
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| PullError::Hub(format!("cannot make an HTTP client: {e}")))?;
        Ok(Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            client,
            dir,
            budget,
        })
    }

    /// Pulls `r` (the hub's file already there is kept as it is): the file's place in the
    /// folder. Its caller says `success`.
    pub async fn pull(
        &self,
        r: &HubRef,
        progress: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<PathBuf, PullError> {
        progress(Progress::Status("pulling manifest".into()));
        let file = self.choose(r).await?;
        let local = file
            .path
            .rsplit('/')
            .next()
            .unwrap_or(&file.path)
            .to_string();
        if !name_ok(&local) || !local.to_ascii_lowercase().ends_with(".gguf") {
            return Err(PullError::Hub(format!(
                "the hub's file name {:?} cannot be a model file name here",
                file.path
            )));
        }
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|e| PullError::Io(format!("cannot make {}: {e}", self.dir.display())))?;
        let target = self.dir.join(&local);
        if self.already_there(&target, &file, progress).await? {
            r.remember(&target)?;
            return Ok(target);
        }
        let partial = self.dir.join(format!(".{local}.partial"));
        if let Some(size) = file.size {
            self.check_budget(&[&target, &partial], size)?;
        }
        let got = self.download(r, &file, &partial, progress).await?;
        if let Some(expected) = &file.sha256 {
            progress(Progress::Status("verifying sha256 digest".into()));
            if !got.eq_ignore_ascii_case(expected) {
                let _ = tokio::fs::remove_file(&partial).await;
                return Err(PullError::Digest {
                    expected: expected.clone(),
                    got,
                });
            }
        }
        progress(Progress::Status("writing manifest".into()));
        tokio::fs::rename(&partial, &target)
            .await
            .map_err(|e| PullError::Io(format!("cannot put {} in place: {e}", target.display())))?;
        r.remember(&target)?;
        Ok(target)
    }

    /// Whether `target` is the hub's file already: its size, and its digest where the hub
    /// gives one.
    async fn already_there(
        &self,
        target: &Path,
        file: &HubFile,
        progress: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<bool, PullError> {
        let Ok(meta) = tokio::fs::metadata(target).await else {
            return Ok(false);
        };
        if file.size.is_some_and(|s| s != meta.len()) {
            return Ok(false);
        }
        let Some(expected) = &file.sha256 else {
            return Ok(file.size.is_some());
        };
        progress(Progress::Status("verifying sha256 digest".into()));
        let path = target.to_path_buf();
        let got = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            let mut f = std::fs::File::open(path)?;
            let mut h = Sha256::new();
            std::io::copy(&mut f, &mut h)?;
            Ok(format!("{:x}", h.finalize()))
        })
        .await
        .map_err(|e| PullError::Io(e.to_string()))?
        .map_err(|e| PullError::Io(format!("{}: {e}", target.display())))?;
        Ok(got.eq_ignore_ascii_case(expected))
    }

    /// The repository's GGUF the name means: its quantization's, the only one, or Q4_K_M.
    async fn choose(&self, r: &HubRef) -> Result<HubFile, PullError> {
        let url = format!(
            "{}/api/models/{}/{}?blobs=true",
            self.endpoint, r.owner, r.repo
        );
        let resp = self.client.get(&url).send().await.map_err(|e| {
            PullError::Hub(format!(
                "cannot reach the hub at {}: {}",
                self.endpoint,
                with_causes(&e)
            ))
        })?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND
            || resp.status() == reqwest::StatusCode::UNAUTHORIZED
        {
            return Err(PullError::NotFound(format!(
                "{}/{} is not on the hub at {}",
                r.owner, r.repo, self.endpoint
            )));
        }
        if !resp.status().is_success() {
            return Err(PullError::Hub(format!(
                "the hub answered {} for {}/{}",
                resp.status(),
                r.owner,
                r.repo
            )));
        }
        let body = read_bounded(resp, MAX_LISTING_BYTES).await?;
        let listing: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| PullError::Hub(format!("the hub's file listing is not JSON: {e}")))?;
        let ggufs: Vec<HubFile> = listing["siblings"]
            .as_array()
            .map(|s| s.as_slice())
            .unwrap_or_default()
            .iter()
            .filter_map(|f| {
                let path = f["rfilename"].as_str()?;
                path.to_ascii_lowercase()
                    .ends_with(".gguf")
                    .then(|| HubFile {
                        path: path.to_string(),
                        size: f["lfs"]["size"].as_u64().or(f["size"].as_u64()),
                        sha256: f["lfs"]["sha256"].as_str().map(str::to_string),
                    })
            })
            .collect();
        let names = || {
            ggufs
                .iter()
                .map(|f| f.path.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let matching = |q: &str| -> Vec<HubFile> {
            let q = q.to_ascii_lowercase();
            ggufs
                .iter()
                .filter(|f| {
                    let stem = f.path.to_ascii_lowercase();
                    let stem = stem.trim_end_matches(".gguf");
                    stem.ends_with(&format!("-{q}"))
                        || stem.ends_with(&format!(".{q}"))
                        || stem.ends_with(&format!("_{q}"))
                        || stem == q
                })
                .cloned()
                .collect()
        };
        if ggufs.is_empty() {
            return Err(PullError::NotFound(format!(
                "{}/{} has no GGUF file",
                r.owner, r.repo
            )));
        }
        let chosen = match &r.quant {
            Some(q) => matching(q),
            None if ggufs.len() == 1 => ggufs.clone(),
            None => matching(PREFERRED_QUANT),
        };
        match chosen.as_slice() {
            [one] => Ok(one.clone()),
            [] => Err(PullError::Choice(format!(
                "{}/{}{}: name one of its files' quantizations after ':' ({})",
                r.owner,
                r.repo,
                r.quant
                    .as_deref()
                    .map(|q| format!(" has no {q} file"))
                    .unwrap_or_default(),
                names()
            ))),
            _ => Err(PullError::Choice(format!(
                "{}/{}: several files match; the files are {}",
                r.owner,
                r.repo,
                names()
            ))),
        }
    }

    /// The folder's GGUFs and partial downloads, but this file's own (`mine`: its place and its
    /// partial, which `size` counts), and the new file must fit the disk budget.
    fn check_budget(&self, mine: &[&Path], size: u64) -> Result<(), PullError> {
        let Some(budget) = self.budget else {
            return Ok(());
        };
        let held = folder_bytes(&self.dir, mine);
        if held + size > budget {
            return Err(PullError::Budget(format!(
                "the model folder holds {} MiB; with this file's {} MiB it would pass its budget of {} MiB (models.disk_budget_mib): delete a model first",
                held >> 20,
                size >> 20,
                budget >> 20
            )));
        }
        Ok(())
    }

    /// Downloads the file into `partial` (resuming what is there): its SHA-256 in hex.
    async fn download(
        &self,
        r: &HubRef,
        file: &HubFile,
        partial: &Path,
        progress: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<String, PullError> {
        let io = |e: std::io::Error| PullError::Io(format!("{}: {e}", partial.display()));
        let mut have = tokio::fs::metadata(partial).await.map_or(0, |m| m.len());
        if file.size.is_some_and(|s| have > s) {
            have = 0;
        }
        let url = format!(
            "{}/{}/{}/resolve/main/{}",
            self.endpoint, r.owner, r.repo, file.path
        );
        let mut req = self.client.get(&url);
        if have > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let resp = req.send().await.map_err(|e| {
            PullError::Hub(format!(
                "cannot download {}: {}",
                file.path,
                with_causes(&e)
            ))
        })?;
        let resumed = resp.status() == reqwest::StatusCode::PARTIAL_CONTENT;
        if !resp.status().is_success() {
            return Err(PullError::Hub(format!(
                "the hub answered {} for {}",
                resp.status(),
                file.path
            )));
        }
        if !resumed {
            have = 0;
        }
        let total = file
            .size
            .or_else(|| resp.content_length().map(|n| n + have))
            .unwrap_or(0);
        if file.size.is_none() {
            // the hub gave no size: the answer's length is the first word of it
            self.check_budget(&[partial], total)?;
        }
        let mut hasher = Sha256::new();
        let mut out = if have > 0 {
            // the bytes already here count in the digest
            let mut f = tokio::fs::File::open(partial).await.map_err(io)?;
            let mut buf = vec![0u8; 1 << 20];
            let mut left = have;
            while left > 0 {
                let n = tokio::io::AsyncReadExt::read(&mut f, &mut buf)
                    .await
                    .map_err(io)?;
                if n == 0 {
                    break;
                }
                let n = n.min(left as usize);
                hasher.update(&buf[..n]);
                left -= n as u64;
            }
            tokio::fs::OpenOptions::new()
                .append(true)
                .open(partial)
                .await
                .map_err(io)?
        } else {
            tokio::fs::File::create(partial).await.map_err(io)?
        };
        let digest = file
            .sha256
            .as_ref()
            .map(|s| format!("sha256:{s}"))
            .unwrap_or_else(|| file.path.clone());
        progress(Progress::Status(pulling(&digest)));
        let mut done = have;
        let mut said = Instant::now();
        progress(Progress::Bytes {
            digest: digest.clone(),
            total,
            completed: done,
        });
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                PullError::Hub(format!(
                    "the download of {} broke off after {done} bytes ({e}); pull again to resume",
                    file.path
                ))
            })?;
            if total > 0 && done + chunk.len() as u64 > total {
                return Err(PullError::Hub(format!(
                    "{} is longer than the {total} bytes the hub said",
                    file.path
                )));
            }
            out.write_all(&chunk).await.map_err(io)?;
            hasher.update(&chunk);
            done += chunk.len() as u64;
            if said.elapsed() >= PROGRESS_EVERY {
                said = Instant::now();
                progress(Progress::Bytes {
                    digest: digest.clone(),
                    total,
                    completed: done,
                });
            }
        }
        out.flush().await.map_err(io)?;
        out.sync_all().await.map_err(io)?;
        if total > 0 && done < total {
            return Err(PullError::Hub(format!(
                "the download of {} ended after {done} of {total} bytes; pull again to resume",
                file.path
            )));
        }
        progress(Progress::Bytes {
            digest,
            total: done,
            completed: done,
        });
        Ok(format!("{:x}", hasher.finalize()))
    }
}

/// Bytes of the GGUFs (and partial downloads) in `dir`, but the files `except`.
fn folder_bytes(dir: &Path, except: &[&Path]) -> u64 {
    let Ok(files) = std::fs::read_dir(dir) else {
        return 0;
    };
    files
        .filter_map(|f| f.ok())
        .filter(|f| !except.contains(&f.path().as_path()))
        .filter(|f| {
            let n = f.file_name().to_string_lossy().to_ascii_lowercase();
            n.ends_with(".gguf") || n.ends_with(".partial")
        })
        .filter_map(|f| f.metadata().ok().map(|m| m.len()))
        .sum()
}

async fn read_bounded(resp: reqwest::Response, max: usize) -> Result<Vec<u8>, PullError> {
    let mut out = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|e| PullError::Hub(format!("the hub's answer broke off: {e}")))?;
        if out.len() + chunk.len() > max {
            return Err(PullError::Hub(format!(
                "the hub's file listing is larger than {max} bytes"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MOD-PULL-1: hub names as Ollama and llama-server users write them.
    #[test]
    fn hub_names_parse() {
        let r = HubRef::parse("hf.co/ggml-org/gemma-3-270m-GGUF:Q4_K_M", false).unwrap();
        assert_eq!(
            (r.owner.as_str(), r.repo.as_str(), r.quant.as_deref()),
            ("ggml-org", "gemma-3-270m-GGUF", Some("Q4_K_M"))
        );
        assert!(HubRef::parse("huggingface.co/a/b", false)
            .unwrap()
            .quant
            .is_none());
        assert!(HubRef::parse("a/b:Q8_0", true).is_ok());
        for bad in [
            "a/b",
            "hf.co/a",
            "hf.co/../b",
            "hf.co/a/b:../../x",
            "hf.co/a/b c",
        ] {
            assert!(HubRef::parse(bad, false).is_err(), "{bad}");
        }
    }

    /// MOD-PULL-3: the folder's other models and partial downloads count against the disk
    /// budget with the new file; the file's own partial (a pull being resumed) is in its size,
    /// not counted twice.
    #[test]
    fn the_disk_budget_counts_the_folder_and_the_new_file_once() {
        let dir = std::env::temp_dir().join(format!("orchd-budget-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("other.gguf"), vec![0u8; 1 << 20]).unwrap();
        std::fs::write(dir.join(".x.gguf.partial"), vec![0u8; 2 << 20]).unwrap();
        std::fs::write(dir.join("notes.txt"), vec![0u8; 8 << 20]).unwrap();
        let (target, partial) = (dir.join("x.gguf"), dir.join(".x.gguf.partial"));
        let puller = Puller::new(dir.clone(), Some(7 << 19)).unwrap(); // 3.5 MiB
                                                                       // 1 MiB held + 2.5 MiB of x (its 2 MiB partial inside it): fits
        assert!(puller.check_budget(&[&target, &partial], 5 << 19).is_ok());
        // 1 MiB + 3 MiB: does not, and says the sizes
        let e = puller
            .check_budget(&[&target, &partial], 3 << 20)
            .unwrap_err();
        assert!(e.to_string().contains("holds 1 MiB"), "{e}");
        // another file's pull counts x's partial
        let y = dir.join("y.gguf");
        assert!(puller.check_budget(&[&y], 1 << 20).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_status_line_takes_19_characters_of_any_name() {
        assert_eq!(
            pulling("sha256:0123456789abcdef"),
            "pulling sha256:0123456789ab"
        );
        // byte 19 falls inside a character here
        let long = "ab模型一二三四五六七八九十.gguf";
        assert_eq!(pulling(long).chars().count(), 8 + 19);
    }
}
