//! Which files a client may have the server load as a model (`POST /engines`, pool reloads):
//! regular files that start with the GGUF magic, inside the configured model directories (the
//! model cache, the directories of the configured pools' models, and `models.dirs`).
//!
//! A path is refused before anything is opened when it has a `..` component or lies outside
//! the directories as written; then its canonical form (symlinks resolved) must still lie
//! inside one, and it must be a regular file (no FIFO, device or directory) before it is
//! opened to read the magic. A path outside the directories as written is told which
//! directories are allowed and the config key that adds one (FC-PATH-1: the caller is an
//! admin, and a typo of a folder is the usual cause); every other refusal says only "not an
//! allowed model path" or "not a GGUF model": whether a file exists outside the directories,
//! or why it could not be read, is never told.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Why a model path was refused. The messages are the whole story a client gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelPathError {
    /// Outside every model directory as written (nothing was looked at).
    #[error("not in a model folder: the allowed folders are {allowed}; models.dirs in the config adds one")]
    Outside { allowed: String },
    #[error("not an allowed model path")]
    NotAllowed,
    #[error("not a GGUF model")]
    NotGguf,
}

/// The directories models may come from, as configured and canonicalized.
#[derive(Debug, Clone, Default)]
pub struct ModelDirs {
    /// (as configured, made absolute; canonical)
    dirs: Vec<(PathBuf, PathBuf)>,
}

fn absolute(p: &Path) -> Option<PathBuf> {
    if p.is_absolute() {
        Some(p.to_path_buf())
    } else {
        std::env::current_dir().ok().map(|d| d.join(p))
    }
}

impl ModelDirs {
    /// Directories that do not exist are left out.
    pub fn new<P: AsRef<Path>>(dirs: impl IntoIterator<Item = P>) -> Self {
        let mut out: Vec<(PathBuf, PathBuf)> = Vec::new();
        for d in dirs {
            let d = d.as_ref();
            if d.as_os_str().is_empty() {
                continue;
            }
            let (Some(abs), Ok(canon)) = (absolute(d), std::fs::canonicalize(d)) else {
                continue;
            };
            if canon.is_dir() && !out.iter().any(|(a, c)| *a == abs && *c == canon) {
                out.push((abs, canon));
            }
        }
        Self { dirs: out }
    }

    /// The canonical directories (for the docs and logs).
    pub fn canonical(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|(_, c)| c.as_path())
    }

    /// Whether `path`, its links resolved, lies inside one of the directories (nothing else
    /// is checked: a listing's filter, before `check` on use).
    pub fn contains(&self, path: &Path) -> bool {
        std::fs::canonicalize(path).is_ok_and(|c| self.dirs.iter().any(|(_, d)| c.starts_with(d)))
    }

    /// The canonical path of an allowed GGUF model at `requested`.
    pub fn check(&self, requested: &str) -> Result<PathBuf, ModelPathError> {
        use ModelPathError::*;
        let p = Path::new(requested);
        if requested.is_empty()
            || requested.contains('\0')
            || p.components().any(|c| matches!(c, Component::ParentDir))
        {
            return Err(NotAllowed);
        }
        let abs = absolute(p).ok_or(NotAllowed)?;
        // lexically inside a directory, as written or in its canonical form: nothing outside
        // is looked at
        if !self
            .dirs
            .iter()
            .any(|(a, c)| abs.starts_with(a) || abs.starts_with(c))
        {
            let allowed: Vec<String> = self
                .dirs
                .iter()
                .map(|(a, _)| a.display().to_string())
                .collect();
            return Err(Outside {
                allowed: if allowed.is_empty() {
                    "none".into()
                } else {
                    allowed.join(", ")
                },
            });
        }
        let canon = std::fs::canonicalize(&abs).map_err(|_| NotAllowed)?;
        if !self.dirs.iter().any(|(_, c)| canon.starts_with(c)) {
            return Err(NotAllowed);
        }
        let meta = std::fs::metadata(&canon).map_err(|_| NotAllowed)?;
        if !meta.is_file() {
            return Err(NotAllowed);
        }
        let mut magic = [0u8; 4];
        std::fs::File::open(&canon)
            .and_then(|mut f| f.read_exact(&mut magic))
            .map_err(|_| NotGguf)?;
        if &magic != b"GGUF" {
            return Err(NotGguf);
        }
        Ok(canon)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("orchd-mp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// SEC-MODEL-1, FC-PATH-1: only regular GGUF files inside the directories load; `..`,
    /// symlinks out, FIFOs, directories and missing files get the same answer; a path outside
    /// the folders as written is told the allowed folders and the config key.
    #[test]
    fn paths_outside_or_odd_are_refused_alike() {
        let root = dir("root");
        let models = root.join("models");
        std::fs::create_dir_all(&models).unwrap();
        std::fs::write(models.join("ok.gguf"), b"GGUF\x03\0\0\0rest").unwrap();
        std::fs::write(models.join("text.gguf"), b"hello").unwrap();
        std::fs::write(root.join("secret"), b"GGUF outside").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(root.join("secret"), models.join("link.gguf")).unwrap();
        let fifo = models.join("fifo.gguf");
        let _ = std::process::Command::new("mkfifo").arg(&fifo).status();
        let dirs = ModelDirs::new([&models]);
        let s = |p: PathBuf| p.to_string_lossy().into_owned();
        assert_eq!(
            dirs.check(&s(models.join("ok.gguf"))).unwrap(),
            std::fs::canonicalize(models.join("ok.gguf")).unwrap()
        );
        use ModelPathError::*;
        assert_eq!(dirs.check(&s(models.join("text.gguf"))), Err(NotGguf));
        for bad in [
            s(models.join("../secret")),
            s(models.join("link.gguf")),
            s(models.join("missing.gguf")),
            s(models.clone()),
            String::new(),
        ] {
            assert_eq!(dirs.check(&bad), Err(NotAllowed), "{bad}");
        }
        let outside = Outside {
            allowed: models.display().to_string(),
        };
        for bad in [
            s(root.join("secret")),
            "/etc/passwd".to_string(),
            "/root/.ssh/id_rsa".to_string(),
        ] {
            assert_eq!(dirs.check(&bad), Err(outside.clone()), "{bad}");
        }
        assert!(outside.to_string().contains("models.dirs"));
        if fifo.exists() {
            assert_eq!(dirs.check(&s(fifo)), Err(NotAllowed));
        }
        let _ = std::fs::remove_dir_all(root);
    }
}
