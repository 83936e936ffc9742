//! Public KV-cache traces for `bench replay`: the Mooncake FAST'25 format (`timestamp` ms,
//! `input_length`, `output_length`, `hash_ids` per 512-token block) and the Alibaba
//! Bailian format (`chat_id`, `parent_chat_id`, `timestamp`, `input_length`,
//! `output_length`, `type`, `turn`, `hash_ids` per 16-token block), detected by their
//! fields. Each hash id maps to one deterministic block of tokens, so two prompts share a
//! prefix exactly where the trace says they do. Pure parsing and arithmetic: no I/O beyond
//! reading the file.

use super::stats::{mix, tokens};
use std::collections::HashSet;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum TraceFormat {
    /// Mooncake FAST'25: 512 tokens per hash id.
    Mooncake,
    /// Alibaba Bailian: 16 tokens per hash id.
    Bailian,
}

impl TraceFormat {
    pub fn block_tokens(&self) -> u64 {
        match self {
            TraceFormat::Mooncake => 512,
            TraceFormat::Bailian => 16,
        }
    }
}

/// One request of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRequest {
    pub timestamp_ms: f64,
    pub input_length: u64,
    pub output_length: u64,
    pub hash_ids: Vec<u64>,
    /// The conversation (Bailian `chat_id`, following `parent_chat_id` to its root); None
    /// in the Mooncake format.
    pub session: Option<i64>,
}

#[derive(Clone, Debug)]
pub struct Trace {
    pub format: TraceFormat,
    pub requests: Vec<TraceRequest>,
}

fn field<'a>(
    v: &'a serde_json::Value,
    k: &str,
    line: usize,
) -> Result<&'a serde_json::Value, String> {
    v.get(k)
        .ok_or_else(|| format!("trace line {line}: missing field `{k}`"))
}

fn number(v: &serde_json::Value, k: &str, line: usize) -> Result<f64, String> {
    field(v, k, line)?
        .as_f64()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| format!("trace line {line}: `{k}` must be a non-negative number"))
}

/// Parses a trace, keeping the first `limit` requests (all when None).
pub fn parse(text: &str, limit: Option<usize>) -> Result<Trace, String> {
    let mut format = None;
    let mut requests = vec![];
    let mut root_of: std::collections::HashMap<i64, i64> = Default::default();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        if limit.is_some_and(|l| requests.len() >= l) {
            break;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("trace line {n}: {e}"))?;
        let this = if v.get("chat_id").is_some() {
            TraceFormat::Bailian
        } else {
            TraceFormat::Mooncake
        };
        match format {
            None => format = Some(this),
            Some(f) if f != this => {
                return Err(format!(
                    "trace line {n}: mixes the Mooncake and Bailian formats"
                ))
            }
            _ => {}
        }
        let hash_ids: Vec<u64> = field(&v, "hash_ids", n)?
            .as_array()
            .ok_or_else(|| format!("trace line {n}: `hash_ids` must be an array"))?
            .iter()
            .map(|h| {
                h.as_u64().ok_or_else(|| {
                    format!("trace line {n}: hash ids must be non-negative integers")
                })
            })
            .collect::<Result<_, _>>()?;
        let input_length = number(&v, "input_length", n)? as u64;
        if input_length == 0 {
            return Err(format!("trace line {n}: `input_length` must be at least 1"));
        }
        let needed = input_length.div_ceil(this.block_tokens());
        if hash_ids.len() as u64 != needed {
            return Err(format!(
                "trace line {n}: {} hash ids for {input_length} tokens (expected {needed} of {} tokens)",
                hash_ids.len(),
                this.block_tokens()
            ));
        }
        let session = if this == TraceFormat::Bailian {
            let chat = field(&v, "chat_id", n)?
                .as_i64()
                .ok_or_else(|| format!("trace line {n}: `chat_id` must be an integer"))?;
            let parent = v
                .get("parent_chat_id")
                .and_then(|p| p.as_i64())
                .unwrap_or(-1);
            let root = if parent >= 0 {
                *root_of.get(&parent).unwrap_or(&parent)
            } else {
                chat
            };
            root_of.insert(chat, root);
            Some(root)
        } else {
            None
        };
        requests.push(TraceRequest {
            timestamp_ms: number(&v, "timestamp", n)?,
            input_length,
            output_length: number(&v, "output_length", n)? as u64,
            hash_ids,
            session,
        });
    }
    let format = format.ok_or("the trace holds no request")?;
    Ok(Trace { format, requests })
}

impl Trace {
    /// The prompt of a request: each hash id's deterministic block, the last one cut to
    /// the request's length. `salt` changes every block alike (a replay over a store that
    /// outlives it, such as Mooncake, uses a fresh one per run).
    pub fn prompt(&self, r: &TraceRequest, vocab: u32, salt: u64) -> Vec<u32> {
        let b = self.format.block_tokens() as usize;
        let mut out = Vec::with_capacity(r.input_length as usize);
        for id in &r.hash_ids {
            out.extend(tokens(mix(*id ^ 0x7472_6163_6500_0000 ^ salt), b, vocab));
        }
        out.truncate(r.input_length as usize);
        out
    }

    /// Per request, the ideal cached tokens: those of the blocks whose id appeared in an
    /// earlier request (a full block, or the cut last block), capped at the prompt length
    /// minus one (the last token is always computed).
    pub fn ideal_cached(&self) -> Vec<u64> {
        let b = self.format.block_tokens();
        let mut seen: HashSet<u64> = HashSet::new();
        self.requests
            .iter()
            .map(|r| {
                let mut cached = 0;
                for (j, id) in r.hash_ids.iter().enumerate() {
                    let len = b.min(r.input_length - j as u64 * b);
                    if seen.contains(id) {
                        cached += len;
                    }
                }
                for id in &r.hash_ids {
                    seen.insert(*id);
                }
                cached.min(r.input_length - 1)
            })
            .collect()
    }

    /// Distinct blocks of the replayed requests (their KV is what L3 must hold).
    pub fn unique_blocks(&self) -> usize {
        self.requests
            .iter()
            .flat_map(|r| r.hash_ids.iter())
            .collect::<HashSet<_>>()
            .len()
    }

    pub fn max_input(&self) -> u64 {
        self.requests
            .iter()
            .map(|r| r.input_length)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOONCAKE: &str = r#"{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 10, "input_length": 1030, "output_length": 3, "hash_ids": [0, 1, 2]}
{"timestamp": 20, "input_length": 600, "output_length": 3, "hash_ids": [0, 3]}
"#;

    #[test]
    fn mooncake_traces_share_prefixes_where_their_ids_do() {
        let t = parse(MOONCAKE, None).unwrap();
        assert_eq!(t.format, TraceFormat::Mooncake);
        let p: Vec<Vec<u32>> = t.requests.iter().map(|r| t.prompt(r, 1000, 0)).collect();
        assert_ne!(
            t.prompt(&t.requests[0], 1000, 9),
            p[0],
            "a salt changes the prompt"
        );
        assert_eq!(p[0].len(), 1000);
        assert_eq!(p[1].len(), 1030);
        // Block 1 is cut to 488 tokens in request 0: a prefix of request 1's block 1.
        assert_eq!(p[0][..], p[1][..1000]);
        assert_eq!(p[2][..512], p[0][..512]);
        assert_ne!(p[2][512..600], p[0][512..600]);
        // Ideal: request 1 finds 512 + 512 (block 1 seen, whole in request 1); request 2
        // finds block 0 only.
        assert_eq!(t.ideal_cached(), vec![0, 1024, 512]);
        assert_eq!(t.unique_blocks(), 4);
        assert_eq!(parse(MOONCAKE, Some(1)).unwrap().requests.len(), 1);
    }

    #[test]
    fn bailian_traces_follow_sessions_to_their_root() {
        let text = r#"{"chat_id": 5, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 20, "output_length": 4, "type": "text", "turn": 1, "hash_ids": [7, 8]}
{"chat_id": 9, "parent_chat_id": 5, "timestamp": 3.0, "input_length": 40, "output_length": 4, "type": "text", "turn": 2, "hash_ids": [7, 8, 11]}
{"chat_id": 12, "parent_chat_id": 9, "timestamp": 4.0, "input_length": 33, "output_length": 4, "type": "text", "turn": 3, "hash_ids": [7, 8, 13]}
"#;
        let t = parse(text, None).unwrap();
        assert_eq!(t.format, TraceFormat::Bailian);
        let s: Vec<Option<i64>> = t.requests.iter().map(|r| r.session).collect();
        assert_eq!(s, vec![Some(5), Some(5), Some(5)]);
        assert_eq!(t.ideal_cached(), vec![0, 32, 32]);
    }

    #[test]
    fn malformed_traces_name_the_line() {
        for (text, needle) in [
            ("{\"timestamp\": 0}", "line 1: missing field `hash_ids`"),
            ("not json", "line 1"),
            (
                "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1]}",
                "expected 2",
            ),
            (
                "{\"timestamp\": -1, \"input_length\": 6, \"output_length\": 1, \"hash_ids\": [1]}",
                "non-negative",
            ),
            ("", "no request"),
        ] {
            let e = parse(text, None).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }
}
