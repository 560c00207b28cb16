//! The Responses API's `usage`: `input_tokens` counts every input token,
//! the cached ones (`input_tokens_details.cached_tokens`) included. A
//! stream carries it in its terminal event's response
//! (`response.completed`, or `response.incomplete` / `response.failed`);
//! the earlier events' responses have `"usage": null`.

use serde::Deserialize;

use super::Usage;

#[derive(Debug, Deserialize)]
struct Block {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    input_tokens_details: Option<Details>,
}

#[derive(Debug, Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

#[derive(Debug, Default)]
pub struct Acc {
    usage: Option<Usage>,
}

impl Acc {
    pub fn read(&mut self, block: &[u8]) {
        let Ok(b) = serde_json::from_slice::<Block>(block) else {
            return;
        };
        let (Some(input), Some(output)) = (b.input_tokens, b.output_tokens) else {
            return;
        };
        let read = b
            .input_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0);
        self.usage = Some(Usage {
            uncached_input: input.saturating_sub(read),
            cache_read: read,
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
    fn input_tokens_include_the_cached_ones() {
        let mut acc = Acc::default();
        acc.read(br#"{"input_tokens":5000,"input_tokens_details":{"cached_tokens":4096},"output_tokens":120,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":5120}"#);
        let u = acc.usage().unwrap();
        assert_eq!((u.uncached_input, u.cache_read, u.output), (904, 4096, 120));
    }
}
