//! OTLP export proven offline: spans emitted through the engine host's telemetry setup arrive
//! at an in-test OTLP receiver, over gRPC (tonic TraceService) and over HTTP (protobuf at
//! /v1/traces), with the expected parent/child tree, resource and attributes.

mod common;

use common::otlp::{grpc_receiver, http_receiver};
use engine_host::telemetry::{otel_layer, provider, OtlpProtocol, OtlpTarget};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tracing_subscriber::layer::SubscriberExt;

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

/// Emits the tree towards `target` on a runtime of its own, then flushes and shuts down.
fn emit_and_flush(rt: &tokio::runtime::Runtime, target: OtlpTarget) {
    rt.block_on(async move {
        let p = emit(target);
        tokio::task::spawn_blocking(move || {
            p.force_flush().unwrap();
            p.shutdown().unwrap();
        })
        .await
        .unwrap();
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn spans_arrive_over_grpc() {
    let rt = runtime();
    let (endpoint, got) = grpc_receiver(&rt);
    emit_and_flush(
        &rt,
        OtlpTarget {
            endpoint,
            protocol: OtlpProtocol::Grpc,
        },
    );
    check_tree(&got.lock().unwrap());
}

#[test]
fn spans_arrive_over_http() {
    let (endpoint, got, handle) = http_receiver();
    let rt = runtime();
    emit_and_flush(
        &rt,
        OtlpTarget {
            endpoint,
            protocol: OtlpProtocol::Http,
        },
    );
    check_tree(&got.lock().unwrap());
    rt.block_on(handle.stop(true));
}
