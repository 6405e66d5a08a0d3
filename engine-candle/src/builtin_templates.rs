//! Chat templates by name, as llama-server's `--chat-template NAME` knows them: for a GGUF
//! whose embedded template is wrong or missing. Each is written here as Jinja and rendered by
//! the same engine as an embedded template; the turns each produces follow llama.cpp's
//! built-in formats (`llama-chat.cpp`), except that a content goes in as sent where llama.cpp
//! trims it (a template never sees a content's text: `chat_template.rs`). None writes the
//! model's start token: the tokenizer puts it first when the model wants it.

/// `(name, Jinja)` of every built-in template.
const BUILTIN: &[(&str, &str)] = &[
    ("chatml", CHATML),
    ("llama2", LLAMA2),
    ("llama2-sys", LLAMA2_SYS),
    ("llama3", LLAMA3),
    ("llama4", LLAMA4),
    ("gemma", crate::chat_template::GEMMA_FALLBACK),
    ("mistral-v1", MISTRAL_V1),
    ("mistral-v3", MISTRAL_V3),
    ("mistral-v3-tekken", MISTRAL_V3_TEKKEN),
    ("mistral-v7", MISTRAL_V7),
    ("mistral-v7-tekken", MISTRAL_V7_TEKKEN),
    ("phi3", PHI3),
    ("phi4", PHI4),
    ("falcon3", FALCON3),
    ("zephyr", ZEPHYR),
    ("vicuna", VICUNA),
    ("vicuna-orca", VICUNA_ORCA),
    ("deepseek", DEEPSEEK),
    ("deepseek2", DEEPSEEK2),
    ("deepseek3", DEEPSEEK3),
    ("command-r", COMMAND_R),
    ("granite", GRANITE),
    ("openchat", OPENCHAT),
    ("exaone3", EXAONE3),
    ("megrez", MEGREZ),
];

/// The Jinja text of the built-in template `name`.
pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTIN
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, t)| *t)
}

/// The names [`builtin`] knows, in a stable order.
pub fn builtin_names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(n, _)| *n)
}

const CHATML: &str = "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}";

/// `[INST] ` opens a turn; a system message without markup (the model has no system role).
const LLAMA2: &str = "{%- set ns = namespace(open=true) -%}{{ '[INST] ' }}{%- for m in messages -%}{%- if not ns.open -%}{{ '[INST] ' }}{%- set ns.open = true -%}{%- endif -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '\n' }}{%- elif m['role'] == 'user' -%}{{ m['content'] + ' [/INST]' }}{%- else -%}{{ m['content'] + '</s>' }}{%- set ns.open = false -%}{%- endif -%}{%- endfor -%}";

const LLAMA2_SYS: &str = "{%- set ns = namespace(open=true) -%}{{ '[INST] ' }}{%- for m in messages -%}{%- if not ns.open -%}{{ '[INST] ' }}{%- set ns.open = true -%}{%- endif -%}{%- if m['role'] == 'system' -%}{{ '<<SYS>>\n' + m['content'] + '\n<</SYS>>\n\n' }}{%- elif m['role'] == 'user' -%}{{ m['content'] + ' [/INST]' }}{%- else -%}{{ m['content'] + '</s>' }}{%- set ns.open = false -%}{%- endif -%}{%- endfor -%}";

const LLAMA3: &str = "{%- for m in messages -%}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif -%}";

const LLAMA4: &str = "{%- for m in messages -%}{{ '<|header_start|>' + m['role'] + '<|header_end|>\n\n' + m['content'] + '<|eot|>' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|header_start|>assistant<|header_end|>\n\n' }}{%- endif -%}";

/// Mistral v1/v3: a system message goes inside the next `[INST]`, before the user's text.
const MISTRAL_V1: &str = "{%- set ns = namespace(open=false) -%}{%- for m in messages -%}{%- if not ns.open -%}{{ ' [INST] ' }}{%- set ns.open = true -%}{%- endif -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '\n\n' }}{%- elif m['role'] == 'user' -%}{{ m['content'] + ' [/INST]' }}{%- else -%}{{ ' ' + m['content'] + '</s>' }}{%- set ns.open = false -%}{%- endif -%}{%- endfor -%}";

const MISTRAL_V3: &str = "{%- set ns = namespace(open=false) -%}{%- for m in messages -%}{%- if not ns.open -%}{{ '[INST] ' }}{%- set ns.open = true -%}{%- endif -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '\n\n' }}{%- elif m['role'] == 'user' -%}{{ m['content'] + '[/INST]' }}{%- else -%}{{ ' ' + m['content'] + '</s>' }}{%- set ns.open = false -%}{%- endif -%}{%- endfor -%}";

const MISTRAL_V3_TEKKEN: &str = "{%- set ns = namespace(open=false) -%}{%- for m in messages -%}{%- if not ns.open -%}{{ '[INST]' }}{%- set ns.open = true -%}{%- endif -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '\n\n' }}{%- elif m['role'] == 'user' -%}{{ m['content'] + '[/INST]' }}{%- else -%}{{ m['content'] + '</s>' }}{%- set ns.open = false -%}{%- endif -%}{%- endfor -%}";

const MISTRAL_V7: &str = "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ '[SYSTEM_PROMPT] ' + m['content'] + '[/SYSTEM_PROMPT]' }}{%- elif m['role'] == 'user' -%}{{ '[INST] ' + m['content'] + '[/INST]' }}{%- else -%}{{ ' ' + m['content'] + '</s>' }}{%- endif -%}{%- endfor -%}";

const MISTRAL_V7_TEKKEN: &str = "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ '[SYSTEM_PROMPT]' + m['content'] + '[/SYSTEM_PROMPT]' }}{%- elif m['role'] == 'user' -%}{{ '[INST]' + m['content'] + '[/INST]' }}{%- else -%}{{ m['content'] + '</s>' }}{%- endif -%}{%- endfor -%}";

const PHI3: &str = "{%- for m in messages -%}{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}";

const PHI4: &str = "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '<|im_sep|>' + m['content'] + '<|im_end|>' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant<|im_sep|>' }}{%- endif -%}";

const FALCON3: &str = "{%- for m in messages -%}{{ '<|' + m['role'] + '|>\n' + m['content'] + '\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}";

const ZEPHYR: &str = "{%- for m in messages -%}{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|endoftext|>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}";

const VICUNA: &str = "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '\n\n' }}{%- elif m['role'] == 'user' -%}{{ 'USER: ' + m['content'] + '\n' }}{%- elif m['role'] == 'assistant' -%}{{ 'ASSISTANT: ' + m['content'] + '</s>\n' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ 'ASSISTANT:' }}{%- endif -%}";

const VICUNA_ORCA: &str = "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ 'SYSTEM: ' + m['content'] + '\n' }}{%- elif m['role'] == 'user' -%}{{ 'USER: ' + m['content'] + '\n' }}{%- elif m['role'] == 'assistant' -%}{{ 'ASSISTANT: ' + m['content'] + '</s>\n' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ 'ASSISTANT:' }}{%- endif -%}";

const DEEPSEEK: &str = "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ m['content'] }}{%- elif m['role'] == 'user' -%}{{ '### Instruction:\n' + m['content'] + '\n' }}{%- elif m['role'] == 'assistant' -%}{{ '### Response:\n' + m['content'] + '\n<|EOT|>\n' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ '### Response:\n' }}{%- endif -%}";

const DEEPSEEK2: &str = "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '\n\n' }}{%- elif m['role'] == 'user' -%}{{ 'User: ' + m['content'] + '\n\n' }}{%- elif m['role'] == 'assistant' -%}{{ 'Assistant: ' + m['content'] + '<｜end▁of▁sentence｜>' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}";

const DEEPSEEK3: &str = "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '\n\n' }}{%- elif m['role'] == 'user' -%}{{ '<｜User｜>' + m['content'] }}{%- elif m['role'] == 'assistant' -%}{{ '<｜Assistant｜>' + m['content'] + '<｜end▁of▁sentence｜>' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<｜Assistant｜>' }}{%- endif -%}";

const COMMAND_R: &str = "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + m['content'] + '<|END_OF_TURN_TOKEN|>' }}{%- elif m['role'] == 'user' -%}{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + m['content'] + '<|END_OF_TURN_TOKEN|>' }}{%- elif m['role'] == 'assistant' -%}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' + m['content'] + '<|END_OF_TURN_TOKEN|>' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{%- endif -%}";

const GRANITE: &str = "{%- for m in messages -%}{{ '<|start_of_role|>' + m['role'] + '<|end_of_role|>' + m['content'] + '<|end_of_text|>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|start_of_role|>assistant<|end_of_role|>\n' }}{%- endif -%}";

const OPENCHAT: &str = "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '<|end_of_turn|>' }}{%- else -%}{{ 'GPT4 Correct ' + (m['role'] | capitalize) + ': ' + m['content'] + '<|end_of_turn|>' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ 'GPT4 Correct Assistant:' }}{%- endif -%}";

const EXAONE3: &str = "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ '[|system|]' + m['content'] + '[|endofturn|]\n' }}{%- elif m['role'] == 'user' -%}{{ '[|user|]' + m['content'] + '\n' }}{%- elif m['role'] == 'assistant' -%}{{ '[|assistant|]' + m['content'] + '[|endofturn|]\n' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ '[|assistant|]' }}{%- endif -%}";

const MEGREZ: &str = "{%- for m in messages -%}{{ '<|role_start|>' + m['role'] + '<|role_end|>' + m['content'] + '<|turn_end|>' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|role_start|>assistant<|role_end|>' }}{%- endif -%}";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_template::ChatTemplate;
    use engine_port::ChatTurn;

    fn turns() -> Vec<ChatTurn> {
        [
            ("system", "Be brief."),
            ("user", "Hi"),
            ("assistant", "Hello."),
            ("user", "Bye"),
        ]
        .iter()
        .map(|(r, c)| ChatTurn {
            role: r.to_string(),
            content: c.to_string(),
        })
        .collect()
    }

    fn render(name: &str) -> String {
        let t =
            ChatTemplate::configured(builtin(name).unwrap(), "<s>".into(), "</s>".into()).unwrap();
        t.render(&turns()).unwrap()
    }

    /// LLS-TMPL-1: each built-in renders the turns in llama.cpp's format for that name.
    #[test]
    fn builtins_render_llama_cpp_formats() {
        let cases = [
            ("chatml", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
            ("llama2", "[INST] Be brief.\nHi [/INST]Hello.</s>[INST] Bye [/INST]"),
            ("llama2-sys", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]"),
            ("llama3", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
            ("gemma", "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"),
            ("mistral-v1", " [INST] Be brief.\n\nHi [/INST] Hello.</s> [INST] Bye [/INST]"),
            ("mistral-v3", "[INST] Be brief.\n\nHi[/INST] Hello.</s>[INST] Bye[/INST]"),
            ("mistral-v7", "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST] Hello.</s>[INST] Bye[/INST]"),
            ("phi3", "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n"),
            ("vicuna", "Be brief.\n\nUSER: Hi\nASSISTANT: Hello.</s>\nUSER: Bye\nASSISTANT:"),
            ("openchat", "Be brief.<|end_of_turn|>GPT4 Correct User: Hi<|end_of_turn|>GPT4 Correct Assistant: Hello.<|end_of_turn|>GPT4 Correct User: Bye<|end_of_turn|>GPT4 Correct Assistant:"),
            ("command-r", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Bye<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        ];
        for (name, want) in cases {
            assert_eq!(render(name), want, "{name}");
        }
        // every name compiles and renders
        for name in builtin_names() {
            assert!(!render(name).is_empty(), "{name}");
        }
        assert!(builtin("ChatML").is_some());
        assert!(builtin("nope").is_none());
    }
}
