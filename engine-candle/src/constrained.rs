//! Constrained decoding (structured output) with llguidance, the library llama.cpp, vLLM and
//! SGLang use: a grammar (a JSON Schema, any JSON object, or a Lark grammar) is compiled once
//! against the model's vocabulary, and at every step of a constrained sequence the tokens that
//! would leave the language are masked before sampling. Unconstrained sequences pay nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use engine_port::OutputConstraint;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

use crate::error::{EngineError, Result};
use crate::tokenizer::GgufTokenizer;

/// Compiled grammars an engine remembers (the most recently used).
const REMEMBERED: usize = 32;

/// The model's vocabulary as llguidance reads it.
struct VocabEnv {
    trie: TokTrie,
    tokenizer: Arc<GgufTokenizer>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        // text inside a grammar is the client's: never parsed for control tokens
        self.tokenizer
            .encode_plain(&String::from_utf8_lossy(s))
            .unwrap_or_default()
    }
}

/// `schema` with llguidance's option for compact JSON (`{"a": 1, "b": [2, 3]}`: one space
/// after `:` and `,`, no newlines) unless the schema sets its own `x-guidance`: a small model
/// given free whitespace wanders in it, spending tokens on blank lines.
fn compact(schema: serde_json::Value) -> std::result::Result<serde_json::Value, &'static str> {
    let mut schema = match schema {
        serde_json::Value::Bool(true) => serde_json::json!({}),
        serde_json::Value::Object(o) => serde_json::Value::Object(o),
        _ => return Err("a JSON Schema is an object (or true)"),
    };
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    Ok(schema)
}

/// An engine's grammar compiler and the grammars it compiled.
pub struct Grammars {
    tokenizer: Arc<GgufTokenizer>,
    /// Built on the first constrained request (it walks the whole vocabulary).
    factory: OnceLock<std::result::Result<ParserFactory, String>>,
    compiled: Mutex<Remembered>,
}

/// The constraints compiled last, and those refused last with their reason (a client that
/// sends a costly schema again is refused without spending its budget again).
#[derive(Default)]
struct Remembered {
    compiled: VecDeque<(OutputConstraint, Matcher)>,
    refused: VecDeque<(OutputConstraint, String)>,
}

fn invalid(c: &OutputConstraint, why: impl std::fmt::Display) -> EngineError {
    EngineError::Constraint(format!("{}: {}", c.field(), readable(&why.to_string())))
}

/// The budget of a grammar (ISO-4), tighter than llguidance's defaults, which let one regular
/// expression take seconds and hundreds of MB to compile: what compiling it may spend (lexer
/// fuel: ~50 000 a ms; lexer states: 1-2 kB each) and what one token's mask may (~14 000 a ms
/// of lexer fuel, ~20 000 Earley items a ms). Fuel does not count every cost (following a
/// large automaton over the vocabulary is free of it: 70 ms a token for one pattern), so the
/// CPU time of a mask is budgeted too: the first, computed when the constraint is compiled
/// on a request's thread, and every one after it in the decode loop, where a constrained
/// sequence's mask holds up every sequence of the batch. The JSON Schemas and grammars users
/// send (tools, extraction) take a tenth of it or less (measured: a first mask of 0.1-2 ms,
/// then 0.07-0.6 ms a token; the costly pattern of ISO-4 70 ms a token; an object that
/// requires itself 26 ms). Errors never carry the parser's state or the grammar.
pub const LEXER_STATES: usize = 20_000;
pub const COMPILE_FUEL: u64 = 500_000;
pub const STEP_FUEL: u64 = 100_000;
pub const STEP_ITEMS: usize = 20_000;
/// CPU time the first mask (with the lexer it builds) may take, at compile.
pub const FIRST_MASK_BUDGET: Duration = Duration::from_millis(20);
/// CPU time any later mask may take in the decode loop.
pub const STEP_MASK_BUDGET: Duration = Duration::from_millis(10);

fn budget(l: &mut llguidance::api::ParserLimits) {
    l.verbose_errors = false;
    l.max_lexer_states = LEXER_STATES;
    l.initial_lexer_fuel = COMPILE_FUEL;
    l.step_lexer_fuel = STEP_FUEL;
    l.step_max_items = STEP_ITEMS;
    // large patterns are followed when a mask needs them (under the step budget), not run
    // over the whole vocabulary while compiling
    l.precompute_large_lexemes = false;
}

/// A reason a client can read from what llguidance said: its first line, with the names of its
/// stop reasons said in words.
fn readable(e: &str) -> String {
    let first = e
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && *l != "<non-verbose/>")
        .unwrap_or("it cannot be used");
    let words = [
        (
            "NoExtensionBias",
            "no output can satisfy it (a rule that refers only to itself, or never ends)",
        ),
        ("NoExtension", "no output can satisfy it"),
        (
            "LexerTooComplex",
            "it is too costly to follow (a pattern with too many repetitions or alternatives)",
        ),
        (
            "ParserTooComplex",
            "it is too costly to follow (too many alternatives at once)",
        ),
        ("InternalError", "it could not be followed"),
    ];
    for (name, said) in words {
        if first.contains(name) {
            return said.to_string();
        }
    }
    if first.contains("fuel") || first.contains("lexer states") || first.contains("too many") {
        return format!("it is too costly to compile ({first})");
    }
    first.chars().take(300).collect()
}

/// CPU time the calling thread has used (a mask's cost whatever else runs on the machine).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a plain syscall writing into the timespec given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Remembered compiled and refused constraints, each.
const REMEMBERED_REFUSALS: usize = 32;

impl Grammars {
    pub fn new(tokenizer: Arc<GgufTokenizer>) -> Self {
        Self {
            tokenizer,
            factory: OnceLock::new(),
            compiled: Mutex::new(Remembered::default()),
        }
    }

    fn factory(&self) -> Result<&ParserFactory> {
        let built = self.factory.get_or_init(|| {
            let tok = &self.tokenizer;
            let eos = *tok
                .stop_ids()
                .first()
                .ok_or("the model has no end-of-sequence token")?;
            let words: Vec<Vec<u8>> = (0..tok.vocab_size() as u32)
                .map(|id| match tok.token_bytes(id) {
                    // control tokens: llguidance's special-token marker, never text
                    [] => {
                        let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                        w.extend(tok.token_text(id).unwrap_or_default().into_bytes());
                        w
                    }
                    b => b.to_vec(),
                })
                .collect();
            let info = TokRxInfo::new(words.len() as u32, eos);
            let env: TokEnv = Arc::new(VocabEnv {
                trie: TokTrie::from(&info, &words),
                tokenizer: tok.clone(),
            });
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            factory.quiet();
            budget(factory.limits_mut());
            Ok(factory)
        });
        built
            .as_ref()
            .map_err(|e| EngineError::Tokenizer(format!("constrained decoding: {e}")))
    }

    /// A fresh matcher for `c`: compiled once (its first mask computed within its budget),
    /// then cloned from the compiled one; a refusal is remembered too.
    pub fn matcher(&self, c: &OutputConstraint) -> Result<Constrained> {
        let eos = self.tokenizer.stop_ids().to_vec();
        {
            let mut known = self.lock();
            if let Some(i) = known.compiled.iter().position(|(k, _)| k == c) {
                if let Some(hit) = known.compiled.remove(i) {
                    let fresh = hit.1.deep_clone();
                    known.compiled.push_front(hit);
                    return Ok(Constrained::new(fresh, eos, c.field()));
                }
            }
            if let Some((_, why)) = known.refused.iter().find(|(k, _)| k == c) {
                return Err(EngineError::Constraint(why.clone()));
            }
        }
        match self.compile(c) {
            Ok(matcher) => {
                let fresh = matcher.deep_clone();
                let mut known = self.lock();
                known.compiled.push_front((c.clone(), matcher));
                known.compiled.truncate(REMEMBERED);
                Ok(Constrained::new(fresh, eos, c.field()))
            }
            Err(EngineError::Constraint(why)) => {
                let mut known = self.lock();
                known.refused.push_front((c.clone(), why.clone()));
                known.refused.truncate(REMEMBERED_REFUSALS);
                Err(EngineError::Constraint(why))
            }
            Err(other) => Err(other),
        }
    }

    /// Compiles `c` and takes its first step on a copy: a grammar that cannot take it, or
    /// whose first mask costs more than [`FIRST_MASK_BUDGET`], is the client's mistake,
    /// refused here and not met by the decode loop (ISO-4, ISO-5).
    fn compile(&self, c: &OutputConstraint) -> Result<Matcher> {
        let grammar = match c {
            OutputConstraint::JsonSchema(text) => {
                let schema: serde_json::Value =
                    serde_json::from_str(text).map_err(|e| invalid(c, format!("not JSON: {e}")))?;
                TopLevelGrammar::from_json_schema(compact(schema).map_err(|why| invalid(c, why))?)
            }
            OutputConstraint::Grammar(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let parser = self
            .factory()?
            .create_parser(grammar)
            .map_err(|e| invalid(c, e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid(c, e));
        }
        let mut first = matcher.deep_clone();
        let spent = thread_cpu();
        let mask = first.compute_mask().map_err(|e| invalid(c, e))?;
        let took = thread_cpu().saturating_sub(spent);
        if took > FIRST_MASK_BUDGET {
            return Err(invalid(
                c,
                format!(
                    "it is too costly to follow: its first step took {} ms of CPU, over the budget of {} ms (many repetitions, alternatives or nested references)",
                    took.as_millis(),
                    FIRST_MASK_BUDGET.as_millis()
                ),
            ));
        }
        if mask.is_zero() && !first.is_accepting().unwrap_or(false) {
            return Err(invalid(c, "no output can satisfy it"));
        }
        Ok(matcher)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.compiled.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why a constrained sequence had to stop: its request's field and a reason it can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConstraintFailure {
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for ConstraintFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// One sequence's constraint: where it stands in the grammar.
pub struct Constrained {
    matcher: Matcher,
    /// The model's end tokens: allowed exactly when the grammar may end.
    stop_ids: Vec<u32>,
    /// The request field it came from (`json_schema`, `grammar`).
    field: &'static str,
}

impl Constrained {
    fn new(matcher: Matcher, stop_ids: Vec<u32>, field: &'static str) -> Self {
        Self {
            matcher,
            stop_ids,
            field,
        }
    }

    fn failure(&self, why: impl std::fmt::Display) -> ConstraintFailure {
        ConstraintFailure {
            field: self.field,
            message: readable(&why.to_string()),
        }
    }

    /// Masks `logits` in place: every token the grammar does not allow next gets −∞; the end
    /// tokens keep their logits when the grammar may end here. A mask that costs more than
    /// [`STEP_MASK_BUDGET`] of CPU ends the sequence: it would hold up the whole batch.
    pub fn mask(&mut self, logits: &mut [f32]) -> std::result::Result<(), ConstraintFailure> {
        let spent = thread_cpu();
        let allowed = self.matcher.compute_mask().map_err(|e| self.failure(e))?;
        let took = thread_cpu().saturating_sub(spent);
        if took > STEP_MASK_BUDGET {
            return Err(self.failure(format!(
                "it is too costly to follow: a step took {} ms of CPU, over the budget of {} ms",
                took.as_millis(),
                STEP_MASK_BUDGET.as_millis()
            )));
        }
        let eos = self.stop_ids.first().copied();
        let may_end = eos.is_some_and(|e| allowed.is_allowed(e));
        let ends: Vec<(usize, f32)> = self
            .stop_ids
            .iter()
            .filter_map(|&s| logits.get(s as usize).map(|l| (s as usize, *l)))
            .collect();
        allowed.iter_unset_entries(|i| {
            if let Some(l) = logits.get_mut(i) {
                *l = f32::NEG_INFINITY;
            }
        });
        for l in logits.iter_mut().skip(allowed.len()) {
            *l = f32::NEG_INFINITY;
        }
        if may_end {
            for (i, l) in ends {
                logits[i] = l;
            }
        }
        if !logits.iter().any(|l| l.is_finite()) {
            return Err(self.failure("no output can satisfy it from here"));
        }
        Ok(())
    }

    /// Moves the grammar past the sampled token.
    pub fn consume(&mut self, token: u32) -> std::result::Result<(), ConstraintFailure> {
        self.matcher
            .consume_token(token)
            .map_err(|e| self.failure(e))
    }

    /// Moves the grammar past tokens already produced.
    pub fn consume_all(&mut self, tokens: &[u32]) -> std::result::Result<(), String> {
        self.matcher
            .consume_tokens(tokens)
            .map_err(|e| readable(&e.to_string()))
    }

    /// The grammar is complete and allows nothing more.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}
