//! SentencePiece vocabularies (GGUF `tokenizer.ggml.model = "llama"`: Gemma's, Llama 2's,
//! Mistral's) as a `tokenizers` BPE. llama.cpp's SPM tokenizer starts from the text's
//! characters and keeps merging the neighbouring pair whose joined text is a token with the
//! highest score; characters that are no token fall back to `<0xXX>` byte tokens. A BPE whose
//! merges are every split of every token into two tokens, ranked by the joined token's score,
//! does the same (what Hugging Face's SentencePiece converter builds). Spaces are `▁`.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use tokenizers::models::bpe::BPE;

use crate::error::{EngineError, Result};

/// GGUF token types (llama.cpp `llama_token_type`).
pub(crate) const TOKEN_TYPE_NORMAL: i32 = 1;
pub(crate) const TOKEN_TYPE_CONTROL: i32 = 3;
pub(crate) const TOKEN_TYPE_BYTE: i32 = 6;

/// SentencePiece's visible space.
pub(crate) const SPACE: char = '▁';

pub(crate) fn f32_array(md: &HashMap<String, Value>, key: &str) -> Option<Vec<f32>> {
    let Some(Value::Array(items)) = md.get(key) else {
        return None;
    };
    items
        .iter()
        .map(|v| match v {
            Value::F32(x) => Some(*x),
            Value::F64(x) => Some(*x as f32),
            _ => None,
        })
        .collect()
}

/// The BPE of a SentencePiece vocabulary. Control tokens are never the result of a merge:
/// `<eos>` written in a client's text stays the characters it is.
pub(crate) fn model(tokens: &[&str], scores: &[f32], types: &[i32]) -> Result<BPE> {
    if scores.len() != tokens.len() {
        return Err(EngineError::Tokenizer(format!(
            "{} scores for {} tokens",
            scores.len(),
            tokens.len()
        )));
    }
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    let ty = |i: usize| types.get(i).copied().unwrap_or(TOKEN_TYPE_NORMAL);
    // (score of the joined token, its id, split point in bytes)
    let mut ranked: Vec<(f32, u32, usize)> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if ty(i) == TOKEN_TYPE_CONTROL || ty(i) == TOKEN_TYPE_BYTE {
            continue;
        }
        for (at, _) in t.char_indices().skip(1) {
            let (a, b) = t.split_at(at);
            let joinable = |s: &str| {
                vocab
                    .get(s)
                    .is_some_and(|&j| ty(j as usize) != TOKEN_TYPE_CONTROL)
            };
            if joinable(a) && joinable(b) {
                ranked.push((scores[i], i as u32, at));
            }
        }
    }
    // highest score first; ties by id, then by split, so the order never depends on hashing
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    let merges: Vec<(String, String)> = ranked
        .into_iter()
        .map(|(_, i, at)| {
            let (a, b) = tokens[i as usize].split_at(at);
            (a.to_string(), b.to_string())
        })
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true);
    if let Some(unk) = tokens
        .iter()
        .enumerate()
        .find(|(i, t)| **t == "<unk>" || types.get(*i) == Some(&2))
    {
        builder = builder.unk_token(unk.1.to_string()).fuse_unk(true);
    }
    builder
        .build()
        .map_err(|e| EngineError::Tokenizer(format!("SentencePiece BPE: {e}")))
}

/// The bytes a SentencePiece token stands for: `▁` as a space, `<0xXX>` as its byte.
pub(crate) fn token_bytes(token: &str, ty: i32) -> Vec<u8> {
    if ty == TOKEN_TYPE_BYTE {
        if let Some(b) = token
            .strip_prefix("<0x")
            .and_then(|h| h.strip_suffix('>'))
            .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            return vec![b];
        }
    }
    token.replace(SPACE, " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::Tokenizer;

    /// A toy vocabulary: the merges follow the joined token's score, not the order of pairs.
    #[test]
    fn merges_follow_the_joined_tokens_score() {
        let tokens = [
            "<unk>", "<0x41>", "a", "b", "c", "ab", "bc", "abc", "▁", "▁a",
        ];
        let mut types = vec![TOKEN_TYPE_NORMAL; tokens.len()];
        types[0] = 2;
        types[1] = TOKEN_TYPE_BYTE;
        // "bc" outranks "ab": "abc" → a + bc → abc; "abb" → ab + b
        let scores = [0.0, 0.0, -1.0, -1.0, -1.0, -5.0, -3.0, -4.0, -1.0, -2.0];
        let bpe = model(&tokens, &scores, &types).unwrap();
        let t = Tokenizer::new(bpe);
        let ids = |s: &str| t.encode_fast(s, false).unwrap().get_ids().to_vec();
        assert_eq!(ids("abc"), vec![7]);
        assert_eq!(ids("abb"), vec![5, 3]);
        assert_eq!(ids("bca"), vec![6, 2]);
        assert_eq!(
            ids("A"),
            vec![1],
            "a character outside the vocabulary falls back to bytes"
        );
        assert_eq!(token_bytes("<0x41>", TOKEN_TYPE_BYTE), b"A");
        assert_eq!(token_bytes("▁a", TOKEN_TYPE_NORMAL), b" a");
    }
}
