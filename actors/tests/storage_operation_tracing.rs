//! Storage-operation tracing through a RankEngine: a capturing subscriber layer records
//! every span (name, parent, fields) and event, and the tests check the lifecycle tree
//! request → storage_operation → l3_op → l3_backend_call, the agreement and the ending,
//! and that no attribute carries an object key. In its own test binary: tracing's
//! per-callsite interest cache races with scoped subscribers when unrelated tests run in
//! parallel.

use actors::clock::SystemClock;
use actors::engine::factory::{build_rank, RankSpec};
use actors::engine::{agree_single, RankEngine};
use actors::l3::store::memory::MemoryStore;
use actors::l3::store::Store;
use actors::scheduler::RequestEvent;
use messages::RequestId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

#[derive(Clone, Debug, Default)]
struct Captured {
    name: String,
    parent: Option<usize>,
    fields: BTreeMap<String, String>,
    events: Vec<BTreeMap<String, String>>,
}

/// Spans indexed by creation order (registry ids are reused; this index is not).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().to_string(), format!("{v:?}"));
    }
    fn record_str(&mut self, f: &Field, v: &str) {
        self.0.insert(f.name().to_string(), v.to_string());
    }
}

impl<S> Layer<S> for Capture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Index>().map(|i| i.0));
        let mut c = Captured {
            name: attrs.metadata().name().to_string(),
            parent,
            ..Captured::default()
        };
        attrs.record(&mut Fields(&mut c.fields));
        let mut all = self.0.lock().unwrap();
        span.extensions_mut().insert(Index(all.len()));
        all.push(c);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(i) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        values.record(&mut Fields(&mut self.0.lock().unwrap()[i].fields));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.event_span(event) else {
            return;
        };
        let Some(i) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        let mut f = BTreeMap::new();
        event.record(&mut Fields(&mut f));
        self.0.lock().unwrap()[i].events.push(f);
    }
}

fn spec() -> RankSpec {
    RankSpec::small(true)
}

fn engine(store: Arc<MemoryStore>) -> RankEngine {
    build_rank(&spec(), SystemClock::shared(), move |_| {
        let s: Arc<dyn Store> = store;
        Ok(s)
    })
    .unwrap()
}

/// Serves one request to completion, then rounds until storage is idle.
fn serve(e: &mut RankEngine, id: u64, prompt: &[u32]) {
    let mut done = false;
    let mut first = Some((RequestId(id), prompt.to_vec(), 2));
    for _ in 0..20_000 {
        let agreed =
            agree_single(e.head_now(), first.take().into_iter().collect(), vec![]).unwrap();
        e.run_round_now(agreed).unwrap();
        for ev in e.drain_events() {
            match ev {
                RequestEvent::Finished { id: r, .. } if r.0 == id => done = true,
                RequestEvent::Aborted(r, why) if r.0 == id => panic!("aborted: {why}"),
                _ => {}
            }
        }
        let idle = e.stm().is_none_or(|s| {
            s.stats().outstanding_tickets == 0 && s.stats().queued_backup_candidates == 0
        });
        if done && idle {
            return;
        }
        std::thread::yield_now();
    }
    panic!("request {id} never finished");
}

fn prompt(n: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 31 + 11) % 997).collect()
}

struct Tree(Vec<Captured>);

impl Tree {
    fn named(&self, name: &str) -> Vec<(usize, &Captured)> {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, c)| c.name == name)
            .collect()
    }
    fn children(&self, parent: usize, name: &str) -> Vec<(usize, &Captured)> {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, c)| c.parent == Some(parent) && c.name == name)
            .collect()
    }
    fn ops(&self, kind: &str) -> Vec<(usize, &Captured)> {
        self.named("storage_operation")
            .into_iter()
            .filter(|(_, c)| c.fields.get("kind").map(String::as_str) == Some(kind))
            .collect()
    }
    /// The op's l3_op child carries a backend call and the executor's lifecycle events.
    fn check_executor_child(&self, op: usize) {
        let l3 = self.children(op, "l3_op");
        assert_eq!(l3.len(), 1, "one l3_op under the storage_operation");
        let (l3i, l3c) = l3[0];
        assert!(
            !self.children(l3i, "l3_backend_call").is_empty(),
            "the backend call is a child of l3_op"
        );
        let msgs: Vec<&str> = l3c
            .events
            .iter()
            .filter_map(|e| e.get("message").map(String::as_str))
            .collect();
        assert!(msgs.contains(&"completed"), "{msgs:?}");
        assert_eq!(
            self.0[op].fields.get("op_id"),
            l3c.fields.get("op"),
            "the executor's span names the same operation"
        );
    }
    fn ending(&self, op: usize) -> String {
        let c = &self.0[op];
        let agreements = self.children(op, "agreement");
        assert_eq!(agreements.len(), 1, "one agreement per operation");
        let ending = c.fields.get("ending").cloned().expect("an ending recorded");
        assert_eq!(
            self.children(op, &ending).len(),
            1,
            "the ending is a child span"
        );
        assert!(c.fields.contains_key("outcome"));
        ending
    }
}

#[test]
fn a_read_and_a_backup_trace_their_storage_lifecycle() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let store = Arc::new(MemoryStore::new());
    let p = prompt(41);
    tracing::subscriber::with_default(subscriber, || {
        // The writer misses (QUERY) and backs its blocks up (PUT).
        let mut writer = engine(store.clone());
        serve(&mut writer, 1, &p);
        writer.close_now();
        // A fresh reader restores the prefix: QUERY → GET → publish.
        let mut reader = engine(store.clone());
        serve(&mut reader, 2, &p);
        assert_eq!(reader.scheduler().stats().prefix_l3, 40);
        reader.close_now();
    });
    let tree = Tree(capture.0.lock().unwrap().clone());

    let requests = tree.named("request");
    assert_eq!(requests.len(), 2, "one span per request");
    let (writer_req, reader_req) = (requests[0].0, requests[1].0);
    assert_eq!(tree.0[writer_req].fields["outcome"], "finished");

    // Reads are children of their request's span.
    let queries = tree.ops("query");
    assert_eq!(queries.len(), 2);
    assert_eq!(queries[0].1.parent, Some(writer_req));
    assert_eq!(queries[1].1.parent, Some(reader_req));
    for (i, q) in &queries {
        tree.check_executor_child(*i);
        assert_eq!(q.fields["rank"], "0");
        assert_eq!(q.fields["keys"], "10", "ten aligned blocks are queried");
    }
    assert_eq!(tree.0[queries[0].0].fields["outcome"], "none", "a miss");
    assert_eq!(
        tree.ending(queries[0].0),
        "publish",
        "the mask reached the request"
    );
    assert_eq!(tree.0[queries[1].0].fields["outcome"], "ok");
    assert_eq!(tree.ending(queries[1].0), "publish");

    let gets = tree.ops("get");
    assert_eq!(gets.len(), 1, "only the reader reads");
    let (get, g) = gets[0];
    assert_eq!(g.parent, Some(reader_req));
    tree.check_executor_child(get);
    assert_eq!(g.fields["outcome"], "ok");
    assert_eq!(tree.ending(get), "publish");
    let publish = tree.children(get, "publish");
    assert_eq!(publish[0].1.fields["rows"], "10");
    let agreement = tree.children(get, "agreement");
    assert_eq!(agreement[0].1.fields["success"], "10");
    assert_eq!(agreement[0].1.fields["retired"], "true");
    assert_ne!(g.fields["bytes"], "0", "a GET carries its payload bytes");

    // Backups are root spans.
    let puts = tree.ops("put");
    assert!(!puts.is_empty(), "the writer backed up");
    for (i, put) in &puts {
        assert_eq!(put.parent, None, "a backup is a root span");
        tree.check_executor_child(*i);
        assert_eq!(tree.ending(*i), "publish");
        assert_ne!(put.fields["bytes"], "0");
    }

    // No attribute or event field carries an object key.
    for c in &tree.0 {
        for v in c
            .fields
            .values()
            .chain(c.events.iter().flat_map(|e| e.values()))
        {
            assert!(!v.contains("tsl3-"), "{} carries a key: {v}", c.name);
        }
    }
}

#[test]
fn a_detached_read_ends_with_detach() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let store = Arc::new(MemoryStore::new());
    tracing::subscriber::with_default(subscriber, || {
        let mut e = engine(store.clone());
        // The request arrives and is cancelled in the round its QUERY completes.
        let agreed =
            agree_single(e.head_now(), vec![(RequestId(5), prompt(30), 2)], vec![]).unwrap();
        e.run_round_now(agreed).unwrap();
        let mut cancelled = false;
        for _ in 0..20_000 {
            let report = e.head_now();
            let cancel = if !cancelled && !report.completions.is_empty() {
                cancelled = true;
                vec![RequestId(5)]
            } else {
                vec![]
            };
            let agreed = agree_single(report, vec![], cancel).unwrap();
            e.run_round_now(agreed).unwrap();
            e.drain_events();
            let idle = e.stm().is_none_or(|s| s.stats().outstanding_tickets == 0);
            if cancelled && idle {
                break;
            }
            std::thread::yield_now();
        }
        assert!(cancelled);
        e.close_now();
    });
    let tree = Tree(capture.0.lock().unwrap().clone());
    let queries = tree.ops("query");
    assert_eq!(queries.len(), 1);
    assert_eq!(tree.ending(queries[0].0), "detach");
    let req = tree.named("request");
    assert_eq!(req[0].1.fields["outcome"], "aborted");
}
