//! The integration tests: one binary, so a test build links once.

mod support;

mod agent_decisions;
mod agent_fixture;
mod agent_properties;
mod binary;
mod chart_files;
mod context_compact;
mod engine_properties;
mod engine_vectors;
mod fact_chats;
mod format_fixtures;
mod format_properties;
mod format_rules;
mod format_stable;
mod hostile;
mod metrics_scrape;
mod openai_properties;
mod operator;
mod proxy_agent;
mod proxy_basics;
mod proxy_failures;
mod proxy_relevance;
mod proxy_streaming;
mod proxy_tls;
mod proxy_transparency;
mod proxy_upgrade;
mod relevance_retention;
mod sdk_formats;
mod sdk_openai;
mod stable_mode;
mod stable_relevance;
mod summaries;
mod summary_redis;
mod upstream_pool;
