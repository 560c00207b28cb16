//! compaction-proxy: a transparent reverse proxy that compacts the `messages`
//! of OpenAI-style chat-completions requests to a budget and reports what it
//! removed.

pub mod config;
pub mod engine;
pub mod memory_compact;
pub mod openai;
pub mod policy;
