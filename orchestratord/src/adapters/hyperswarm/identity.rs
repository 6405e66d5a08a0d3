//! The host's Hyperswarm identity: the 32-byte topic peers look up (its base58 is the Server
//! ID) and the seed of the Noise key pair, kept in a file so both survive restarts.

use std::path::Path;

use rand::RngCore;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Hex of the 32-byte topic.
    pub topic: String,
    /// Hex of the 32-byte key-pair seed (secret).
    pub seed: String,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("identity file {path}: {message}")]
    File { path: String, message: String },
}

fn random_hex() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

fn valid(h: &str) -> bool {
    hex::decode(h).is_ok_and(|b| b.len() == 32)
}

impl Identity {
    /// Reads the identity at `path`, or creates it (owner-only permissions) when absent.
    pub fn load_or_create(path: &Path) -> Result<Self, IdentityError> {
        let err = |message: String| IdentityError::File {
            path: path.display().to_string(),
            message,
        };
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let id: Identity = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
                if !valid(&id.topic) || !valid(&id.seed) {
                    return Err(err("topic and seed must be 64 hex characters".into()));
                }
                Ok(id)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let id = Identity {
                    topic: random_hex(),
                    seed: random_hex(),
                };
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
                }
                let text = serde_json::to_string_pretty(&id).map_err(|e| err(e.to_string()))?;
                write_private(path, text.as_bytes()).map_err(|e| err(e.to_string()))?;
                Ok(id)
            }
            Err(e) => Err(err(e.to_string())),
        }
    }

    /// The Server ID peers type: base58 (Bitcoin alphabet) of the topic bytes.
    pub fn server_id(&self) -> String {
        bs58::encode(hex::decode(&self.topic).unwrap_or_default()).into_string()
    }
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HS-ID-1: created once, then the same Server ID on every load.
    #[test]
    fn identity_is_created_once_and_stable() {
        let dir = std::env::temp_dir().join(format!("orchd-id-{}", std::process::id()));
        let path = dir.join("nested/identity.json");
        let a = Identity::load_or_create(&path).unwrap();
        let b = Identity::load_or_create(&path).unwrap();
        assert_eq!(a, b);
        let id = a.server_id();
        assert!((43..=44).contains(&id.len()), "{id}");
        assert_eq!(
            bs58::decode(&id).into_vec().unwrap(),
            hex::decode(&a.topic).unwrap()
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(&path, "{\"topic\":\"zz\",\"seed\":\"00\"}").unwrap();
        assert!(Identity::load_or_create(&path).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
