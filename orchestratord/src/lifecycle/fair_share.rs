//! Fair share across tenants (ORCH-FAIR-1..4): who goes next within a priority class, and how
//! much of the queue each tenant may hold.
//!
//! Order is the virtual token counter of Sheng et al. (OSDI '24, "Fairness in Serving Large
//! Language Models"): each tenant's counter is the service it received — prompt tokens when its
//! task starts, each generated token as it comes — divided by its weight, and the next task to
//! start is the head of the backlogged tenant with the least counter. A tenant that becomes
//! backlogged starts level with the least-served of those already waiting (or, when nobody
//! waits, with the tenant that started last): being idle earns no credit. Within a tenant its
//! own order stays (class, kept places, arrival).
//!
//! Capacity: a tenant's share of the queue is the capacity times its weight over the weights of
//! the tenants waiting (itself included). When the queue is full, a tenant below its share is
//! still admitted; the room comes from the tenant furthest over its share, whose newest queued
//! task is sent back (queue.rs). With one tenant both are exactly first come, first served.
//!
//! This module owns the counters; the queue asks it for orders and shares.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use std::collections::BTreeMap;

use crate::config::{Fairness, TenantConfig};

/// Tenants named in metrics at most (configured ones first); the rest are `other`.
const MAX_LABELLED_TENANTS: usize = 32;
/// Counters kept at most: past it, the least-served idle tenants are forgotten (a forgotten
/// tenant comes back level with the others, as any that becomes backlogged does).
const MAX_COUNTERS: usize = 4096;
/// The metric label of tenants without their own.
const OTHER: &str = "other";

pub struct FairShare {
    mode: Fairness,
    weights: HashMap<String, f64>,
    /// Tenants with their own metric label, in order; the rest are `other`.
    labelled: Vec<String>,
    ledger: Mutex<Ledger>,
}

#[derive(Default)]
struct Ledger {
    /// Tokens served divided by the weight, by tenant.
    served: HashMap<String, f64>,
    /// The counter of the tenant whose task started last: where a tenant that becomes
    /// backlogged while nobody waits begins.
    floor: f64,
}

/// One queued task as the order sees it: its tenant and the tokens it is expected to take.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub tenant: &'a str,
    pub cost: f64,
}

impl FairShare {
    /// `tenants`: the configured ones (weights); `known_tenants`: tenants that get their own
    /// metric labels besides them (the key set's).
    pub fn new(
        mode: Fairness,
        tenants: &BTreeMap<String, TenantConfig>,
        known_tenants: &[String],
    ) -> Self {
        let weights: HashMap<String, f64> = tenants
            .iter()
            .map(|(name, t)| (name.clone(), t.weight))
            .collect();
        let mut labelled: Vec<String> = Vec::new();
        for t in tenants.keys().chain(known_tenants) {
            if !labelled.contains(t) && labelled.len() < MAX_LABELLED_TENANTS {
                labelled.push(t.clone());
            }
        }
        if labelled.is_empty() {
            // no keys: every caller is the one local tenant
            labelled.push(crate::auth::keys::LOCAL_TENANT.to_string());
        }
        Self {
            mode,
            weights,
            labelled,
            ledger: Mutex::new(Ledger::default()),
        }
    }

    pub fn mode(&self) -> Fairness {
        self.mode
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn weight(&self, tenant: &str) -> f64 {
        self.weights.get(tenant).copied().unwrap_or(1.0)
    }

    /// The tenant's name in metrics: configured and key-set tenants by name, others `other`.
    pub fn label<'a>(&self, tenant: &'a str) -> &'a str {
        if self.labelled.iter().any(|t| t == tenant) {
            tenant
        } else {
            OTHER
        }
    }

    fn labels(&self) -> Vec<&str> {
        self.labelled
            .iter()
            .map(String::as_str)
            .chain([OTHER])
            .collect()
    }

    /// Every tenant series at 0 (dashboards see them before the first task).
    pub fn publish_initial(&self) {
        crate::metrics::tenant_series_at_zero(&self.labels());
    }

    /// Publishes the tasks queued by tenant (`owners`: one per queued task).
    pub fn publish_queued<'a>(&self, owners: impl Iterator<Item = &'a str>) {
        crate::metrics::tenant_queued(&self.labels(), &self.count_by_label(owners));
    }

    /// Publishes the tasks running by tenant (`owners`: one per running task).
    pub fn publish_running<'a>(&self, owners: impl Iterator<Item = &'a str>) {
        crate::metrics::tenant_running(&self.labels(), &self.count_by_label(owners));
    }

    fn count_by_label<'a>(&self, owners: impl Iterator<Item = &'a str>) -> Vec<(&'a str, usize)> {
        let mut out: Vec<(&str, usize)> = Vec::new();
        for o in owners {
            let l = self.label(o);
            match out.iter_mut().find(|(t, _)| *t == l) {
                Some(e) => e.1 += 1,
                None => out.push((l, 1)),
            }
        }
        out
    }

    /// The tenants it knows, idle ones too: configured and key-set ones (the labelled), then
    /// those served so far, in name order.
    pub fn known(&self) -> Vec<String> {
        let mut out = self.labelled.clone();
        let served: Vec<String> = self.lock().served.keys().cloned().collect();
        for t in served {
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out.sort_unstable();
        out
    }

    /// Weighted tokens served to `tenant` so far.
    pub fn served(&self, tenant: &str) -> f64 {
        self.lock().served.get(tenant).copied().unwrap_or(0.0)
    }

    /// Where `tenant`'s counter stands once it is backlogged beside `waiting` (the tenants with
    /// tasks queued, itself not among them): level with the least-served of them, or with the
    /// tenant that started last when nobody waits; never below where it was.
    fn lifted(ledger: &Ledger, tenant: &str, waiting: &[&str]) -> f64 {
        let own = ledger.served.get(tenant).copied().unwrap_or(0.0);
        let level = waiting
            .iter()
            .map(|t| ledger.served.get(*t).copied().unwrap_or(0.0))
            .min_by(f64::total_cmp)
            .unwrap_or(ledger.floor);
        own.max(level)
    }

    /// `tenant` had nothing queued and now has: its counter is lifted (no credit for idling).
    pub fn activate(&self, tenant: &str, waiting: &[&str]) {
        let mut l = self.lock();
        let c = Self::lifted(&l, tenant, waiting);
        if !l.served.contains_key(tenant) && l.served.len() >= MAX_COUNTERS {
            let waiting: HashSet<&str> = waiting.iter().copied().collect();
            if let Some(idle) = l
                .served
                .iter()
                .filter(|(t, _)| !waiting.contains(t.as_str()))
                .min_by(|a, b| a.1.total_cmp(b.1))
                .map(|(t, _)| t.clone())
            {
                l.served.remove(&idle);
            }
        }
        l.served.insert(tenant.to_string(), c);
    }

    /// A task of `tenant` starts with `prompt_tokens` to read: they count as served now.
    pub fn started(&self, tenant: &str, prompt_tokens: usize) {
        let w = self.weight(tenant);
        let mut l = self.lock();
        let c = l.served.entry(tenant.to_string()).or_insert(0.0);
        let before = *c;
        *c += prompt_tokens as f64 / w;
        l.floor = l.floor.max(before);
        crate::metrics::tenant_tokens(self.label(tenant), prompt_tokens);
    }

    /// `tokens` more were generated for `tenant`.
    pub fn charge(&self, tenant: &str, tokens: usize) {
        let w = self.weight(tenant);
        *self.lock().served.entry(tenant.to_string()).or_insert(0.0) += tokens as f64 / w;
        crate::metrics::tenant_tokens(self.label(tenant), tokens);
    }

    /// The order in which one class's queued tasks (`entries`, in their first-come order)
    /// start: positions into `entries`. `newcomer`: a tenant not yet waiting whose counter is
    /// taken as lifted (an admission's prediction for a task not queued yet).
    pub fn order(&self, entries: &[Entry<'_>], newcomer: Option<&str>) -> Vec<usize> {
        if self.mode == Fairness::Fifo {
            return (0..entries.len()).collect();
        }
        // each tenant's own tasks, in their order
        let mut groups: Vec<(&str, std::collections::VecDeque<usize>)> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            match groups.iter_mut().find(|g| g.0 == e.tenant) {
                Some(g) => g.1.push_back(i),
                None => groups.push((e.tenant, [i].into())),
            }
        }
        if groups.len() <= 1 {
            return (0..entries.len()).collect();
        }
        let mut counters: Vec<f64> = {
            let l = self.lock();
            let waiting: Vec<&str> = groups
                .iter()
                .map(|g| g.0)
                .filter(|t| Some(*t) != newcomer)
                .collect();
            groups
                .iter()
                .map(|g| match newcomer {
                    Some(n) if n == g.0 => Self::lifted(&l, n, &waiting),
                    _ => l.served.get(g.0).copied().unwrap_or(0.0),
                })
                .collect()
        };
        let weights: Vec<f64> = groups.iter().map(|g| self.weight(g.0)).collect();
        let mut out = Vec::with_capacity(entries.len());
        while out.len() < entries.len() {
            // the least-served tenant with tasks left; on a tie the one with fewer left (a
            // tenant that just became backlogged, level with the others, goes before their
            // long lines), then the one whose head came first
            let Some(g) = (0..groups.len())
                .filter(|&g| !groups[g].1.is_empty())
                .min_by(|&a, &b| {
                    counters[a]
                        .total_cmp(&counters[b])
                        .then(groups[a].1.len().cmp(&groups[b].1.len()))
                        .then(groups[a].1[0].cmp(&groups[b].1[0]))
                })
            else {
                break;
            };
            let Some(i) = groups[g].1.pop_front() else {
                break;
            };
            counters[g] += entries[i].cost / weights[g];
            out.push(i);
        }
        out
    }

    /// Shares of a queue of `capacity` places among the tenants waiting (`waiting`: tenant and
    /// tasks queued) plus `tenant`: whether `tenant`, holding its queued tasks and one more,
    /// stays within its share, and if so the tenant furthest over its own (the one to make
    /// room), if any.
    pub fn room_from<'a>(
        &self,
        capacity: usize,
        waiting: &[(&'a str, usize)],
        tenant: &str,
    ) -> Option<&'a str> {
        if self.mode == Fairness::Fifo {
            return None;
        }
        let total_weight: f64 = waiting
            .iter()
            .filter(|(t, _)| *t != tenant)
            .map(|(t, _)| self.weight(t))
            .sum::<f64>()
            + self.weight(tenant);
        let share = |t: &str| capacity as f64 * self.weight(t) / total_weight;
        let own = waiting
            .iter()
            .find(|(t, _)| *t == tenant)
            .map_or(0, |(_, n)| *n);
        if (own + 1) as f64 > share(tenant) {
            return None;
        }
        waiting
            .iter()
            .filter(|(t, n)| *t != tenant && *n as f64 > share(t))
            .max_by(|a, b| (a.1 as f64 - share(a.0)).total_cmp(&(b.1 as f64 - share(b.0))))
            .map(|(t, _)| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fair(weights: &[(&str, f64)]) -> FairShare {
        let tenants = weights
            .iter()
            .map(|(t, w)| {
                let c = TenantConfig {
                    weight: *w,
                    ..Default::default()
                };
                (t.to_string(), c)
            })
            .collect();
        FairShare::new(Fairness::Tenant, &tenants, &[])
    }

    fn entries<'a>(tenants: &[&'a str]) -> Vec<Entry<'a>> {
        tenants
            .iter()
            .map(|t| Entry {
                tenant: t,
                cost: 10.0,
            })
            .collect()
    }

    /// ORCH-FAIR-1: equal weights alternate between backlogged tenants whatever the arrival
    /// order; the less-served tenant goes first; one tenant keeps first-come order.
    #[test]
    fn backlogged_tenants_alternate_and_the_less_served_goes_first() {
        let f = fair(&[]);
        let e = entries(&["a", "a", "a", "a", "b", "b"]);
        // level: the shorter line first, then by turns
        assert_eq!(f.order(&e, None), [4, 0, 5, 1, 2, 3]);
        f.charge("a", 25);
        assert_eq!(f.order(&e, None), [4, 5, 0, 1, 2, 3]);
        let one = entries(&["a", "a", "a"]);
        assert_eq!(f.order(&one, None), [0, 1, 2]);
    }

    /// ORCH-FAIR-1: weights 3:1 give the heavier tenant three starts for each of the other's.
    #[test]
    fn weights_split_the_starts() {
        let f = fair(&[("a", 3.0)]);
        let e = entries(&["b", "b", "b", "a", "a", "a", "a", "a", "a"]);
        let order: Vec<&str> = f.order(&e, None).iter().map(|&i| e[i].tenant).collect();
        assert_eq!(order, ["b", "a", "a", "a", "b", "a", "a", "a", "b"]);
    }

    /// ORCH-FAIR-2: a tenant that was idle while another was served starts level with the
    /// tenants waiting, not with the credit of its idle time; with nobody waiting, level with
    /// the tenant that started last.
    #[test]
    fn an_idle_tenant_earns_no_credit() {
        let f = fair(&[]);
        f.started("a", 1000);
        f.activate("b", &["a"]);
        assert_eq!(f.served("b"), 1000.0);
        f.started("b", 10);
        f.charge("b", 5000);
        f.activate("c", &[]);
        assert_eq!(f.served("c"), 1000.0, "the counter of the last to start");
        // a newcomer's prediction takes the lifted counter (level with b, the least-served
        // waiting) without changing it
        f.started("a", 9000);
        let e = entries(&["a", "b", "d"]);
        assert_eq!(f.order(&e, Some("d")), [1, 2, 0]);
        assert_eq!(f.served("d"), 0.0);
    }

    /// ORCH-FAIR-3: a tenant below its share of a full queue gets room from the one furthest
    /// over its own; at or over its share it gets none; `fifo` never makes room.
    #[test]
    fn room_comes_from_the_tenant_furthest_over_its_share() {
        let f = fair(&[("c", 2.0)]);
        assert_eq!(f.room_from(8, &[("a", 6), ("b", 2)], "c"), Some("a"));
        assert_eq!(f.room_from(8, &[("a", 4), ("b", 4)], "b"), None);
        assert_eq!(f.room_from(8, &[("a", 8)], "a"), None);
        let fifo = FairShare::new(Fairness::Fifo, &Default::default(), &[]);
        assert_eq!(fifo.room_from(8, &[("a", 8)], "b"), None);
        assert_eq!(fifo.order(&entries(&["a", "a", "b"]), None), [0, 1, 2]);
    }
}
