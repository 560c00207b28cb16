//! The summarizer client: how the proxy asks a model for a summary.
//!
//! - [`Summarize`]: the one small trait (a request in, text and usage out),
//!   so map-reduce and the pipeline are tested without a network;
//! - one file per wire format, like [`crate::format`]: [`chat`] (OpenAI
//!   chat completions), [`anthropic`] (Anthropic Messages), [`responses`]
//!   (OpenAI Responses): each builds its request body and reads an answer;
//! - [`client`]: the HTTP implementation (its own hyper client, a total
//!   deadline, the caller's key only under `credentials = "caller"`);
//! - [`prompt`]: the prompt's frame and the transcript it is given;
//! - [`mapreduce`]: a transcript larger than the window in chunks, then a
//!   reduce pass.
//!
//! Every failure is a [`SummarizeError`] with a bounded reason, which the
//! proxy turns into a fallback to the engine, never a failed request.

pub mod anthropic;
pub mod chat;
pub mod client;
pub mod decisions;
pub mod mapreduce;
pub mod prompt;
pub mod responses;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http::Uri;

use crate::format::Format;

/// A compiled `[summarizers.<name>]` section.
#[derive(Debug, Clone)]
pub struct Settings {
    pub name: std::sync::Arc<str>,
    /// The endpoint the format's requests go to (path included).
    pub endpoint: Uri,
    pub format: Format,
    pub model: String,
    pub credentials: Credentials,
    /// For one whole summary, every call of its map-reduce included.
    pub timeout: Duration,
    pub window_tokens: usize,
    pub max_concurrency: usize,
    pub max_chunks: usize,
    pub max_passes: usize,
    pub max_output_tokens: usize,
}

/// Whose key a summarizer call carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// The key of the request being compacted (its `authorization`,
    /// `x-api-key` or `api-key` header).
    Caller,
    /// The key in this environment variable, read at each call.
    Env(String),
}

impl Credentials {
    /// Reads a `credentials` value: `"caller"` or `"env:NAME"`.
    pub fn parse(text: &str) -> Result<Credentials, String> {
        if text == "caller" {
            return Ok(Credentials::Caller);
        }
        match text.strip_prefix("env:") {
            Some(name)
                if !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                Ok(Credentials::Env(name.to_owned()))
            }
            _ => Err(format!(
                "{text:?}: expected \"caller\" or \"env:NAME\" with NAME an environment variable"
            )),
        }
    }
}

impl Settings {
    /// The endpoint for `format` at `url`: a URL with no path (or `/`)
    /// gets the format's standard path; one with a path is used as given.
    pub fn endpoint_for(url: &Uri, format: Format) -> Uri {
        let path = url.path();
        if !(path.is_empty() || path == "/") {
            return url.clone();
        }
        let mut parts = url.clone().into_parts();
        let standard = match format {
            Format::Chat => "/v1/chat/completions",
            Format::Anthropic => "/v1/messages",
            Format::Responses => "/v1/responses",
        };
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static(standard));
        Uri::from_parts(parts).unwrap_or_else(|_| url.clone())
    }
}

/// One call's input: the frame (a system prompt) and the text to work on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRequest {
    pub system: String,
    pub user: String,
    pub max_output_tokens: usize,
}

/// What the provider reported it used; `None` when it reported nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

impl Usage {
    /// Sums two calls' usage; a side that reported nothing adds nothing,
    /// and the sum is `None` only when neither reported.
    pub fn plus(self, other: Usage) -> Usage {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        Usage {
            prompt_tokens: sum(self.prompt_tokens, other.prompt_tokens),
            completion_tokens: sum(self.completion_tokens, other.completion_tokens),
        }
    }
}

/// One call's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub text: String,
    pub usage: Usage,
}

/// Why a summary could not be had. [`SummarizeError::reason`] is the
/// bounded label of `summarize_fallbacks_total`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummarizeError {
    #[error("the summarizer did not answer within its deadline")]
    Timeout,
    #[error("the summarizer could not be reached: {0}")]
    Transport(String),
    #[error("the summarizer answered HTTP {0}")]
    Status(u16),
    #[error("the summarizer refused")]
    Refusal,
    #[error("the summarizer's answer was empty")]
    Empty,
    #[error("the summarizer's answer was not one its format allows")]
    Garbage,
    #[error("no key for the summarizer: {0}")]
    Credentials(String),
    #[error("the conversation needs {needed} chunks, more than the {allowed} allowed")]
    TooManyChunks { needed: usize, allowed: usize },
    #[error("the chunk summaries did not merge into one within {0} passes")]
    NoConvergence(usize),
    /// A decision answer in the right shape that does not decide each
    /// candidate exactly once (`tool_decisions = "model"`).
    #[error("the decisions do not match the candidates: {0}")]
    InvalidDecisions(String),
    /// The decision model's observation does not fit its window.
    #[error("the observation needs {needed} chars, more than the {room} that fit")]
    ObservationTooLarge { needed: usize, room: usize },
}

impl SummarizeError {
    pub fn reason(&self) -> &'static str {
        match self {
            SummarizeError::Timeout => "timeout",
            SummarizeError::Transport(_) => "transport",
            SummarizeError::Status(_) => "status",
            SummarizeError::Refusal => "refusal",
            SummarizeError::Empty => "empty",
            SummarizeError::Garbage => "garbage",
            SummarizeError::Credentials(_) => "credentials",
            SummarizeError::TooManyChunks { .. } => "too-many-chunks",
            SummarizeError::NoConvergence(_) => "no-convergence",
            SummarizeError::InvalidDecisions(_) => "invalid-decisions",
            SummarizeError::ObservationTooLarge { .. } => "too-large",
        }
    }

    /// Whether the conversation itself is beyond the limits (not the
    /// summarizer failing): the compact API answers it 400.
    pub fn is_over_limits(&self) -> bool {
        matches!(
            self,
            SummarizeError::TooManyChunks { .. } | SummarizeError::NoConvergence(_)
        )
    }
}

/// A boxed future, so the trait can be used as `dyn Summarize`.
pub type SummaryFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Summary, SummarizeError>> + Send + 'a>>;

/// A model that writes one summary per request.
pub trait Summarize: Send + Sync {
    fn summarize<'a>(&'a self, request: &'a SummaryRequest) -> SummaryFuture<'a>;
}

/// Summarizes `entries` with the summarizer `settings` name, within its
/// total deadline (`timeout_secs`, every map-reduce call included): the
/// one path from a transcript to a summary, shared by the proxy's
/// summaries and the context-compact API, so a deadline is always
/// [`SummarizeError::Timeout`] and every other failure keeps its own
/// [`SummarizeError::reason`].
pub async fn summarize_within(
    client: &client::HttpClient,
    settings: std::sync::Arc<Settings>,
    caller: client::CallerKey,
    entries: &[String],
    prompt: &prompt::PromptSettings,
) -> Result<mapreduce::Written, SummarizeError> {
    let summarizer: std::sync::Arc<dyn Summarize> = std::sync::Arc::new(client::HttpSummarizer {
        client: client.clone(),
        settings: settings.clone(),
        caller,
    });
    within(
        settings.timeout,
        mapreduce::summarize(
            summarizer,
            entries,
            prompt,
            mapreduce::Limits::of(&settings),
        ),
    )
    .await
}

/// `work` within `deadline`; past it, [`SummarizeError::Timeout`].
pub async fn within<T>(
    deadline: Duration,
    work: impl Future<Output = Result<T, SummarizeError>>,
) -> Result<T, SummarizeError> {
    tokio::time::timeout(deadline, work)
        .await
        .map_err(|_| SummarizeError::Timeout)?
}

/// What every format's reader checks of the text it found: something is
/// there, and it is not a refusal in place of a summary.
pub(crate) fn checked(text: String, usage: Usage) -> Result<Summary, SummarizeError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(SummarizeError::Empty);
    }
    if looks_like_refusal(trimmed) {
        return Err(SummarizeError::Refusal);
    }
    Ok(Summary {
        text: trimmed.to_owned(),
        usage,
    })
}

/// A short answer that opens as models open a refusal. A summary never
/// starts by apologising; a long answer that happens to is kept.
fn looks_like_refusal(text: &str) -> bool {
    const OPENINGS: [&str; 6] = [
        "i'm sorry",
        "i am sorry",
        "sorry,",
        "i can't",
        "i cannot",
        "i can\u{2019}t",
    ];
    let head: String = text.chars().take(20).collect::<String>().to_lowercase();
    text.chars().count() < 400 && OPENINGS.iter().any(|o| head.starts_with(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_the_caller_or_a_named_variable() {
        assert_eq!(Credentials::parse("caller"), Ok(Credentials::Caller));
        assert_eq!(
            Credentials::parse("env:SUMMARY_KEY"),
            Ok(Credentials::Env("SUMMARY_KEY".into()))
        );
        for bad in ["", "env:", "env:A-B", "key", "Caller"] {
            assert!(Credentials::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bare_url_gets_the_formats_path_and_a_path_is_kept() {
        let bare: Uri = "http://127.0.0.1:9000".parse().unwrap();
        assert_eq!(
            Settings::endpoint_for(&bare, Format::Anthropic).to_string(),
            "http://127.0.0.1:9000/v1/messages"
        );
        assert_eq!(
            Settings::endpoint_for(&bare, Format::Chat).path(),
            "/v1/chat/completions"
        );
        let given: Uri = "https://gw.example/openai/v1/responses".parse().unwrap();
        assert_eq!(Settings::endpoint_for(&given, Format::Responses), given);
    }

    #[test]
    fn usage_sums_what_was_reported() {
        let a = Usage {
            prompt_tokens: Some(10),
            completion_tokens: None,
        };
        let b = Usage {
            prompt_tokens: Some(5),
            completion_tokens: Some(3),
        };
        assert_eq!(
            a.plus(b),
            Usage {
                prompt_tokens: Some(15),
                completion_tokens: Some(3)
            }
        );
        assert_eq!(Usage::default().plus(Usage::default()), Usage::default());
    }

    #[test]
    fn empty_and_refusing_answers_are_errors() {
        assert_eq!(
            checked("  \n".into(), Usage::default()),
            Err(SummarizeError::Empty)
        );
        assert_eq!(
            checked(
                "I'm sorry, but I can't help with that.".into(),
                Usage::default()
            ),
            Err(SummarizeError::Refusal)
        );
        let fine = checked(" ## Task\nFix the build. ".into(), Usage::default()).unwrap();
        assert_eq!(fine.text, "## Task\nFix the build.");
    }
}
