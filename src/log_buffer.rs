//! The log writer: standard error, buffered on the proxy's worker threads
//! the way nginx buffers its access log (`buffer=64k flush=1s`). Writing
//! each request's line with its own `write` call cost as much CPU as the
//! proxying itself; buffered, a worker writes once per [`FLUSH_BYTES`] or
//! per [`FLUSH_EVERY`] at the latest.
//!
//! Only threads that opt in ([`buffer_this_thread`], the workers) buffer.
//! Warnings and errors are never held back: they flush what the thread has
//! buffered, then go out at once, so the log stays in order per thread.

use std::cell::RefCell;
use std::io::Write;
use std::time::Duration;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// A worker writes its buffer once it holds this much.
pub const FLUSH_BYTES: usize = 32 * 1024;
/// And at least this often while it holds anything
/// ([`crate::proxy::workers`] runs the timer).
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    /// `Some` on threads that buffer.
    static BUFFER: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Makes the calling thread buffer its log lines until [`flush_this_thread`]
/// (or a full buffer, or a warning) writes them.
pub fn buffer_this_thread() {
    BUFFER.with(|b| {
        b.borrow_mut()
            .get_or_insert_with(|| Vec::with_capacity(FLUSH_BYTES + 1024));
    });
}

/// Writes what the calling thread has buffered.
pub fn flush_this_thread() {
    BUFFER.with(|b| {
        if let Some(buffer) = b.borrow_mut().as_mut() {
            write_out(buffer);
        }
    });
}

fn write_out(buffer: &mut Vec<u8>) {
    if !buffer.is_empty() {
        // Nowhere to report a failed log write: the line is lost, as with
        // an unbuffered write.
        let _ = std::io::stderr().write_all(buffer);
        buffer.clear();
    }
}

/// The [`MakeWriter`] given to the tracing subscriber.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

/// Where one event's text goes.
pub enum EventWriter {
    /// This thread's buffer.
    Buffered,
    /// Standard error at once.
    Direct(std::io::Stderr),
}

impl Write for EventWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            EventWriter::Direct(stderr) => stderr.write(bytes),
            EventWriter::Buffered => {
                let held = BUFFER.with(|b| match b.borrow_mut().as_mut() {
                    Some(buffer) => {
                        buffer.extend_from_slice(bytes);
                        if buffer.len() >= FLUSH_BYTES {
                            write_out(buffer);
                        }
                        true
                    }
                    None => false,
                });
                if held {
                    Ok(bytes.len())
                } else {
                    std::io::stderr().write(bytes)
                }
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter::Buffered
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> EventWriter {
        writer_for(*meta.level())
    }
}

fn writer_for(level: Level) -> EventWriter {
    if level <= Level::WARN {
        flush_this_thread();
        EventWriter::Direct(std::io::stderr())
    } else {
        EventWriter::Buffered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> Option<usize> {
        BUFFER.with(|b| b.borrow().as_ref().map(Vec::len))
    }

    #[test]
    fn only_threads_that_opt_in_buffer() {
        std::thread::spawn(|| {
            let mut w = Stderr.make_writer();
            w.write_all(b"").unwrap();
            assert_eq!(held(), None);
            buffer_this_thread();
            w.write_all(b"a line\n").unwrap();
            assert_eq!(held(), Some(7));
            flush_this_thread();
            assert_eq!(held(), Some(0));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_full_buffer_is_written_out() {
        std::thread::spawn(|| {
            buffer_this_thread();
            let mut w = Stderr.make_writer();
            let line = [b'x'; 1000];
            for _ in 0..FLUSH_BYTES / 1000 - 1 {
                w.write_all(&line).unwrap();
            }
            assert!(held().unwrap() >= FLUSH_BYTES - 2000);
            w.write_all(&line).unwrap();
            w.write_all(&line).unwrap();
            assert!(held().unwrap() < FLUSH_BYTES, "{held:?}", held = held());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_warning_flushes_what_came_before_it() {
        std::thread::spawn(|| {
            buffer_this_thread();
            Stderr.make_writer().write_all(b"info\n").unwrap();
            assert!(matches!(writer_for(Level::INFO), EventWriter::Buffered));
            assert_eq!(held(), Some(5));
            assert!(matches!(writer_for(Level::WARN), EventWriter::Direct(_)));
            assert_eq!(held(), Some(0));
        })
        .join()
        .unwrap();
    }
}
