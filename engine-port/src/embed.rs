//! Embeddings in the port's language: what to embed, how hidden states are pooled, and what
//! comes back. An embedding job is one request's inputs, run in one slot; the engine batches
//! the inputs of the jobs it holds together (micro-batching across requests), and an input's
//! vector never depends on what else shared its pass.

use tokio_util::sync::CancellationToken;

use crate::slots::SlotPermit;

/// How a sequence's last hidden states become its embedding (llama.cpp's `pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Pooling {
    /// One vector per token.
    None,
    /// The mean over the tokens.
    #[default]
    Mean,
    /// The first token's (BERT's `[CLS]`).
    Cls,
    /// The last token's.
    Last,
    /// The first token's through the model's classification head: relevance scores
    /// (rerankers).
    Rank,
}

impl Pooling {
    /// From llama.cpp's number (`{arch}.pooling_type`: 0 none, 1 mean, 2 cls, 3 last, 4 rank).
    pub fn from_gguf(n: u32) -> Option<Self> {
        Some(match n {
            0 => Self::None,
            1 => Self::Mean,
            2 => Self::Cls,
            3 => Self::Last,
            4 => Self::Rank,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::Last => "last",
            Self::Rank => "rank",
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "none" => Self::None,
            "mean" => Self::Mean,
            "cls" => Self::Cls,
            "last" => Self::Last,
            "rank" => Self::Rank,
            other => {
                return Err(format!(
                    "unknown pooling {other:?} (none | mean | cls | last | rank)"
                ))
            }
        })
    }
}

/// One input of an embedding request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbedInput {
    /// Text, tokenized as the model embeds text (BERT's `[CLS] … [SEP]`, a decoder's BOS).
    Text(String),
    /// Token ids as given.
    Tokens(Vec<u32>),
    /// A query and a document, scored together by a reranker.
    Pair { query: String, document: String },
}

impl EmbedInput {
    /// Its size in bytes (an id counts four), for budgets before a tokenizer ran.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Text(t) => t.len(),
            Self::Tokens(ids) => ids.len() * 4,
            Self::Pair { query, document } => query.len() + document.len(),
        }
    }
}

/// What an engine that embeds says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbedInfo {
    /// The length of its vectors.
    pub dims: usize,
    /// The pooling it uses when a request names none.
    pub pooling: Pooling,
    /// The most tokens one input may have.
    pub max_tokens: usize,
    /// Whether it can score pairs (a classification head: `Pooling::Rank`).
    pub ranks: bool,
}

/// One request's inputs to embed, in one slot.
pub struct EmbedJob {
    /// The slot it runs in (given back when the engine is done with the job).
    pub permit: SlotPermit,
    pub inputs: Vec<EmbedInput>,
    /// The inputs' token ids as admission counted them (`None`: the engine tokenizes, or
    /// takes text).
    pub tokens: Option<Vec<Vec<u32>>>,
    /// `None`: the model's own.
    pub pooling: Option<Pooling>,
    /// Scale each vector to unit length (not scores).
    pub normalize: bool,
    /// Fired when the request ends early: inputs not yet run are not run.
    pub cancel: CancellationToken,
}

/// Per input: its pooled vector (one), its tokens' vectors (`Pooling::None`), or its scores
/// (`Pooling::Rank`, one vector of the head's outputs).
pub type Embeddings = Vec<Vec<Vec<f32>>>;
