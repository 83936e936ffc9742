//! A minimal HTTP/1.1 client for the benchmarks (std sockets, one request per connection):
//! plain JSON requests, and a streamed completion whose first token chunk is timed as it
//! arrives. It owns no policy: callers decide what a status or a body means.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A response: status and body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, String> {
    let s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|_| s.set_write_timeout(Some(timeout)))
        .and_then(|_| s.set_nodelay(true))
        .map_err(|e| format!("socket options: {e}"))?;
    Ok(s)
}

fn write_request(
    s: &mut TcpStream,
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> Result<(), String> {
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(body.as_bytes()))
        .map_err(|e| format!("{method} {path}: {e}"))
}

/// Status line and headers; the reader is left at the body.
fn read_head(r: &mut impl BufRead) -> Result<(u16, bool, Option<usize>), String> {
    let mut line = String::new();
    r.read_line(&mut line)
        .map_err(|e| format!("status line: {e}"))?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line {line:?}"))?;
    let (mut chunked, mut length) = (false, None);
    loop {
        line.clear();
        r.read_line(&mut line)
            .map_err(|e| format!("headers: {e}"))?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            } else if k == "content-length" {
                length = v.parse().ok();
            }
        }
    }
    Ok((status, chunked, length))
}

/// Reads one chunk of a chunked body (None at the last chunk).
fn read_chunk(r: &mut impl BufRead) -> Result<Option<Vec<u8>>, String> {
    let mut line = String::new();
    r.read_line(&mut line)
        .map_err(|e| format!("chunk size: {e}"))?;
    let size_text = line.trim().split(';').next().unwrap_or("");
    let size =
        usize::from_str_radix(size_text, 16).map_err(|_| format!("bad chunk size {line:?}"))?;
    if size == 0 {
        return Ok(None);
    }
    let mut buf = vec![0; size + 2];
    r.read_exact(&mut buf).map_err(|e| format!("chunk: {e}"))?;
    buf.truncate(size);
    Ok(Some(buf))
}

fn read_body(r: &mut impl BufRead, chunked: bool, length: Option<usize>) -> Result<String, String> {
    let mut body = vec![];
    if chunked {
        while let Some(c) = read_chunk(r)? {
            body.extend_from_slice(&c);
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        r.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
    } else {
        r.read_to_end(&mut body).map_err(|e| format!("body: {e}"))?;
    }
    String::from_utf8(body).map_err(|_| "the body is not UTF-8".to_string())
}

/// One request; the whole response.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<Response, String> {
    let mut s = connect(addr, timeout)?;
    write_request(&mut s, addr, method, path, body, token)?;
    let mut r = BufReader::new(s);
    let (status, chunked, length) = read_head(&mut r)?;
    let body = read_body(&mut r, chunked, length)?;
    Ok(Response { status, body })
}

/// A streamed completion: when its first token arrived, when each later one did, and the
/// final chunk (usage and the `tsl3` object).
#[derive(Debug)]
pub struct Streamed {
    pub status: u16,
    /// Time from the request's first byte sent to the first token chunk received.
    pub ttft: Duration,
    /// Arrival times of every token chunk, from the request's start.
    pub token_times: Vec<Duration>,
    /// The final data chunk (JSON), or the error body of a non-200 answer.
    pub last: serde_json::Value,
}

/// POSTs `body` (a completion request with `"stream": true` and
/// `"stream_options": {"include_usage": true}`) and reads the SSE stream.
pub fn stream_completion(addr: &str, body: &str, timeout: Duration) -> Result<Streamed, String> {
    let mut s = connect(addr, timeout)?;
    let start = Instant::now();
    write_request(&mut s, addr, "POST", "/v1/completions", body, None)?;
    let mut r = BufReader::new(s);
    let (status, chunked, length) = read_head(&mut r)?;
    if status != 200 || !chunked {
        let text = read_body(&mut r, chunked, length)?;
        let last = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        return Ok(Streamed {
            status,
            ttft: start.elapsed(),
            token_times: vec![],
            last,
        });
    }
    let mut pending = String::new();
    let mut token_times = vec![];
    let mut last = serde_json::Value::Null;
    while let Some(c) = read_chunk(&mut r)? {
        pending.push_str(&String::from_utf8_lossy(&c));
        // Events are separated by a blank line; a chunk may hold part of one.
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let v: serde_json::Value =
                serde_json::from_str(data).map_err(|e| format!("bad SSE data: {e}"))?;
            // The usage chunk (asked for with stream_options.include_usage) is the last;
            // a choice's finish chunk carries no token.
            let finish = v["choices"][0]["finish_reason"].is_string();
            if v.get("usage").is_some_and(|u| !u.is_null()) || v.get("error").is_some() {
                last = v;
            } else if !finish {
                token_times.push(start.elapsed());
            }
        }
    }
    let ttft = token_times
        .first()
        .copied()
        .unwrap_or_else(|| start.elapsed());
    Ok(Streamed {
        status,
        ttft,
        token_times,
        last,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_and_heads_are_read() {
        let raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
        let mut r = BufReader::new(&raw[..]);
        let (status, chunked, _) = read_head(&mut r).unwrap();
        assert_eq!((status, chunked), (200, true));
        assert_eq!(read_body(&mut r, chunked, None).unwrap(), "hello world");
        let raw = b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 2\r\n\r\n{}";
        let mut r = BufReader::new(&raw[..]);
        let (status, chunked, len) = read_head(&mut r).unwrap();
        assert_eq!((status, chunked, len), (413, false, Some(2)));
        assert_eq!(read_body(&mut r, chunked, len).unwrap(), "{}");
        let mut r = BufReader::new(&b"zz\r\n"[..]);
        assert!(read_chunk(&mut r).is_err());
    }
}
