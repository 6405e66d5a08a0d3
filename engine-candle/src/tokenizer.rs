//! The tokenizer of a GGUF (`tokenizer.ggml.*`), no hub access: byte-level BPE (`gpt2`:
//! SmolLM, Llama 3, Qwen), SentencePiece (`llama`: Gemma, see `spm_vocab.rs`) or WordPiece
//! (`bert`: BERT's encoders, from llama.cpp's "phantom space" vocabulary).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as Normalizers};
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{EngineError, Result};
use crate::hparams::{md_str, md_u32};
use crate::spm_vocab::{self, TOKEN_TYPE_CONTROL};

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The split regex of Llama 3 style tokenizers (`pre = llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The split regex of Qwen2 tokenizers (`pre = qwen2`): digits one at a time.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Tokenizer plus the per-token byte table used for incremental detokenization.
pub struct GgufTokenizer {
    inner: Tokenizer,
    /// The same tokenizer with special-token parsing off: `<|im_end|>` written in a client's
    /// text is encoded as the characters it is, never as the control token.
    plain: Tokenizer,
    /// Raw bytes of every token id; empty for control tokens (never shown as text).
    token_bytes: Vec<Vec<u8>>,
    /// Ids that end a generation (EOS, end-of-turn, end-of-text).
    stop_ids: Vec<u32>,
    bos_id: Option<u32>,
    add_bos: bool,
    pre: String,
}

fn ids_of(t: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    let enc = t
        .encode_fast(text, false)
        .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
    Ok(enc.get_ids().to_vec())
}

fn str_array<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<Vec<&'a str>> {
    let Some(Value::Array(items)) = md.get(key) else {
        return Err(EngineError::Tokenizer(format!("metadata {key} is missing")));
    };
    items
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.as_str()),
            _ => Err(EngineError::Tokenizer(format!("{key} holds a non-string"))),
        })
        .collect()
}

fn i32_array(md: &HashMap<String, Value>, key: &str) -> Option<Vec<i32>> {
    let Some(Value::Array(items)) = md.get(key) else {
        return None;
    };
    items
        .iter()
        .map(|v| match v {
            Value::I32(x) => Some(*x),
            Value::U32(x) => i32::try_from(*x).ok(),
            _ => None,
        })
        .collect()
}

/// GPT-2's reversible byte <-> printable character table.
fn byte_level_alphabet() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = ('!' as u32..='~' as u32).collect();
    printable.extend('¡' as u32..='¬' as u32);
    printable.extend('®' as u32..='ÿ' as u32);
    let mut map = HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0u32..256 {
        let c = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        if let Some(ch) = char::from_u32(c) {
            map.insert(ch, b as u8);
        }
    }
    map
}

fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let byte_level_regex = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
    let byte_level_plain = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false));
    let split = |re: &str| -> Result<PreTokenizerWrapper> {
        Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map(PreTokenizerWrapper::Split)
        .map_err(|e| EngineError::Tokenizer(format!("split regex: {e}")))
    };
    Ok(match pre {
        // SmolLM: every digit alone, then GPT-2 byte-level splitting without a prefix space.
        "smollm" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            byte_level_regex(),
        ])),
        "gpt2" | "default" => byte_level_regex(),
        "llama-bpe" | "llama3" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![split(LLAMA3_SPLIT)?, byte_level_plain()]))
        }
        "qwen2" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![split(QWEN2_SPLIT)?, byte_level_plain()]))
        }
        other => {
            return Err(EngineError::Unsupported(format!(
                "tokenizer pre-tokenizer {other:?} (supported: smollm, gpt2, default, llama-bpe, qwen2)"
            )))
        }
    })
}

/// A byte-level BPE (`tokenizer.ggml.model = "gpt2"`) and the bytes of each token.
fn byte_level(
    md: &HashMap<String, Value>,
    tokens: &[&str],
    pre: &str,
) -> Result<(Tokenizer, Vec<Vec<u8>>)> {
    let merges = str_array(md, "tokenizer.ggml.merges")?;
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    let merges: Vec<(String, String)> = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| EngineError::Tokenizer(format!("malformed merge {m:?}")))
        })
        .collect::<Result<_>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| EngineError::Tokenizer(format!("BPE: {e}")))?;
    let mut inner = Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    let alphabet = byte_level_alphabet();
    let bytes = tokens
        .iter()
        .map(|tok| {
            let b: Option<Vec<u8>> = tok.chars().map(|c| alphabet.get(&c).copied()).collect();
            b.unwrap_or_else(|| tok.as_bytes().to_vec())
        })
        .collect();
    Ok((inner, bytes))
}

/// A SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`) and the bytes of each token:
/// spaces become `▁`, with one before the text when `add_space_prefix` (llama.cpp's default).
fn sentencepiece(
    md: &HashMap<String, Value>,
    tokens: &[&str],
    types: &[i32],
) -> Result<(Tokenizer, Vec<Vec<u8>>)> {
    let scores = spm_vocab::f32_array(md, "tokenizer.ggml.scores")
        .ok_or_else(|| EngineError::Tokenizer("tokenizer.ggml.scores is missing".into()))?;
    let mut inner = Tokenizer::new(spm_vocab::model(tokens, &scores, types)?);
    let space = Replace::new(" ", spm_vocab::SPACE.to_string())
        .map_err(|e| EngineError::Tokenizer(format!("normalizer: {e}")))?;
    let prefix = !matches!(
        md.get("tokenizer.ggml.add_space_prefix"),
        Some(Value::Bool(false))
    );
    let normalizer = if prefix {
        NormalizerWrapper::Sequence(Normalizers::new(vec![
            NormalizerWrapper::Prepend(Prepend::new(spm_vocab::SPACE.to_string())),
            NormalizerWrapper::Replace(space),
        ]))
    } else {
        NormalizerWrapper::Replace(space)
    };
    inner
        .with_normalizer(Some(normalizer))
        .map_err(|e| EngineError::Tokenizer(format!("normalizer: {e}")))?;
    let bytes = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| spm_vocab::token_bytes(t, types.get(i).copied().unwrap_or(1)))
        .collect();
    Ok((inner, bytes))
}

/// WordPiece as llama.cpp stores BERT's vocabulary: a word's first piece written with a leading
/// U+2581, a continuation without BERT's `##`, control tokens as they are. Text is cleaned,
/// lowercased with accents stripped and split at whitespace and punctuation (CJK characters
/// alone) before the pieces are matched, as BERT's uncased tokenizers and llama.cpp's WPM do.
fn wordpiece(tokens: &[&str], types: &[i32]) -> Result<(Tokenizer, Vec<Vec<u8>>)> {
    let mut vocab = ahash::AHashMap::with_capacity(tokens.len());
    let mut bytes = Vec::with_capacity(tokens.len());
    for (i, tok) in tokens.iter().enumerate() {
        let control = types.get(i).copied() == Some(TOKEN_TYPE_CONTROL);
        let (piece, text) = match tok.strip_prefix(spm_vocab::SPACE) {
            _ if control => (tok.to_string(), Vec::new()),
            Some(word) => (word.to_string(), format!(" {word}").into_bytes()),
            None => (format!("##{tok}"), tok.as_bytes().to_vec()),
        };
        vocab.entry(piece).or_insert(i as u32);
        bytes.push(text);
    }
    let unk = tokens
        .iter()
        .find(|t| **t == "[UNK]")
        .map_or("[UNK]".to_string(), |t| t.to_string());
    let model = WordPiece::builder()
        .vocab(vocab)
        .unk_token(unk)
        .continuing_subword_prefix("##".into())
        .build()
        .map_err(|e| EngineError::Tokenizer(format!("wordpiece: {e}")))?;
    let mut inner = Tokenizer::new(model);
    inner
        .with_normalizer(Some(NormalizerWrapper::BertNormalizer(
            BertNormalizer::new(true, true, None, true),
        )))
        .map_err(|e| EngineError::Tokenizer(format!("normalizer: {e}")))?;
    inner.with_pre_tokenizer(Some(PreTokenizerWrapper::BertPreTokenizer(
        BertPreTokenizer,
    )));
    Ok((inner, bytes))
}

impl GgufTokenizer {
    pub fn from_metadata(md: &HashMap<String, Value>) -> Result<Self> {
        let model = md_str(md, "tokenizer.ggml.model").unwrap_or("");
        let tokens = str_array(md, "tokenizer.ggml.tokens")?;
        let types = i32_array(md, "tokenizer.ggml.token_type").unwrap_or_default();
        let (pre, (mut inner, bytes)) = match model {
            "gpt2" => {
                let pre = md_str(md, "tokenizer.ggml.pre").unwrap_or("default");
                (pre.to_string(), byte_level(md, &tokens, pre)?)
            }
            "llama" => ("spm".to_string(), sentencepiece(md, &tokens, &types)?),
            "bert" => ("wpm".to_string(), wordpiece(&tokens, &types)?),
            other => {
                return Err(EngineError::Unsupported(format!(
                "tokenizer model {other:?} (supported: gpt2 byte-level BPE, llama SentencePiece, bert WordPiece)"
            )))
            }
        };
        let mut special = Vec::new();
        let mut token_bytes = Vec::with_capacity(tokens.len());
        for ((i, tok), b) in tokens.iter().enumerate().zip(bytes) {
            let ty = types.get(i).copied().unwrap_or(1);
            if ty == TOKEN_TYPE_CONTROL {
                special.push(AddedToken::from(tok.to_string(), true));
                token_bytes.push(Vec::new());
            } else if ty == TOKEN_TYPE_USER_DEFINED {
                special.push(AddedToken::from(tok.to_string(), false));
                token_bytes.push(b);
            } else {
                token_bytes.push(b);
            }
        }
        inner
            .add_special_tokens(special)
            .map_err(|e| EngineError::Tokenizer(format!("special tokens: {e}")))?;
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);

        let id = |key: &str| md_u32(md, key).ok();
        let mut stop_ids: Vec<u32> = Vec::new();
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
            if let Some(i) = id(key) {
                stop_ids.push(i);
            }
        }
        for name in [
            "<|endoftext|>",
            "<|im_end|>",
            "<|eot_id|>",
            "<|end_of_text|>",
            "<end_of_turn>",
        ] {
            if let Some(i) = tokens.iter().position(|t| *t == name) {
                stop_ids.push(i as u32);
            }
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let add_bos = matches!(
            md.get("tokenizer.ggml.add_bos_token"),
            Some(Value::Bool(true))
        );
        Ok(Self {
            inner,
            plain,
            token_bytes,
            stop_ids,
            bos_id: id("tokenizer.ggml.bos_token_id"),
            add_bos,
            pre,
        })
    }

    /// Token ids of `text`; special tokens written in the text are recognised. BOS first when
    /// the model wants it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids: Vec<u32> = self.bos().into_iter().collect();
        ids.extend(self.encode_markup(text)?);
        Ok(ids)
    }

    /// Token ids of text from a client: special tokens written in it are plain text, so no
    /// one can forge a turn or an end of text. No BOS is added (see [`Self::bos`]).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        ids_of(&self.plain, text)
    }

    /// Token ids of text the server itself wrote (a chat template's markup): special tokens
    /// are recognised. No BOS is added.
    pub fn encode_markup(&self, text: &str) -> Result<Vec<u32>> {
        ids_of(&self.inner, text)
    }

    /// The BOS id when the model wants one before every prompt.
    pub fn bos(&self) -> Option<u32> {
        self.bos_id.filter(|_| self.add_bos)
    }

    /// Text of `ids`, control tokens left out. Invalid UTF-8 is replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Text of `ids` with control tokens written out (`<|im_start|>`), as the prompt had them.
    pub fn decode_with_special(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            let b = self.token_bytes(id);
            if b.is_empty() {
                if let Some(t) = self.inner.id_to_token(id) {
                    bytes.extend_from_slice(t.as_bytes());
                }
            } else {
                bytes.extend_from_slice(b);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes one token stands for (empty for control tokens and unknown ids).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes
            .get(id as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.binary_search(&id).is_ok()
    }

    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The `tokenizer.ggml.pre` kind this tokenizer implements.
    pub fn pre_kind(&self) -> &str {
        &self.pre
    }

    /// The id of a token by its text in the vocabulary.
    pub fn id_of(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The text of a token as stored in the vocabulary (for special tokens in templates).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}
