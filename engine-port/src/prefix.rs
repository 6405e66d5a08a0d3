//! What an engine holds of the prompts it saw, in a form placement can compare with a new
//! prompt without the tokens: chained hashes of fixed-size token blocks (vLLM's and llm-d's KV
//! events do the same with their page size). Block `k`'s hash covers its tokens and the hash of
//! block `k - 1`, so one hash stands for the whole prefix up to its block's end: a prompt whose
//! first `n` block hashes are all held shares at least `n` blocks with something the engine
//! holds.
//!
//! The hash is XXH3-64 (a specified algorithm: the same in every build and process, so remote
//! workers and other replicas can publish theirs), each block's tokens as little-endian `u32`s,
//! seeded by the block before (the first by [`CHAIN_SEED`]).

use std::collections::HashSet;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::PromptInput;

/// Tokens per block. 16 as vLLM's pages: a match is short of the true shared prefix by at most
/// 15 tokens, and a 4,096-token prompt is 256 hashes (2 KB); hashing it costs microseconds
/// (the replay bench, `cargo bench -p orchestratord --bench prefix_replay`, measures both).
pub const PREFIX_BLOCK_TOKENS: usize = 16;

/// The seed of a chain's first block.
pub const CHAIN_SEED: u64 = 0x6f72_6368_6470_6678;

/// The most block hashes one engine publishes: past it, the blocks of the sequences it saw
/// last are left out (bounds the index of every reader; 65,536 blocks are a million tokens).
pub const MAX_PUBLISHED_BLOCKS: usize = 1 << 16;

/// The hashes of the full blocks of `tokens`, first block first (a last partial block has
/// none: it can still change).
pub fn prefix_chain(tokens: &[u32]) -> Vec<u64> {
    let mut chain = Vec::with_capacity(tokens.len() / PREFIX_BLOCK_TOKENS);
    let mut bytes = [0u8; PREFIX_BLOCK_TOKENS * 4];
    let mut seed = CHAIN_SEED;
    for block in tokens.chunks_exact(PREFIX_BLOCK_TOKENS) {
        for (out, t) in bytes.chunks_exact_mut(4).zip(block) {
            out.copy_from_slice(&t.to_le_bytes());
        }
        seed = xxh3_64_with_seed(&bytes, seed);
        chain.push(seed);
    }
    chain
}

/// The seed of a text chain's first block: text chains never meet token chains.
pub const TEXT_CHAIN_SEED: u64 = 0x6f72_6368_6474_7874;

/// Bytes per block of a text chain: [`PREFIX_BLOCK_TOKENS`] tokens' worth at the estimate of
/// four bytes a token, so a held text block counts as that many tokens.
pub const TEXT_BLOCK_BYTES: usize = PREFIX_BLOCK_TOKENS * 4;

/// The chain of a prompt placement has no token ids for (a model only remote workers serve:
/// nothing here tokenizes it): the same chained hashes over blocks of the prompt's bytes —
/// a chat's turns each as role, 0x1E, content, 0x1F — full blocks only.
pub fn text_prefix_chain(prompt: &PromptInput, continuation: &str) -> Vec<u64> {
    let mut bytes = Vec::new();
    match prompt {
        PromptInput::Text(t) => bytes.extend_from_slice(t.as_bytes()),
        PromptInput::Chat(turns) => {
            for t in turns {
                bytes.extend_from_slice(t.role.as_bytes());
                bytes.push(0x1e);
                bytes.extend_from_slice(t.content.as_bytes());
                bytes.push(0x1f);
            }
        }
        // ids are run by engines that say what they hold; a chain of text pieces alone would
        // skip them
        PromptInput::Tokens(_) => return Vec::new(),
    }
    bytes.extend_from_slice(continuation.as_bytes());
    let mut seed = TEXT_CHAIN_SEED;
    bytes
        .chunks_exact(TEXT_BLOCK_BYTES)
        .map(|block| {
            seed = xxh3_64_with_seed(block, seed);
            seed
        })
        .collect()
}

/// The block hashes of every prefix an engine holds now (its rows, its prompt cache).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CachedPrefixes {
    blocks: HashSet<u64>,
}

impl std::fmt::Debug for CachedPrefixes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CachedPrefixes({} blocks)", self.blocks.len())
    }
}

impl CachedPrefixes {
    /// What holding `sequences` means, most important first: past
    /// [`MAX_PUBLISHED_BLOCKS`] the rest is left out.
    pub fn of<'a>(sequences: impl IntoIterator<Item = &'a [u32]>) -> Self {
        let mut blocks = HashSet::new();
        for seq in sequences {
            for h in prefix_chain(seq) {
                if blocks.len() >= MAX_PUBLISHED_BLOCKS {
                    return Self { blocks };
                }
                blocks.insert(h);
            }
        }
        Self { blocks }
    }

    /// From published block hashes (a remote worker's or another replica's), at most
    /// [`MAX_PUBLISHED_BLOCKS`] of them.
    pub fn from_blocks(hashes: impl IntoIterator<Item = u64>) -> Self {
        Self {
            blocks: hashes.into_iter().take(MAX_PUBLISHED_BLOCKS).collect(),
        }
    }

    /// Prompt tokens of the prompt whose chain is `chain` that the engine holds: the blocks
    /// before the first one it does not.
    pub fn held_tokens(&self, chain: &[u64]) -> usize {
        chain.iter().take_while(|h| self.blocks.contains(h)).count() * PREFIX_BLOCK_TOKENS
    }

    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Every block hash held (for publishing to other processes).
    pub fn hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.blocks.iter().copied()
    }

    /// What changed from `before` to `self`: the hashes added and those evicted.
    pub fn changes_from(&self, before: &CachedPrefixes) -> (Vec<u64>, Vec<u64>) {
        let added = self.blocks.difference(&before.blocks).copied().collect();
        let evicted = before.blocks.difference(&self.blocks).copied().collect();
        (added, evicted)
    }

    /// Applies published changes (a remote worker's), keeping the bound.
    pub fn apply(&mut self, added: &[u64], evicted: &[u64]) {
        for h in evicted {
            self.blocks.remove(h);
        }
        for &h in added {
            if self.blocks.len() >= MAX_PUBLISHED_BLOCKS {
                break;
            }
            self.blocks.insert(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn a_chain_has_one_hash_per_full_block_and_depends_on_everything_before() {
        let a = toks(40, 0);
        let chain = prefix_chain(&a);
        assert_eq!(chain.len(), 2);
        let mut b = a.clone();
        b[0] += 1; // the first block differs: so does every hash after it
        let other = prefix_chain(&b);
        assert!(chain.iter().zip(&other).all(|(x, y)| x != y));
        // the same tokens in another call: the same chain (stable)
        assert_eq!(prefix_chain(&a), chain);
        assert_eq!(prefix_chain(&a[..31]), chain[..1]);
    }

    #[test]
    fn held_tokens_counts_the_blocks_before_the_first_miss() {
        let system = toks(48, 1);
        let mut turn1 = system.clone();
        turn1.extend(toks(20, 900));
        let held = CachedPrefixes::of([turn1.as_slice()]);
        assert_eq!(held.blocks(), 4);
        let mut turn2 = turn1.clone();
        turn2.extend(toks(40, 5000));
        assert_eq!(held.held_tokens(&prefix_chain(&turn2)), 64);
        let stranger = toks(64, 77);
        assert_eq!(held.held_tokens(&prefix_chain(&stranger)), 0);
        // another conversation with the same system prompt shares its three blocks only
        let mut other = system.clone();
        other.extend(toks(30, 1234));
        assert_eq!(held.held_tokens(&prefix_chain(&other)), 48);
    }

    #[test]
    fn changes_replayed_give_the_same_set_and_the_bound_holds() {
        let before = CachedPrefixes::of([toks(64, 3).as_slice()]);
        let after = CachedPrefixes::of([toks(32, 3).as_slice(), toks(48, 8).as_slice()]);
        let (added, evicted) = after.changes_from(&before);
        let mut replayed = before.clone();
        replayed.apply(&added, &evicted);
        assert_eq!(replayed, after);
        let huge = toks((MAX_PUBLISHED_BLOCKS + 10) * PREFIX_BLOCK_TOKENS, 0);
        assert_eq!(
            CachedPrefixes::of([huge.as_slice()]).blocks(),
            MAX_PUBLISHED_BLOCKS
        );
    }

    /// PLACE-6: a prompt with no ids chains over its bytes: a chat's next turn extends the
    /// chain of the one before, a changed turn breaks it, and text never meets a token chain.
    #[test]
    fn a_text_chain_grows_with_the_conversation() {
        let turn = |role: &str, content: &str| crate::ChatTurn {
            role: role.into(),
            content: content.into(),
        };
        let mut chat = vec![turn("system", &"You are terse. ".repeat(10))];
        chat.push(turn("user", &"What is a prefix cache? ".repeat(4)));
        let first = text_prefix_chain(&PromptInput::Chat(chat.clone()), "");
        assert_eq!(first.len(), 260 / TEXT_BLOCK_BYTES); // 260 bytes: 4 full blocks
        chat.push(turn("assistant", &"One that keeps work. ".repeat(8)));
        let second = text_prefix_chain(&PromptInput::Chat(chat.clone()), "");
        assert!(second.len() > first.len());
        assert_eq!(second[..first.len()], first[..]);
        chat[0].role = "user".into();
        let changed = text_prefix_chain(&PromptInput::Chat(chat), "");
        assert_ne!(changed[0], second[0]);
        let text = "x".repeat(TEXT_BLOCK_BYTES * 2);
        let chain = text_prefix_chain(&PromptInput::Text(text.clone()), "");
        assert_eq!(chain.len(), 2);
        let as_tokens: Vec<u32> = text.bytes().map(u32::from).collect();
        assert!(prefix_chain(&as_tokens).iter().all(|h| !chain.contains(h)));
        assert!(text_prefix_chain(&PromptInput::Tokens(vec![]), &text).is_empty());
    }
}
