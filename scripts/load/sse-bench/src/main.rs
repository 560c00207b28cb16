//! The load harness's streaming origin and client, one small binary.
//!
//! `sse-bench origin PORT [EVENTS] [INTERVAL_MS]`: answers every request on
//! 127.0.0.1:PORT with a chat completion stream (`text/event-stream`,
//! chunked, keep-alive) of EVENTS events INTERVAL_MS apart, then
//! `data: [DONE]`. Each event carries its sequence number and the wall-clock
//! time it was written, so the client can check order and measure delay.
//!
//! `sse-bench client URL BODY_FILE STREAMS [EVENTS] [RAMP_SECS] [LOOP_SECS] [HEADER]`:
//! opens STREAMS connections (spread over RAMP_SECS), POSTs the body on each
//! and reads the stream; with LOOP_SECS > 0 each connection sends request
//! after request until then (the soak). HEADER is `name: value`, sent on
//! every request. Prints errors, event order, the gaps between events as the
//! client sees them, the origin-to-client delay and the time to first event;
//! exits 1 when any stream failed or arrived out of order.
//!
//! Rust and one thread each, not Python: 1,000 streams of 50 events 20 ms
//! apart are 50,000 events a second, which a Python origin and client could
//! not serve on a small machine without becoming what is measured.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let result = match args.first().map(String::as_str) {
        Some("origin") => runtime.block_on(origin(&args[1..])),
        Some("client") => runtime.block_on(client(&args[1..])),
        _ => Err("usage: sse-bench origin PORT [EVENTS] [INTERVAL_MS] | client URL BODY STREAMS [EVENTS] [RAMP_SECS] [LOOP_SECS] [HEADER]".into()),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("sse-bench: {message}");
            ExitCode::from(2)
        }
    }
}

fn arg<T: std::str::FromStr>(args: &[String], index: usize, default: T) -> Result<T, String> {
    match args.get(index) {
        None => Ok(default),
        Some(text) => text.parse().map_err(|_| format!("bad argument {text:?}")),
    }
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

// ---------------------------------------------------------------- origin

async fn origin(args: &[String]) -> Result<ExitCode, String> {
    let port: u16 = arg(args, 0, 0)?;
    let events: u32 = arg(args, 1, 50)?;
    let interval = Duration::from_secs_f64(arg::<f64>(args, 2, 20.0)? / 1000.0);
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            // Out of descriptors or similar: wait, then accept again.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = socket.set_nodelay(true);
        tokio::spawn(async move {
            let _ = serve_streams(socket, events, interval).await;
        });
    }
}

/// Requests on one keep-alive connection, each answered with a stream.
async fn serve_streams(socket: TcpStream, events: u32, interval: Duration) -> std::io::Result<()> {
    let (read, mut write) = socket.into_split();
    let mut reader = BufReader::new(read);
    let mut line = String::new();
    loop {
        let mut content_length = 0usize;
        loop {
            line.clear();
            if reader.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            if let Some((name, value)) = trimmed.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; content_length];
        reader.read_exact(&mut body).await?;
        write
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")
            .await?;
        let mut ticks = tokio::time::interval(interval);
        for seq in 0..events {
            ticks.tick().await;
            let event = format!(
                "data: {{\"id\":\"chatcmpl-load\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"w{seq} \"}},\"finish_reason\":null}}],\"seq\":{seq},\"sent_us\":{}}}\n\n",
                now_micros()
            );
            write
                .write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes())
                .await?;
        }
        ticks.tick().await;
        let done = "data: [DONE]\n\n";
        write
            .write_all(format!("{:x}\r\n{done}\r\n0\r\n\r\n", done.len()).as_bytes())
            .await?;
    }
}

// ---------------------------------------------------------------- client

#[derive(Default)]
struct Figures {
    ok: u64,
    failed: u64,
    events: u64,
    out_of_order: u64,
    errors: BTreeMap<String, u64>,
    gaps_us: Vec<u64>,
    delays_us: Vec<u64>,
    first_event_us: Vec<u64>,
}

impl Figures {
    fn absorb(&mut self, other: Figures) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.events += other.events;
        self.out_of_order += other.out_of_order;
        for (reason, count) in other.errors {
            *self.errors.entry(reason).or_default() += count;
        }
        self.gaps_us.extend(other.gaps_us);
        self.delays_us.extend(other.delays_us);
        self.first_event_us.extend(other.first_event_us);
    }

    fn fail(&mut self, reason: impl Into<String>) {
        self.failed += 1;
        *self.errors.entry(reason.into()).or_default() += 1;
    }
}

struct Target {
    addr: String,
    request: Vec<u8>,
    events: u32,
}

async fn client(args: &[String]) -> Result<ExitCode, String> {
    let url = args.first().ok_or("client needs URL")?;
    let body_file = args.get(1).ok_or("client needs BODY_FILE")?;
    let streams: usize = arg(args, 2, 1000)?;
    let events: u32 = arg(args, 3, 50)?;
    let ramp = Duration::from_secs_f64(arg(args, 4, 1.0)?);
    let loop_for = Duration::from_secs_f64(arg(args, 5, 0.0)?);
    let header = args
        .get(6)
        .map(|h| format!("{}\r\n", h.trim()))
        .unwrap_or_default();

    let rest = url
        .strip_prefix("http://")
        .ok_or("URL must start with http://")?;
    let (addr, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let body = std::fs::read(body_file).map_err(|e| format!("{body_file}: {e}"))?;
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\naccept: text/event-stream\r\nauthorization: Bearer sk-load-harness-not-a-secret\r\n{header}content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let target = std::sync::Arc::new(Target {
        addr: addr.to_string(),
        request,
        events,
    });

    let started = Instant::now();
    let deadline = started + loop_for;
    let open = std::rc::Rc::new(std::cell::Cell::new((0usize, 0usize)));
    let local = tokio::task::LocalSet::new();
    let figures = local
        .run_until(async {
            let mut tasks = Vec::with_capacity(streams);
            for i in 0..streams {
                let target = target.clone();
                let open = open.clone();
                let delay = ramp.mul_f64(i as f64 / streams as f64);
                tasks.push(tokio::task::spawn_local(async move {
                    tokio::time::sleep(delay).await;
                    let mut figures = Figures::default();
                    match TcpStream::connect(&target.addr).await {
                        Err(e) => figures.fail(format!("connect: {:?}", e.kind())),
                        Ok(socket) => {
                            let _ = socket.set_nodelay(true);
                            let (now, peak) = open.get();
                            open.set((now + 1, peak.max(now + 1)));
                            let mut reader = BufReader::new(socket);
                            loop {
                                match read_stream(&mut reader, &target, &mut figures).await {
                                    Ok(()) => figures.ok += 1,
                                    Err(reason) => {
                                        figures.fail(reason);
                                        break;
                                    }
                                }
                                if Instant::now() >= deadline {
                                    break;
                                }
                            }
                            let (now, peak) = open.get();
                            open.set((now - 1, peak));
                        }
                    }
                    figures
                }));
            }
            let mut all = Figures::default();
            for task in tasks {
                all.absorb(task.await.unwrap_or_default());
            }
            all
        })
        .await;
    let wall = started.elapsed();
    report(&figures, open.get().1, wall);
    Ok(if figures.failed == 0 && figures.out_of_order == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// One request and its whole stream; Err says why the stream failed.
async fn read_stream(
    reader: &mut BufReader<TcpStream>,
    target: &Target,
    figures: &mut Figures,
) -> Result<(), String> {
    let sent = Instant::now();
    reader
        .get_mut()
        .write_all(&target.request)
        .await
        .map_err(|e| format!("write: {:?}", e.kind()))?;
    let mut line = String::new();
    let mut status_line = true;
    let mut chunked = false;
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .await
            .map_err(|e| format!("read head: {:?}", e.kind()))?;
        if n == 0 {
            return Err("closed before the answer".into());
        }
        let trimmed = line.trim_end();
        if status_line {
            let code = trimmed.split(' ').nth(1).unwrap_or("?");
            if code != "200" {
                return Err(format!("status {code}"));
            }
            status_line = false;
        } else if trimmed.is_empty() {
            break;
        } else if let Some((name, value)) = trimmed.split_once(':') {
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().contains("chunked")
            {
                chunked = true;
            }
        }
    }
    if !chunked {
        return Err("answer not chunked".into());
    }
    // De-chunk into `pending`, cutting events at each blank line.
    let mut pending: Vec<u8> = Vec::new();
    let mut next_seq = 0u32;
    let mut last: Option<Instant> = None;
    loop {
        line.clear();
        reader
            .read_line(&mut line)
            .await
            .map_err(|e| format!("read chunk: {:?}", e.kind()))?;
        let size = usize::from_str_radix(line.trim_end().split(';').next().unwrap_or(""), 16)
            .map_err(|_| format!("bad chunk size {:?}", line.trim_end()))?;
        let mut data = vec![0; size + 2];
        reader
            .read_exact(&mut data)
            .await
            .map_err(|_| format!("closed after {next_seq} of {} events", target.events))?;
        if size == 0 {
            return Err(format!(
                "ended after {next_seq} of {} events without [DONE]",
                target.events
            ));
        }
        let arrived = Instant::now();
        pending.extend_from_slice(&data[..size]);
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let data = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim)
                .collect::<String>();
            if data == "[DONE]" {
                if next_seq != target.events {
                    return Err(format!(
                        "[DONE] after {next_seq} of {} events",
                        target.events
                    ));
                }
                // The last chunk (size 0, then CRLF) ends the answer.
                line.clear();
                let _ = reader.read_line(&mut line).await;
                line.clear();
                let _ = reader.read_line(&mut line).await;
                return Ok(());
            }
            let seq = number_after(&data, "\"seq\":").ok_or("event without seq")?;
            let sent_us = number_after(&data, "\"sent_us\":").unwrap_or(0);
            figures.events += 1;
            if seq != u64::from(next_seq) {
                figures.out_of_order += 1;
            }
            next_seq = seq as u32 + 1;
            figures.delays_us.push(now_micros().saturating_sub(sent_us));
            match last {
                None => figures
                    .first_event_us
                    .push(arrived.duration_since(sent).as_micros() as u64),
                Some(previous) => figures
                    .gaps_us
                    .push(arrived.duration_since(previous).as_micros() as u64),
            }
            last = Some(arrived);
        }
    }
}

fn number_after(text: &str, key: &str) -> Option<u64> {
    let start = text.find(key)? + key.len();
    let digits: String = text[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

fn quantile_ms(values: &mut [u64], q: f64) -> String {
    if values.is_empty() {
        return "-".into();
    }
    values.sort_unstable();
    let index = ((values.len() as f64 * q) as usize).min(values.len() - 1);
    format!("{:.1}", values[index] as f64 / 1000.0)
}

fn report(figures: &Figures, peak: usize, wall: Duration) {
    let mut gaps = figures.gaps_us.clone();
    let mut delays = figures.delays_us.clone();
    let mut first = figures.first_event_us.clone();
    println!(
        "streams ok {}, failed {}, peak concurrent connections {peak}, events {}, out of order {}, wall {:.1} s",
        figures.ok,
        figures.failed,
        figures.events,
        figures.out_of_order,
        wall.as_secs_f64()
    );
    println!(
        "gap between events (client side), ms: p50 {} p90 {} p99 {} max {}",
        quantile_ms(&mut gaps, 0.5),
        quantile_ms(&mut gaps, 0.9),
        quantile_ms(&mut gaps, 0.99),
        quantile_ms(&mut gaps, 1.0)
    );
    println!(
        "origin write to client read, ms: p50 {} p99 {} max {}; first event after request, ms: p50 {} p99 {}",
        quantile_ms(&mut delays, 0.5),
        quantile_ms(&mut delays, 0.99),
        quantile_ms(&mut delays, 1.0),
        quantile_ms(&mut first, 0.5),
        quantile_ms(&mut first, 0.99)
    );
    for (reason, count) in &figures.errors {
        println!("error x{count}: {reason}");
    }
}
