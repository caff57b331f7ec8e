//! A minimal HTTP/1.0 client for tests on loopback: one GET per connection (so no chunked
//! bodies), and a reader of server-sent events. Every read has a deadline.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// An answer.
#[derive(Debug)]
pub(crate) struct Response {
    /// Status code.
    pub(crate) status: u16,
    /// The header block, as sent.
    pub(crate) headers: String,
    /// The body.
    pub(crate) body: String,
}

/// `http://HOST:PORT/PATH?QUERY` to (`HOST:PORT`, `/PATH?QUERY`).
pub(crate) fn split_url(url: &str) -> Result<(String, String), String> {
    let rest = url.strip_prefix("http://").ok_or(format!("not an http URL: {url}"))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    Ok((host.to_owned(), path.to_owned()))
}

fn connect(host: &str, path: &str, timeout: Duration) -> Result<TcpStream, String> {
    let addr = host.parse().map_err(|e| format!("{host}: {e}"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{e}"))?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| format!("{e}"))?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| format!("{e}"))?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: */*\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|e| format!("{e}"))?;
    Ok(stream)
}

/// Reads the status line and headers.
fn head(reader: &mut impl BufRead) -> Result<(u16, String), String> {
    let mut headers = String::new();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).map_err(|e| format!("reading headers: {e}"))?;
        if n == 0 || line == "\r\n" {
            break;
        }
        headers.push_str(&line);
    }
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(format!("no status line in {headers:?}"))?;
    Ok((status, headers))
}

/// GET `path` from `host` (`127.0.0.1:PORT`), reading the whole answer within 10 s.
pub(crate) fn get(host: &str, path: &str) -> Result<Response, String> {
    let stream = connect(host, path, Duration::from_secs(10))?;
    let mut reader = BufReader::new(stream);
    let (status, headers) = head(&mut reader)?;
    let mut body = String::new();
    reader.read_to_string(&mut body).map_err(|e| format!("reading the body: {e}"))?;
    Ok(Response { status, headers, body })
}

/// An open `text/event-stream`.
#[derive(Debug)]
pub(crate) struct Events {
    reader: BufReader<TcpStream>,
}

impl Events {
    /// Opens the stream at `path`; fails unless the answer is 200 with the SSE content type.
    pub(crate) fn open(host: &str, path: &str) -> Result<Self, String> {
        let stream = connect(host, path, Duration::from_secs(10))?;
        let mut reader = BufReader::new(stream);
        let (status, headers) = head(&mut reader)?;
        // Short reads, so `next` notices its deadline.
        reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(250)))
            .map_err(|e| format!("{e}"))?;
        if status != 200 || !headers.to_ascii_lowercase().contains("text/event-stream") {
            return Err(format!("not an event stream: {status} {headers}"));
        }
        Ok(Self { reader })
    }

    /// The data of the next event (keep-alive comments skipped), `None` when the stream ends,
    /// an error when nothing arrives by `deadline`.
    pub(crate) fn next(&mut self, deadline: Instant) -> Result<Option<String>, String> {
        let mut data = String::new();
        // A read that times out keeps what it read of the line in here.
        let mut line = String::new();
        loop {
            if Instant::now() > deadline {
                return Err("no event before the deadline".into());
            }
            match self.reader.read_line(&mut line) {
                Ok(0) => return Ok(None),
                Ok(_) if !line.ends_with('\n') => continue,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(format!("reading events: {e}")),
            }
            let text = std::mem::take(&mut line);
            let line = text.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if !data.is_empty() {
                    return Ok(Some(data));
                }
            } else if let Some(d) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
        }
    }
}
