//! Anthropic Messages' `usage`. `input_tokens` counts only the input after
//! the last cache breakpoint: cache reads (`cache_read_input_tokens`) and
//! writes (`cache_creation_input_tokens`, split by time to live in
//! `cache_creation.ephemeral_5m_input_tokens` / `ephemeral_1h_input_tokens`)
//! come on top of it.
//!
//! A stream reports usage twice: in `message_start` (`message.usage`, its
//! input and the first output token) and in `message_delta`, whose counts
//! are cumulative: each field it carries replaces the earlier one.
//!
//! With server-side compaction the top-level counts leave out the
//! compaction pass; `usage.iterations` lists every sampling pass, and the
//! entries of `"type": "compaction"` are added to the bill.

use serde::Deserialize;

use super::Usage;

#[derive(Debug, Deserialize)]
struct Block {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_creation: Option<Ttl>,
    iterations: Option<Vec<Iteration>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct Ttl {
    ephemeral_5m_input_tokens: Option<u64>,
    ephemeral_1h_input_tokens: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
struct Iteration {
    #[serde(rename = "type")]
    kind: Option<String>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

/// The latest value of every field.
#[derive(Debug, Default)]
pub struct Acc {
    input: Option<u64>,
    output: Option<u64>,
    read: Option<u64>,
    write: Option<u64>,
    write_1h: Option<u64>,
    /// Compaction passes: input, cache reads, cache writes, output.
    compaction: Option<[u64; 4]>,
}

impl Acc {
    pub fn read(&mut self, block: &[u8]) {
        let Ok(b) = serde_json::from_slice::<Block>(block) else {
            return;
        };
        self.input = b.input_tokens.or(self.input);
        self.output = b.output_tokens.or(self.output);
        self.read = b.cache_read_input_tokens.or(self.read);
        self.write = b.cache_creation_input_tokens.or(self.write);
        if let Some(ttl) = b.cache_creation {
            self.write_1h = ttl.ephemeral_1h_input_tokens.or(self.write_1h);
            if self.write.is_none() {
                let five = ttl.ephemeral_5m_input_tokens.unwrap_or(0);
                self.write = Some(five + ttl.ephemeral_1h_input_tokens.unwrap_or(0));
            }
        }
        if let Some(iterations) = b.iterations {
            let mut sum = [0u64; 4];
            for i in iterations
                .iter()
                .filter(|i| i.kind.as_deref() == Some("compaction"))
            {
                sum[0] += i.input_tokens.unwrap_or(0);
                sum[1] += i.cache_read_input_tokens.unwrap_or(0);
                sum[2] += i.cache_creation_input_tokens.unwrap_or(0);
                sum[3] += i.output_tokens.unwrap_or(0);
            }
            self.compaction = Some(sum);
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        let (input, output) = (self.input?, self.output?);
        let [c_input, c_read, c_write, c_output] = self.compaction.unwrap_or_default();
        let write = self.write.unwrap_or(0);
        Some(Usage {
            uncached_input: input + c_input,
            cache_read: self.read.unwrap_or(0) + c_read,
            cache_write: write + c_write,
            cache_write_1h: self.write_1h.unwrap_or(0).min(write),
            output: output + c_output,
            compaction_input: c_input + c_read + c_write,
            compaction_output: c_output,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_reads_and_writes_come_on_top_of_input_tokens() {
        let mut acc = Acc::default();
        acc.read(br#"{"input_tokens":50,"cache_creation_input_tokens":1500,"cache_read_input_tokens":8000,"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":500},"output_tokens":1,"service_tier":"standard"}"#);
        let u = acc.usage().unwrap();
        assert_eq!(
            (
                u.uncached_input,
                u.cache_read,
                u.cache_write,
                u.cache_write_1h,
                u.output
            ),
            (50, 8000, 1500, 500, 1)
        );
    }

    #[test]
    fn message_delta_counts_are_cumulative_and_replace_the_start() {
        let mut acc = Acc::default();
        acc.read(br#"{"input_tokens":472,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":2}"#);
        acc.read(br#"{"output_tokens":503}"#);
        let u = acc.usage().unwrap();
        assert_eq!((u.uncached_input, u.output), (472, 503));
        // A later delta that repeats the input counts replaces them too.
        acc.read(br#"{"input_tokens":470,"cache_read_input_tokens":2,"output_tokens":510}"#);
        let u = acc.usage().unwrap();
        assert_eq!((u.uncached_input, u.cache_read, u.output), (470, 2, 510));
    }

    #[test]
    fn compaction_iterations_are_added_to_the_bill() {
        let mut acc = Acc::default();
        acc.read(br#"{"input_tokens":23000,"output_tokens":1000,"iterations":[{"type":"compaction","input_tokens":180000,"output_tokens":3500},{"type":"message","input_tokens":23000,"output_tokens":1000}]}"#);
        let u = acc.usage().unwrap();
        assert_eq!((u.uncached_input, u.output), (203_000, 4500));
        assert_eq!((u.compaction_input, u.compaction_output), (180_000, 3500));
    }

    #[test]
    fn a_start_without_output_is_unknown_until_it_comes() {
        let mut acc = Acc::default();
        acc.read(br#"{"cache_read_input_tokens":3}"#);
        assert_eq!(acc.usage(), None);
    }
}
