//! The actix-web routes: `POST /v1/completions` (JSON or SSE stream), `GET /health`,
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
    Token(u32),
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
    /// Events for the client; a send error means the client went away (a cancellation).
    pub events: flume::Sender<TokenEvent>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminCommandKind {
    ClearCache,
    SetWeightVersion { target: u64, draft: Option<u64> },
}

#[derive(Debug)]
pub struct AdminSubmission {
    pub command: AdminCommandKind,
    pub reply: flume::Sender<Result<String, String>>,
}

/// The round loop's side of the frontend.
pub struct FrontendInbox {
    pub submissions: flume::Receiver<Submission>,
    pub admin: flume::Receiver<AdminSubmission>,
}

type Render = Arc<dyn Fn() -> String + Send + Sync>;

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
    /// Renders the health document (JSON).
    pub health: Render,
    next_id: Arc<AtomicU64>,
}

/// A bounded inbox of `capacity` requests and its HTTP side.
pub fn inbox(
    capacity: usize,
    limits: RequestLimits,
    admin_token: String,
    model: String,
    metrics: Render,
    health: Render,
) -> (FrontendState, FrontendInbox) {
    let (submit, submissions) = flume::bounded(capacity);
    let (admin, admin_rx) = flume::bounded(16);
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
        },
        FrontendInbox {
            submissions,
            admin: admin_rx,
        },
    )
}

/// Registers every route.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/completions", web::post().to(completions))
        .route("/health", web::get().to(health))
        .route("/metrics", web::get().to(metrics))
        .route("/admin/clear_cache", web::post().to(admin_clear))
        .route("/admin/weight_version", web::post().to(admin_weights));
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

async fn completions(state: web::Data<FrontendState>, body: web::Bytes) -> HttpResponse {
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
    let prompt_tokens = prompt.len() as u32;
    let (tx, rx) = flume::unbounded();
    let sub = Submission {
        prompt,
        max_tokens: req.max_tokens,
        events: tx,
    };
    if let Err(e) = state.submit.try_send(sub) {
        let why = match e {
            flume::TrySendError::Full(_) => "the request queue is full",
            flume::TrySendError::Disconnected(_) => "the engine is shutting down",
        };
        return error(StatusCode::SERVICE_UNAVAILABLE, "overloaded", why);
    }
    let id = format!("cmpl-{}", state.next_id.fetch_add(1, Ordering::Relaxed));
    let model = req.model.clone().unwrap_or_else(|| state.model.clone());
    if req.stream {
        return stream_response(id, model, prompt_tokens, rx);
    }
    let mut tokens = vec![];
    loop {
        match rx.recv_async().await {
            Ok(TokenEvent::Token(t)) => tokens.push(t),
            Ok(TokenEvent::Done {
                usage,
                finish_reason,
            }) => {
                let body = response(id, model, prompt_tokens, tokens, usage, Some(finish_reason));
                return HttpResponse::Ok().json(body);
            }
            Ok(TokenEvent::Failed(m)) => {
                return error(StatusCode::INTERNAL_SERVER_ERROR, "engine_error", m)
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
                TokenEvent::Token(t) => {
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

async fn health(state: web::Data<FrontendState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body((state.health)())
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

async fn admin(state: &FrontendState, command: AdminCommandKind) -> HttpResponse {
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
    admin(&state, AdminCommandKind::ClearCache).await
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
        AdminCommandKind::SetWeightVersion {
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
            Arc::new(|| "{\"status\":\"ok\"}".to_string()),
        )
    }

    /// A probe standing in for the round loop: answers every request with its prompt's
    /// first bytes, so the HTTP layer is tested alone (the real round loop is tested by the
    /// serving tests).
    fn probe(inbox: FrontendInbox) {
        std::thread::spawn(move || {
            while let Ok(s) = inbox.submissions.recv() {
                for t in s.prompt.iter().take(s.max_tokens as usize) {
                    let _ = s.events.send(TokenEvent::Token(*t));
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
