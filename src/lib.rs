//! compaction-proxy: a transparent reverse proxy that compacts the
//! conversation of LLM API requests (OpenAI chat completions, Anthropic
//! Messages, OpenAI Responses) to a budget and reports what it removed.
//!
//! Modules by concern (a request's path through them is documented in
//! [`proxy`]):
//! - [`engine`]: the pure compaction engine of `COMPACTION.md` (no I/O).
//! - [`format`](mod@format): the body formats, side by side behind one interface.
//! - [`compaction`]: the format-neutral pipeline (pins, exact or stable
//!   mode, format rules, loss), pure like the engine.
//! - [`outcome`]: what compacting one body produced.
//! - [`memory_compact`]: the engine's HTTP API request schema.
//! - [`config`] and [`policy`]: layered configuration and policy resolution.
//! - [`cache`]: outcomes of repeated bodies and stable mode's checkpoints.
//! - [`analysis_store`]: relevance analyses and history words between turns.
//! - [`proxy`]: server, forwarding, headers, streaming.
//! - [`usage`]: the provider's billed usage, read from responses as they
//!   pass, priced, and the estimate of what the original would have cost.
//! - [`metrics`]: what operators watch ([`proxy::admin`] serves it).
//! - [`error`]: the proxy's own failures as HTTP answers.
//! - [`summarizer`]: the model client that writes summaries (one file
//!   per wire format), and map-reduce over large transcripts.
//! - [`store`]: summaries keyed by what they were made from.
//! - [`cli`]: the commands of the binary.
//!
//! Each module uses only modules below it: no two top-level modules name
//! each other, however indirectly, and the pure core ([`engine`],
//! [`format`](mod@format), [`compaction`], [`outcome`]) names no I/O; the test
//! `module_layers` reads the source and checks both.

pub mod analysis_store;
pub mod cache;
pub mod cli;
pub mod compaction;
pub mod config;
pub mod engine;
pub mod error;
pub mod explain;
pub mod format;
pub mod inspector;
pub mod log_buffer;
pub mod memory;
pub mod memory_compact;
pub mod metrics;
pub mod outcome;
pub mod policy;
pub mod proxy;
pub mod store;
pub mod summarizer;
pub mod usage;
