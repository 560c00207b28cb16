//! Conversations sent turn by turn, and what a provider with prompt caching
//! bills for them: shared by `benches/stable.rs` and its small test version
//! (`tests/integration/stable_mode.rs`).
//!
//! Billing model of issue 7: billed input = chars not repeating the
//! previous request's prefix + 10% of the chars that do. The prefix is
//! counted in whole messages: a provider serves from cache every message
//! before the first one that changed.

#![allow(dead_code)]

use std::time::Instant;

use compaction_proxy::compaction::stable::{Checkpoints, NoCheckpoints};
use compaction_proxy::format::Format;
use compaction_proxy::policy::CompiledPolicy;
use compaction_proxy::proxy::compact::outcome_of;
use serde_json::{json, Value};

/// A deterministic generator (Knuth's MMIX LCG): no RNG dependency.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.next() as usize % (hi - lo + 1)
    }

    pub fn words(&mut self, chars: usize) -> String {
        const WORDS: &[&str] = &[
            "order",
            "depot",
            "route",
            "truck",
            "driver",
            "invoice",
            "customer",
            "delay",
            "the",
            "a",
            "to",
            "of",
            "and",
            "in",
            "is",
            "for",
            "on",
            "with",
            "that",
            "we",
            "src/main.rs",
            "error",
            "test",
            "build",
            "function",
            "returns",
            "value",
            "line",
            "Stockholm",
            "Norrby",
            "7731",
            "pallet",
            "schedule",
            "window",
            "ETA",
            "manifest",
        ];
        let mut s = String::with_capacity(chars + 16);
        while s.len() < chars {
            s.push_str(WORDS[self.next() as usize % WORDS.len()]);
            s.push(if self.next() % 12 == 0 { '.' } else { ' ' });
        }
        s.truncate(chars);
        s
    }
}

/// The request bodies of one conversation, turn by turn: each is the
/// previous one plus the model's answer and the next input.
pub fn requests(history: &[Value], starts: &[usize]) -> Vec<Vec<u8>> {
    starts
        .iter()
        .map(|&end| {
            serde_json::to_vec(&json!({"model": "gpt-4o", "messages": &history[..end]})).unwrap()
        })
        .collect()
}

/// A dispatcher chat of `turns` turns: users write 150–450 chars, the
/// assistant answers 300–900. Returns the messages and each request's end.
pub fn dispatcher_chat(turns: usize, seed: u64) -> (Vec<Value>, Vec<usize>) {
    let mut rng = Lcg(seed);
    let mut history = vec![
        json!({"role": "system", "content": "You are the dispatch assistant of a freight company. Answer precisely."}),
    ];
    let mut ends = Vec::new();
    for _ in 0..turns {
        let user = rng.range(150, 450);
        history.push(json!({"role": "user", "content": rng.words(user)}));
        ends.push(history.len());
        let answer = rng.range(300, 900);
        history.push(json!({"role": "assistant", "content": rng.words(answer)}));
    }
    (history, ends)
}

/// A coding agent of `turns` turns: a system prompt and task, then rounds
/// of 1–3 parallel tool calls (arguments 60–1,500 chars) whose results run
/// 200 chars to 12 KB, with a user follow-up every 25 turns. `scale` (in
/// percent) shrinks arguments and results for quick test runs.
pub fn coding_agent(turns: usize, seed: u64, scale: usize) -> (Vec<Value>, Vec<usize>) {
    let mut rng = Lcg(seed);
    let mut history = vec![
        json!({"role": "system", "content": format!("You are a coding agent. {}", rng.words(2000))}),
        json!({"role": "user", "content": format!("Task: {}", rng.words(600))}),
    ];
    let mut ends = vec![history.len()];
    let mut call = 0;
    for turn in 1..turns {
        let calls = rng.range(1, 3);
        let mut tool_calls = Vec::new();
        let mut results = Vec::new();
        for _ in 0..calls {
            call += 1;
            let id = format!("call_{call}");
            let len = rng.range(60, 1500) * scale / 100;
            let args = json!({"path": "src/main.rs", "content": rng.words(len)});
            tool_calls.push(json!({"id": id, "type": "function", "function": {"name": if call % 3 == 0 { "write_file" } else { "read_file" }, "arguments": args.to_string()}}));
            let size = match rng.range(0, 9) {
                0..=4 => rng.range(200, 1500),
                5..=7 => rng.range(1500, 5000),
                _ => rng.range(5000, 12000),
            };
            results.push(json!({"role": "tool", "tool_call_id": id, "content": rng.words(size * scale / 100)}));
        }
        history.push(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}));
        history.extend(results);
        ends.push(history.len());
        if turn % 25 == 0 {
            // The model answers the tool results in words; the user follows
            // up: one more request.
            let (answer, follow_up) = (rng.range(200, 600), rng.range(100, 400));
            history.push(json!({"role": "assistant", "content": rng.words(answer)}));
            history.push(json!({"role": "user", "content": rng.words(follow_up)}));
            ends.push(history.len());
        }
    }
    (history, ends)
}

/// What sending a conversation turn by turn under one policy cost.
#[derive(Debug, Default)]
pub struct Bill {
    pub turns: usize,
    /// Chars a provider bills, the cached prefix at 10%.
    pub billed: f64,
    /// Turns whose forwarded messages begin with the previous turn's.
    pub extending: usize,
    /// Mean forwarded chars over the budget, on turns whose history
    /// outgrew it.
    pub fill: f64,
    pub outgrown_turns: usize,
    /// Per-turn compaction times in seconds.
    pub seconds: Vec<f64>,
    /// The forwarded bodies, in order.
    pub forwarded: Vec<Vec<u8>>,
}

impl Bill {
    pub fn extending_share(&self) -> f64 {
        // The first turn has nothing to extend.
        self.extending as f64 / (self.turns.saturating_sub(1)).max(1) as f64
    }
}

/// Sends each request through the proxy's own compaction step (or none)
/// and bills what would be forwarded.
pub fn bill(
    requests: &[Vec<u8>],
    policy: Option<&CompiledPolicy>,
    checkpoints: &dyn Checkpoints,
) -> Bill {
    let mut bill = Bill::default();
    let mut previous: Vec<String> = Vec::new();
    for request in requests {
        let started = Instant::now();
        let forwarded = match policy {
            None => request.clone(),
            Some(policy) => {
                let outcome = outcome_of(request, policy, Format::Chat, usize::MAX, checkpoints)
                    .expect("compactable");
                outcome
                    .rewritten
                    .map(|b| b.to_vec())
                    .unwrap_or_else(|| request.clone())
            }
        };
        bill.seconds.push(started.elapsed().as_secs_f64());
        let value: Value = serde_json::from_slice(&forwarded).unwrap();
        let messages: Vec<String> = value["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.to_string())
            .collect();
        let chars = |m: &String| message_chars(&serde_json::from_str(m).unwrap());
        let common = previous
            .iter()
            .zip(&messages)
            .take_while(|(a, b)| a == b)
            .count();
        if bill.turns > 0 && common == previous.len() {
            bill.extending += 1;
        }
        let total: f64 = messages.iter().map(chars).sum();
        let cached: f64 = messages[..common].iter().map(chars).sum();
        bill.billed += (total - cached) + 0.1 * cached;
        if let Some(policy) = policy {
            let input = compaction_proxy::format::chat::ChatBody::parse(request)
                .unwrap()
                .total_chars();
            if input > policy.engine.budget_chars {
                bill.fill += total / policy.engine.budget_chars as f64;
                bill.outgrown_turns += 1;
            }
        }
        bill.turns += 1;
        bill.forwarded.push(forwarded);
        previous = messages;
    }
    if bill.outgrown_turns > 0 {
        bill.fill /= bill.outgrown_turns as f64;
    }
    bill
}

/// The chars of one chat message a provider bills: its text, tool-call
/// names and arguments.
pub fn message_chars(v: &Value) -> f64 {
    let text = v["content"].as_str().unwrap_or_default().chars().count();
    let calls = v["tool_calls"].as_array().map_or(0, |c| {
        c.iter()
            .map(|c| {
                let f = &c["function"];
                f["name"].as_str().unwrap_or_default().chars().count()
                    + f["arguments"].as_str().unwrap_or_default().chars().count()
            })
            .sum()
    });
    (text + calls) as f64
}

/// What forwarded chat bodies, sent in order, are billed: the messages
/// repeating the previous body's leading ones at 10%, the rest whole.
pub fn billed_of(forwarded: &[Vec<u8>]) -> f64 {
    let mut billed = 0.0;
    let mut previous: Vec<Value> = Vec::new();
    for body in forwarded {
        let value: Value = serde_json::from_slice(body).unwrap();
        let messages = value["messages"].as_array().unwrap().clone();
        let common = previous
            .iter()
            .zip(&messages)
            .take_while(|(a, b)| a == b)
            .count();
        let total: f64 = messages.iter().map(message_chars).sum();
        let cached: f64 = messages[..common].iter().map(message_chars).sum();
        billed += (total - cached) + 0.1 * cached;
        previous = messages;
    }
    billed
}

/// `bill` with no checkpoint store (every turn replays cold).
pub fn bill_cold(requests: &[Vec<u8>], policy: Option<&CompiledPolicy>) -> Bill {
    bill(requests, policy, &NoCheckpoints)
}

/// The p-th percentile (0..=100) of some seconds.
pub fn percentile(seconds: &[f64], p: f64) -> f64 {
    let mut s = seconds.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return 0.0;
    }
    s[((s.len() - 1) as f64 * p / 100.0).round() as usize]
}
