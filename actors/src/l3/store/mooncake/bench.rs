//! `engine-host bench mooncake`: GET and PUT throughput of N objects, one batch each,
//! through three clients against the same master in the same run: the L3 executor over
//! MooncakeStore (the engine host's path: a registered Host allocation, one job per batch,
//! timed from submit until its completion is observed), MooncakeStore called directly, and
//! Mooncake's own Python client (`MooncakeDistributedStore` of the master's venv), with the
//! ratios to Python. It owns only the measurement; it never runs in tests' timing
//! assertions (figures are reported, not checked) and never touches another namespace than
//! the fresh ones it creates and removes.

use super::MooncakeStore;
use crate::clock::SystemClock;
use crate::host::HostCacheStorage;
use crate::l3::executor::{L3Executor, Submitted};
use crate::l3::store::{KeyResult, Store};
use messages::settings::{MooncakeStoreSettings, StorageRuntimeConfig};
use messages::{
    HostRange, Namespace, OperationId, StorageDone, StorageGetOp, StorageKey, StorageOp,
    StoragePutOp,
};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Throughput of one client, in GiB/s.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientFigures {
    pub client: &'static str,
    pub put_gib_s: f64,
    pub get_gib_s: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MooncakeBenchReport {
    pub objects: usize,
    pub object_bytes: usize,
    pub rounds: usize,
    /// Through the L3 executor over MooncakeStore (Host buffer registered).
    pub executor: ClientFigures,
    /// MooncakeStore called directly.
    pub tsl3: ClientFigures,
    pub python: ClientFigures,
}

impl MooncakeBenchReport {
    /// tsl3 / Python for PUT and GET (1.0: the same throughput).
    pub fn ratios(&self) -> (f64, f64) {
        (
            self.tsl3.put_gib_s / self.python.put_gib_s,
            self.tsl3.get_gib_s / self.python.get_gib_s,
        )
    }

    /// executor / Python for PUT and GET.
    pub fn executor_ratios(&self) -> (f64, f64) {
        (
            self.executor.put_gib_s / self.python.put_gib_s,
            self.executor.get_gib_s / self.python.get_gib_s,
        )
    }

    pub fn render(&self) -> String {
        let (put, get) = self.ratios();
        let (eput, eget) = self.executor_ratios();
        format!(
            "mooncake bench: {} x {} KiB, one batch each, same master, median of {} rounds\n\
             {:<8} PUT {:>7.3} GiB/s  GET {:>7.3} GiB/s\n\
             {:<8} PUT {:>7.3} GiB/s  GET {:>7.3} GiB/s\n\
             {:<8} PUT {:>7.3} GiB/s  GET {:>7.3} GiB/s\n\
             ratio executor/python: PUT {:.2}  GET {:.2}\n\
             ratio tsl3/python: PUT {:.2}  GET {:.2}",
            self.objects,
            self.object_bytes / 1024,
            self.rounds,
            self.executor.client,
            self.executor.put_gib_s,
            self.executor.get_gib_s,
            self.tsl3.client,
            self.tsl3.put_gib_s,
            self.tsl3.get_gib_s,
            self.python.client,
            self.python.put_gib_s,
            self.python.get_gib_s,
            eput,
            eget,
            put,
            get
        )
    }
}

fn gib_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / secs.max(1e-9)
}

fn fresh_namespace(client: &str) -> Namespace {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    Namespace(format!("tsl3bench-{client}-{}-{nanos:x}", std::process::id()).into())
}

/// Runs the three clients, each after an untimed one-object warm-up. `python` is the
/// interpreter of the master's venv (deploy/mooncake/env.sh exports it as
/// $MOONCAKE_PYTHON). The clients alternate for `rounds` rounds (each on a fresh
/// namespace) and each figure is the median of its rounds, which tames a shared machine's
/// noise.
pub fn bench_mooncake(
    settings: &MooncakeStoreSettings,
    python: &str,
    objects: usize,
    object_bytes: usize,
    rounds: usize,
) -> Result<MooncakeBenchReport, String> {
    if objects == 0 || object_bytes == 0 || rounds == 0 {
        return Err("objects, object_bytes and rounds must be greater than 0".into());
    }
    let mut executor = Vec::with_capacity(rounds);
    let mut ours = Vec::with_capacity(rounds);
    let mut theirs = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        executor.push(bench_executor(settings, objects, object_bytes)?);
        ours.push(bench_tsl3(settings, objects, object_bytes)?);
        theirs.push(bench_python(settings, python, objects, object_bytes)?);
    }
    Ok(MooncakeBenchReport {
        objects,
        object_bytes,
        rounds,
        executor: median(&executor),
        tsl3: median(&ours),
        python: median(&theirs),
    })
}

/// Per-figure median (the upper one for an even count).
fn median(runs: &[ClientFigures]) -> ClientFigures {
    let pick = |f: fn(&ClientFigures) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    ClientFigures {
        client: runs[0].client,
        put_gib_s: pick(|r| r.put_gib_s),
        get_gib_s: pick(|r| r.get_gib_s),
    }
}

fn bench_tsl3(
    settings: &MooncakeStoreSettings,
    objects: usize,
    object_bytes: usize,
) -> Result<ClientFigures, String> {
    let store = MooncakeStore::connect(settings).map_err(|e| e.to_string())?;
    let total = objects * object_bytes;
    let sources: Vec<Vec<u8>> = (0..objects)
        .map(|i| (0..object_bytes).map(|b| ((i + b) % 251) as u8).collect())
        .collect();
    let mut landed: Vec<Vec<u8>> = vec![vec![0u8; object_bytes]; objects];
    let ns = fresh_namespace("tsl3");
    let keys: Vec<StorageKey> = (0..objects as u32)
        .map(|p| ns.key(0xbe4c, 0, p, 0))
        .collect();
    let srcs: Vec<&[u8]> = sources.iter().map(|s| s.as_slice()).collect();
    // Warm-up (untimed): the first transfer opens the connections to the owner.
    let warm = ns.key(0xbe4c, 1, 0, 0);
    store
        .put(std::slice::from_ref(&warm), &srcs[..1])
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let put = store.put(&keys, &srcs).map_err(|e| e.to_string())?;
    let put_s = t.elapsed().as_secs_f64();
    if let Some(bad) = put.iter().find(|r| !matches!(r, KeyResult::Ok { .. })) {
        return Err(format!("tsl3 PUT row failed: {bad:?}"));
    }
    let mut dests: Vec<&mut [u8]> = landed.iter_mut().map(|d| d.as_mut_slice()).collect();
    let t = Instant::now();
    let got = store.get(&keys, &mut dests).map_err(|e| e.to_string())?;
    let get_s = t.elapsed().as_secs_f64();
    if let Some(bad) = got.iter().find(|r| {
        **r != KeyResult::Ok {
            bytes: object_bytes as u64,
        }
    }) {
        return Err(format!("tsl3 GET row failed: {bad:?}"));
    }
    if landed != sources {
        return Err("tsl3 GET bytes differ from the PUT bytes".into());
    }
    let _ = store.remove_namespace(&ns);
    let _ = store.close();
    Ok(ClientFigures {
        client: "tsl3",
        put_gib_s: gib_s(total, put_s),
        get_gib_s: gib_s(total, get_s),
    })
}

/// Submits one job and waits (bounded) until its completion is observed; it must have
/// fully succeeded.
fn settle(exec: &L3Executor, op: StorageOp) -> Result<StorageDone, String> {
    let id = op.id();
    match exec.submit(op) {
        Submitted::Queued => {}
        other => return Err(format!("executor did not queue {id}: {other:?}")),
    }
    if !exec.wait_undelivered(1, Duration::from_secs(300)) {
        return Err(format!("executor job {id} did not settle"));
    }
    let (done, _) = exec.poll();
    let d = done
        .into_iter()
        .find(|d| d.op == id)
        .ok_or_else(|| format!("no completion of {id}"))?;
    if !d.fully_succeeded() {
        return Err(format!(
            "executor job {id} failed: error {:?}, rejection {:?}, failures {:?}",
            d.error,
            d.rejection,
            d.failures.iter().flatten().next()
        ));
    }
    Ok(d)
}

/// The engine host's path: one PUT job and one GET job of `objects` keys each through the
/// L3 executor over MooncakeStore, from and into a registered Host allocation.
fn bench_executor(
    settings: &MooncakeStoreSettings,
    objects: usize,
    object_bytes: usize,
) -> Result<ClientFigures, String> {
    let total = objects * object_bytes;
    let ob = object_bytes as u64;
    let host = HostCacheStorage::new(2 * total as u64).map_err(|e| e.to_string())?;
    for i in 0..objects {
        let fill: Vec<u8> = (0..object_bytes).map(|b| ((i + b) % 251) as u8).collect();
        host.write(i as u64 * ob, &fill)
            .map_err(|e| e.to_string())?;
    }
    let store = MooncakeStore::connect(settings).map_err(|e| e.to_string())?;
    store.register_host(&host).map_err(|e| e.to_string())?;
    let store: Arc<dyn Store> = Arc::new(store);
    let runtime = StorageRuntimeConfig {
        query_workers: 1,
        get_workers: 1,
        put_workers: 1,
        query_queue_capacity: 2,
        get_queue_capacity: 2,
        put_queue_capacity: 2,
        outstanding_limit: 8,
        health_cooldown_ms: 1000,
        close_deadline_ms: 30_000,
    };
    let exec = L3Executor::start(store.clone(), host.clone(), runtime, SystemClock::shared())
        .map_err(|e| e.to_string())?;
    let ns = fresh_namespace("executor");
    let keys: Vec<StorageKey> = (0..objects as u32)
        .map(|p| ns.key(0xbe4c, 0, p, 0))
        .collect();
    let sources: Vec<HostRange> = (0..objects as u64)
        .map(|i| HostRange::new(i * ob, ob))
        .collect();
    let destinations: Vec<HostRange> = (0..objects as u64)
        .map(|i| HostRange::new(total as u64 + i * ob, ob))
        .collect();
    // Warm-up (untimed): the first transfer opens the connections to the owner.
    settle(
        &exec,
        StorageOp::Put(StoragePutOp {
            op: OperationId(1),
            keys: vec![ns.key(0xbe4c, 1, 0, 0)],
            sources: sources[..1].to_vec(),
        }),
    )?;
    let t = Instant::now();
    let put = settle(
        &exec,
        StorageOp::Put(StoragePutOp {
            op: OperationId(2),
            keys: keys.clone(),
            sources,
        }),
    )?;
    let put_s = t.elapsed().as_secs_f64();
    if put.new_writes as usize != objects {
        return Err(format!(
            "executor PUT wrote {} new objects of {objects}",
            put.new_writes
        ));
    }
    let t = Instant::now();
    let got = settle(
        &exec,
        StorageOp::Get(StorageGetOp {
            op: OperationId(3),
            request: None,
            keys,
            destinations,
        }),
    )?;
    let get_s = t.elapsed().as_secs_f64();
    if got.bytes.iter().any(|b| *b != ob) {
        return Err("executor GET rows read short".into());
    }
    let sent = host
        .read(HostRange::new(0, total as u64))
        .map_err(|e| e.to_string())?;
    let landed = host
        .read(HostRange::new(total as u64, total as u64))
        .map_err(|e| e.to_string())?;
    if sent != landed {
        return Err("executor GET bytes differ from the PUT bytes".into());
    }
    let _ = store.remove_namespace(&ns);
    let report = exec.close();
    if report.restart_required {
        return Err("executor close required a restart".into());
    }
    Ok(ClientFigures {
        client: "executor",
        put_gib_s: gib_s(total, put_s),
        get_gib_s: gib_s(total, get_s),
    })
}

/// The same batches through `mooncake.store.MooncakeDistributedStore`; prints
/// "<put seconds> <get seconds>".
const PYTHON_BENCH: &str = r#"
import ctypes, sys, time
from mooncake.store import MooncakeDistributedStore
master, metadata, ns, n, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
s = MooncakeDistributedStore()
rc = s.setup("127.0.0.1", metadata, 0, 0, "tcp", "", master)
if rc != 0:
    sys.exit("setup returned %d" % rc)
total = n * size
src = (ctypes.c_ubyte * total).from_buffer(bytearray(bytes(i % 251 for i in range(251)) * (total // 251 + 1))[:total])
dst = (ctypes.c_ubyte * total)()
for buf in (src, dst):
    if s.register_buffer(ctypes.addressof(buf), total) != 0:
        sys.exit("register_buffer failed")
keys = ["%s-%032x-g0-p%d-s0" % (ns, 0xbe4c, i) for i in range(n)]
sp = [ctypes.addressof(src) + i * size for i in range(n)]
dp = [ctypes.addressof(dst) + i * size for i in range(n)]
sizes = [size] * n
s.batch_put_from(["%s-%032x-g1-p0-s0" % (ns, 0xbe4c)], sp[:1], sizes[:1])  # warm-up, untimed
t = time.perf_counter(); r = s.batch_put_from(keys, sp, sizes); put = time.perf_counter() - t
if any(x != 0 for x in r):
    sys.exit("put rows failed: %r" % sorted(set(r)))
t = time.perf_counter(); r = s.batch_get_into(keys, dp, sizes); get = time.perf_counter() - t
if any(x != size for x in r):
    sys.exit("get rows failed: %r" % sorted(set(r)))
if bytes(dst) != bytes(src):
    sys.exit("get bytes differ")
s.remove_by_regex("^" + ns.replace(".", "\\.") + "-", True)
print(put, get)
"#;

fn bench_python(
    settings: &MooncakeStoreSettings,
    python: &str,
    objects: usize,
    object_bytes: usize,
) -> Result<ClientFigures, String> {
    let ns = fresh_namespace("python");
    let out = Command::new(python)
        .arg("-c")
        .arg(PYTHON_BENCH)
        .arg(&settings.master_server_addr)
        .arg(&settings.metadata_server)
        .arg(&*ns.0)
        .arg(objects.to_string())
        .arg(object_bytes.to_string())
        .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(format!(
            "python bench failed ({}): {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    let secs: Vec<f64> = stdout
        .split_whitespace()
        .rev()
        .take(2)
        .filter_map(|s| s.parse().ok())
        .collect();
    let [get_s, put_s] = secs[..] else {
        return Err(format!("python bench printed {stdout:?}"));
    };
    let total = objects * object_bytes;
    Ok(ClientFigures {
        client: "python",
        put_gib_s: gib_s(total, put_s),
        get_gib_s: gib_s(total, get_s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_ratios_and_rendering() {
        let r = MooncakeBenchReport {
            objects: 1000,
            object_bytes: 65536,
            rounds: 3,
            executor: ClientFigures {
                client: "executor",
                put_gib_s: 0.5,
                get_gib_s: 3.0,
            },
            tsl3: ClientFigures {
                client: "tsl3",
                put_gib_s: 1.0,
                get_gib_s: 1.5,
            },
            python: ClientFigures {
                client: "python",
                put_gib_s: 2.0,
                get_gib_s: 1.5,
            },
        };
        assert_eq!(r.ratios(), (0.5, 1.0));
        assert_eq!(r.executor_ratios(), (0.25, 2.0));
        let m = median(&[
            ClientFigures {
                client: "tsl3",
                put_gib_s: 3.0,
                get_gib_s: 1.0,
            },
            ClientFigures {
                client: "tsl3",
                put_gib_s: 1.0,
                get_gib_s: 9.0,
            },
            ClientFigures {
                client: "tsl3",
                put_gib_s: 2.0,
                get_gib_s: 5.0,
            },
        ]);
        assert_eq!((m.put_gib_s, m.get_gib_s), (2.0, 5.0));
        let text = r.render();
        assert!(text.contains("1000 x 64 KiB"), "{text}");
        assert!(
            text.contains("ratio tsl3/python: PUT 0.50  GET 1.00"),
            "{text}"
        );
        assert!(
            text.contains("ratio executor/python: PUT 0.25  GET 2.00"),
            "{text}"
        );
        assert!(text.contains("executor PUT   0.500 GiB/s"), "{text}");
    }

    #[test]
    fn empty_bench_is_rejected_before_connecting() {
        let s = MooncakeStoreSettings {
            library_path: "/nonexistent".into(),
            local_hostname: "127.0.0.1".into(),
            metadata_server: "P2PHANDSHAKE".into(),
            master_server_addr: "127.0.0.1:1".into(),
            protocol: "tcp".into(),
            device_name: String::new(),
            global_segment_size: 0,
            local_buffer_size: 0,
            tenant_id: "default".into(),
            dfs_dir: String::new(),
        };
        assert!(bench_mooncake(&s, "python3", 0, 1, 1).is_err());
        assert!(bench_mooncake(&s, "python3", 1, 1, 0).is_err());
    }
}
