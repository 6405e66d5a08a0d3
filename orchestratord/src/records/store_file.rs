//! Whether the database file the store opened is still the one at its path. Deleted (or
//! replaced) while the server runs, SQLite goes on writing to the unlinked file: every commit
//! succeeds and nothing is kept. The writer checks before each batch and refuses to pretend.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The file the store opened: its path and identity (device, inode).
pub struct StoreFile {
    path: PathBuf,
    identity: Option<(u64, u64)>,
}

impl StoreFile {
    /// The file now at `path` (`None` for an in-memory store: nothing to watch).
    pub fn at(path: Option<PathBuf>) -> Self {
        let identity = path
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| (m.dev(), m.ino()));
        Self {
            path: path.unwrap_or_default(),
            identity,
        }
    }

    /// Why the opened file is no longer the store, if it is not.
    pub fn lost(&self) -> Option<String> {
        let (dev, ino) = self.identity?;
        match std::fs::metadata(&self.path) {
            Err(e) => Some(format!(
                "the database file {} is gone ({e}); nothing can be stored until the server restarts",
                self.path.display()
            )),
            Ok(m) if (m.dev(), m.ino()) != (dev, ino) => Some(format!(
                "the database file {} was replaced by another file; nothing can be stored until the server restarts",
                self.path.display()
            )),
            Ok(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OPS-REC-6: a deleted or replaced database file is noticed; an in-memory store never
    /// is.
    #[test]
    fn a_deleted_or_replaced_file_is_noticed() {
        let dir = std::env::temp_dir().join(format!("orchd-storefile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.sqlite3");
        std::fs::write(&p, b"x").unwrap();
        let f = StoreFile::at(Some(p.clone()));
        // held open, as SQLite holds it: its inode is not reused by the next file
        let _held = std::fs::File::open(&p).unwrap();
        assert_eq!(f.lost(), None);
        std::fs::remove_file(&p).unwrap();
        assert!(f.lost().unwrap().contains("gone"));
        std::fs::write(dir.join("other"), b"y").unwrap();
        std::fs::rename(dir.join("other"), &p).unwrap();
        assert!(f.lost().unwrap().contains("replaced"));
        assert_eq!(StoreFile::at(None).lost(), None);
        let _ = std::fs::remove_dir_all(dir);
    }
}
