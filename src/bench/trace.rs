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

    /// Per request, the ideal cached tokens: the prefix an earlier request computed. Block
    /// by block, a block whose id appeared before counts the tokens of it an earlier
    /// request held (a block cut at an earlier prompt's end counts only that cut, and
    /// nothing after it is cached); capped at the prompt length minus one (the last token
    /// is always computed).
    pub fn ideal_cached(&self) -> Vec<u64> {
        let b = self.format.block_tokens();
        let mut seen: std::collections::HashMap<u64, u64> = Default::default();
        self.requests
            .iter()
            .map(|r| {
                let mut cached = 0;
                for (j, id) in r.hash_ids.iter().enumerate() {
                    let len = b.min(r.input_length - j as u64 * b);
                    match seen.get(id) {
                        Some(&had) => {
                            cached += len.min(had);
                            if had < len {
                                break;
                            }
                        }
                        None => break,
                    }
                }
                for (j, id) in r.hash_ids.iter().enumerate() {
                    let len = b.min(r.input_length - j as u64 * b);
                    let e = seen.entry(*id).or_insert(0);
                    *e = (*e).max(len);
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

/// A synthetic multi-turn conversation trace: `sessions` conversations of `turns` turns in
/// the Bailian format (16-token hash ids). Turn 1 is a system prompt every session shares
/// plus a user message; turn k+1's prompt is turn k's prompt, its answer and a new user
/// message, so it extends turn k's prompt exactly at turn k's (usually nonaligned) end:
/// turn k's blocks keep their ids, the block cut at turn k's end included (the prompt of a
/// cut block is a prefix of its whole block, see `Trace::prompt`). Sessions interleave:
/// turn k of session s arrives at `(k * sessions + s) * gap_ms`.
#[derive(Clone, Copy, Debug)]
pub struct ConversationSpec {
    pub sessions: u32,
    pub turns: u32,
    pub system_tokens: u64,
    /// Mean user message; each varies in [mean/2, 3 mean/2].
    pub user_tokens: u64,
    /// Mean answer; each varies the same way.
    pub output_tokens: u64,
    pub gap_ms: f64,
    pub seed: u64,
}

impl ConversationSpec {
    /// The trace as JSONL, one request per line, in arrival order.
    pub fn jsonl(&self) -> String {
        const B: u64 = 16;
        let vary = |mean: u64, salt: u64| -> u64 {
            let lo = (mean / 2).max(1);
            lo + mix(self.seed ^ mix(salt)) % (mean + 1)
        };
        let mut next_id = 0u64;
        let mut fresh = || {
            next_id += 1;
            next_id
        };
        let system: Vec<u64> = (0..self.system_tokens / B).map(|_| fresh()).collect();
        // Per session: (chat id, input length, hash ids) of its latest turn.
        let mut last: Vec<Option<(u64, u64, Vec<u64>)>> = vec![None; self.sessions as usize];
        let mut lines = Vec::new();
        let mut chat = 0u64;
        for k in 0..self.turns {
            for s in 0..self.sessions {
                let salt = (u64::from(s) << 32) | u64::from(k);
                let user = vary(self.user_tokens, salt ^ 0x75);
                let (parent, input, mut ids) = match &last[s as usize] {
                    None => (-1i64, self.system_tokens + user, system.clone()),
                    Some((c, n, ids)) => {
                        let answer = vary(self.output_tokens, salt ^ 0x6f);
                        (*c as i64, n + answer + user, ids.clone())
                    }
                };
                while (ids.len() as u64) < input.div_ceil(B) {
                    ids.push(fresh());
                }
                chat += 1;
                let output = vary(self.output_tokens, salt ^ 0x6f ^ 1);
                lines.push(
                    serde_json::json!({
                        "chat_id": chat,
                        "parent_chat_id": parent,
                        "timestamp": (u64::from(k) * u64::from(self.sessions) + u64::from(s)) as f64 * self.gap_ms,
                        "input_length": input,
                        "output_length": output,
                        "type": "text",
                        "turn": k + 1,
                        "hash_ids": ids,
                    })
                    .to_string(),
                );
                last[s as usize] = Some((chat, input, ids));
            }
        }
        lines.join("\n") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_trace_extends_each_turn_at_its_prompt_end() {
        let spec = ConversationSpec {
            sessions: 3,
            turns: 3,
            system_tokens: 40,
            user_tokens: 20,
            output_tokens: 10,
            gap_ms: 5.0,
            seed: 7,
        };
        let text = spec.jsonl();
        assert_eq!(text, spec.jsonl(), "deterministic");
        let t = parse(&text, None).unwrap();
        assert_eq!(t.format, TraceFormat::Bailian);
        assert_eq!(t.requests.len(), 9);
        let p: Vec<Vec<u32>> = t.requests.iter().map(|r| t.prompt(r, 1000, 0)).collect();
        let ideal = t.ideal_cached();
        for s in 0..3 {
            // Turn k+1 of session s is request (k+1)*3 + s: its prompt starts with turn
            // k's whole prompt, and that prompt is its ideal reuse.
            for k in 0..2 {
                let (a, b) = (k * 3 + s, (k + 1) * 3 + s);
                assert_eq!(t.requests[a].session, t.requests[b].session);
                assert!(p[b].len() > p[a].len());
                assert_eq!(p[b][..p[a].len()], p[a][..], "session {s} turn {}", k + 2);
                assert_eq!(ideal[b], p[a].len() as u64);
            }
            // Turn 1 shares the two system blocks with earlier sessions only.
            assert_eq!(ideal[s], if s == 0 { 0 } else { 32 });
        }
        assert_ne!(p[0][32..40], p[1][32..40], "block 2 is each session's own");
    }

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
        // Ideal: request 1 finds request 0's whole prompt (block 0, and the 488 tokens of
        // block 1 request 0 held); request 2 finds block 0 only.
        assert_eq!(t.ideal_cached(), vec![0, 1000, 512]);
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
        // Turn 2 finds turn 1's 20 tokens (its block 8 was cut at 4); turn 3 finds blocks 7
        // and 8 (turn 2 held 8 whole).
        assert_eq!(t.ideal_cached(), vec![0, 20, 32]);
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
