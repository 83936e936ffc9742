//! The OpenAI routes against a fake round loop (a thread answering Submissions), so the
//! HTTP layer is tested alone: shapes, indices, stops, sampling as submitted, errors.

use crate::frontend::api::{FallbackReason, PrefixUsage, RequestLimits};
use crate::frontend::text::{ByteCodec, ChatMessage, TextCodec};
use crate::frontend::{configure, inbox, FrontendInbox, FrontendState, HealthSource, TokenEvent};
use actix_web::{http::StatusCode, test, web, App};
use messages::{SamplingParams, TokenLogprobs};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

struct Healthy;

impl HealthSource for Healthy {
    fn render(&self) -> (bool, String) {
        (true, "{}".into())
    }
    fn failure(&self) -> Option<String> {
        None
    }
}

/// The synthetic codec with token 7 as end-of-sequence.
struct EosCodec;

impl TextCodec for EosCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        ByteCodec.encode(text)
    }
    fn decode(&self, tokens: &[u32]) -> String {
        ByteCodec.decode(tokens)
    }
    fn token_text(&self, token: u32) -> String {
        ByteCodec.token_text(token)
    }
    fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, String> {
        ByteCodec.chat_prompt(messages)
    }
    fn eos_tokens(&self) -> Vec<u32> {
        vec![7]
    }
}

/// Tokens are UTF-8 bytes decoded lossily (a character may span tokens, as in a byte-level
/// BPE).
struct Utf8Codec;

impl TextCodec for Utf8Codec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        ByteCodec.encode(text)
    }
    fn decode(&self, tokens: &[u32]) -> String {
        let bytes: Vec<u8> = tokens.iter().map(|t| *t as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
    fn token_text(&self, token: u32) -> String {
        self.decode(&[token])
    }
    fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, String> {
        ByteCodec.chat_prompt(messages)
    }
    fn eos_tokens(&self) -> Vec<u32> {
        vec![]
    }
}

/// Healthy until the replica failed.
struct Failed;

impl HealthSource for Failed {
    fn render(&self) -> (bool, String) {
        (false, "{}".into())
    }
    fn failure(&self) -> Option<String> {
        Some("rank 1 failed: gone".into())
    }
}

const MODEL: &str = "synthetic-tiny";

fn state_with(codec: Arc<dyn TextCodec>) -> (FrontendState, FrontendInbox) {
    inbox(
        256,
        RequestLimits {
            max_prompt_tokens: 256,
            max_output_tokens: 64,
            vocab_size: 256,
        },
        String::new(),
        MODEL.into(),
        codec,
        Arc::new(String::new),
        Arc::new(Healthy),
    )
}

/// What the fake loop saw of one Submission.
#[derive(Clone, Debug)]
struct Seen {
    prompt: Vec<u32>,
    max_tokens: u32,
    sampling: SamplingParams,
}

/// A fake round loop: answers every request with its prompt's tokens (up to max_tokens;
/// with log-probabilities when asked: the token at -0.5 and the next k ids), then Done
/// with "length". Every Submission is reported on the returned channel. `pause` sleeps
/// between tokens; a token that cannot be sent (the client dropped its receiver) ends the
/// request and is reported as `cancelled`.
fn fake_loop(
    ib: FrontendInbox,
    pause: Duration,
) -> (flume::Receiver<Seen>, flume::Receiver<usize>) {
    let (seen_tx, seen) = flume::unbounded();
    let (cancel_tx, cancelled) = flume::unbounded();
    std::thread::spawn(move || {
        while let Ok(s) = ib.submissions.recv() {
            let _ = seen_tx.send(Seen {
                prompt: s.prompt.clone(),
                max_tokens: s.max_tokens,
                sampling: s.sampling,
            });
            let events = s.events.clone();
            let cancel_tx = cancel_tx.clone();
            std::thread::spawn(move || {
                for (i, t) in s.prompt.iter().take(s.max_tokens as usize).enumerate() {
                    let lp = s.sampling.logprobs.map(|k| {
                        TokenLogprobs::new(
                            -0.5,
                            (0..u32::from(k)).map(|j| (*t + j, -0.5 - j as f32)),
                        )
                    });
                    std::thread::sleep(pause);
                    if events.send(TokenEvent::Token(*t, lp)).is_err() {
                        let _ = cancel_tx.send(i);
                        return;
                    }
                }
                let _ = events.send(TokenEvent::Done {
                    usage: PrefixUsage {
                        device: 1,
                        host: 0,
                        l3: 2,
                        computed: 3,
                        fallback_reason: FallbackReason::Partial,
                    },
                    finish_reason: "length",
                });
            });
        }
    });
    (seen, cancelled)
}

macro_rules! app {
    ($st:expr) => {
        test::init_service(
            App::new()
                .app_data(web::Data::new($st))
                .configure(configure),
        )
        .await
    };
}

/// A POST answered: the status and the JSON body (a stream: its data events as an array).
async fn read(resp: actix_web::dev::ServiceResponse) -> (StatusCode, Value) {
    let status = resp.status();
    let body = test::read_body(resp).await;
    let v = serde_json::from_slice(&body).unwrap_or_else(|_| {
        let events: Vec<Value> = String::from_utf8_lossy(&body)
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap_or(Value::String(d.into())))
            .collect();
        Value::Array(events)
    });
    (status, v)
}

macro_rules! post {
    ($app:expr, $path:expr, $body:expr) => {{
        let req = test::TestRequest::post()
            .uri($path)
            .set_payload($body.to_string())
            .to_request();
        read(test::call_service($app, req).await).await
    }};
}

fn seen_all(seen: &flume::Receiver<Seen>) -> Vec<Seen> {
    seen.drain().collect()
}

#[actix_web::test]
async fn models_are_listed_and_retrieved_and_unknown_ids_are_404() {
    let (st, _ib) = state_with(Arc::new(ByteCodec));
    let app = app!(st);
    let req = test::TestRequest::get().uri("/v1/models").to_request();
    let v: Value = test::call_and_read_body_json(&app, req).await;
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["object"], "model");
    assert!(v["data"][0]["created"].as_u64().unwrap() > 0);
    let req = test::TestRequest::get()
        .uri("/v1/models/synthetic-tiny")
        .to_request();
    let v: Value = test::call_and_read_body_json(&app, req).await;
    assert_eq!(v["id"], MODEL);
    let req = test::TestRequest::get()
        .uri("/v1/models/org/other")
        .to_request();
    let resp = test::call_service(&app, req).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["param"], "model");
}

#[actix_web::test]
async fn a_completion_has_ids_created_usage_and_the_tier_split() {
    let (st, ib) = state_with(Arc::new(ByteCodec));
    let (seen, _) = fake_loop(ib, Duration::ZERO);
    let app = app!(st);
    let (code, a) = post!(
        &app,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "ABC", "max_tokens": 2})
    );
    assert_eq!(code, StatusCode::OK, "{a}");
    let (_, b) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": "ABC", "max_tokens": 2})
    );
    assert_eq!(a["object"], "text_completion");
    let id = a["id"].as_str().unwrap();
    assert!(id.starts_with("cmpl-") && id.len() == 5 + 24, "{id}");
    assert_ne!(a["id"], b["id"], "ids are random, not a counter");
    assert!(a["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(a["model"], MODEL);
    assert_eq!(a["choices"][0]["text"], "bc");
    assert_eq!(a["choices"][0]["finish_reason"], "length");
    assert!(a["choices"][0]["logprobs"].is_null());
    assert_eq!(a["usage"]["prompt_tokens"], 3);
    assert_eq!(a["usage"]["completion_tokens"], 2);
    assert_eq!(a["usage"]["total_tokens"], 5);
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
    assert_eq!(a["tsl3"]["l3"], 2);
    assert_eq!(a["tsl3"]["output_tokens"], json!([65, 66]));
    let s = seen_all(&seen);
    assert_eq!(s[0].prompt, vec![65, 66, 67]);
    assert_eq!(s[0].max_tokens, 2);
    // The default is OpenAI's temperature 1.
    assert_eq!(s[0].sampling.temperature, 1.0);
}

#[actix_web::test]
async fn batches_and_n_index_choices_prompt_major() {
    let (st, ib) = state_with(Arc::new(ByteCodec));
    let (seen, _) = fake_loop(ib, Duration::ZERO);
    let app = app!(st);
    let (code, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": ["AB", "CD"], "n": 2, "max_tokens": 2, "temperature": 0})
    );
    assert_eq!(code, StatusCode::OK, "{v}");
    let texts: Vec<(u64, &str)> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["index"].as_u64().unwrap(), c["text"].as_str().unwrap()))
        .collect();
    assert_eq!(texts, [(0, "bc"), (1, "bc"), (2, "de"), (3, "de")]);
    assert_eq!(v["usage"]["prompt_tokens"], 4, "each prompt counted once");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(seen_all(&seen).len(), 4, "one engine request per choice");
    // Token-id lists, and one list of token ids.
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": [[1, 2], [3]], "max_tokens": 2})
    );
    assert_eq!(v["choices"][1]["text"], "$");
    assert_eq!(v["tsl3"]["output_tokens"], json!([1, 2]));
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": [5, 6], "max_tokens": 1})
    );
    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
    let (code, v) = post!(&app, "/v1/completions", json!({"prompt": [[1], "a"]}));
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "prompt");
}

#[actix_web::test]
async fn seeds_reach_the_engine_as_seed_plus_sample_index() {
    let (st, ib) = state_with(Arc::new(ByteCodec));
    let (seen, _) = fake_loop(ib, Duration::ZERO);
    let app = app!(st);
    let body = json!({"prompt": "A", "n": 3, "max_tokens": 1, "seed": 41, "temperature": 0.7, "top_p": 0.9, "top_k": 5});
    post!(&app, "/v1/completions", body.clone());
    let mut a: Vec<SamplingParams> = seen_all(&seen).into_iter().map(|s| s.sampling).collect();
    a.sort_by_key(|s| s.seed);
    assert_eq!(a.iter().map(|s| s.seed).collect::<Vec<_>>(), [41, 42, 43]);
    assert!(a
        .iter()
        .all(|s| s.temperature == 0.7 && s.top_p == 0.9 && s.top_k == 5));
    post!(&app, "/v1/completions", body);
    let mut b: Vec<SamplingParams> = seen_all(&seen).into_iter().map(|s| s.sampling).collect();
    b.sort_by_key(|s| s.seed);
    assert_eq!(a, b, "the same request submits the same sampling");
    // Without a seed each sample draws its own.
    post!(
        &app,
        "/v1/completions",
        json!({"prompt": "A", "n": 2, "max_tokens": 1})
    );
    let c = seen_all(&seen);
    assert_ne!(c[0].sampling.seed, c[1].sampling.seed);
    // Chat: the same.
    post!(
        &app,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "n": 2, "max_tokens": 1, "seed": 9})
    );
    let mut d: Vec<u64> = seen_all(&seen).iter().map(|s| s.sampling.seed).collect();
    d.sort();
    assert_eq!(d, [9, 10]);
}

#[actix_web::test]
async fn stops_truncate_the_text_finish_with_stop_and_cancel_the_request() {
    let (st, ib) = state_with(Arc::new(EosCodec));
    let (_seen, cancelled) = fake_loop(ib, Duration::from_millis(20));
    let app = app!(st);
    // "ABCDEFGH" answers "bcdefghi"; the stop string is not in the text.
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": "ABCDEFGH", "max_tokens": 8, "stop": ["zz", "de"]})
    );
    assert_eq!(v["choices"][0]["text"], "bc", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["tsl3"]["output_tokens"], json!([65, 66, 67, 68]));
    assert!(
        v["tsl3"]["l3"].is_null(),
        "cancelled before the engine reported the split"
    );
    let at = cancelled
        .recv_timeout(Duration::from_secs(5))
        .expect("the engine request is cancelled");
    assert!(at < 8, "cancelled at token {at}");
    // A stop token id.
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": [1, 2, 3, 4], "max_tokens": 4, "stop_token_ids": [3]})
    );
    assert_eq!(v["choices"][0]["text"], "\"#");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The codec's end-of-sequence token (7).
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": [1, 7, 3], "max_tokens": 3})
    );
    assert_eq!(v["choices"][0]["text"], "\"");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 2, "the stop token counts");
    // A stop at the last allowed token cancels nothing: the engine's finish arrives and
    // the choice keeps its tier split.
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": [1, 2, 7], "max_tokens": 3})
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["choices"][0]["text"], "\"#");
    assert!(!v["tsl3"]["l3"].is_null(), "the split is reported: {v}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    // No stop: "length".
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": [1, 2], "max_tokens": 2})
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Streamed: the held-back prefix of a stop string that never completes is sent.
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": "ABCD", "max_tokens": 4, "stop": "ex", "stream": true})
    );
    let text: String = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "bcde");
}

#[actix_web::test]
async fn logprobs_and_echo_have_their_shapes() {
    let (st, ib) = state_with(Arc::new(ByteCodec));
    let (seen, _) = fake_loop(ib, Duration::ZERO);
    let app = app!(st);
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": "AB", "max_tokens": 2, "logprobs": 2})
    );
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["b", "c"]));
    assert_eq!(lp["token_logprobs"], json!([-0.5, -0.5]));
    assert_eq!(lp["top_logprobs"][0], json!({"b": -0.5, "c": -1.5}));
    assert_eq!(lp["text_offset"], json!([0, 1]));
    assert_eq!(seen_all(&seen)[0].sampling.logprobs, Some(2));
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": "AB", "max_tokens": 1, "echo": true})
    );
    assert_eq!(v["choices"][0]["text"], "ABb");
    let (code, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": "AB", "echo": true, "logprobs": 1})
    );
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "echo");
    let (code, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": "AB", "logprobs": 21})
    );
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "logprobs");
    // Chat logprobs.
    let (_, v) = post!(
        &app,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "logprobs": true, "top_logprobs": 1})
    );
    let c = &v["choices"][0]["logprobs"]["content"][0];
    assert_eq!(c["logprob"], -0.5);
    assert_eq!(c["top_logprobs"].as_array().unwrap().len(), 1);
    assert!(c["token"].is_string() && c["bytes"].is_array());
    let last = seen_all(&seen).pop().unwrap();
    assert_eq!(last.sampling.logprobs, Some(1));
}

#[actix_web::test]
async fn chat_renders_the_template_and_answers_in_chat_shape() {
    let (st, ib) = state_with(Arc::new(ByteCodec));
    let (seen, _) = fake_loop(ib, Duration::ZERO);
    let app = app!(st);
    let body = json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]},
        ],
        "max_completion_tokens": 3,
    });
    let (code, v) = post!(&app, "/v1/chat/completions", body);
    assert_eq!(code, StatusCode::OK, "{v}");
    let s = seen_all(&seen);
    let want = "<|system|>\nS\n<|user|>\nhi\n<|assistant|>\n";
    assert_eq!(s[0].prompt, ByteCodec.encode(want).unwrap());
    assert_eq!(s[0].max_tokens, 3);
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        ByteCodec.decode(&s[0].prompt[..3])
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], want.len());
    // n
    let (_, v) = post!(
        &app,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "n": 3, "max_tokens": 1})
    );
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    assert_eq!(v["choices"][2]["index"], 2);
}

#[actix_web::test]
async fn chat_streams_role_then_content_then_finish_and_usage_when_asked() {
    let (st, ib) = state_with(Arc::new(ByteCodec));
    fake_loop(ib, Duration::ZERO);
    let app = app!(st);
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}});
    let (_, v) = post!(&app, "/v1/chat/completions", body);
    let ev = v.as_array().unwrap();
    assert_eq!(ev.len(), 6, "role, 2 contents, finish, usage, DONE: {v}");
    assert!(ev[..5]
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["created"].as_u64().is_some()));
    assert!(ev[..5].windows(2).all(|w| w[0]["id"] == w[1]["id"]));
    assert_eq!(ev[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        ev[1]["choices"][0]["delta"]["content"], "]",
        "'<' reads as ']'"
    );
    assert_eq!(ev[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(ev[4]["choices"], json!([]));
    assert_eq!(ev[4]["usage"]["completion_tokens"], 2);
    assert_eq!(ev[5], "[DONE]");
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": true, "n": 2});
    let (_, v) = post!(&app, "/v1/chat/completions", body);
    let ev = v.as_array().unwrap();
    assert_eq!(ev.len(), 2 + 4 + 2 + 1, "{v}");
    assert!(ev.iter().all(|c| c.get("usage").is_none()));
}

#[actix_web::test]
async fn completion_streams_carry_created_and_echo_first() {
    let (st, ib) = state_with(Arc::new(ByteCodec));
    fake_loop(ib, Duration::ZERO);
    let app = app!(st);
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": "AB", "max_tokens": 1, "stream": true, "echo": true})
    );
    let ev = v.as_array().unwrap();
    assert_eq!(ev[0]["choices"][0]["text"], "AB");
    assert_eq!(ev[1]["choices"][0]["text"], "b");
    assert!(ev[..3]
        .iter()
        .all(|c| c["created"].as_u64().is_some() && c["object"] == "text_completion"));
}

#[actix_web::test]
async fn unsupported_and_unknown_parameters_are_named() {
    let (st, ib) = state_with(Arc::new(ByteCodec));
    fake_loop(ib, Duration::ZERO);
    let app = app!(st);
    let m = json!([{"role": "user", "content": "x"}]);
    let cases = [
        (
            "/v1/completions",
            json!({"prompt": "a", "presence_penalty": 0.5}),
            "presence_penalty",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "frequency_penalty": 1}),
            "frequency_penalty",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logit_bias": {"5": 1}}),
            "logit_bias",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "best_of": 3}),
            "best_of",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "suffix": "z"}),
            "suffix",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "bogus": 1}),
            "bogus",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "temperature": 5}),
            "temperature",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "top_p": 0}),
            "top_p",
        ),
        ("/v1/completions", json!({"prompt": "a", "n": 0}), "n"),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 65}),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": m, "tools": [{"type": "function"}]}),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": m, "tool_choice": "auto"}),
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": m, "functions": []}),
            "functions",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": m, "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": m, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": m, "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": m, "echo": true}),
            "echo",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": m, "max_completion_tokens": 0}),
            "max_completion_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content",
        ),
        ("/v1/chat/completions", json!({"messages": []}), "messages"),
    ];
    for (path, body, param) in cases {
        let (code, v) = post!(&app, path, body.clone());
        assert_eq!(code, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(param),
            "{v}"
        );
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    // Neutral values and no-effect keys pass.
    let ok = json!({"prompt": "a", "max_tokens": 1, "presence_penalty": 0, "frequency_penalty": 0, "user": "u", "best_of": 1, "logit_bias": {}, "suffix": null});
    assert_eq!(post!(&app, "/v1/completions", ok).0, StatusCode::OK);
    let ok = json!({"messages": m, "max_tokens": 1, "response_format": {"type": "text"}, "tool_choice": "none", "user": "u"});
    assert_eq!(post!(&app, "/v1/chat/completions", ok).0, StatusCode::OK);
    // Another model is a 404.
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let (code, v) = post!(
            &app,
            path,
            json!({"model": "gpt-4", "prompt": "a", "messages": m})
        );
        assert_eq!(code, StatusCode::NOT_FOUND);
        assert_eq!(v["error"]["code"], "model_not_found");
    }
}

#[actix_web::test]
async fn streamed_text_holds_multi_byte_characters_until_complete() {
    let (st, ib) = state_with(Arc::new(Utf8Codec));
    fake_loop(ib, Duration::ZERO);
    let app = app!(st);
    // "é€a" as bytes: the fake loop answers with the same bytes.
    let prompt: Vec<u32> = "é€a".bytes().map(u32::from).collect();
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 6, "stream": true})
    );
    let texts: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(texts, ["é", "€", "a"], "{v}");
    let (_, v) = post!(
        &app,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 6})
    );
    assert_eq!(v["choices"][0]["text"], "é€a");
}

#[actix_web::test]
async fn a_failed_replica_answers_503_in_openai_shape() {
    let (st, _ib) = inbox(
        4,
        RequestLimits {
            max_prompt_tokens: 64,
            max_output_tokens: 4,
            vocab_size: 256,
        },
        String::new(),
        MODEL.into(),
        Arc::new(ByteCodec),
        Arc::new(String::new),
        Arc::new(Failed),
    );
    let app = app!(st);
    let m = json!([{"role": "user", "content": "x"}]);
    for (path, body) in [
        ("/v1/completions", json!({"prompt": "a", "max_tokens": 1})),
        (
            "/v1/chat/completions",
            json!({"messages": m, "max_tokens": 1, "stream": true}),
        ),
    ] {
        let (code, v) = post!(&app, path, body);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{path}: {v}");
        assert_eq!(v["error"]["code"], "replica_failed");
        assert_eq!(v["error"]["type"], "server_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("failed"));
    }
}
