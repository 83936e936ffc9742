//! The actix-web routes: `POST /v1/completions` (JSON or SSE stream), `GET /health`
//! (and `/health/live`, `/health/ready`),
//! `GET /metrics`, and the admin endpoints behind a bearer token. Requests reach the round
//! loop through a bounded flume inbox (full: 503, never an unbounded queue).

use super::api::{
    BadRequest, Choice, CompletionRequest, CompletionResponse, ErrorBody, ErrorDetail, PrefixUsage,
    PromptTokensDetails, RequestLimits, Tsl3Info, Usage,
};
use actix_web::{http::StatusCode, web, HttpRequest, HttpResponse};
use futures::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What the round loop reports back for one request.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenEvent {
    /// The next output token, with its log-probabilities when the request asked for them.
    Token(u32, Option<messages::TokenLogprobs>),
    Done {
        usage: PrefixUsage,
        finish_reason: &'static str,
    },
    Failed(String),
}

/// One accepted completion request, for the round loop.
#[derive(Debug)]
pub struct Submission {
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    /// How its tokens are chosen (validated).
    pub sampling: messages::SamplingParams,
    /// Events for the client; a send error means the client went away (a cancellation).
    pub events: flume::Sender<TokenEvent>,
}

pub use messages::AdminCommand;

/// One admin command from the HTTP side, with the channel its result answers.
#[derive(Debug)]
pub struct AdminSubmission {
    pub command: AdminCommand,
    pub reply: flume::Sender<Result<String, String>>,
}

/// The round loop's side of the frontend.
pub struct FrontendInbox {
    pub submissions: flume::Receiver<Submission>,
    pub admin: flume::Receiver<AdminSubmission>,
    /// Notified after every submission and admin command, so an idle loop wakes at once.
    pub wake: Arc<tokio::sync::Notify>,
}

type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The rank's health document (JSON) and whether it is ready to take traffic.
/// What the HTTP side reads of the rank's health.
pub trait HealthSource: Send + Sync {
    /// (ready, the JSON health document).
    fn render(&self) -> (bool, String);
    /// Why the replica failed, once it has (read before queueing every request, so it is
    /// a lookup, not a render).
    fn failure(&self) -> Option<String>;
}

pub type HealthRender = Arc<dyn HealthSource>;

/// The HTTP side (shared by every worker of the actix-web server).
#[derive(Clone)]
pub struct FrontendState {
    submit: flume::Sender<Submission>,
    admin: flume::Sender<AdminSubmission>,
    pub limits: RequestLimits,
    pub admin_token: String,
    pub model: String,
    /// Renders the Prometheus text exposition.
    pub metrics: Render,
    /// Renders the health document (JSON) and the readiness it states.
    pub health: HealthRender,
    next_id: Arc<AtomicU64>,
    wake: Arc<tokio::sync::Notify>,
}

impl FrontendState {
    /// What wakes a quiet round loop (the HTTP side notifies it with every submission and
    /// admin command; a signal handler notifies it when a stop is requested).
    pub fn loop_waker(&self) -> Arc<tokio::sync::Notify> {
        self.wake.clone()
    }
}

/// A bounded inbox of `capacity` requests and its HTTP side.
pub fn inbox(
    capacity: usize,
    limits: RequestLimits,
    admin_token: String,
    model: String,
    metrics: Render,
    health: HealthRender,
) -> (FrontendState, FrontendInbox) {
    let (submit, submissions) = flume::bounded(capacity);
    let (admin, admin_rx) = flume::bounded(16);
    let wake = Arc::new(tokio::sync::Notify::new());
    (
        FrontendState {
            submit,
            admin,
            limits,
            admin_token,
            model,
            metrics,
            health,
            next_id: Arc::new(AtomicU64::new(1)),
            wake: wake.clone(),
        },
        FrontendInbox {
            submissions,
            admin: admin_rx,
            wake,
        },
    )
}

/// Registers every route (the leader's API).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/completions", web::post().to(completions))
        .route("/admin/clear_cache", web::post().to(admin_clear))
        .route("/admin/weight_version", web::post().to(admin_weights))
        .route("/admin/reset_local", web::post().to(admin_reset_local));
    configure_observability(cfg);
}

/// Registers `/metrics` and the health routes only (every rank's own address).
pub fn configure_observability(cfg: &mut web::ServiceConfig) {
    cfg.route("/health", web::get().to(health))
        .route("/health/live", web::get().to(health_live))
        .route("/health/ready", web::get().to(health_ready))
        .route("/metrics", web::get().to(metrics))
        .default_service(web::to(not_found));
}

/// Every unknown path or method answers a JSON error, like every other error.
async fn not_found(req: HttpRequest) -> HttpResponse {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {} {}", req.method(), req.path()),
    )
}

/// The longest request body a completion can need: the longest prompt the cache groups
/// hold, as a JSON token-id array of the widest ids (or as text of up to 4 bytes per
/// token, JSON-escaped), plus room for the other fields.
pub fn max_body_bytes(limits: &RequestLimits) -> usize {
    let digits = limits.vocab_size.max(1).to_string().len() + 1; // digits and a comma
    let per_token = digits.max(6 * 4); // "\uXXXX" escapes of a 4-byte character
    limits
        .max_prompt_tokens
        .saturating_mul(per_token)
        .saturating_add(64 * 1024)
}

/// Reads the body up to `limit` bytes; a longer one is a JSON 413 naming the limit.
async fn read_body(mut payload: web::Payload, limit: usize) -> Result<web::Bytes, HttpResponse> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("reading the request body: {e}"),
            )
        })?;
        if body.len() + chunk.len() > limit {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!(
                    "the request body exceeds {limit} bytes (the longest prompt the cache groups hold)"
                ),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

fn error(status: StatusCode, kind: &'static str, message: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status).json(ErrorBody {
        error: ErrorDetail {
            message: message.into(),
            kind,
        },
    })
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn completions(state: web::Data<FrontendState>, payload: web::Payload) -> HttpResponse {
    let body = match read_body(payload, max_body_bytes(&state.limits)).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let req: CompletionRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("bad JSON: {e}"),
            )
        }
    };
    let prompt = match req.tokens(&state.limits) {
        Ok(p) => p,
        Err(BadRequest(m)) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", m),
    };
    // A replica that failed answers at once instead of queueing for a round loop that
    // ended.
    if let Some(why) = state.health.failure() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "replica_failed", why);
    }
    let prompt_tokens = prompt.len() as u32;
    let (tx, rx) = flume::unbounded();
    let sub = Submission {
        prompt,
        max_tokens: req.max_tokens,
        sampling: messages::SamplingParams::GREEDY,
        events: tx,
    };
    if let Err(e) = state.submit.try_send(sub) {
        let why = match e {
            flume::TrySendError::Full(_) => "the request queue is full",
            flume::TrySendError::Disconnected(_) => "the engine is shutting down",
        };
        return error(StatusCode::SERVICE_UNAVAILABLE, "overloaded", why);
    }
    state.wake.notify_one();
    let id = format!("cmpl-{}", state.next_id.fetch_add(1, Ordering::Relaxed));
    let model = req.model.clone().unwrap_or_else(|| state.model.clone());
    if req.stream {
        return stream_response(id, model, prompt_tokens, rx);
    }
    let mut tokens = vec![];
    loop {
        match rx.recv_async().await {
            Ok(TokenEvent::Token(t, _)) => tokens.push(t),
            Ok(TokenEvent::Done {
                usage,
                finish_reason,
            }) => {
                let body = response(id, model, prompt_tokens, tokens, usage, Some(finish_reason));
                return HttpResponse::Ok().json(body);
            }
            Ok(TokenEvent::Failed(m)) => {
                return error(StatusCode::SERVICE_UNAVAILABLE, "engine_unavailable", m)
            }
            Err(_) => {
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "engine_error",
                    "the engine stopped before the request finished",
                )
            }
        }
    }
}

fn response(
    id: String,
    model: String,
    prompt_tokens: u32,
    tokens: Vec<u32>,
    usage: PrefixUsage,
    finish_reason: Option<&'static str>,
) -> CompletionResponse {
    let n = tokens.len() as u32;
    CompletionResponse {
        id,
        object: "text_completion",
        created: now_secs(),
        model,
        choices: vec![Choice {
            index: 0,
            text: tokens.iter().map(|t| super::api::token_text(*t)).collect(),
            finish_reason,
        }],
        usage: Usage {
            prompt_tokens,
            completion_tokens: n,
            total_tokens: prompt_tokens + n,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: usage.cached(),
            },
        },
        tsl3: Tsl3Info {
            device: usage.device,
            host: usage.host,
            l3: usage.l3,
            computed: usage.computed,
            fallback_reason: usage.fallback_reason,
            output_tokens: tokens,
        },
    }
}

/// SSE: one chunk per token (the first is flushed at the first token), then a final chunk
/// with usage and the tsl3 object, then `[DONE]`.
fn stream_response(
    id: String,
    model: String,
    prompt_tokens: u32,
    rx: flume::Receiver<TokenEvent>,
) -> HttpResponse {
    let mut tokens: Vec<u32> = vec![];
    // Ends after the final chunk even if the round loop keeps the sender alive.
    let stream = rx
        .into_stream()
        .scan(false, move |finished, ev| {
            if *finished {
                return futures::future::ready(None);
            }
            let chunk = match ev {
                TokenEvent::Token(t, _) => {
                    tokens.push(t);
                    let c = serde_json::json!({
                        "id": id, "object": "text_completion", "model": model,
                        "choices": [{"index": 0, "text": super::api::token_text(t).to_string(), "finish_reason": null}],
                    });
                    format!("data: {c}\n\n")
                }
                TokenEvent::Done {
                    usage,
                    finish_reason,
                } => {
                    *finished = true;
                    let last = response(
                        id.clone(),
                        model.clone(),
                        prompt_tokens,
                        std::mem::take(&mut tokens),
                        usage,
                        Some(finish_reason),
                    );
                    let mut v = serde_json::to_value(&last).unwrap_or_default();
                    if let Some(choices) = v.get_mut("choices") {
                        *choices = serde_json::json!([{"index": 0, "text": "", "finish_reason": finish_reason}]);
                    }
                    format!("data: {v}\n\ndata: [DONE]\n\n")
                }
                TokenEvent::Failed(m) => {
                    *finished = true;
                    let e = serde_json::json!({"error": {"message": m, "type": "engine_error"}});
                    format!("data: {e}\n\ndata: [DONE]\n\n")
                }
            };
            futures::future::ready(Some(Ok::<_, actix_web::Error>(web::Bytes::from(chunk))))
        });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(stream)
}

/// The health document, always 200 (its `status` and `ready` say the rest).
async fn health(state: web::Data<FrontendState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(state.health.render().1)
}

/// Liveness: the process answers HTTP.
async fn health_live() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body("{\"status\":\"live\"}")
}

/// Readiness: 200 when the rank takes traffic, 503 with the document (its `reason`)
/// otherwise.
async fn health_ready(state: web::Data<FrontendState>) -> HttpResponse {
    let (ready, doc) = state.health.render();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    HttpResponse::build(code)
        .content_type("application/json")
        .body(doc)
}

async fn metrics(state: web::Data<FrontendState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body((state.metrics)())
}

fn authorized(state: &FrontendState, req: &HttpRequest) -> Result<(), Box<HttpResponse>> {
    if state.admin_token.is_empty() {
        return Err(Box::new(error(
            StatusCode::FORBIDDEN,
            "admin_disabled",
            "admin endpoints are disabled (server.admin_token is empty)",
        )));
    }
    let expected = format!("Bearer {}", state.admin_token);
    let given = req
        .headers()
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    // Constant-time comparison of the bearer token.
    let same = given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        Ok(())
    } else {
        Err(Box::new(error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        )))
    }
}

async fn admin(state: &FrontendState, command: AdminCommand) -> HttpResponse {
    let (tx, rx) = flume::bounded(1);
    if state
        .admin
        .try_send(AdminSubmission { command, reply: tx })
        .is_err()
    {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "admin queue is full",
        );
    }
    state.wake.notify_one();
    match rx.recv_async().await {
        Ok(Ok(m)) => HttpResponse::Ok().json(serde_json::json!({"ok": true, "message": m})),
        Ok(Err(m)) => error(StatusCode::CONFLICT, "admin_failed", m),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_error",
            "the engine stopped",
        ),
    }
}

async fn admin_clear(state: web::Data<FrontendState>, req: HttpRequest) -> HttpResponse {
    if let Err(r) = authorized(&state, &req) {
        return *r;
    }
    admin(&state, AdminCommand::ClearCache).await
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    /// Also drop the Host (L2) cache; false drops the Device (L1) only.
    #[serde(default = "yes")]
    host: bool,
}

fn yes() -> bool {
    true
}

async fn admin_reset_local(
    state: web::Data<FrontendState>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    if let Err(r) = authorized(&state, &req) {
        return *r;
    }
    let body = match read_body(payload, 4096).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let r: ResetBody = if body.iter().all(|b| b.is_ascii_whitespace()) {
        ResetBody { host: true }
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    format!("bad JSON: {e}"),
                )
            }
        }
    };
    admin(&state, AdminCommand::ResetLocal { host: r.host }).await
}

/// Fuzzing (crate::fuzz): the admin bodies parse as their handlers parse them.
pub fn fuzz_admin_bodies(data: &[u8]) {
    let _ = serde_json::from_slice::<ResetBody>(data).map(|r| r.host);
    let _ = serde_json::from_slice::<WeightBody>(data).map(|w| (w.target, w.draft));
}

#[derive(serde::Deserialize)]
struct WeightBody {
    target: u64,
    #[serde(default)]
    draft: Option<u64>,
}

async fn admin_weights(
    state: web::Data<FrontendState>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    if let Err(r) = authorized(&state, &req) {
        return *r;
    }
    let w: WeightBody = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("bad JSON: {e}"),
            )
        }
    };
    admin(
        &state,
        AdminCommand::SetWeightVersion {
            target: w.target,
            draft: w.draft,
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::super::api::FallbackReason;
    use super::*;
    use actix_web::{test, App};

    /// A health source that never changes and never fails.
    struct FixedHealth(bool, &'static str);

    impl HealthSource for FixedHealth {
        fn render(&self) -> (bool, String) {
            (self.0, self.1.to_string())
        }
        fn failure(&self) -> Option<String> {
            None
        }
    }

    fn state(token: &str) -> (FrontendState, FrontendInbox) {
        inbox(
            4,
            RequestLimits {
                max_prompt_tokens: 64,
                max_output_tokens: 8,
                vocab_size: 256,
            },
            token.into(),
            "synthetic-tiny".into(),
            Arc::new(|| "tsl3_up 1\n".to_string()),
            Arc::new(FixedHealth(true, "{\"status\":\"ok\"}")),
        )
    }

    /// A probe standing in for the round loop: answers every request with its prompt's
    /// first bytes, so the HTTP layer is tested alone (the real round loop is tested by the
    /// serving tests).
    fn probe(inbox: FrontendInbox) {
        std::thread::spawn(move || {
            while let Ok(s) = inbox.submissions.recv() {
                for t in s.prompt.iter().take(s.max_tokens as usize) {
                    let _ = s.events.send(TokenEvent::Token(*t, None));
                }
                let _ = s.events.send(TokenEvent::Done {
                    usage: PrefixUsage {
                        device: 0,
                        host: 1,
                        l3: 2,
                        computed: 3,
                        fallback_reason: FallbackReason::Partial,
                    },
                    finish_reason: "length",
                });
            }
        });
    }

    #[actix_web::test]
    async fn completion_reports_usage_and_tier_split() {
        let (st, ib) = state("");
        probe(ib);
        let app =
            test::init_service(App::new().app_data(web::Data::new(st)).configure(configure)).await;
        let req = test::TestRequest::post()
            .uri("/v1/completions")
            .set_payload(r#"{"prompt":"ABC","max_tokens":2}"#)
            .to_request();
        let v: serde_json::Value = test::call_and_read_body_json(&app, req).await;
        assert_eq!(v["usage"]["prompt_tokens"], 3);
        assert_eq!(v["usage"]["completion_tokens"], 2);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
        assert_eq!(v["tsl3"]["l3"], 2);
        assert_eq!(v["tsl3"]["fallback_reason"], "partial");
        assert_eq!(v["tsl3"]["output_tokens"], serde_json::json!([65, 66]));
    }

    #[actix_web::test]
    async fn stream_sends_one_chunk_per_token_then_done() {
        let (st, ib) = state("");
        probe(ib);
        let app =
            test::init_service(App::new().app_data(web::Data::new(st)).configure(configure)).await;
        let req = test::TestRequest::post()
            .uri("/v1/completions")
            .set_payload(r#"{"prompt":[1,2,3],"max_tokens":3,"stream":true}"#)
            .to_request();
        let body = test::call_and_read_body(&app, req).await;
        let text = String::from_utf8_lossy(&body);
        let chunks: Vec<&str> = text.split("\n\n").filter(|c| !c.is_empty()).collect();
        assert_eq!(chunks.len(), 5, "3 tokens + final + DONE: {text}");
        assert!(chunks[4].contains("[DONE]"));
        assert!(chunks[3].contains("cached_tokens"));
    }

    #[actix_web::test]
    async fn bad_requests_get_4xx_with_a_message() {
        let (st, ib) = state("");
        probe(ib);
        let app =
            test::init_service(App::new().app_data(web::Data::new(st)).configure(configure)).await;
        for (payload, needle) in [
            ("{not json", "bad JSON"),
            (r#"{"prompt":""}"#, "empty"),
            (r#"{"prompt":[300]}"#, "vocabulary"),
        ] {
            let req = test::TestRequest::post()
                .uri("/v1/completions")
                .set_payload(payload)
                .to_request();
            let resp = test::call_service(&app, req).await;
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
            let body = test::read_body(resp).await;
            assert!(String::from_utf8_lossy(&body).contains(needle), "{payload}");
        }
    }

    #[actix_web::test]
    async fn admin_needs_the_bearer_token() {
        let (st, ib) = state("s3cret");
        std::thread::spawn(move || {
            while let Ok(a) = ib.admin.recv() {
                let _ = a.reply.send(Ok(format!("{:?}", a.command)));
            }
        });
        let app =
            test::init_service(App::new().app_data(web::Data::new(st)).configure(configure)).await;
        let req = test::TestRequest::post()
            .uri("/admin/clear_cache")
            .to_request();
        assert_eq!(
            test::call_service(&app, req).await.status(),
            StatusCode::UNAUTHORIZED
        );
        let req = test::TestRequest::post()
            .uri("/admin/clear_cache")
            .insert_header(("authorization", "Bearer wrong!"))
            .to_request();
        assert_eq!(
            test::call_service(&app, req).await.status(),
            StatusCode::UNAUTHORIZED
        );
        let req = test::TestRequest::post()
            .uri("/admin/weight_version")
            .insert_header(("authorization", "Bearer s3cret"))
            .set_payload(r#"{"target":7}"#)
            .to_request();
        let v: serde_json::Value = test::call_and_read_body_json(&app, req).await;
        assert_eq!(v["ok"], true);
        assert!(v["message"].as_str().unwrap().contains("target: 7"));
    }

    #[actix_web::test]
    async fn long_token_prompts_pass_and_oversized_bodies_get_a_json_413() {
        let (st, ib) = inbox(
            4,
            RequestLimits {
                max_prompt_tokens: 100_000,
                max_output_tokens: 8,
                vocab_size: 128_256,
            },
            String::new(),
            "synthetic".into(),
            Arc::new(String::new),
            Arc::new(FixedHealth(false, "")),
        );
        probe(ib);
        let app =
            test::init_service(App::new().app_data(web::Data::new(st)).configure(configure)).await;
        // 100k six-digit token ids: about 700 KB, far above actix's 256 KiB default.
        let ids: Vec<String> = (0..100_000)
            .map(|i| (128_000 + i % 256).to_string())
            .collect();
        let body = format!("{{\"prompt\":[{}],\"max_tokens\":1}}", ids.join(","));
        assert!(body.len() > 256 * 1024);
        let req = test::TestRequest::post()
            .uri("/v1/completions")
            .set_payload(body)
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), StatusCode::OK);
        // One token too many is a 400 naming the limit; a body past the limit a JSON 413.
        let too_long = vec!["1"; 100_001].join(",");
        let req = test::TestRequest::post()
            .uri("/v1/completions")
            .set_payload(format!("{{\"prompt\":[{too_long}]}}"))
            .to_request();
        assert_eq!(
            test::call_service(&app, req).await.status(),
            StatusCode::BAD_REQUEST
        );
        let huge = " ".repeat(8 << 20);
        let req = test::TestRequest::post()
            .uri("/v1/completions")
            .set_payload(huge)
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let v: serde_json::Value = test::read_body_json(resp).await;
        assert!(v["error"]["message"].as_str().unwrap().contains("exceeds"));
    }

    #[actix_web::test]
    async fn unknown_routes_answer_json() {
        let (st, _ib) = state("");
        let app =
            test::init_service(App::new().app_data(web::Data::new(st)).configure(configure)).await;
        let req = test::TestRequest::get().uri("/v2/nothing").to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let v: serde_json::Value = test::read_body_json(resp).await;
        assert_eq!(v["error"]["type"], "not_found");
    }

    #[actix_web::test]
    async fn reset_local_names_the_tiers_it_drops() {
        let (st, ib) = state("tok");
        std::thread::spawn(move || {
            while let Ok(a) = ib.admin.recv() {
                let _ = a.reply.send(Ok(format!("{:?}", a.command)));
            }
        });
        let app =
            test::init_service(App::new().app_data(web::Data::new(st)).configure(configure)).await;
        for (payload, expect) in [
            ("", "ResetLocal { host: true }"),
            (r#"{"host":false}"#, "ResetLocal { host: false }"),
        ] {
            let req = test::TestRequest::post()
                .uri("/admin/reset_local")
                .insert_header(("authorization", "Bearer tok"))
                .set_payload(payload)
                .to_request();
            let v: serde_json::Value = test::call_and_read_body_json(&app, req).await;
            assert_eq!(v["message"], expect);
        }
        let req = test::TestRequest::post()
            .uri("/admin/reset_local")
            .insert_header(("authorization", "Bearer tok"))
            .set_payload(r#"{"hosts":1}"#)
            .to_request();
        assert_eq!(
            test::call_service(&app, req).await.status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[actix_web::test]
    async fn a_full_inbox_answers_503() {
        let (st, _ib) = state("");
        let app = test::init_service(
            App::new()
                .app_data(web::Data::new(st.clone()))
                .configure(configure),
        )
        .await;
        for _ in 0..4 {
            let (tx, _rx) = flume::unbounded();
            st.submit
                .try_send(Submission {
                    prompt: vec![1],
                    max_tokens: 1,
                    sampling: messages::SamplingParams::GREEDY,
                    events: tx,
                })
                .unwrap();
        }
        let req = test::TestRequest::post()
            .uri("/v1/completions")
            .set_payload(r#"{"prompt":"x","max_tokens":1}"#)
            .to_request();
        assert_eq!(
            test::call_service(&app, req).await.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
