//! Protocol adapters: each turns its protocol into a task (through `admission::admit`) and the
//! task's events back into its protocol. None of them queues, places or streams by itself.

pub mod anthropic;
pub mod embeddings;
pub mod follow;
pub mod hyperswarm;
pub mod kolosal;
pub mod llama_server;
pub mod ollama;
pub mod openai;
pub mod raw_prompt;
pub mod seed_chat;
pub mod tokenize;
pub mod tool_calls;
