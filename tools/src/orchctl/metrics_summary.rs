//! `orchctl metrics`: a short human summary of `/metrics` (the Prometheus text format).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::Output;
use contracts::metric_names as m;

/// One sample line: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of a Prometheus text exposition (comments and malformed lines skipped).
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = value.trim().parse().ok()?;
    let (name, labels) = match head.split_once('{') {
        Some((n, rest)) => (n, parse_labels(rest.strip_suffix('}')?)?),
        None => (head, Vec::new()),
    };
    Some(Sample {
        name: name.trim().to_string(),
        labels,
        value,
    })
}

/// `a="x",b="y\"z"` → pairs, unescaping `\"`, `\\` and `\n`.
fn parse_labels(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek() == Some(&',') || chars.peek() == Some(&' ') {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next() != Some('"') {
            return None;
        }
        let mut val = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => val.push('\n'),
                    c => val.push(c),
                },
                c => val.push(c),
            }
        }
        out.push((key, val));
    }
}

fn sum(samples: &[Sample], name: &str) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

/// Values of `name` by one label, zeros left out.
fn by_label(samples: &[Sample], name: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == name && s.value != 0.0) {
        *out.entry(s.label(label).unwrap_or("").to_string())
            .or_insert(0.0) += s.value;
    }
    out
}

/// The `q` quantile of histogram `name` from its buckets, interpolated within the bucket as
/// Prometheus' `histogram_quantile` does; `None` without observations.
pub fn quantile(samples: &[Sample], name: &str, q: f64) -> Option<f64> {
    let bucket = format!("{name}_bucket");
    let mut buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.name == bucket)
        .filter_map(|s| {
            let le = s.label("le")?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, s.value))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lo, mut below) = (0.0, 0.0);
    for (bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lo);
            }
            let inside = count - below;
            let frac = if inside > 0.0 {
                (rank - below) / inside
            } else {
                1.0
            };
            return Some(lo + (bound - lo) * frac);
        }
        (lo, below) = (bound, count);
    }
    None
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{:.0} ms", s * 1000.0))
}

fn pairs(map: &BTreeMap<String, f64>) -> String {
    if map.is_empty() {
        return "none".into();
    }
    map.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The summary of an exposition.
pub fn summarise(text: &str) -> Output {
    let s = parse(text);
    let finished = by_label(&s, m::TASKS_FINISHED, m::L_OUTCOME);
    let rejected = by_label(&s, m::TASKS_REJECTED, m::L_REASON);
    let errors = by_label(&s, m::ERRORS, m::L_CODE);
    let queue = by_label(&s, m::QUEUE_DEPTH, m::L_PRIORITY);
    let busy = by_label(&s, m::POOL_SLOTS_BUSY, m::L_POOL);
    let mut pools: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for x in s.iter().filter(|x| x.name == m::POOL_SLOTS) {
        let id = x.label(m::L_POOL).unwrap_or("").to_string();
        pools.insert(id.clone(), (busy.get(&id).copied().unwrap_or(0.0), x.value));
    }
    let ttft = [0.5, 0.95].map(|q| quantile(&s, m::TTFT, q));
    let itl = [0.5, 0.95].map(|q| quantile(&s, m::TOKEN_LATENCY, q));
    let slots: Vec<String> = pools
        .iter()
        .map(|(id, (b, t))| format!("{id} {b}/{t}"))
        .collect();
    let human = format!(
        "tasks      {} enqueued, {} started; finished: {}\n\
         rejected   {}\n\
         queue      {}\n\
         slots      {}\n\
         tokens     {} in, {} out\n\
         ttft       p50 {}, p95 {}\n\
         inter-tok  p50 {}, p95 {}\n\
         errors     {}\n\
         workers    {}\n",
        sum(&s, m::TASKS_ENQUEUED),
        sum(&s, m::TASKS_STARTED),
        pairs(&finished),
        pairs(&rejected),
        pairs(&queue),
        if slots.is_empty() {
            "no pools".into()
        } else {
            slots.join(", ")
        },
        sum(&s, m::TOKENS_IN),
        sum(&s, m::TOKENS_OUT),
        secs(ttft[0]),
        secs(ttft[1]),
        secs(itl[0]),
        secs(itl[1]),
        pairs(&errors),
        sum(&s, m::WORKERS_CONNECTED),
    );
    let json: Value = json!({
        "tasks_enqueued": sum(&s, m::TASKS_ENQUEUED),
        "tasks_started": sum(&s, m::TASKS_STARTED),
        "finished": finished, "rejected": rejected, "errors": errors, "queue": queue,
        "slots": pools.iter().map(|(id, (b, t))| (id.clone(), json!({"busy": b, "total": t}))).collect::<BTreeMap<_, _>>(),
        "tokens_in": sum(&s, m::TOKENS_IN), "tokens_out": sum(&s, m::TOKENS_OUT),
        "ttft_seconds": {"p50": ttft[0], "p95": ttft[1]},
        "inter_token_seconds": {"p50": itl[0], "p95": itl[1]},
        "workers_connected": sum(&s, m::WORKERS_CONNECTED),
    });
    Output { human, json }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x y\n\
        orchd_tasks_finished_total{outcome=\"stop\"} 3\n\
        orchd_tasks_finished_total{outcome=\"error\"} 0\n\
        orchd_pool_slots{pool=\"a \\\"q\\\"\"} 4\n\
        orchd_pool_slots_busy{pool=\"a \\\"q\\\"\"} 1\n\
        orchd_time_to_first_token_seconds_bucket{le=\"0.1\"} 0\n\
        orchd_time_to_first_token_seconds_bucket{le=\"0.5\"} 10\n\
        orchd_time_to_first_token_seconds_bucket{le=\"+Inf\"} 10\n";

    #[test]
    fn labels_with_escapes_and_quantiles_from_buckets() {
        let s = parse(TEXT);
        assert_eq!(s[2].labels[0].1, "a \"q\"");
        // all 10 between 0.1 and 0.5: the median is interpolated half way
        let p50 = quantile(&s, "orchd_time_to_first_token_seconds", 0.5).unwrap();
        assert!((p50 - 0.3).abs() < 1e-9, "{p50}");
        let out = summarise(TEXT);
        assert!(out.human.contains("finished: stop 3\n"), "{}", out.human);
        assert!(out.human.contains("a \"q\" 1/4"), "{}", out.human);
        assert_eq!(out.json["slots"]["a \"q\""]["total"], 4.0);
    }
}
