//! A request's `keep_alive` (Ollama's): how long its on-demand model stays loaded once idle
//! (MOD-FOLDER-6). A number is seconds; a string is a duration (`"5m"`, `"1h30m"`, `"90s"`,
//! or a bare number of seconds); `0` unloads the model as soon as it is idle; a negative
//! value keeps it loaded until the memory budget needs the room or an operator drains it.

use std::time::Duration;

/// How long an idle on-demand model stays loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    For(Duration),
    Forever,
}

/// Reads a `keep_alive` value; the error says what is accepted.
pub fn parse(v: &serde_json::Value) -> Result<KeepAlive, String> {
    let bad = || {
        format!(
            "keep_alive must be a number of seconds or a duration such as \"5m\" (negative: stay loaded), not {v}"
        )
    };
    let secs = match v {
        serde_json::Value::Number(n) => n.as_f64().ok_or_else(bad)?,
        serde_json::Value::String(s) => {
            let s = s.trim();
            if let Ok(n) = s.parse::<f64>() {
                n
            } else if let Some(rest) = s.strip_prefix('-') {
                humantime::parse_duration(rest).map_err(|_| bad())?;
                -1.0
            } else {
                humantime::parse_duration(s)
                    .map_err(|_| bad())?
                    .as_secs_f64()
            }
        }
        _ => return Err(bad()),
    };
    if !secs.is_finite() {
        return Err(bad());
    }
    if secs < 0.0 {
        return Ok(KeepAlive::Forever);
    }
    Ok(KeepAlive::For(Duration::from_secs_f64(secs.min(1e9))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// MOD-FOLDER-6: Ollama's forms of `keep_alive`.
    #[test]
    fn numbers_durations_zero_and_negative() {
        let secs = |s: u64| Ok(KeepAlive::For(Duration::from_secs(s)));
        assert_eq!(parse(&json!(0)), secs(0));
        assert_eq!(parse(&json!(30)), secs(30));
        assert_eq!(parse(&json!("5m")), secs(300));
        assert_eq!(parse(&json!("1h30m")), secs(5400));
        assert_eq!(parse(&json!("45")), secs(45));
        assert_eq!(parse(&json!(-1)), Ok(KeepAlive::Forever));
        assert_eq!(parse(&json!("-1m")), Ok(KeepAlive::Forever));
        for bad in [json!("soon"), json!(true), json!([1])] {
            assert!(parse(&bad).unwrap_err().contains("keep_alive"), "{bad}");
        }
    }
}
