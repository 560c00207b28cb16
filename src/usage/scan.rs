//! Finding a response's `usage` object as its frames go by, without
//! holding the response.
//!
//! A JSON document is read byte by byte as a tiny state machine: inside a
//! string (most of a model's answer) it jumps to the next quote or
//! backslash with `memchr`; outside one it tracks nesting. Only two keys
//! matter, and only near the top of the document (an object at depth 1
//! or 2: `usage` of a chat completion or a `message_delta`, `message.usage`
//! of a `message_start`, `response.usage` of `response.completed`): a
//! `usage` whose value is an object is copied out (at most
//! [`MAX_USAGE_BYTES`]) and handed to the format's reader when it closes;
//! the first `model` string is kept (at most [`MAX_MODEL_BYTES`]). A
//! `usage` deeper down (a tool's arguments, say) is never taken for the
//! bill, nor a key spelled inside a string.
//!
//! In a stream (`text/event-stream`) each `data:` line is one document;
//! other lines are skipped. State carries across frames, so a line, a key
//! or the usage object itself may be cut anywhere.
//!
//! A frame that holds no usage costs a pass over its bytes and no
//! allocation: the copy buffer is made once, when the first usage object
//! starts.

/// The most bytes of one usage object kept (a real one is under 1 KB,
/// Anthropic's with iterations a few KB). Past it the object is dropped.
pub const MAX_USAGE_BYTES: usize = 16 * 1024;
/// The most bytes of a model name kept.
pub const MAX_MODEL_BYTES: usize = 128;
/// Nesting tracked exactly; deeper levels are only counted.
const TRACKED_DEPTH: u32 = 64;

/// Whether the body is one JSON document or a stream of `data:` lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Json,
    Sse,
}

/// Where an SSE line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Reading the field name: how many bytes of `data:` matched so far.
    Start(u8),
    /// After `data:`, before the optional space.
    AfterColon,
    /// In a data line's JSON.
    Data,
    /// In a line that is not data: skipped to its end.
    Skip,
}

/// What the key before the current value was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Other,
    Usage,
    Model,
}

/// The scanner's state for one response.
#[derive(Debug)]
pub struct Scanner {
    framing: Framing,
    line: Line,
    /// Containers open, and (bit i) whether the one at depth i+1 is an object.
    depth: u32,
    objects: u64,
    in_string: bool,
    escaped: bool,
    /// The string being read is a key (of an object at depth <= 2).
    string_is_key: bool,
    /// The key read so far (enough to tell `usage` and `model` apart).
    key: [u8; 6],
    key_len: u8,
    /// The next string in this object is a key.
    expect_key: bool,
    /// The key the value now starting belongs to, at depth <= 2.
    value_of: Key,
    /// The usage object being copied, from the depth it opened at.
    capture: Vec<u8>,
    capture_depth: Option<u32>,
    /// The model name, as found (or being read).
    model: [u8; MAX_MODEL_BYTES],
    model_len: usize,
    reading_model: bool,
    model_done: bool,
}

impl Scanner {
    pub fn new(framing: Framing) -> Self {
        Scanner {
            framing,
            line: Line::Start(0),
            depth: 0,
            objects: 0,
            in_string: false,
            escaped: false,
            string_is_key: false,
            key: [0; 6],
            key_len: 0,
            expect_key: false,
            value_of: Key::Other,
            capture: Vec::new(),
            capture_depth: None,
            model: [0; MAX_MODEL_BYTES],
            model_len: 0,
            reading_model: false,
            model_done: false,
        }
    }

    /// The model the response named (its first top-level `model`).
    pub fn model(&self) -> Option<&str> {
        if !self.model_done || self.model_len == 0 {
            return None;
        }
        std::str::from_utf8(&self.model[..self.model_len]).ok()
    }

    /// Reads the next bytes; `found` gets each usage object completed in them.
    pub fn feed(&mut self, mut data: &[u8], found: &mut impl FnMut(&[u8])) {
        while !data.is_empty() {
            let used = match self.framing {
                Framing::Json => self.json(data, found),
                Framing::Sse => self.sse(data, found),
            };
            data = &data[used..];
        }
    }

    /// Reads SSE bytes up to a line's end or a state change; returns how
    /// many it used.
    fn sse(&mut self, data: &[u8], found: &mut impl FnMut(&[u8])) -> usize {
        const FIELD: &[u8] = b"data:";
        match self.line {
            Line::Start(matched) => {
                let b = data[0];
                if b == b'\n' || b == b'\r' {
                    self.line = Line::Start(0);
                } else if b == FIELD[usize::from(matched)] {
                    self.line = if usize::from(matched) + 1 == FIELD.len() {
                        Line::AfterColon
                    } else {
                        Line::Start(matched + 1)
                    };
                } else {
                    self.line = Line::Skip;
                }
                1
            }
            Line::AfterColon => {
                self.line = Line::Data;
                self.reset_document();
                usize::from(data[0] == b' ')
            }
            Line::Skip => match memchr::memchr(b'\n', data) {
                Some(end) => {
                    self.line = Line::Start(0);
                    end + 1
                }
                None => data.len(),
            },
            Line::Data => {
                // JSON escapes its newlines: the first raw one ends the line.
                let end = memchr::memchr(b'\n', data);
                let line = &data[..end.unwrap_or(data.len())];
                let mut used = 0;
                while used < line.len() {
                    used += self.json(&line[used..], found);
                }
                if let Some(end) = end {
                    self.line = Line::Start(0);
                    return end + 1;
                }
                used
            }
        }
    }

    /// A new document starts (each SSE data line): what an unfinished one
    /// left is dropped.
    fn reset_document(&mut self) {
        self.depth = 0;
        self.objects = 0;
        self.in_string = false;
        self.escaped = false;
        self.string_is_key = false;
        self.key_len = 0;
        self.expect_key = false;
        self.value_of = Key::Other;
        self.capture.clear();
        self.capture_depth = None;
        if self.reading_model {
            self.reading_model = false;
            self.model_len = 0;
        }
    }

    fn top_is_object(&self) -> bool {
        self.depth >= 1 && self.depth <= TRACKED_DEPTH && self.objects >> (self.depth - 1) & 1 == 1
    }

    /// Whether every container open is an object and there are at most two:
    /// where the bill's `usage` and the `model` are.
    fn near_top(&self) -> bool {
        (self.depth == 1 && self.objects & 1 == 1) || (self.depth == 2 && self.objects & 3 == 3)
    }

    /// Reads JSON bytes; returns how many it used (at least one).
    fn json(&mut self, data: &[u8], found: &mut impl FnMut(&[u8])) -> usize {
        if self.in_string {
            return self.string(data);
        }
        let b = data[0];
        if self.capture_depth.is_some() {
            self.keep(&[b]);
        }
        match b {
            b'"' => {
                self.in_string = true;
                self.escaped = false;
                self.string_is_key = self.expect_key && self.near_top();
                self.key_len = 0;
                if !self.expect_key
                    && self.value_of == Key::Model
                    && !self.model_done
                    && self.near_top()
                {
                    self.reading_model = true;
                    self.model_len = 0;
                }
                self.value_of = Key::Other;
            }
            b':' => {
                self.expect_key = false;
            }
            b',' => {
                self.expect_key = self.top_is_object();
                self.value_of = Key::Other;
            }
            b'{' | b'[' => {
                let object = b == b'{';
                if object && self.value_of == Key::Usage && self.capture_depth.is_none() {
                    self.capture.clear();
                    self.capture.reserve(512);
                    self.capture.push(b'{');
                    self.capture_depth = Some(self.depth);
                }
                self.value_of = Key::Other;
                if self.depth < TRACKED_DEPTH {
                    let bit = 1u64 << self.depth;
                    self.objects = if object {
                        self.objects | bit
                    } else {
                        self.objects & !bit
                    };
                }
                self.depth = self.depth.saturating_add(1);
                self.expect_key = object;
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                self.expect_key = false;
                self.value_of = Key::Other;
                if self.capture_depth == Some(self.depth) {
                    self.capture_depth = None;
                    if !self.capture.is_empty() {
                        found(&self.capture);
                    }
                    self.capture.clear();
                }
            }
            _ => {
                // Whitespace keeps what the key said; a scalar uses it up.
                if !b.is_ascii_whitespace() {
                    self.value_of = Key::Other;
                }
            }
        }
        1
    }

    /// Reads string bytes up to and including its closing quote.
    fn string(&mut self, data: &[u8]) -> usize {
        if self.escaped {
            self.escaped = false;
            self.string_bytes(&data[..1]);
            return 1;
        }
        match memchr::memchr2(b'"', b'\\', data) {
            None => {
                self.string_bytes(data);
                data.len()
            }
            Some(i) if data[i] == b'\\' => {
                self.string_bytes(&data[..=i]);
                self.escaped = true;
                i + 1
            }
            Some(i) => {
                self.string_bytes(&data[..i]);
                if self.capture_depth.is_some() {
                    self.keep(b"\"");
                }
                self.in_string = false;
                if self.string_is_key {
                    self.value_of = match &self.key[..usize::from(self.key_len)] {
                        b"usage" => Key::Usage,
                        b"model" => Key::Model,
                        _ => Key::Other,
                    };
                } else if self.reading_model {
                    self.reading_model = false;
                    self.model_done = true;
                }
                self.string_is_key = false;
                i + 1
            }
        }
    }

    fn string_bytes(&mut self, bytes: &[u8]) {
        if self.capture_depth.is_some() {
            self.keep(bytes);
        }
        if self.string_is_key {
            for &b in bytes {
                if usize::from(self.key_len) < self.key.len() {
                    self.key[usize::from(self.key_len)] = b;
                }
                // Longer keys stay longer than any compared.
                self.key_len = self.key_len.saturating_add(1).min(self.key.len() as u8);
            }
        } else if self.reading_model {
            let room = MAX_MODEL_BYTES - self.model_len;
            let take = bytes.len().min(room);
            self.model[self.model_len..self.model_len + take].copy_from_slice(&bytes[..take]);
            self.model_len += take;
        }
    }

    fn keep(&mut self, bytes: &[u8]) {
        if self.capture.len() + bytes.len() > MAX_USAGE_BYTES {
            // Too large to be a usage block: dropped, never half-read.
            self.capture_depth = None;
            self.capture = Vec::new();
            return;
        }
        self.capture.extend_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(framing: Framing, frames: &[&[u8]]) -> (Vec<String>, Option<String>) {
        let mut scanner = Scanner::new(framing);
        let mut found = Vec::new();
        for frame in frames {
            scanner.feed(frame, &mut |u| {
                found.push(String::from_utf8(u.to_vec()).unwrap())
            });
        }
        (found, scanner.model().map(str::to_owned))
    }

    #[test]
    fn a_top_level_usage_object_is_found_with_the_model() {
        let body = br#"{"id":"x","model":"gpt-4o-mini","choices":[{"message":{"content":"hi \"usage\": {"}}],"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":2}}}"#;
        let (found, model) = scan(Framing::Json, &[body]);
        assert_eq!(
            found,
            [r#"{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":2}}"#]
        );
        assert_eq!(model.as_deref(), Some("gpt-4o-mini"));
    }

    #[test]
    fn usage_deeper_down_or_null_is_not_the_bill() {
        let body = br#"{"model":"m","content":[{"type":"tool_use","input":{"usage":{"input_tokens":5}}}],"usage":null}"#;
        assert_eq!(scan(Framing::Json, &[body]).0, Vec::<String>::new());
        // A nested object's `model` is not the response's.
        let body = br#"{"content":[{"model":"inner"}],"x":{"model":"second"}}"#;
        assert_eq!(scan(Framing::Json, &[body]).1.as_deref(), Some("second"));
    }

    #[test]
    fn stream_lines_are_documents_and_usage_is_found_at_depth_two() {
        let stream = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
            ": comment with \"usage\":{\"x\":1}\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n",
            "data: [DONE]\n\n",
        );
        let (found, model) = scan(Framing::Sse, &[stream.as_bytes()]);
        assert_eq!(
            found,
            [
                r#"{"input_tokens":10,"output_tokens":1}"#,
                r#"{"output_tokens":7}"#
            ]
        );
        assert_eq!(model.as_deref(), Some("claude-sonnet-4-5"));
    }

    #[test]
    fn every_cut_of_a_stream_finds_the_same() {
        let stream = "data: {\"model\":\"gpt-4o\",\"choices\":[],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\ndata: [DONE]\n\n";
        let whole = scan(Framing::Sse, &[stream.as_bytes()]);
        assert_eq!(whole.0.len(), 1);
        for cut in 0..stream.len() {
            let (a, b) = stream.as_bytes().split_at(cut);
            assert_eq!(scan(Framing::Sse, &[a, b]), whole, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = stream.as_bytes().chunks(1).collect();
        assert_eq!(scan(Framing::Sse, &bytes), whole);
    }

    #[test]
    fn an_unfinished_line_does_not_leak_into_the_next() {
        let stream = "data: {\"usage\":{\"a\":1\ndata: {\"usage\":{\"b\":2}}\n";
        assert_eq!(scan(Framing::Sse, &[stream.as_bytes()]).0, [r#"{"b":2}"#]);
    }

    #[test]
    fn an_oversized_usage_object_is_dropped() {
        let big = format!(
            "{{\"usage\":{{\"x\":\"{}\"}},\"model\":\"m\"}}",
            "a".repeat(MAX_USAGE_BYTES)
        );
        let (found, model) = scan(Framing::Json, &[big.as_bytes()]);
        assert!(found.is_empty());
        assert_eq!(model.as_deref(), Some("m"));
    }

    #[test]
    fn a_frame_without_usage_allocates_nothing() {
        let mut scanner = Scanner::new(Framing::Sse);
        let frame =
            b"data: {\"choices\":[{\"delta\":{\"content\":\"hello there\"}}],\"usage\":null}\n\n";
        for _ in 0..100 {
            scanner.feed(frame, &mut |_| panic!("no usage here"));
        }
        assert_eq!(scanner.capture.capacity(), 0);
    }
}
