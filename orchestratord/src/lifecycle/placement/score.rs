//! The order in which placement tries the pools that can take a task now (PLACE-1..3): the
//! conversation's own pool first while it has room (session affinity), then the pools holding
//! the longest cached prefix of the prompt (less `min_cached_tokens` for every sequence the
//! pool runs), then the least loaded. A pool is preferred for its
//! cache or its session only within the load bound — the sequences it runs once it takes the
//! task at most `load_bound` times its fair share (the mean load of the pools serving the
//! model, by slots), or one above that share where that is more (a light load) — so one shared
//! system prompt does not send everything to one pool. Pure: no pool, no lock.

use std::cmp::Ordering;

pub use contracts::PlacementReason as Reason;

/// One pool that can take the task now (it accepts work and has a free slot).
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub id: &'a str,
    pub slots_total: usize,
    /// Slots it runs now (what its engine reports from every source, when more).
    pub used: usize,
    /// What its engine reports running from every source (a worker's other clients).
    pub engine_load: usize,
    pub service_ms: Option<f64>,
    /// Prompt tokens of the task its engine holds from a cached prefix.
    pub held_tokens: usize,
}

/// How cache and load are weighed (from `[placement]`).
#[derive(Debug, Clone, Copy)]
pub struct Weights {
    pub min_cached_tokens: usize,
    pub load_bound: f64,
}

/// The least loaded first: most free slots, then least engine load, then lowest recent
/// service time, then id.
fn by_load(a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    let free = |c: &Candidate<'_>| c.slots_total.saturating_sub(c.used);
    free(b)
        .cmp(&free(a))
        .then_with(|| a.engine_load.cmp(&b.engine_load))
        .then_with(|| {
            let la = a.service_ms.unwrap_or(f64::MAX);
            let lb = b.service_ms.unwrap_or(f64::MAX);
            la.partial_cmp(&lb).unwrap_or(Ordering::Equal)
        })
        .then_with(|| a.id.cmp(b.id))
}

/// `candidates` in the order to try them, each with the reason it would be chosen for.
/// `serving`: (used, slots) of every pool serving the model, whether it has room or not (the
/// mean load is theirs); `affinity`: the pool the conversation last ran on.
pub fn order<'a>(
    candidates: &[Candidate<'a>],
    serving: &[(usize, usize)],
    affinity: Option<&str>,
    w: Weights,
) -> Vec<(&'a str, Reason)> {
    let used: usize = serving.iter().map(|&(u, _)| u).sum();
    let slots: usize = serving.iter().map(|&(_, s)| s).sum::<usize>().max(1);
    // a pool's fair share of the sequences once this task runs, by its size
    let fair = |c: &Candidate<'_>| c.slots_total as f64 * (used + 1) as f64 / slots as f64;
    let within = |c: &Candidate<'_>| {
        let f = fair(c);
        (c.used + 1) as f64 <= (w.load_bound * f).max(f + 1.0)
    };
    let mut rest: Vec<&Candidate<'a>> = candidates.iter().collect();
    rest.sort_by(|a, b| by_load(a, b));
    let mut out = Vec::with_capacity(candidates.len());
    if let Some(pos) = affinity.and_then(|id| rest.iter().position(|c| c.id == id)) {
        if within(rest[pos]) {
            out.push((rest.remove(pos).id, Reason::Affinity));
        }
    }
    let mut cached: Vec<&Candidate<'a>> = rest
        .iter()
        .copied()
        .filter(|c| c.held_tokens > 0 && c.held_tokens >= w.min_cached_tokens && within(c))
        .collect();
    // a cached prefix counts for its tokens less `min_cached_tokens` per sequence the pool
    // runs: a pool holding a block or two more of the prompt (every pool holds a shared
    // system prompt) does not win over a less loaded one, its whole history does
    let worth = |c: &Candidate<'_>| {
        c.held_tokens as i64 - (w.min_cached_tokens.min(1 << 20) * c.used) as i64
    };
    cached.sort_by(|a, b| worth(b).cmp(&worth(a)).then_with(|| by_load(a, b)));
    for c in &cached {
        out.push((c.id, Reason::Cache));
    }
    rest.retain(|c| !cached.iter().any(|k| k.id == c.id));
    out.extend(rest.into_iter().map(|c| (c.id, Reason::Load)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Weights = Weights {
        min_cached_tokens: 64,
        load_bound: 1.5,
    };

    fn pool(id: &str, used: usize, held: usize) -> Candidate<'_> {
        Candidate {
            id,
            slots_total: 4,
            used,
            engine_load: 0,
            service_ms: None,
            held_tokens: held,
        }
    }

    fn serving(c: &[Candidate<'_>]) -> Vec<(usize, usize)> {
        c.iter().map(|c| (c.used, c.slots_total)).collect()
    }

    fn first<'a>(c: &[Candidate<'a>], affinity: Option<&str>) -> (&'a str, Reason) {
        order(c, &serving(c), affinity, W)[0]
    }

    /// PLACE-2: the longest cached prefix wins among pools within the load bound.
    #[test]
    fn the_longest_cached_prefix_wins() {
        let c = [pool("a", 1, 0), pool("b", 1, 512), pool("c", 1, 128)];
        let o = order(&c, &serving(&c), None, W);
        assert_eq!(
            o,
            vec![
                ("b", Reason::Cache),
                ("c", Reason::Cache),
                ("a", Reason::Load)
            ]
        );
    }

    /// PLACE-2: below the minimum match the cache does not count: the least loaded wins.
    #[test]
    fn a_short_match_does_not_count() {
        let c = [pool("a", 2, 48), pool("b", 0, 0)];
        assert_eq!(first(&c, None), ("b", Reason::Load));
    }

    /// PLACE-2: a pool holding the prefix of every task (one shared system prompt) takes them
    /// only while within the bound: two pools of 4 slots split a burst of 6 4:2, not 4:0 and
    /// the rest queued behind it.
    #[test]
    fn a_shared_prefix_does_not_send_everything_to_one_pool() {
        let mut used = [0usize, 0];
        for _ in 0..6 {
            let c = [pool("a", used[0], 256), pool("b", used[1], 0)];
            let c: Vec<_> = c.into_iter().filter(|c| c.used < 4).collect();
            let (id, _) = order(&c, &[(used[0], 4), (used[1], 4)], None, W)[0];
            used[usize::from(id == "b")] += 1;
        }
        assert_eq!(used, [4, 2]);
    }

    /// PLACE-2: where every pool holds the shared system prompt, a block or two more held by
    /// the busier pool does not outweigh a sequence more running there: the less loaded pool
    /// holding the prompt comes first; a whole conversation's history still does.
    #[test]
    fn a_few_more_blocks_do_not_outweigh_the_load() {
        let c = [pool("a", 2, 608), pool("b", 1, 592)];
        assert_eq!(first(&c, None), ("b", Reason::Cache));
        let c = [pool("a", 2, 900), pool("b", 1, 592)];
        assert_eq!(first(&c, None), ("a", Reason::Cache));
    }

    /// PLACE-3: the conversation's pool first while within the bound, the score after.
    #[test]
    fn a_session_stays_on_its_pool_while_it_has_room() {
        let c = [pool("a", 1, 0), pool("b", 1, 512)];
        assert_eq!(first(&c, Some("a")), ("a", Reason::Affinity));
        // a pool far above the others loses its sessions to the score
        let c = [pool("a", 3, 512), pool("b", 0, 0)];
        assert_eq!(first(&c, Some("a")), ("b", Reason::Load));
        // a session whose pool is not among the candidates (full, gone) goes by the score
        let c = [pool("b", 1, 512)];
        assert_eq!(first(&c, Some("a")), ("b", Reason::Cache));
    }

    /// ORCH-PL-1: with nothing cached, most free slots first, then id.
    #[test]
    fn with_nothing_cached_the_least_loaded_first() {
        let c = [pool("b", 1, 0), pool("a", 1, 0), pool("c", 0, 0)];
        let ids: Vec<_> = order(&c, &serving(&c), None, W)
            .into_iter()
            .map(|(id, r)| {
                assert_eq!(r, Reason::Load);
                id
            })
            .collect();
        assert_eq!(ids, ["c", "a", "b"]);
    }
}
