//! Grammars have a budget (ISO-4, ISO-5): a constraint whose compile would cost more time or
//! memory than its budget, or that cannot make progress from its first step, is refused when
//! compiled — with a readable reason naming the field and no internal state — and never
//! reaches the decode loop.

mod common;

use std::time::{Duration, Instant};

use engine_candle::EngineError;
use engine_port::OutputConstraint;

fn schema(v: serde_json::Value) -> OutputConstraint {
    OutputConstraint::JsonSchema(v.to_string())
}

/// What a refused constraint says: the error's text.
fn refused(c: &OutputConstraint) -> (String, Duration) {
    let e = common::engine();
    let t0 = Instant::now();
    let out = e.constrain(c);
    let took = t0.elapsed();
    match out {
        Err(EngineError::Constraint(m)) => (m, took),
        Err(other) => panic!("not a constraint error: {other}"),
        Ok(_) => panic!("compiled: {c:?}"),
    }
}

fn assert_readable(m: &str, field: &str) {
    assert!(m.starts_with(&format!("{field}: ")), "{m}");
    for internal in [
        "<state>",
        "<grammar>",
        "compute_time_us",
        "NoExtensionBias",
        "\n",
    ] {
        assert!(!m.contains(internal), "internal state in {m:?}");
    }
    assert!(m.len() < 400, "{} bytes: {m}", m.len());
}

/// ISO-4: a costly regular expression is refused within its budget (about a second at most),
/// not compiled and then followed at 70 ms a token in the decode loop; the refusal is
/// remembered (the same schema again costs nothing).
#[test]
fn a_costly_pattern_is_refused_within_its_budget() {
    for n in [3, 17, 50] {
        let c = schema(serde_json::json!({
            "type": "object",
            "properties": {"s": {"type": "string", "pattern": format!("^((a{{100}}){{100}}){{{n}}}$")}},
            "required": ["s"]
        }));
        let (m, took) = refused(&c);
        assert_readable(&m, "json_schema");
        assert!(m.contains("too costly"), "{m}");
        assert!(took < Duration::from_secs(3), "{n}: {took:?}");
        let (again, took) = refused(&c);
        assert_eq!(again, m);
        assert!(took < Duration::from_millis(50), "remembered: {took:?}");
    }
}

/// ISO-5: schemas and grammars that compile but cannot take a first step are refused when
/// compiled, with a reason.
#[test]
fn constraints_that_cannot_start_are_refused_with_a_reason() {
    let cases = [
        schema(serde_json::json!({"$ref": "#"})),
        schema(
            serde_json::json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        ),
    ];
    for c in &cases {
        let (m, _) = refused(c);
        assert_readable(&m, "json_schema");
    }
    let (m, _) = refused(&OutputConstraint::Grammar("start: a\na: a\n".into()));
    assert_readable(&m, "grammar");
}

/// A usual schema still compiles, and fast the second time (remembered).
#[test]
fn a_usual_schema_compiles() {
    let e = common::engine();
    let c = schema(
        serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    );
    e.constrain(&c).unwrap();
    let t0 = Instant::now();
    e.constrain(&c).unwrap();
    assert!(t0.elapsed() < Duration::from_millis(200));
}
