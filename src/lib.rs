//! compaction-proxy: a transparent reverse proxy that compacts the `messages`
//! of OpenAI-style chat-completions requests to a budget and reports what it
//! removed.
//!
//! Modules by concern (a request's path through them is documented in
//! [`proxy`]):
//! - [`engine`]: the pure compaction engine of `COMPACTION.md` (no I/O).
//! - [`memory_compact`]: the engine's HTTP API request schema.
//! - [`openai`]: the chat-completions body model.
//! - [`config`] and [`policy`]: layered configuration and policy resolution.
//! - [`cache`]: compaction outcomes of repeated bodies.
//! - [`proxy`]: server, forwarding, headers, streaming.
//! - [`metrics`] and [`admin`]: what operators watch and probe.
//! - [`error`]: the proxy's own failures as HTTP answers.
//! - [`cli`]: the commands of the binary.

pub mod admin;
pub mod cache;
pub mod cli;
pub mod config;
pub mod engine;
pub mod error;
pub mod explain;
pub mod memory_compact;
pub mod metrics;
pub mod openai;
pub mod policy;
pub mod proxy;
