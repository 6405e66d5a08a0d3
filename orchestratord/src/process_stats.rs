//! This process's resident memory and CPU time, read from `/proc` (Linux; `None` elsewhere).

use std::time::Duration;

/// Resident set size in bytes (`VmRSS` of `/proc/self/status`).
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// User + system CPU time of the process (`/proc/self/stat` fields 14 and 15, in the kernel's
/// fixed 100 Hz `USER_HZ` units).
pub fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // the command name may hold spaces or ')': fields restart after the last ')'
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime field 15
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Average CPU use since `uptime` began, as a percentage of all cores.
pub fn cpu_percent_since_start(uptime: Duration) -> Option<f64> {
    let cpu = cpu_time()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let wall = uptime.as_secs_f64() * cores as f64;
    (wall > 0.0).then(|| (cpu.as_secs_f64() / wall * 100.0).min(100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_on_linux() {
        if cfg!(target_os = "linux") {
            let rss = resident_bytes().unwrap();
            assert!(
                rss > 1 << 20,
                "a running test binary has more than 1 MiB resident"
            );
            // burn a little CPU so the counter moves past its 10 ms resolution
            let start = std::time::Instant::now();
            let mut x = 0u64;
            while start.elapsed() < Duration::from_millis(60) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            assert!(cpu_time().unwrap() >= Duration::from_millis(20));
        }
    }
}
