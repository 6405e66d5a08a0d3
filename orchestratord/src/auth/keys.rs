//! API keys: where they come from, how they are kept, how a presented key is checked.
//!
//! An entry is `tenant:scope:key`. `scope` is `data` or `admin`; `key` is the secret itself,
//! or `sha256:` followed by the 64 hex digits of its SHA-256 (for key files that must not hold
//! the secret). Entries come from `auth.keys` in the config, from `auth.key_file` (one per
//! line, `#` comments and blank lines ignored) and from the env variable `ORCHD_API_KEYS`
//! (comma-separated). Only digests are kept; a presented key is hashed and compared with every
//! digest in constant time. Nothing here ever formats a key into a message.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::TenantConfig;

/// What a key may do. `Admin` covers everything `Data` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Tasks, chat APIs, sessions and artifacts of the key's own tenant.
    Data,
    /// Pools, drain, reload, `/engines` writes, workers; every tenant's tasks.
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::Admin => "admin",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "data" => Some(Self::Data),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }
}

/// Who is calling: the tenant a key belongs to, and its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: String,
    pub scope: Scope,
}

/// The tenant of every caller while auth is off (loopback without keys).
pub const LOCAL_TENANT: &str = "local";
/// The tenant of an orchestrator's requests run by this process as its remote worker.
pub const REMOTE_TENANT: &str = "orchestrator";

impl Principal {
    /// The caller while no key is configured: one tenant that may do everything.
    pub fn local() -> Self {
        Self {
            tenant: LOCAL_TENANT.into(),
            scope: Scope::Admin,
        }
    }

    /// A caller inside this process (a worker's in-process backend), with data scope.
    pub fn in_process(tenant: &str) -> Self {
        Self {
            tenant: tenant.into(),
            scope: Scope::Data,
        }
    }

    /// Whether this caller may look at every tenant's tasks and sessions (admins).
    pub fn sees_all(&self) -> bool {
        self.scope == Scope::Admin
    }
}

struct Entry {
    tenant: String,
    scope: Scope,
    digest: [u8; 32],
}

/// The configured keys, as digests.
#[derive(Default)]
pub struct KeyStore {
    entries: Vec<Entry>,
    /// Tenants' weights and quotas given after their keys (`name=value` options).
    options: std::collections::BTreeMap<String, TenantConfig>,
}

/// Applies one `name=value` option of a key entry to `t`.
fn apply_option(t: &mut TenantConfig, opt: &str) -> Result<(), &'static str> {
    let (name, value) = opt
        .split_once('=')
        .ok_or("options after the key are name=value")?;
    fn num<T: std::str::FromStr>(v: &str) -> Result<T, &'static str> {
        v.parse().map_err(|_| "an option's value is not a number")
    }
    match name {
        "weight" => t.weight = num(value)?,
        "max_concurrent" => t.max_concurrent = Some(num(value)?),
        "max_queued" => t.max_queued = Some(num(value)?),
        "tokens_per_minute" => t.tokens_per_minute = Some(num(value)?),
        "requests_per_minute" => t.requests_per_minute = Some(num(value)?),
        "max_priority" => {
            t.max_priority = Some(match value {
                "interactive" => contracts::Priority::Interactive,
                "batch" => contracts::Priority::Batch,
                _ => return Err("max_priority is interactive or batch"),
            })
        }
        _ => {
            return Err("unknown option (weight, max_concurrent, max_queued, tokens_per_minute, requests_per_minute, max_priority)")
        }
    }
    Ok(())
}

impl std::fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // tenants and scopes only: never a digest
        f.debug_list()
            .entries(
                self.entries
                    .iter()
                    .map(|e| format!("{}:{}", e.tenant, e.scope.as_str())),
            )
            .finish()
    }
}

/// A malformed key entry. Says where, never what the key was.
#[derive(Debug, thiserror::Error)]
#[error("{source_name} entry {index}: {problem}")]
pub struct KeyError {
    pub source_name: String,
    pub index: usize,
    pub problem: &'static str,
}

fn valid_tenant(t: &str) -> bool {
    (1..=64).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn digest_of(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn parse_hex_digest(h: &str) -> Option<[u8; 32]> {
    let v = hex::decode(h).ok()?;
    v.try_into().ok()
}

impl KeyStore {
    /// Weights and quotas given after keys, by tenant.
    pub fn tenant_options(&self) -> &std::collections::BTreeMap<String, TenantConfig> {
        &self.options
    }

    /// The tenants that have keys, each once, in the order their keys were added.
    pub fn tenants(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for e in &self.entries {
            if !out.contains(&e.tenant) {
                out.push(e.tenant.clone());
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Adds the entries of one source (`source_name` names it in errors: "ORCHD_API_KEYS",
    /// the key file's path, "auth.keys").
    pub fn add_entries<'a>(
        &mut self,
        source_name: &str,
        entries: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), KeyError> {
        for (i, raw) in entries.into_iter().enumerate() {
            let err = |problem| KeyError {
                source_name: source_name.to_string(),
                index: i + 1,
                problem,
            };
            let raw = raw.trim();
            let mut parts = raw.splitn(3, ':');
            let (Some(tenant), Some(scope), Some(rest)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Err(err("expected tenant:scope:key"));
            };
            // the key, then the tenant's options, if any
            let mut words = rest.split_whitespace();
            let key = words.next().unwrap_or("");
            let opts: Vec<&str> = words.collect();
            if !opts.is_empty() {
                let mut t = TenantConfig::default();
                for o in &opts {
                    apply_option(&mut t, o).map_err(err)?;
                }
                // the config's rule: a weight in range, no quota of 0
                t.check()
                    .map_err(|_| err("a weight must be 0.01-1000 and a quota at least 1"))?;
                match self.options.get(tenant) {
                    Some(seen) if *seen != t => {
                        return Err(err(
                            "this tenant's options differ from those of its other key",
                        ))
                    }
                    _ => {
                        self.options.insert(tenant.to_string(), t);
                    }
                }
            }
            if !valid_tenant(tenant) {
                return Err(err("the tenant must be 1-64 characters of [A-Za-z0-9._-]"));
            }
            let scope =
                Scope::parse(scope).ok_or_else(|| err("the scope must be data or admin"))?;
            if key.is_empty() {
                return Err(err("the key is empty"));
            }
            let digest = match key.strip_prefix("sha256:") {
                Some(h) => parse_hex_digest(h)
                    .ok_or_else(|| err("sha256: must be followed by 64 hex digits"))?,
                None => digest_of(key),
            };
            if self.entries.iter().any(|e| e.digest == digest) {
                return Err(err("the same key is configured twice"));
            }
            if !key.starts_with("sha256:") && key.len() < 16 {
                tracing::warn!(
                    tenant,
                    source = source_name,
                    "an API key shorter than 16 characters is easy to guess"
                );
            }
            self.entries.push(Entry {
                tenant: tenant.to_string(),
                scope,
                digest,
            });
        }
        Ok(())
    }

    /// Adds the lines of a key file (blank lines and `#` comments skipped).
    pub fn add_file(&mut self, path: &str, text: &str) -> Result<(), KeyError> {
        self.add_entries(
            path,
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#')),
        )
    }

    /// The principal `presented` belongs to. Every digest is compared, in constant time each.
    pub fn verify(&self, presented: &str) -> Option<Principal> {
        let d = digest_of(presented);
        let mut found = None;
        for e in &self.entries {
            let eq: bool = e.digest.ct_eq(&d).into();
            if eq && found.is_none() {
                found = Some(Principal {
                    tenant: e.tenant.clone(),
                    scope: e.scope,
                });
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SEC-KEY-1: entries parse from every form; only the exact key verifies, with its tenant
    /// and scope; hashed entries verify the key they hash.
    /// ORCH-FAIR-5: options after a key set its tenant's weight and quotas; a bad option, or
    /// a second key of the tenant with other options, is refused naming the entry.
    #[test]
    fn options_after_a_key_set_the_tenants_weight_and_quotas() {
        let mut ks = KeyStore::default();
        ks.add_entries(
            "t",
            [
                "gold:data:gold-secret-0123456789 weight=3 requests_per_minute=60 max_priority=batch",
                "gold:admin:gold-admin-0123456789 weight=3 requests_per_minute=60 max_priority=batch",
                "plain:data:plain-secret-0123456789",
            ],
        )
        .unwrap();
        let gold = &ks.tenant_options()["gold"];
        assert_eq!(gold.weight, 3.0);
        assert_eq!(gold.requests_per_minute, Some(60));
        assert_eq!(gold.max_priority, Some(contracts::Priority::Batch));
        assert!(!ks.tenant_options().contains_key("plain"));
        assert_eq!(ks.verify("gold-secret-0123456789").unwrap().tenant, "gold");
        for bad in [
            "x:data:k0123456789abcdef weight=0",
            "x:data:k0123456789abcdef speed=3",
            "x:data:k0123456789abcdef max_queued",
            "x:data:k0123456789abcdef requests_per_minute=0",
            "gold:data:other-0123456789abcdef weight=2",
        ] {
            assert!(ks.add_entries("t", [bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_parse_and_verify() {
        let mut ks = KeyStore::default();
        ks.add_entries("env", "alice:data:k1,ops:admin:k2".split(','))
            .unwrap();
        let hashed = format!("bob:data:sha256:{}", hex::encode(digest_of("bob-secret")));
        ks.add_file("file", &format!("# comment\n\n{hashed}\n"))
            .unwrap();
        assert_eq!(ks.len(), 3);
        let a = ks.verify("k1").unwrap();
        assert_eq!((a.tenant.as_str(), a.scope), ("alice", Scope::Data));
        assert_eq!(ks.verify("k2").unwrap().scope, Scope::Admin);
        assert_eq!(ks.verify("bob-secret").unwrap().tenant, "bob");
        assert!(ks.verify("k3").is_none());
        assert!(ks.verify("k1 ").is_none());
        assert!(ks.verify("").is_none());
        // a key with colons keeps them
        ks.add_entries("cfg", ["carol:data:a:b:c"]).unwrap();
        assert_eq!(ks.verify("a:b:c").unwrap().tenant, "carol");
    }

    /// SEC-KEY-1: malformed entries are refused naming the source and entry, never the key.
    #[test]
    fn bad_entries_never_echo_the_key() {
        for bad in [
            "alice:root:supersecretvalue",
            "al ice:data:supersecretvalue",
            "alice:supersecretvalue",
            "alice:data:sha256:supersecretvalue",
        ] {
            let e = KeyStore::default().add_entries("env", [bad]).unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with("env entry 1"), "{msg}");
            assert!(!msg.contains("supersecretvalue"), "{msg}");
        }
        let mut ks = KeyStore::default();
        let e = ks
            .add_entries(
                "env",
                ["a:data:dup-key-xxxxxxxx", "b:admin:dup-key-xxxxxxxx"],
            )
            .unwrap_err();
        assert_eq!(e.index, 2);
        assert!(!format!("{ks:?}").contains("dup-key"));
    }
}
