//! OTLP export proven offline: spans emitted through the engine host's telemetry setup arrive
//! at an in-test OTLP receiver, over gRPC (tonic TraceService) and over HTTP (protobuf at
//! /v1/traces), with the expected parent/child tree, resource and attributes.

use engine_host::telemetry::{otel_layer, provider, OtlpProtocol, OtlpTarget};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::sync::{Arc, Mutex};
use tracing_subscriber::layer::SubscriberExt;

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Emits one storage-operation-like span tree: op → queue, backend_call.
fn emit(target: OtlpTarget) -> opentelemetry_sdk::trace::SdkTracerProvider {
    let p = provider(&target, "tsl3-test", 3).unwrap();
    let subscriber = tracing_subscriber::registry().with(otel_layer(&p));
    tracing::subscriber::with_default(subscriber, || {
        let op = tracing::info_span!("storage_operation", op_id = 7u64, kind = "get", keys = 2u64);
        let _g = op.enter();
        tracing::info_span!("queue").in_scope(|| {});
        tracing::info_span!("backend_call", bytes = 4096u64).in_scope(|| {});
    });
    p
}

fn spans(reqs: &[ExportTraceServiceRequest]) -> Vec<(Span, Vec<(String, String)>)> {
    let mut out = vec![];
    for r in reqs {
        for rs in &r.resource_spans {
            let res: Vec<(String, String)> = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .map(|kv| {
                    let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                        Some(Value::StringValue(s)) => s,
                        Some(Value::IntValue(i)) => i.to_string(),
                        other => format!("{other:?}"),
                    };
                    (kv.key.clone(), v)
                })
                .collect();
            for ss in &rs.scope_spans {
                for s in &ss.spans {
                    out.push((s.clone(), res.clone()));
                }
            }
        }
    }
    out
}

fn check_tree(reqs: &[ExportTraceServiceRequest]) {
    let all = spans(reqs);
    let find = |n: &str| {
        all.iter().find(|(s, _)| s.name == n).unwrap_or_else(|| {
            panic!(
                "span {n} missing: {:?}",
                all.iter().map(|s| &s.0.name).collect::<Vec<_>>()
            )
        })
    };
    let (op, res) = find("storage_operation");
    let (queue, _) = find("queue");
    let (backend, _) = find("backend_call");
    assert!(op.parent_span_id.is_empty(), "the operation is a root span");
    assert_eq!(queue.parent_span_id, op.span_id);
    assert_eq!(backend.parent_span_id, op.span_id);
    assert_eq!(queue.trace_id, op.trace_id);
    assert!(op.attributes.iter().any(|kv| kv.key == "op_id"));
    assert!(
        res.iter().any(|(k, v)| k == "tp_rank" && v == "3"),
        "{res:?}"
    );
    assert!(res
        .iter()
        .any(|(k, v)| k == "service.name" && v == "tsl3-test"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_arrive_over_grpc() {
    let sink = Sink::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(sink.clone()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    let handle = tokio::spawn(server);
    let p = emit(OtlpTarget {
        endpoint: format!("http://{addr}"),
        protocol: OtlpProtocol::Grpc,
    });
    tokio::task::spawn_blocking(move || {
        p.force_flush().unwrap();
        p.shutdown().unwrap();
    })
    .await
    .unwrap();
    check_tree(&sink.0.lock().unwrap());
    handle.abort();
}

#[actix_web::test]
async fn spans_arrive_over_http() {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let got: Arc<Mutex<Vec<ExportTraceServiceRequest>>> = Arc::default();
    let g2 = got.clone();
    let server = HttpServer::new(move || {
        let g = g2.clone();
        App::new().route(
            "/v1/traces",
            web::post().to(move |body: web::Bytes| {
                let g = g.clone();
                async move {
                    match ExportTraceServiceRequest::decode(body) {
                        Ok(r) => {
                            g.lock().unwrap().push(r);
                            HttpResponse::Ok()
                                .content_type("application/x-protobuf")
                                .body(
                                    ExportTraceServiceResponse {
                                        partial_success: None,
                                    }
                                    .encode_to_vec(),
                                )
                        }
                        Err(_) => HttpResponse::BadRequest().finish(),
                    }
                }
            }),
        )
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    let running = server.run();
    let handle = running.handle();
    actix_web::rt::spawn(running);
    let target = OtlpTarget {
        endpoint: format!("http://{addr}"),
        protocol: OtlpProtocol::Http,
    };
    // The exporter runs on its own tokio runtime thread; the actix system keeps serving.
    actix_web::rt::task::spawn_blocking(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let p = emit(target);
            tokio::task::spawn_blocking(move || {
                p.force_flush().unwrap();
                p.shutdown().unwrap();
            })
            .await
            .unwrap();
        });
    })
    .await
    .unwrap();
    check_tree(&got.lock().unwrap());
    handle.stop(true).await;
}
