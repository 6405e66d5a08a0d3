//! Constrained decoding (structured output) with llguidance, the library llama.cpp, vLLM and
//! SGLang use: a grammar (a JSON Schema, any JSON object, or a Lark grammar) is compiled once
//! against the model's vocabulary, and at every step of a constrained sequence the tokens that
//! would leave the language are masked before sampling. Unconstrained sequences pay nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

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
    compiled: Mutex<VecDeque<(OutputConstraint, Matcher)>>,
}

fn invalid(c: &OutputConstraint, why: impl std::fmt::Display) -> EngineError {
    EngineError::Constraint(format!("{}: {why}", c.field()))
}

impl Grammars {
    pub fn new(tokenizer: Arc<GgufTokenizer>) -> Self {
        Self {
            tokenizer,
            factory: OnceLock::new(),
            compiled: Mutex::new(VecDeque::new()),
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
            Ok(factory)
        });
        built
            .as_ref()
            .map_err(|e| EngineError::Tokenizer(format!("constrained decoding: {e}")))
    }

    /// A fresh matcher for `c`: compiled once, then cloned from the compiled one.
    pub fn matcher(&self, c: &OutputConstraint) -> Result<Constrained> {
        let eos = self.tokenizer.stop_ids().to_vec();
        {
            let mut known = self.lock();
            if let Some(i) = known.iter().position(|(k, _)| k == c) {
                if let Some(hit) = known.remove(i) {
                    let fresh = hit.1.deep_clone();
                    known.push_front(hit);
                    return Ok(Constrained::new(fresh, eos));
                }
            }
        }
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
        let fresh = matcher.deep_clone();
        let mut known = self.lock();
        known.push_front((c.clone(), matcher));
        known.truncate(REMEMBERED);
        Ok(Constrained::new(fresh, eos))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(OutputConstraint, Matcher)>> {
        self.compiled.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One sequence's constraint: where it stands in the grammar.
pub struct Constrained {
    matcher: Matcher,
    /// The model's end tokens: allowed exactly when the grammar may end.
    stop_ids: Vec<u32>,
}

impl Constrained {
    fn new(matcher: Matcher, stop_ids: Vec<u32>) -> Self {
        Self { matcher, stop_ids }
    }

    /// Masks `logits` in place: every token the grammar does not allow next gets −∞; the end
    /// tokens keep their logits when the grammar may end here.
    pub fn mask(&mut self, logits: &mut [f32]) -> std::result::Result<(), String> {
        let allowed = self.matcher.compute_mask().map_err(|e| e.to_string())?;
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
            return Err("the grammar allows no token here".into());
        }
        Ok(())
    }

    /// Moves the grammar past the sampled token.
    pub fn consume(&mut self, token: u32) -> std::result::Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Moves the grammar past tokens already produced.
    pub fn consume_all(&mut self, tokens: &[u32]) -> std::result::Result<(), String> {
        self.matcher
            .consume_tokens(tokens)
            .map_err(|e| e.to_string())
    }

    /// The grammar is complete and allows nothing more.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}
