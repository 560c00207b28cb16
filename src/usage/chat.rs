//! Chat completions' `usage`: `prompt_tokens` counts every input token,
//! the cached ones (`prompt_tokens_details.cached_tokens`) included. A
//! stream carries it only in its last chunk, and only when the request set
//! `stream_options.include_usage`. Gateways that put Anthropic models
//! behind the chat API (LiteLLM) add `cache_creation_input_tokens`, also
//! counted in `prompt_tokens`, and sometimes `cache_read_input_tokens` in
//! place of the details.

use serde::Deserialize;

use super::Usage;

#[derive(Debug, Deserialize)]
struct Block {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

/// The last usage block seen.
#[derive(Debug, Default)]
pub struct Acc {
    usage: Option<Usage>,
}

impl Acc {
    pub fn read(&mut self, block: &[u8]) {
        let Ok(b) = serde_json::from_slice::<Block>(block) else {
            return;
        };
        let (Some(prompt), Some(output)) = (b.prompt_tokens, b.completion_tokens) else {
            return; // no bill in it: unknown, not zero
        };
        let read = b
            .prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .or(b.cache_read_input_tokens)
            .unwrap_or(0);
        let write = b.cache_creation_input_tokens.unwrap_or(0);
        self.usage = Some(Usage {
            uncached_input: prompt.saturating_sub(read).saturating_sub(write),
            cache_read: read,
            cache_write: write,
            output,
            ..Usage::default()
        });
    }

    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_tokens_include_the_cached_ones() {
        let mut acc = Acc::default();
        acc.read(br#"{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}"#);
        let u = acc.usage().unwrap();
        assert_eq!(
            (u.uncached_input, u.cache_read, u.cache_write, u.output),
            (86, 1920, 0, 300)
        );
    }

    #[test]
    fn a_gateways_cache_writes_are_part_of_prompt_tokens() {
        let mut acc = Acc::default();
        acc.read(br#"{"prompt_tokens":1000,"completion_tokens":5,"cache_creation_input_tokens":700,"cache_read_input_tokens":200}"#);
        let u = acc.usage().unwrap();
        assert_eq!(
            (u.uncached_input, u.cache_read, u.cache_write),
            (100, 200, 700)
        );
    }

    #[test]
    fn a_block_without_counts_is_unknown() {
        let mut acc = Acc::default();
        acc.read(br#"{"total_tokens":5}"#);
        acc.read(b"not json");
        assert_eq!(acc.usage(), None);
    }
}
