//! Storage-operation traces from a real `engine-host serve` process arrive at an in-test
//! OTLP receiver (gRPC TraceService, and protobuf over HTTP at /v1/traces): completions sent
//! over HTTP produce request → storage_operation (QUERY, GET) → l3_op → l3_backend_call
//! trees with their agreement and ending, backups are root storage_operation spans, and no
//! attribute carries an object key. SIGTERM ends the process; the telemetry guard flushes
//! the exporter before it exits.

mod common;

use common::otlp::{grpc_receiver, http_receiver};
use common::Host;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

fn prompt(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 13 + salt * 101) % 997).collect()
}

fn value(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.clone()) {
        Some(Value::StringValue(s)) => s,
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

struct Spans(Vec<Span>);

impl Spans {
    fn from(reqs: &[ExportTraceServiceRequest]) -> Spans {
        Spans(
            reqs.iter()
                .flat_map(|r| &r.resource_spans)
                .flat_map(|rs| &rs.scope_spans)
                .flat_map(|ss| ss.spans.clone())
                .collect(),
        )
    }
    fn attr(s: &Span, key: &str) -> Option<String> {
        s.attributes
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| value(&kv.value))
    }
    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Span> + 'a {
        self.0.iter().filter(move |s| s.name == name)
    }
    fn ops<'a>(&'a self, kind: &'a str) -> Vec<&'a Span> {
        self.named("storage_operation")
            .filter(|s| Self::attr(s, "kind").as_deref() == Some(kind))
            .collect()
    }
    fn children<'a>(&'a self, parent: &'a Span, name: &'a str) -> Vec<&'a Span> {
        self.0
            .iter()
            .filter(|s| s.name == name && s.parent_span_id == parent.span_id)
            .filter(|s| s.trace_id == parent.trace_id)
            .collect()
    }
    fn parent_of(&self, s: &Span) -> Option<&Span> {
        self.0
            .iter()
            .find(|p| p.span_id == s.parent_span_id && p.trace_id == s.trace_id)
    }
    /// storage_operation → l3_op → l3_backend_call, with the attributes the seed names.
    fn check_operation(&self, op: &Span) {
        for key in ["op_id", "kind", "keys", "bytes", "rank"] {
            assert!(Self::attr(op, key).is_some(), "{key} missing on {op:?}");
        }
        assert_eq!(Self::attr(op, "rank").as_deref(), Some("0"));
        let l3 = self.children(op, "l3_op");
        assert_eq!(l3.len(), 1, "one l3_op child");
        assert_eq!(Self::attr(l3[0], "op"), Self::attr(op, "op_id"));
        assert!(
            !self.children(l3[0], "l3_backend_call").is_empty(),
            "the backend call is a child of l3_op"
        );
    }
    /// The agreement and the ending (a child span named as the `ending` attribute).
    fn ending(&self, op: &Span) -> String {
        assert_eq!(self.children(op, "agreement").len(), 1);
        let end = Self::attr(op, "ending").expect("an ending");
        assert_eq!(self.children(op, &end).len(), 1, "{end} child");
        assert!(Self::attr(op, "outcome").is_some());
        end
    }
    fn no_keys(&self) {
        for s in &self.0 {
            // thread.name is the exporter's own attribute (the round loop's "tsl3-rounds").
            for kv in s.attributes.iter().filter(|kv| kv.key != "thread.name") {
                let v = value(&kv.value);
                assert!(
                    !v.contains("tsl3-"),
                    "{}.{} carries a key: {v}",
                    s.name,
                    kv.key
                );
            }
            for e in &s.events {
                for kv in &e.attributes {
                    let v = value(&kv.value);
                    assert!(!v.contains("tsl3-"), "{} event carries a key: {v}", s.name);
                }
            }
        }
    }
}

#[test]
fn a_restored_read_and_its_backups_are_traced_over_grpc() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (endpoint, got) = grpc_receiver(&rt);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("store");
    let d = d.to_str().unwrap();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("RUST_LOG", "info"),
    ];
    let p = prompt(64, 4);
    // The writer misses and backs its blocks up.
    let writer = Host::start_logged(
        &["serve", "--store", "local", "--store-dir", d],
        &env,
        &dir.path().join("writer.log"),
    );
    assert_eq!(writer.complete(&p, 2)["tsl3"]["fallback_reason"], "miss");
    writer.wait_backups_settled();
    assert!(writer.stop().success());
    // A fresh reader restores the prefix from L3: QUERY → GET → publish.
    let reader = Host::start_logged(
        &["serve", "--store", "local", "--store-dir", d],
        &env,
        &dir.path().join("reader.log"),
    );
    assert_eq!(reader.complete(&p, 2)["tsl3"]["l3"], 60);
    assert!(reader.stop().success());

    let spans = Spans::from(&got.lock().unwrap());
    spans.no_keys();
    let gets = spans.ops("get");
    assert_eq!(gets.len(), 1, "the reader's one GET");
    let get = gets[0];
    spans.check_operation(get);
    assert_eq!(spans.ending(get), "publish");
    assert_eq!(Spans::attr(get, "outcome").as_deref(), Some("ok"));
    let request = spans.parent_of(get).expect("the GET's parent arrived");
    assert_eq!(request.name, "request", "a read is a child of its request");
    assert_eq!(Spans::attr(request, "outcome").as_deref(), Some("finished"));
    // The reader's QUERY shares the request's trace; the writer's QUERY missed.
    let queries = spans.ops("query");
    assert_eq!(queries.len(), 2, "one QUERY per process");
    for q in &queries {
        spans.check_operation(q);
        assert_eq!(spans.ending(q), "publish", "the mask reached its request");
        assert_eq!(spans.parent_of(q).map(|r| r.name.as_str()), Some("request"));
    }
    // The reader's QUERY (16 keys) finds the 15 blocks its GET restores (60 tokens).
    let found = queries
        .iter()
        .find(|q| q.parent_span_id == request.span_id)
        .expect("the reader's QUERY is under its request");
    assert_eq!(Spans::attr(found, "keys").as_deref(), Some("16"));
    assert_eq!(Spans::attr(found, "outcome").as_deref(), Some("partial"));
    let agreed = spans.children(found, "agreement");
    assert_eq!(Spans::attr(agreed[0], "success").as_deref(), Some("15"));
    let published = spans.children(get, "publish");
    assert_eq!(Spans::attr(published[0], "rows").as_deref(), Some("15"));
    assert!(queries
        .iter()
        .any(|q| Spans::attr(q, "outcome").as_deref() == Some("none")));
    // Backups are root spans with the executor's lifecycle beneath.
    let puts = spans.ops("put");
    assert!(!puts.is_empty(), "the writer's backups were traced");
    for put in &puts {
        assert!(put.parent_span_id.is_empty(), "a backup is a root span");
        spans.check_operation(put);
    }
    let settled: Vec<_> = puts
        .iter()
        .filter(|p| Spans::attr(p, "ending").is_some())
        .collect();
    assert!(!settled.is_empty(), "the settled backups were agreed");
    for p in settled {
        assert_eq!(spans.ending(p), "publish", "a settled backup published");
    }
}

#[test]
fn a_memory_store_host_exports_over_http() {
    let (endpoint, got, handle) = http_receiver();
    let dir = tempfile::tempdir().unwrap();
    let host = Host::start_logged(
        &["serve", "--store", "memory"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("TSL3_TELEMETRY__OTLP_PROTOCOL", "http"),
        ],
        &dir.path().join("host.log"),
    );
    assert_eq!(
        host.complete(&prompt(40, 6), 2)["tsl3"]["fallback_reason"],
        "miss"
    );
    host.wait_backups_settled();
    assert!(host.stop().success());
    let spans = Spans::from(&got.lock().unwrap());
    actix_web::rt::System::new().block_on(handle.stop(true));
    spans.no_keys();
    let queries = spans.ops("query");
    assert_eq!(queries.len(), 1);
    spans.check_operation(queries[0]);
    assert_eq!(spans.ending(queries[0]), "publish");
    assert_eq!(Spans::attr(queries[0], "outcome").as_deref(), Some("none"));
    let request = spans
        .parent_of(queries[0])
        .expect("the request span arrived");
    assert_eq!(request.name, "request");
    assert!(spans.ops("get").is_empty(), "a miss reads nothing");
    let puts = spans.ops("put");
    assert!(!puts.is_empty());
    for put in &puts {
        assert!(put.parent_span_id.is_empty());
        spans.check_operation(put);
    }
    let settled: Vec<_> = puts
        .iter()
        .filter(|p| Spans::attr(p, "ending").is_some())
        .collect();
    assert!(!settled.is_empty(), "the settled backups were agreed");
    for p in settled {
        assert_eq!(spans.ending(p), "publish");
    }
}
