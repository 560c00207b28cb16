//! Map-reduce: a transcript larger than the summarizer's window is split
//! into chunks that each fit, the chunks are summarized at most
//! `max_concurrency` at a time, and their summaries are merged in reduce
//! passes until one is left. `max_chunks` bounds the map, `max_passes` the
//! rounds (the map pass included), as Algolia's compaction API bounds
//! them; past either the conversation cannot be summarized within limits.

use std::sync::Arc;

use super::prompt::{self, PromptSettings};
use super::{Summarize, SummarizeError, SummaryRequest, Usage};
use crate::engine::text::{char_count, char_prefix};

/// A token estimate of text: four chars a token, rounded up (the usual
/// ratio of English text and code; the window keeps a margin for it).
pub fn estimate_tokens(text: &str) -> usize {
    char_count(text).div_ceil(4)
}

/// The limits one summary works within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub window_tokens: usize,
    pub max_output_tokens: usize,
    pub max_concurrency: usize,
    pub max_chunks: usize,
    pub max_passes: usize,
}

impl Limits {
    /// A summarizer section's limits.
    pub fn of(settings: &super::Settings) -> Limits {
        Limits {
            window_tokens: settings.window_tokens,
            max_output_tokens: settings.max_output_tokens,
            max_concurrency: settings.max_concurrency,
            max_chunks: settings.max_chunks,
            max_passes: settings.max_passes,
        }
    }
}

/// What one summary took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub text: String,
    /// Chunks of the map pass (1: the transcript fit one call).
    pub chunks: usize,
    /// Rounds of calls: 1 for a direct summary, 2 or more with reduces.
    pub passes: usize,
    /// Summarizer calls made.
    pub calls: usize,
    pub usage: Usage,
}

/// Room for one call's input, in tokens: the window less the answer, the
/// frame and a margin for the estimate and the wire's own tokens.
pub fn input_room(limits: &Limits, system: &str) -> usize {
    let margin = limits.window_tokens / 10 + 32;
    limits
        .window_tokens
        .saturating_sub(limits.max_output_tokens)
        .saturating_sub(estimate_tokens(system))
        .saturating_sub(margin)
}

/// Packs entries in order into chunks of at most `room` tokens each
/// (separated by blank lines); an entry larger than a chunk is cut into
/// parts that fit.
pub fn chunk(entries: &[String], room: usize) -> Vec<String> {
    let room_chars = room.max(1) * 4;
    let mut chunks = Vec::new();
    let mut current = String::new();
    let mut current_chars = 0;
    for entry in entries {
        let mut rest = entry.as_str();
        loop {
            let chars = char_count(rest);
            let sep = if current.is_empty() { 0 } else { 2 };
            if current_chars + sep + chars <= room_chars {
                if sep > 0 {
                    current.push_str("\n\n");
                }
                current.push_str(rest);
                current_chars += sep + chars;
                break;
            }
            if !current.is_empty() {
                chunks.push(std::mem::take(&mut current));
                current_chars = 0;
                continue;
            }
            // Alone and still too large: cut.
            let head = char_prefix(rest, room_chars);
            chunks.push(head.to_owned());
            rest = &rest[head.len()..];
            if rest.is_empty() {
                break;
            }
        }
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

/// Summarizes `entries` (transcript entries, oldest first) under
/// `settings` and `limits`. The total deadline is the caller's.
pub async fn summarize(
    summarizer: Arc<dyn Summarize>,
    entries: &[String],
    settings: &PromptSettings,
    limits: Limits,
) -> Result<Written, SummarizeError> {
    let system = settings.system();
    let room = input_room(&limits, &system);
    if room == 0 {
        return Err(SummarizeError::TooManyChunks {
            needed: usize::MAX,
            allowed: limits.max_chunks,
        });
    }
    // The wrapping text of a map call counts too.
    let chunks = chunk(entries, room.saturating_sub(32).max(1));
    if chunks.len() > limits.max_chunks.max(1) {
        return Err(SummarizeError::TooManyChunks {
            needed: chunks.len(),
            allowed: limits.max_chunks,
        });
    }
    let of = chunks.len();
    let inputs: Vec<String> = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| prompt::map_input(c, (of > 1).then_some((i + 1, of))))
        .collect();
    let mut written = Written {
        text: String::new(),
        chunks: of,
        passes: 1,
        calls: 0,
        usage: Usage::default(),
    };
    let mut summaries = run_all(&summarizer, &system, inputs, limits, &mut written).await?;
    while summaries.len() > 1 {
        if written.passes >= limits.max_passes.max(1) {
            return Err(SummarizeError::NoConvergence(limits.max_passes));
        }
        let groups = group(&summaries, room.saturating_sub(64).max(1));
        if groups.len() >= summaries.len() {
            // No two summaries fit one call: merging cannot shrink them.
            return Err(SummarizeError::NoConvergence(limits.max_passes));
        }
        let inputs = groups
            .iter()
            .map(|g| prompt::reduce_input(g))
            .collect::<Vec<_>>();
        written.passes += 1;
        summaries = run_all(&summarizer, &system, inputs, limits, &mut written).await?;
    }
    written.text = summaries.pop().unwrap_or_default();
    Ok(written)
}

/// Consecutive summaries grouped so each group's parts fit `room` tokens.
fn group(summaries: &[String], room: usize) -> Vec<Vec<String>> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut tokens = 0;
    for s in summaries {
        let t = estimate_tokens(s) + 8;
        match groups.last_mut() {
            Some(g) if tokens + t <= room => {
                g.push(s.clone());
                tokens += t;
            }
            _ => {
                groups.push(vec![s.clone()]);
                tokens = t;
            }
        }
    }
    groups
}

/// One round: every input summarized, at most `max_concurrency` at a
/// time, answers in input order; the first failure fails the round.
async fn run_all(
    summarizer: &Arc<dyn Summarize>,
    system: &str,
    inputs: Vec<String>,
    limits: Limits,
    written: &mut Written,
) -> Result<Vec<String>, SummarizeError> {
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let n = inputs.len();
    for (i, user) in inputs.into_iter().enumerate() {
        let request = SummaryRequest {
            system: system.to_owned(),
            user,
            max_output_tokens: limits.max_output_tokens,
        };
        let (summarizer, permits) = (summarizer.clone(), permits.clone());
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            (i, summarizer.summarize(&request).await)
        });
    }
    let mut out: Vec<Option<String>> = vec![None; n];
    while let Some(joined) = tasks.join_next().await {
        let (i, answer) = joined.map_err(|_| SummarizeError::Transport("task failed".into()))?;
        let summary = answer?;
        written.calls += 1;
        written.usage = written.usage.plus(summary.usage);
        out[i] = Some(summary.text);
    }
    Ok(out.into_iter().map(Option::unwrap_or_default).collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::summarizer::{Summary, SummaryFuture};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// Answers each call with a canned short summary naming the call, and
    /// records inputs and the most calls in flight at once.
    #[derive(Default)]
    pub struct Canned {
        pub inputs: Mutex<Vec<String>>,
        in_flight: AtomicUsize,
        pub most_in_flight: AtomicUsize,
        /// Fail the call with this index.
        pub fail_at: Option<usize>,
    }

    impl Summarize for Canned {
        fn summarize<'a>(&'a self, request: &'a SummaryRequest) -> SummaryFuture<'a> {
            Box::pin(async move {
                let n = {
                    let mut inputs = self.inputs.lock().unwrap();
                    inputs.push(request.user.clone());
                    inputs.len() - 1
                };
                let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.most_in_flight.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                if self.fail_at == Some(n) {
                    return Err(SummarizeError::Status(500));
                }
                Ok(Summary {
                    text: format!("summary {n}"),
                    usage: Usage {
                        prompt_tokens: Some(100),
                        completion_tokens: Some(10),
                    },
                })
            })
        }
    }

    fn limits(window_tokens: usize) -> Limits {
        Limits {
            window_tokens,
            max_output_tokens: 100,
            max_concurrency: 2,
            max_chunks: 16,
            max_passes: 3,
        }
    }

    fn entries(n: usize, chars: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("user: {i} {}", "w".repeat(chars)))
            .collect()
    }

    #[test]
    fn chunks_fit_their_room_keep_order_and_cut_what_is_alone_too_large() {
        let chunks = chunk(&entries(10, 300), 200);
        assert!(chunks.len() > 1);
        assert!(chunks.iter().all(|c| char_count(c) <= 800));
        let joined = chunks.join("\n\n");
        assert_eq!(joined, entries(10, 300).join("\n\n"));
        let huge = chunk(&["x".repeat(2000)], 100);
        assert_eq!(huge.len(), 5);
        assert!(huge.iter().all(|c| char_count(c) == 400));
    }

    #[tokio::test]
    async fn a_transcript_that_fits_is_one_call_one_pass() {
        let canned = Arc::new(Canned::default());
        let out = summarize(
            canned.clone(),
            &entries(3, 50),
            &PromptSettings::default(),
            limits(8000),
        )
        .await
        .unwrap();
        assert_eq!((out.chunks, out.passes, out.calls), (1, 1, 1));
        assert_eq!(out.text, "summary 0");
        assert_eq!(out.usage.prompt_tokens, Some(100));
        let inputs = canned.inputs.lock().unwrap();
        assert!(inputs[0].starts_with("The conversation to summarize"));
        assert!(inputs[0].contains("user: 2 "));
    }

    #[tokio::test]
    async fn a_larger_transcript_is_mapped_in_chunks_then_reduced() {
        let canned = Arc::new(Canned::default());
        // Room of a 1200-token window: 1200 - 100 - frame (~300) - 152.
        let out = summarize(
            canned.clone(),
            &entries(40, 400),
            &PromptSettings::default(),
            limits(1200),
        )
        .await
        .unwrap();
        assert!(out.chunks > 2, "{out:?}");
        assert_eq!(out.passes, 2);
        assert_eq!(out.calls, out.chunks + 1);
        assert_eq!(out.usage.completion_tokens, Some(10 * out.calls as u64));
        assert!(canned.most_in_flight.load(Ordering::SeqCst) <= 2);
        let inputs = canned.inputs.lock().unwrap();
        assert!(inputs[0].starts_with(&format!("Part 1 of {} ", out.chunks)));
        let reduce = inputs.last().unwrap();
        assert!(reduce.starts_with("Summaries of consecutive parts"));
        assert!(reduce.contains(&format!("<part {}>", out.chunks)));
    }

    #[tokio::test]
    async fn past_max_chunks_or_a_failed_call_is_an_error() {
        let canned = Arc::new(Canned::default());
        let mut few = limits(1200);
        few.max_chunks = 2;
        let err = summarize(
            canned.clone(),
            &entries(40, 400),
            &PromptSettings::default(),
            few,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, SummarizeError::TooManyChunks { allowed: 2, .. }),
            "{err:?}"
        );
        assert!(err.is_over_limits());
        assert!(canned.inputs.lock().unwrap().is_empty(), "no call is made");

        let failing = Arc::new(Canned {
            fail_at: Some(1),
            ..Canned::default()
        });
        let err = summarize(
            failing,
            &entries(40, 400),
            &PromptSettings::default(),
            limits(1200),
        )
        .await
        .unwrap_err();
        assert_eq!(err, SummarizeError::Status(500));
    }

    #[tokio::test]
    async fn one_pass_allowed_cannot_merge_chunks() {
        let mut one = limits(1200);
        one.max_passes = 1;
        let err = summarize(
            Arc::new(Canned::default()),
            &entries(40, 400),
            &PromptSettings::default(),
            one,
        )
        .await
        .unwrap_err();
        assert_eq!(err, SummarizeError::NoConvergence(1));
    }
}
