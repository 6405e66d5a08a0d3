//! Fuzzing (proptest) of the text path with the real GGUF tokenizer and chat template: random
//! and hostile strings round-trip through the tokenizer, stream out whole characters, and
//! render in the chat template verbatim (no template injection). `PROPTEST_CASES` sets the
//! number of cases (CI: the default below; `ci/fuzz.sh` runs many more).

mod common;

use engine_candle::TextStream;
use engine_port::ChatTurn;
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

/// Any text, with a fair share of what breaks naive code: template syntax, the model's
/// special tokens, control characters, combining marks, emoji, lone newlines and CRs.
fn hostile_text() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "{{ 7*7 }}",
        "{% for x in range(3) %}x{% endfor %}",
        "{# c #}",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "\u{0}",
        "\r\n",
        "\n\n",
        "\u{301}",
        "🦀",
        "é",
        "ﬁ",
        "\u{200d}",
        "\t",
        " ",
        "'\"\\",
        "</s>",
        "<s>",
    ]);
    prop::collection::vec(
        prop_oneof![any::<String>(), pieces.prop_map(str::to_string)],
        0..8,
    )
    .prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// ENG-TOK-2: encode then decode gives the text back, and streaming the tokens' bytes one
    /// by one yields the decoded text (special tokens are never streamed) in whole characters.
    #[test]
    fn tokenizer_round_trip_and_stream(text in hostile_text()) {
        let tok = common::engine().tokenizer();
        let ids = tok.encode(&text).expect("any text encodes");
        prop_assert_eq!(tok.decode_with_special(&ids), text.clone());
        let mut stream = TextStream::new(Vec::new());
        let mut out = String::new();
        for &id in &ids {
            let pushed = stream.push(tok.token_bytes(id));
            out.push_str(&pushed.text);
        }
        out.push_str(&stream.finish());
        prop_assert_eq!(out, tok.decode(&ids));
    }

    /// ENG-TPL-2: hostile message content renders verbatim: template syntax in a message is
    /// text, never evaluated.
    #[test]
    fn chat_template_renders_content_verbatim(
        contents in prop::collection::vec(hostile_text(), 1..4),
    ) {
        let roles = ["system", "user", "assistant", "user"];
        let messages: Vec<ChatTurn> = contents
            .iter()
            .enumerate()
            .map(|(i, c)| ChatTurn { role: roles[i % roles.len()].into(), content: c.clone() })
            .collect();
        let rendered = common::engine().render_chat(&messages).expect("renders");
        for c in &contents {
            prop_assert!(rendered.contains(c.as_str()), "content {c:?} not verbatim in {rendered:?}");
        }
    }
}
