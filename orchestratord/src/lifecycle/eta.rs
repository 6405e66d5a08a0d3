//! Wait-time predictions from the measured service rate of the pools (EWMAs kept by
//! pool-manager: task service time, and decode time per token seeded by each pool's
//! self-test), never from a constant.

use pool_manager::PoolSnapshot;

/// Predictions for a queue position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Expected wait until a slot starts the task.
    pub predicted_start_ms: u64,
    /// Expected time until one queue place frees up (advice for a 429).
    pub retry_after_ms: u64,
    /// Expected decode time per token on these pools, when measured.
    pub ms_per_token: Option<f64>,
}

/// Expected service time of one task on a pool, in ms.
fn service_ms(p: &PoolSnapshot, typical_tokens: usize) -> Option<f64> {
    p.service_ms_ewma
        .or_else(|| p.ms_per_token_ewma.map(|t| t * typical_tokens as f64))
        .filter(|v| v.is_finite() && *v > 0.0)
}

/// Estimates for a task with `position` tasks ahead of it, served by `pools`.
pub fn estimate(position: usize, pools: &[PoolSnapshot], typical_tokens: usize) -> Estimate {
    let serving: Vec<&PoolSnapshot> = pools.iter().filter(|p| p.state.accepts_work()).collect();
    let free: usize = serving.iter().map(|p| p.slots_free()).sum();
    // tasks finished per ms across the pools
    let rate: f64 = serving
        .iter()
        .filter_map(|p| service_ms(p, typical_tokens).map(|s| p.slots_total as f64 / s))
        .sum();
    let per_token: Vec<f64> = serving.iter().filter_map(|p| p.ms_per_token_ewma).collect();
    let ms_per_token = if per_token.is_empty() {
        None
    } else {
        Some(per_token.iter().sum::<f64>() / per_token.len() as f64)
    };
    if rate <= 0.0 {
        // nothing measured yet (no pool serving): advise a short retry
        return Estimate {
            predicted_start_ms: 0,
            retry_after_ms: 1000,
            ms_per_token,
        };
    }
    let ahead = (position + 1).saturating_sub(free) as f64;
    Estimate {
        predicted_start_ms: (ahead / rate).ceil() as u64,
        retry_after_ms: (1.0 / rate).ceil().max(1.0) as u64,
        ms_per_token,
    }
}

/// Rough probability of finishing by the deadline: the ratio of time left to time needed,
/// capped at 1 (1.0 when there is no deadline or nothing is measured).
pub fn on_time_probability(
    remaining_ms: Option<u64>,
    tokens_left: usize,
    ms_per_token: Option<f64>,
) -> f64 {
    match (remaining_ms, ms_per_token) {
        (Some(left), Some(t)) if tokens_left > 0 && t > 0.0 => {
            (left as f64 / (tokens_left as f64 * t)).clamp(0.0, 1.0)
        }
        (Some(0), _) => 0.0,
        _ => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pool_manager::PoolState;

    fn pool(
        slots: usize,
        busy: usize,
        service: Option<f64>,
        per_token: Option<f64>,
    ) -> PoolSnapshot {
        PoolSnapshot {
            id: "p".into(),
            state: PoolState::Ready,
            descriptor: None,
            model_alias: "m".into(),
            slots_total: slots,
            slots_busy: busy,
            engine_load: None,
            last_error: None,
            engine_alive: true,
            tasks_started: 0,
            tasks_finished: 0,
            reloads_ok: 0,
            reloads_failed: 0,
            restarts: 0,
            model_load_ms: 0,
            service_ms_ewma: service,
            ms_per_token_ewma: per_token,
            drain_deadline_remaining_ms: None,
            consecutive_failures: 0,
            last_tokens_per_s: None,
            prompt_tokens_reused: 0,
            prompt_cache_bytes: 0,
        }
    }

    #[test]
    fn free_slot_means_no_wait() {
        let e = estimate(0, &[pool(2, 1, Some(1000.0), None)], 64);
        assert_eq!(e.predicted_start_ms, 0);
    }

    #[test]
    fn wait_grows_with_position_and_service_time() {
        let pools = [pool(2, 2, Some(1000.0), None)];
        let a = estimate(0, &pools, 64);
        let b = estimate(3, &pools, 64);
        assert_eq!(a.predicted_start_ms, 500); // 2 slots each finishing per 1000 ms
        assert_eq!(b.predicted_start_ms, 2000);
        assert_eq!(a.retry_after_ms, 500);
        let slower = estimate(0, &[pool(2, 2, Some(3000.0), None)], 64);
        assert!(slower.predicted_start_ms > a.predicted_start_ms);
    }

    #[test]
    fn per_token_rate_seeds_the_estimate_before_any_task_finished() {
        let e = estimate(0, &[pool(1, 1, None, Some(10.0))], 100);
        assert_eq!(e.predicted_start_ms, 1000);
    }

    #[test]
    fn on_time_probability_is_bounded() {
        assert_eq!(on_time_probability(None, 10, Some(5.0)), 1.0);
        assert_eq!(on_time_probability(Some(1000), 10, Some(5.0)), 1.0);
        assert!((on_time_probability(Some(25), 10, Some(5.0)) - 0.5).abs() < 1e-9);
    }
}
