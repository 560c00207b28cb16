//! Whether a streamed response has sent its terminal event, so that a
//! client leaving right after it (SDKs close on `data: [DONE]`) is recorded
//! as complete, not as gone.
//!
//! An SSE event is a set of lines; a terminal one is told by how one of its
//! lines starts. Only line starts are compared: inside a JSON `data:` line a
//! newline is always escaped, so a marker quoted in a model's text never
//! starts a line. A line may begin in one frame and go on in the next, so
//! the first bytes of the current line are carried over.

/// How the lines of each format's terminal event start: chat's `[DONE]`,
/// Anthropic's `message_stop`, and the three endings of a Responses stream,
/// each with or without its `event:` line.
const MARKERS: [&[u8]; 9] = [
    b"data: [DONE]",
    b"event: message_stop",
    b"data: {\"type\":\"message_stop\"",
    b"event: response.completed",
    b"event: response.failed",
    b"event: response.incomplete",
    b"data: {\"type\":\"response.completed\"",
    b"data: {\"type\":\"response.failed\"",
    b"data: {\"type\":\"response.incomplete\"",
];

/// The longest marker: no more of a line is ever needed.
const HEAD: usize = 36;

const _: () = {
    let mut i = 0;
    while i < MARKERS.len() {
        assert!(MARKERS[i].len() <= HEAD);
        i += 1;
    }
};

fn is_terminal(line_start: &[u8]) -> bool {
    MARKERS.iter().any(|m| line_start.starts_with(m))
}

/// Reads a stream frame by frame; [`StreamEnd::feed`] says whether the
/// terminal event has been seen.
#[derive(Debug, Clone)]
pub struct StreamEnd {
    /// The first bytes (up to [`HEAD`]) of the line not yet ended.
    head: [u8; HEAD],
    head_len: usize,
    seen: bool,
}

impl Default for StreamEnd {
    fn default() -> Self {
        StreamEnd {
            head: [0; HEAD],
            head_len: 0,
            seen: false,
        }
    }
}

impl StreamEnd {
    /// Whether a terminal event has gone by.
    pub fn seen(&self) -> bool {
        self.seen
    }

    /// Reads the next frame; true once a terminal event has gone by.
    pub fn feed(&mut self, data: &[u8]) -> bool {
        if self.seen {
            return true;
        }
        let mut newlines = memchr::memchr_iter(b'\n', data);
        let first_end = newlines.next();
        // The line carried over from the last frame, completed or extended.
        let carried = &data[..first_end.unwrap_or(data.len())];
        let take = carried.len().min(HEAD - self.head_len);
        self.head[self.head_len..self.head_len + take].copy_from_slice(&carried[..take]);
        self.head_len += take;
        if is_terminal(&self.head[..self.head_len]) {
            self.seen = true;
            return true;
        }
        let Some(first_end) = first_end else {
            return false;
        };
        // Every line starting in this frame.
        let mut start = first_end + 1;
        for end in newlines.chain(std::iter::once(data.len())) {
            if is_terminal(&data[start..]) {
                self.seen = true;
                return true;
            }
            if end == data.len() {
                break;
            }
            start = end + 1;
        }
        // The last line goes on in the next frame.
        let rest = &data[start..];
        self.head_len = rest.len().min(HEAD);
        self.head[..self.head_len].copy_from_slice(&rest[..self.head_len]);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(frames: &[&[u8]]) -> bool {
        let mut end = StreamEnd::default();
        frames.iter().fold(false, |_, f| end.feed(f))
    }

    #[test]
    fn terminal_events_of_each_stream_format_are_recognised() {
        assert!(ends(&[b"data: {\"x\":1}\n\ndata: [DONE]\n\n"]));
        assert!(ends(&[
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        ]));
        assert!(ends(&[b"data: {\"type\":\"message_stop\"}\n\n"]));
        for ending in ["completed", "failed", "incomplete"] {
            let event = format!("event: response.{ending}\ndata: {{}}\n\n");
            assert!(ends(&[event.as_bytes()]), "{event}");
            let bare = format!("data: {{\"type\":\"response.{ending}\",\"response\":{{}}}}\n\n");
            assert!(ends(&[bare.as_bytes()]), "{bare}");
        }
        assert!(!ends(&[b"data: {\"choices\":[]}\n\n"]));
        assert!(!ends(&[b"event: response.output_text.delta\ndata: {}\n\n"]));
    }

    #[test]
    fn a_terminal_event_is_found_wherever_it_lies_in_a_long_frame() {
        // A Responses stream ends with the whole response: its marker is
        // at the start of a long event, not near the frame's end.
        let text = "x".repeat(4096);
        let completed = format!(
            "event: response.output_text.done\ndata: {{}}\n\n\
             event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"text\":\"{text}\"}}}}\n\n"
        );
        assert!(ends(&[completed.as_bytes()]));
        let mut long = vec![b'x'; 4096];
        long.extend_from_slice(b"\ndata: [DONE]\n\n");
        assert!(ends(&[&long]));
    }

    #[test]
    fn a_marker_split_across_frames_is_found() {
        let stream: &[u8] = b"data: {}\n\ndata: [DONE]\n\n";
        for cut in 0..=stream.len() {
            let (a, b) = stream.split_at(cut);
            assert!(ends(&[a, b]), "cut at {cut}");
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert!(ends(&bytes));
    }

    #[test]
    fn a_marker_inside_a_line_is_not_an_ending() {
        // A model quoting a marker: JSON escapes its newlines, so the
        // marker never starts a line.
        assert!(!ends(&[
            b"data: {\"delta\":\"then data: [DONE] and \\nevent: message_stop\"}\n\n"
        ]));
        // Split so that the quoted marker starts a frame.
        assert!(!ends(&[
            b"data: {\"delta\":\"then ",
            b"data: [DONE]\"}\n\n"
        ]));
    }

    #[test]
    fn once_seen_the_ending_stays_seen() {
        let mut end = StreamEnd::default();
        assert!(end.feed(b"data: [DONE]\n\n"));
        assert!(end.feed(b": keep-alive\n\n"));
    }
}
