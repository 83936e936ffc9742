//! Server-sent events for a streamed completion or chat: optional opening chunks, one
//! chunk per text piece, one finish chunk per choice (carrying that choice's `tsl3`), a
//! usage chunk with empty `choices` only when `stream_options.include_usage` asked for it,
//! then `data: [DONE]`. A failure ends the stream with an error event. The endpoint's
//! [`Shape`] renders each choice object; this module owns the framing and the order, and
//! never reads the request.

use super::run::{tsl3, Accounting, Piece, Pieces, Tok};
use actix_web::{web, HttpResponse};
use futures::StreamExt;
use serde_json::{json, Value};

/// How an endpoint renders the choice objects of its chunks.
pub trait Shape: Send + 'static {
    /// The choice object of choice `index`'s opening chunk (chat: the assistant role;
    /// completions: the echoed prompt), if it has one.
    fn opening(&mut self, index: u32) -> Option<Value>;
    fn text(&mut self, index: u32, text: &str, tokens: &[Tok]) -> Value;
    fn finish(&mut self, index: u32, reason: &str) -> Value;
}

/// The fields every chunk carries.
pub struct Envelope {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
}

impl Envelope {
    fn chunk(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

struct Sse<S: Shape> {
    shape: S,
    envelope: Envelope,
    /// None once the stream ended (dropping it cancels every choice still running).
    pieces: Option<Pieces>,
    choices: u32,
    opened: bool,
    finished: Vec<(u32, Option<super::super::api::PrefixUsage>)>,
    first_tsl3: Value,
    accounting: Accounting,
    include_usage: bool,
}

impl<S: Shape> Sse<S> {
    async fn next(mut self) -> Option<(String, Self)> {
        if !self.opened {
            self.opened = true;
            let opening: String = (0..self.choices)
                .filter_map(|i| self.shape.opening(i))
                .map(|c| event(&self.envelope.chunk(vec![c])))
                .collect();
            if !opening.is_empty() {
                return Some((opening, self));
            }
        }
        let piece = self.pieces.as_mut()?.next().await;
        let out = match piece {
            Some(Piece::Text {
                index,
                text,
                tokens,
            }) => event(
                &self
                    .envelope
                    .chunk(vec![self.shape.text(index, &text, &tokens)]),
            ),
            Some(Piece::Finish {
                index,
                reason,
                usage,
                output,
            }) => {
                if let Some(f) = self.finished.get_mut(index as usize) {
                    *f = (output.len() as u32, usage);
                }
                let t = tsl3(usage, &output);
                if index == 0 {
                    self.first_tsl3 = t.clone();
                }
                let mut c = self.envelope.chunk(vec![self.shape.finish(index, reason)]);
                c["tsl3"] = t;
                event(&c)
            }
            Some(Piece::Failed(e)) => {
                self.pieces = None;
                format!("{}data: [DONE]\n\n", event(&e.body()))
            }
            None => {
                self.pieces = None;
                let mut tail = String::new();
                if self.include_usage {
                    let mut c = self.envelope.chunk(vec![]);
                    c["usage"] = self.accounting.usage(&self.finished);
                    c["tsl3"] = std::mem::take(&mut self.first_tsl3);
                    tail.push_str(&event(&c));
                }
                tail.push_str("data: [DONE]\n\n");
                tail
            }
        };
        Some((out, self))
    }
}

/// The SSE answer of a request whose choices are `pieces`.
pub fn respond<S: Shape>(
    shape: S,
    envelope: Envelope,
    pieces: Pieces,
    accounting: Accounting,
    include_usage: bool,
) -> HttpResponse {
    let choices = accounting.prompt_tokens.len() as u32 * accounting.n;
    let sse = Sse {
        shape,
        envelope,
        pieces: Some(pieces),
        choices,
        opened: false,
        finished: vec![(0, None); choices as usize],
        first_tsl3: Value::Null,
        accounting,
        include_usage,
    };
    let stream = futures::stream::unfold(sse, Sse::next)
        .map(|s| Ok::<_, actix_web::Error>(web::Bytes::from(s)));
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(stream)
}
