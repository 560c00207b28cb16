//! Reading a response's usage as it passes: the cost the usage reader adds
//! to each frame of a stream (chat chunks of a few words, Anthropic deltas)
//! and to a plain JSON answer, next to a pass of `memchr` over the same
//! bytes (the floor of any look at them). Throughput is per byte of
//! response.
//!
//! Run: `cargo bench --bench usage -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;

use compaction_proxy::format::Format;
use compaction_proxy::usage::Reader;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::{HeaderMap, HeaderValue, StatusCode};

fn headers(content_type: &'static str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    h
}

/// A chat stream of `n` content chunks, then the usage chunk and `[DONE]`,
/// one frame each, as include_usage sends it (`"usage":null` on every chunk).
fn chat_stream(n: usize) -> Vec<Vec<u8>> {
    let mut frames: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            format!(
                "data: {{\"id\":\"chatcmpl-AbC\",\"object\":\"chat.completion.chunk\",\"created\":1727000000,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" word{i} and\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
            )
            .into_bytes()
        })
        .collect();
    frames.push(b"data: {\"id\":\"chatcmpl-AbC\",\"object\":\"chat.completion.chunk\",\"created\":1727000000,\"model\":\"gpt-4o-2024-08-06\",\"choices\":[],\"usage\":{\"prompt_tokens\":12000,\"completion_tokens\":500,\"total_tokens\":12500,\"prompt_tokens_details\":{\"cached_tokens\":11520}}}\n\n".to_vec());
    frames.push(b"data: [DONE]\n\n".to_vec());
    frames
}

/// An Anthropic stream of `n` text deltas.
fn anthropic_stream(n: usize) -> Vec<Vec<u8>> {
    let mut frames = vec![b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":40,\"cache_creation_input_tokens\":3000,\"cache_read_input_tokens\":12000,\"output_tokens\":1}}}\n\n".to_vec()];
    frames.extend((0..n).map(|i| {
        format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\" word{i} and more\"}}}}\n\n").into_bytes()
    }));
    frames.push(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":500}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_vec());
    frames
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("usage");
    let cases = [
        ("chat stream, 500 chunks", Format::Chat, "text/event-stream", chat_stream(500)),
        ("anthropic stream, 500 deltas", Format::Anthropic, "text/event-stream", anthropic_stream(500)),
        (
            "chat JSON, 20 KB answer",
            Format::Chat,
            "application/json",
            vec![format!(
                "{{\"id\":\"c\",\"object\":\"chat.completion\",\"model\":\"gpt-4o\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{}\"}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":9000,\"completion_tokens\":5000,\"prompt_tokens_details\":{{\"cached_tokens\":8000}}}}}}",
                "the answer, with \\\"quotes\\\" and \\n newlines. ".repeat(400)
            )
            .into_bytes()],
        ),
    ];
    for (name, format, content_type, frames) in &cases {
        let bytes: usize = frames.iter().map(Vec::len).sum();
        group.throughput(Throughput::Bytes(bytes as u64));
        let h = headers(content_type);
        group.bench_function(format!("{name}: reader"), |b| {
            b.iter(|| {
                let mut reader = Reader::for_response(*format, StatusCode::OK, &h).unwrap();
                for frame in frames {
                    reader.feed(black_box(frame));
                }
                let read = reader.finish();
                assert!(read.usage.is_some());
                read
            })
        });
        group.bench_function(format!("{name}: memchr floor"), |b| {
            b.iter(|| {
                frames
                    .iter()
                    .map(|f| memchr::memchr_iter(b'\n', black_box(f)).count())
                    .sum::<usize>()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
