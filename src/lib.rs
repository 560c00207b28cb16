//! compaction-proxy: a transparent reverse proxy that compacts the `messages`
//! of OpenAI-style chat-completions requests to a budget and reports what it
//! removed.

pub mod engine;
pub mod memory_compact;
