//! The SHA-256 of model files (Ollama's `digest`), computed off the async runtime once per
//! file version and remembered for a bounded number of files. One file is read at a time: a
//! burst of model listings waits for the first reading instead of each reading gigabytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// Files remembered; past it the oldest is forgotten.
const REMEMBERED: usize = 64;

/// One file version: its length and modification time.
type Version = (u64, SystemTime);

#[derive(Default)]
pub struct ModelDigests {
    known: Mutex<HashMap<PathBuf, (Version, String, SystemTime)>>,
    /// Held while a file is read.
    reading: tokio::sync::Mutex<()>,
    /// Files read so far.
    reads: std::sync::atomic::AtomicU64,
}

fn version(path: &Path) -> Option<Version> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

fn sha256_hex(path: &Path) -> Option<String> {
    use sha2::{Digest, Sha256};
    let mut file = std::fs::File::open(path).ok()?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).ok()?;
    Some(hex::encode(hasher.finalize()))
}

impl ModelDigests {
    /// The file's SHA-256 (hex), or `None` when it cannot be read.
    pub async fn of(&self, path: &Path) -> Option<String> {
        let path = path.to_path_buf();
        let (path, ver) = tokio::task::spawn_blocking(move || {
            let v = version(&path);
            (path, v)
        })
        .await
        .ok()?;
        let ver = ver?;
        if let Some(d) = self.known_digest(&path, ver) {
            return Some(d);
        }
        let _reading = self.reading.lock().await;
        // read while this one waited
        if let Some(d) = self.known_digest(&path, ver) {
            return Some(d);
        }
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let hashed = path.clone();
        let digest = tokio::task::spawn_blocking(move || sha256_hex(&hashed))
            .await
            .ok()??;
        let mut known = self.lock();
        if known.len() >= REMEMBERED && !known.contains_key(&path) {
            let oldest = known
                .iter()
                .min_by_key(|(_, (_, _, at))| *at)
                .map(|(p, _)| p.clone());
            if let Some(p) = oldest {
                known.remove(&p);
            }
        }
        known.insert(path, (ver, digest.clone(), SystemTime::now()));
        Some(digest)
    }

    /// How many times a file was read (for hashing) so far.
    pub fn files_read(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn known_digest(&self, path: &Path, ver: Version) -> Option<String> {
        match self.lock().get(path) {
            Some((v, digest, _)) if *v == ver => Some(digest.clone()),
            _ => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, (Version, String, SystemTime)>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's digest is its SHA-256, and a changed file gets its new one.
    #[tokio::test]
    async fn digest_follows_the_file() {
        let dir = std::env::temp_dir().join(format!("orchd-digest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("m.gguf");
        std::fs::write(&f, b"abc").unwrap();
        let d = ModelDigests::default();
        assert_eq!(
            d.of(&f).await.unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        std::fs::write(&f, b"abcd").unwrap();
        assert_eq!(
            d.of(&f).await.unwrap(),
            "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589"
        );
        assert_eq!(d.of(&dir.join("absent")).await, None);
        // a burst of askers (one reads, the others wait for it): every one gets the digest
        let f2 = dir.join("n.gguf");
        std::fs::write(&f2, b"abc").unwrap();
        let d = std::sync::Arc::new(ModelDigests::default());
        let askers: Vec<_> = (0..8)
            .map(|_| {
                let (d, f2) = (d.clone(), f2.clone());
                tokio::spawn(async move { d.of(&f2).await })
            })
            .collect();
        for a in askers {
            assert_eq!(
                a.await.unwrap().unwrap(),
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
            );
        }
        assert_eq!(d.files_read(), 1, "the others waited for the one reading");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
