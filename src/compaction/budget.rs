//! `budget = "auto"` (seed 002's dynamic mode): the token budget of a
//! request is its model's context window, minus the output tokens the
//! request asks for (`max_tokens`, `max_completion_tokens`,
//! `max_output_tokens`) and the policy's `reserve_tokens`.
//!
//! Context windows come from the policy's `context_windows` table first,
//! then from [`BUILT_IN_CONTEXT_WINDOWS`]; in each, the longest model-name
//! prefix wins. A model neither table knows gets no derived budget: the
//! policy's fixed budgets (`budget_chars`, `budget_tokens`) apply instead.

/// Context windows (tokens) of current OpenAI and Anthropic model
/// families, by model-name prefix. A policy's `context_windows` adds to and
/// overrides these.
pub const BUILT_IN_CONTEXT_WINDOWS: &[(&str, usize)] = &[
    // OpenAI.
    ("gpt-5", 400_000),
    ("gpt-5-chat", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4.5", 128_000),
    ("gpt-4o", 128_000),
    ("chatgpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4-1106", 128_000),
    ("gpt-4-0125", 128_000),
    ("gpt-4-32k", 32_768),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("o1", 200_000),
    ("o1-mini", 128_000),
    ("o1-preview", 128_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    // Anthropic: every Claude 3, 3.5, 3.7, 4 and 4.5 model.
    ("claude-", 200_000),
];

/// A policy's `budget = "auto"` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoBudget {
    /// The policy's `context_windows`: (model-name prefix, tokens).
    pub windows: Vec<(String, usize)>,
    /// Tokens kept free beside the requested output.
    pub reserve_tokens: usize,
}

/// The value of the longest key of `table` that prefixes `model`.
fn longest_prefix<'a>(
    table: impl IntoIterator<Item = (&'a str, usize)>,
    model: &str,
) -> Option<usize> {
    table
        .into_iter()
        .filter(|(prefix, _)| model.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, tokens)| tokens)
}

impl AutoBudget {
    /// The context window of `model`: the policy's table first, then the
    /// built-in one. Fine-tunes (`ft:gpt-4o:acme`) read as their base model.
    pub fn context_window(&self, model: &str) -> Option<usize> {
        let base = model.strip_prefix("ft:").unwrap_or(model);
        longest_prefix(self.windows.iter().map(|(p, n)| (p.as_str(), *n)), base)
            .or_else(|| longest_prefix(BUILT_IN_CONTEXT_WINDOWS.iter().copied(), base))
    }

    /// The token budget of a request for `model` that asks for up to
    /// `max_output` tokens; `None` for a model no table knows. A request
    /// whose output and reserve take the whole window gets 0: everything
    /// unprotected goes, and the budget is reported missed.
    pub fn budget_tokens(&self, model: Option<&str>, max_output: Option<usize>) -> Option<usize> {
        let window = self.context_window(model?)?;
        Some(
            window
                .saturating_sub(max_output.unwrap_or(0))
                .saturating_sub(self.reserve_tokens),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto(windows: &[(&str, usize)], reserve_tokens: usize) -> AutoBudget {
        AutoBudget {
            windows: windows.iter().map(|(p, n)| (p.to_string(), *n)).collect(),
            reserve_tokens,
        }
    }

    #[test]
    fn the_longest_known_prefix_gives_the_window() {
        let a = auto(&[], 0);
        assert_eq!(a.context_window("gpt-4o-mini-2024-07-18"), Some(128_000));
        assert_eq!(a.context_window("gpt-4.1-nano"), Some(1_047_576));
        assert_eq!(a.context_window("gpt-4-turbo-preview"), Some(128_000));
        assert_eq!(a.context_window("gpt-4-0613"), Some(8_192));
        assert_eq!(a.context_window("gpt-5-mini"), Some(400_000));
        assert_eq!(a.context_window("gpt-5-chat-latest"), Some(128_000));
        assert_eq!(a.context_window("o1-mini"), Some(128_000));
        assert_eq!(a.context_window("o3-pro"), Some(200_000));
        assert_eq!(a.context_window("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(a.context_window("ft:gpt-4o:acme:x"), Some(128_000));
        assert_eq!(a.context_window("llama-3.1-70b"), None);
    }

    #[test]
    fn the_policy_table_comes_before_the_built_in_one() {
        let a = auto(
            &[
                ("gpt-4o", 64_000),
                ("llama-3", 8_000),
                ("llama-3.1", 131_072),
            ],
            0,
        );
        assert_eq!(a.context_window("gpt-4o-mini"), Some(64_000));
        assert_eq!(a.context_window("llama-3-8b"), Some(8_000));
        assert_eq!(a.context_window("llama-3.1-70b"), Some(131_072));
        assert_eq!(a.context_window("claude-opus-4-1"), Some(200_000));
    }

    #[test]
    fn the_budget_is_the_window_minus_output_and_reserve() {
        let a = auto(&[("m", 10_000)], 1_500);
        assert_eq!(a.budget_tokens(Some("m-1"), Some(2_000)), Some(6_500));
        assert_eq!(a.budget_tokens(Some("m-1"), None), Some(8_500));
        assert_eq!(a.budget_tokens(Some("m-1"), Some(9_000)), Some(0));
        assert_eq!(a.budget_tokens(Some("unknown"), Some(10)), None);
        assert_eq!(a.budget_tokens(None, Some(10)), None);
    }
}
