//! The GGUF files of `models.dirs`, each with what its header says (architecture,
//! quantization, parameters, trained context): read once per file version (path, size,
//! modification time), the folders listed again at most once a second.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use pool_manager::candle::{inspect, FileFacts};

use super::recipe::{self, Recipe};
use crate::model_paths::ModelDirs;

/// How often the folders are listed again (a listing and a request each look).
const RESCAN_EVERY: Duration = Duration::from_secs(1);
/// Most files one listing takes (a folder of thousands is an operator's mistake, bounded).
pub const MAX_FILES: usize = 1024;

/// One model file of the folder.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Its file name without `.gguf`: the model name clients use.
    pub name: String,
    pub path: PathBuf,
    pub bytes: u64,
    /// When the file last changed (`/v1/models`' `created`).
    pub modified: Option<SystemTime>,
    /// What its header says, or why it could not be read.
    pub facts: Result<FileFacts, String>,
    /// The context per sequence a load of it would serve, with the folder's settings
    /// ([`super::ModelsFolder::entries`] fills it in).
    pub served_ctx: Option<usize>,
    /// Its recipe (`recipe.rs`), or why the one beside it cannot be read.
    pub recipe: Option<Result<Recipe, String>>,
}

impl Entry {
    /// Whether clients may call it `name`: its name, or the hub name it was pulled as.
    pub fn is_named(&self, name: &str) -> bool {
        self.name == name
            || self
                .recipe
                .as_ref()
                .and_then(|r| r.as_ref().ok())
                .and_then(|r| r.pulled_as.as_deref())
                == Some(name)
    }

    /// Its recipe, when it has one that reads.
    pub fn recipe(&self) -> Option<&Recipe> {
        self.recipe.as_ref().and_then(|r| r.as_ref().ok())
    }
}

/// A file as it is: its path, size and modification time.
pub type Version = (PathBuf, u64, Option<SystemTime>);

pub struct Catalog {
    dirs: Vec<PathBuf>,
    /// Where a model file may really be (links resolved): the server's model folders.
    allowed: ModelDirs,
    listed: Mutex<Option<(Instant, Vec<Entry>)>>,
    read: Mutex<HashMap<Version, Result<FileFacts, String>>>,
}

impl Catalog {
    pub fn new(dirs: &[String], allowed: ModelDirs) -> Self {
        Self {
            allowed,
            dirs: dirs
                .iter()
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .collect(),
            listed: Mutex::new(None),
            read: Mutex::new(HashMap::new()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// Every model of the folders, by name (blocking: file system reads).
    pub fn entries(&self) -> Vec<Entry> {
        self.entries_within(RESCAN_EVERY)
    }

    /// Lists the folders again now (a model was pulled or deleted).
    pub fn refresh(&self) {
        self.entries_within(Duration::ZERO);
    }

    /// The first folder, where pulled models go.
    pub fn first_dir(&self) -> Option<&Path> {
        self.dirs.first().map(PathBuf::as_path)
    }

    /// The model named `name`, or pulled as `name` (a file added is found within a second;
    /// requests for names that are not there list the folders at most once a second).
    pub fn find(&self, name: &str) -> Option<Entry> {
        self.entries().into_iter().find(|e| e.is_named(name))
    }

    fn entries_within(&self, fresh: Duration) -> Vec<Entry> {
        if self.dirs.is_empty() {
            return Vec::new();
        }
        if let Some((at, list)) = self
            .listed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            if at.elapsed() < fresh {
                return list.clone();
            }
        }
        let list = self.scan();
        *self.listed.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), list.clone()));
        list
    }

    fn scan(&self) -> Vec<Entry> {
        let mut out: Vec<Entry> = Vec::new();
        let mut seen: Vec<Version> = Vec::new();
        for dir in &self.dirs {
            let Ok(files) = std::fs::read_dir(dir) else {
                continue;
            };

            let mut paths: Vec<PathBuf> = files
                .filter_map(|f| f.ok().map(|f| f.path()))
                .filter(|p| {
                    p.extension()
                        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
                })
                .collect();
            paths.sort();
            for path in paths {
                if out.len() >= MAX_FILES {
                    break;
                }
                // a link to a file outside every model folder is no model (SEC-MODEL-1)
                if !self.allowed.contains(&path) {
                    continue;
                }
                let Some(entry) = self.entry(&path, &mut seen) else {
                    continue;
                };
                // the first folder's file of a name wins
                if !out.iter().any(|e| e.name == entry.name) {
                    out.push(entry);
                }
            }
        }
        // forget what was read of files that are gone or changed
        self.read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|v, _| seen.contains(v));
        out
    }

    fn entry(&self, path: &Path, seen: &mut Vec<Version>) -> Option<Entry> {
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_file() {
            return None;
        }
        let name = path.file_stem()?.to_str()?.to_string();
        let version = (path.to_path_buf(), meta.len(), meta.modified().ok());
        seen.push(version.clone());
        let cached = self
            .read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&version)
            .cloned();
        let facts = match cached {
            Some(f) => f,
            None => {
                let f = inspect(path).map_err(|e| e.to_string());
                self.read
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(version, f.clone());
                f
            }
        };
        Some(Entry {
            name,
            path: path.to_path_buf(),
            bytes: meta.len(),
            modified: meta.modified().ok(),
            facts,
            served_ctx: None,
            recipe: recipe::read(path),
        })
    }
}
