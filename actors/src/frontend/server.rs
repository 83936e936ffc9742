//! The actix-web route table and the plumbing the routes share: the OpenAI API
//! (`GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/completions`,
//! `POST /v1/chat/completions`; bodies, shapes and rendering are `super::openai`),
//! `GET /health` (and `/health/live`, `/health/ready`), `GET /metrics`, and the admin
//! endpoints behind a bearer token. Requests reach the round loop through a bounded flume
//! inbox (full: 503, never an unbounded queue). Every error is a JSON body in OpenAI's
//! shape: an unknown path is a 404, a known path with the wrong method a 405, a body over
//! the limit a 413.

use super::api::{PrefixUsage, RequestLimits};
use super::openai::{self, params::Generation, run::Stops, ApiError};
use super::text::TextCodec;
use actix_web::{http::StatusCode, web, HttpRequest, HttpResponse};
use futures::StreamExt;
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
    /// The served model id (`/v1/models`; a request naming another is a 404).
    pub model: String,
    /// Text <-> tokens of the served model.
    pub codec: Arc<dyn TextCodec>,
    /// When this frontend started (the model's `created`).
    pub created: u64,
    /// Renders the Prometheus text exposition.
    pub metrics: Render,
    /// Renders the health document (JSON) and the readiness it states.
    pub health: HealthRender,
    wake: Arc<tokio::sync::Notify>,
}

impl FrontendState {
    /// What wakes a quiet round loop (the HTTP side notifies it with every submission and
    /// admin command; a signal handler notifies it when a stop is requested).
    pub fn loop_waker(&self) -> Arc<tokio::sync::Notify> {
        self.wake.clone()
    }

    /// Submits one engine request per choice (prompt, sampling), all or none: a replica
    /// that failed, a full queue or a stopped engine is a 503 (choices already queued are
    /// cancelled when their receivers drop with the error).
    pub fn submit_all(
        &self,
        jobs: Vec<(Vec<u32>, messages::SamplingParams)>,
        max_tokens: u32,
    ) -> Result<Vec<flume::Receiver<TokenEvent>>, ApiError> {
        // A replica that failed answers at once instead of queueing for a round loop that
        // ended.
        if let Some(why) = self.health.failure() {
            return Err(ApiError::unavailable("replica_failed", why));
        }
        let mut receivers = Vec::with_capacity(jobs.len());
        for (prompt, sampling) in jobs {
            let (tx, rx) = flume::unbounded();
            let sub = Submission {
                prompt,
                max_tokens,
                sampling,
                events: tx,
            };
            if let Err(e) = self.submit.try_send(sub) {
                let why = match e {
                    flume::TrySendError::Full(_) => "the request queue is full",
                    flume::TrySendError::Disconnected(_) => "the engine is shutting down",
                };
                return Err(ApiError::unavailable("overloaded", why));
            }
            receivers.push(rx);
        }
        self.wake.notify_one();
        Ok(receivers)
    }

    /// What ends a choice of `g` with "stop": its stop strings and token ids, and the
    /// model's end-of-sequence tokens.
    pub fn stops(&self, g: &Generation) -> Stops {
        let mut token_ids = g.stop_token_ids.clone();
        token_ids.extend(self.codec.eos_tokens());
        Stops {
            strings: g.stop.clone(),
            token_ids,
            max_tokens: g.max_tokens,
        }
    }
}

/// A bounded inbox of `capacity` requests and its HTTP side.
pub fn inbox(
    capacity: usize,
    limits: RequestLimits,
    admin_token: String,
    model: String,
    codec: Arc<dyn TextCodec>,
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
            codec,
            created: openai::run::now_secs(),
            metrics,
            health,
            wake: wake.clone(),
        },
        FrontendInbox {
            submissions,
            admin: admin_rx,
            wake,
        },
    )
}

/// One path answering `route`, and a JSON 405 for any other method.
fn resource(path: &str, route: actix_web::Route) -> actix_web::Resource {
    web::resource(path)
        .route(route)
        .default_service(web::to(method_not_allowed))
}

/// Registers every route (the leader's API).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/v1/models", web::get().to(openai::models::list)))
        .service(resource(
            "/v1/models/{id:.+}",
            web::get().to(openai::models::retrieve),
        ))
        .service(resource("/v1/completions", web::post().to(completions)))
        .service(resource("/v1/chat/completions", web::post().to(chat)))
        .service(resource("/admin/clear_cache", web::post().to(admin_clear)))
        .service(resource(
            "/admin/weight_version",
            web::post().to(admin_weights),
        ))
        .service(resource(
            "/admin/reset_local",
            web::post().to(admin_reset_local),
        ));
    configure_observability(cfg);
}

/// Registers `/metrics` and the health routes only (every rank's own address).
pub fn configure_observability(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/health", web::get().to(health)))
        .service(resource("/health/live", web::get().to(health_live)))
        .service(resource("/health/ready", web::get().to(health_ready)))
        .service(resource("/metrics", web::get().to(metrics)))
        .default_service(web::to(not_found));
}

/// Every unknown path answers a JSON 404, like every other error.
async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no route for {} {}", req.method(), req.path()),
    )
    .code("not_found")
    .response()
}

/// A known path asked with another method.
async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{} is not allowed on {}", req.method(), req.path()),
    )
    .code("method_not_allowed")
    .response()
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
            ApiError::bad_request(format!("reading the request body: {e}")).response()
        })?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!(
                    "the request body exceeds {limit} bytes (the longest prompt the cache groups hold)"
                ),
            )
            .code("request_too_large")
            .response());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// A JSON error of this module's own kinds (admin, bodies), `code` the same as `type`.
fn error(status: StatusCode, kind: &'static str, message: impl Into<String>) -> HttpResponse {
    ApiError::new(status, kind, message).code(kind).response()
}

async fn completions(state: web::Data<FrontendState>, payload: web::Payload) -> HttpResponse {
    match read_body(payload, max_body_bytes(&state.limits)).await {
        Ok(body) => openai::completions::handle(&state, &body).await,
        Err(r) => r,
    }
}

async fn chat(state: web::Data<FrontendState>, payload: web::Payload) -> HttpResponse {
    match read_body(payload, max_body_bytes(&state.limits)).await {
        Ok(body) => openai::chat::handle(&state, &body).await,
        Err(r) => r,
    }
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
            Arc::new(crate::frontend::ByteCodec),
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
        let chunks = |body: web::Bytes| -> Vec<String> {
            String::from_utf8_lossy(&body)
                .split("\n\n")
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        };
        let req = test::TestRequest::post()
            .uri("/v1/completions")
            .set_payload(r#"{"prompt":[1,2,3],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}"#)
            .to_request();
        let c = chunks(test::call_and_read_body(&app, req).await);
        assert_eq!(c.len(), 6, "3 tokens + finish + usage + DONE: {c:?}");
        assert!(c[3].contains("\"finish_reason\":\"length\""), "{}", c[3]);
        assert!(c[4].contains("cached_tokens") && c[4].contains("\"choices\":[]"));
        assert!(c[5].contains("[DONE]"));
        // Usage only when asked for.
        let req = test::TestRequest::post()
            .uri("/v1/completions")
            .set_payload(r#"{"prompt":[1,2,3],"max_tokens":3,"stream":true}"#)
            .to_request();
        let c = chunks(test::call_and_read_body(&app, req).await);
        assert_eq!(c.len(), 5, "3 tokens + finish + DONE: {c:?}");
        assert!(c.iter().all(|c| !c.contains("usage")), "{c:?}");
        assert!(
            c[3].contains("output_tokens"),
            "the finish chunk carries tsl3"
        );
    }

    #[actix_web::test]
    async fn bad_requests_get_4xx_with_a_message() {
        let (st, ib) = state("");
        probe(ib);
        let app =
            test::init_service(App::new().app_data(web::Data::new(st)).configure(configure)).await;
        for (payload, needle, param) in [
            ("{not json", "bad JSON", serde_json::Value::Null),
            (r#"{"prompt":""}"#, "empty", "prompt".into()),
            (r#"{"prompt":[300]}"#, "vocabulary", "prompt".into()),
            (r#"{"max_tokens":1}"#, "required", "prompt".into()),
        ] {
            let req = test::TestRequest::post()
                .uri("/v1/completions")
                .set_payload(payload)
                .to_request();
            let resp = test::call_service(&app, req).await;
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
            let v: serde_json::Value = test::read_body_json(resp).await;
            assert!(
                v["error"]["message"].as_str().unwrap().contains(needle),
                "{payload}"
            );
            assert_eq!(v["error"]["param"], param, "{payload}");
            assert_eq!(v["error"]["type"], "invalid_request_error");
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
            Arc::new(crate::frontend::ByteCodec),
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
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "request_too_large");
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
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v2/nothing"));
        assert!(v["error"].get("param").is_some());
        // A known path with the wrong method is a JSON 405.
        for (method, path) in [
            ("GET", "/v1/completions"),
            ("POST", "/v1/models"),
            ("PUT", "/health"),
        ] {
            let req = test::TestRequest::default()
                .method(method.parse().unwrap())
                .uri(path)
                .to_request();
            let resp = test::call_service(&app, req).await;
            assert_eq!(
                resp.status(),
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}"
            );
            let v: serde_json::Value = test::read_body_json(resp).await;
            assert_eq!(v["error"]["code"], "method_not_allowed");
        }
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
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        let v: serde_json::Value = test::read_body_json(resp).await;
        assert_eq!(v["error"]["code"], "overloaded");
        assert!(v["error"]["message"].as_str().unwrap().contains("full"));
    }
}
