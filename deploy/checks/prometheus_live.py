"""Every dashboard query against a real Prometheus scraping real engine hosts (issue 20).

Starts, all on loopback with temporary directories:
  - an `engine-host launch --tp 2` replica (ranks 0 and 1, /metrics on PORT and PORT+1),
  - a single `engine-host serve` host (its own embedded local store),
  - the Prometheus server binary (deploy/.prometheus/, from deploy/checks/setup.sh) with the
    configuration deploy/observability/gen-prometheus.sh generates for that launch, plus
    the single host's target, scraping every second.
Puts a short load on both (a miss, a Device hit, a Host hit after /admin/reset_local
{"host":false}, an L3 hit after /admin/reset_local, an unrelated prompt, and a prompt ending mid-block
followed by its one-token continuation, a tail), waits until
Prometheus has scraped it, then evaluates every query of dashboards/*.json through
/api/v1/query: each must succeed, each must return series, and each not in MAY_BE_ZERO must
have a non-zero sample. Every TP rank of the launch must be up and present in the
tp_rank-labelled series (the TP-rank variable) and in shard-local L3 I/O. Against the same
Prometheus, a self-test requires the judgement to fail an invalid query, an absent metric, a
zero and a NaN result, and the rank check to fail series of one rank. Stops everything it
started, on success, failure and signals.

Usage: prometheus_live.py ENGINE_HOST_BINARY   (deploy/checks/prometheus_live.sh runs it)
Exit 0 pass, 1 fail."""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import dashlib  # noqa: E402

ROOT = dashlib.ROOT
TOKEN = "prometheus-live-check"
SCRAPE_INTERVAL = "1s"

# Grafana's built-ins at evaluation time. The whole run is well under a minute, so windows
# of a few minutes hold every sample since the first scrape: a rate or increase of what the
# load did is non-zero however long the load took.
BUILTINS = {"__rate_interval": "2m", "__interval": "1s", "__range": "5m"}

# (dashboard file, panel title, refId) of the queries that may legitimately be zero (or, for
# ratios, NaN) right after this load: the check still requires each to be valid and to
# return series (every label combination is exported at zero from the start). Anything
# else must have a non-zero sample. A key that names no query is itself a failure, so this
# list cannot go stale.
MAY_BE_ZERO = {
    # Scrape health: every target is up, so no rank is "not scraped" (this one must be 0,
    # checked below).
    ("tsl3-serving.json", "Ranks not scraped", "A"),
    # Instantaneous gauges, back at zero once the load has drained.
    ("tsl3-l3.json", "Jobs queued and running", "A"),
    ("tsl3-l3.json", "Queued payload bytes", "A"),
    ("tsl3-l3.json", "Oldest job age", "A"),
    ("tsl3-l3.json", "Credits in use", "A"),
    ("tsl3-l3.json", "Ready holds and quarantine", "A"),
    ("tsl3-l3.json", "Promotions in flight and staging", "A"),
    ("tsl3-l3.json", "Promotions in flight and staging", "B"),
    # Health: Healthy is state 0, and no outage means epoch 0 and no unproven retirement;
    # quarantine panels show an outage this load does not cause.
    ("tsl3-l3.json", "Health state", "A"),
    ("tsl3-l3.json", "Health epoch", "A"),
    ("tsl3-l3.json", "Unproven retirement", "A"),
    ("tsl3-l3.json", "Ready holds and quarantine", "B"),
    # Faults and pressure this load does not cause: the read admission gate never closes,
    # no soft timeouts, Ready expirations, pressure bypasses, dropped backup keys or invalid
    # DFS objects.
    ("tsl3-l3.json", "Read admission gate closed", "A"),
    ("tsl3-l3.json", "Soft timeouts vs Ready expirations", "A"),
    ("tsl3-l3.json", "Soft timeouts vs Ready expirations", "B"),
    ("tsl3-l3.json", "Pressure bypasses", "A"),
    ("tsl3-l3.json", "Dropped backup keys by reason", "A"),
    ("tsl3-l3.json", "Invalid DFS objects by reason", "A"),
    ("tsl3-l3.json", "Invalid DFS objects by reason", "B"),
    # DFS -> MEMORY promotion needs an object in the DFS tier but not in MEMORY (another
    # host's backup, or a restarted one): each host here reads back what its own MEMORY tier
    # still holds.
    ("tsl3-l3.json", "Promotion funnel (time range)", "A"),
    ("tsl3-l3.json", "Promotion funnel (time range)", "B"),
    ("tsl3-l3.json", "Promotion funnel (time range)", "C"),
    ("tsl3-l3.json", "Promotion funnel (time range)", "D"),
    ("tsl3-l3.json", "Promotion funnel (time range)", "E"),
    ("tsl3-l3.json", "Promotion rates and failures by reason", "A"),
    ("tsl3-l3.json", "Promotion rates and failures by reason", "B"),
    ("tsl3-l3.json", "Promotion rates and failures by reason", "C"),
    ("tsl3-l3.json", "Promotion rates and failures by reason", "D"),
}


def free_port(consecutive: int = 1) -> int:
    """A loopback port p with p..p+consecutive-1 all free right now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + consecutive > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + consecutive):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no free loopback ports")


def http(method: str, url: str, body: dict | None = None, token: str | None = None,
         timeout: float = 30) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
        return 0, str(e)


class Check:
    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.work = pathlib.Path(tempfile.mkdtemp(prefix="tsl3-prom-live-"))
        self.procs: list[tuple[str, subprocess.Popen, object]] = []
        self.failures: list[str] = []

    # --- processes ---------------------------------------------------------------------
    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs.append((name, p, log))
        return p

    def stop_all(self) -> None:
        """SIGTERM each process we started (launch forwards it to its ranks), then SIGKILL
        the process group of any still running after 10 s. Only our own children's groups."""
        for _, p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name, p, log in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"     {name} ignored SIGTERM for 10 s: SIGKILL", file=sys.stderr)
            try:  # its group: a rank launch left behind
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
            log.close()

    def logs(self) -> None:
        for name, _, _ in self.procs:
            text = (self.work / f"{name}.log").read_text(errors="replace")
            print(f"---- {name}.log (last 40 lines)\n" + "\n".join(text.splitlines()[-40:]), file=sys.stderr)

    def alive(self) -> None:
        for name, p, _ in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited {p.returncode}")

    def wait_for(self, what: str, cond, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.alive()
            if cond():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")

    # --- Prometheus --------------------------------------------------------------------
    def query(self, expr: str) -> dict:
        url = f"{self.prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        code, body = http("GET", url)
        try:
            doc = json.loads(body)
        except json.JSONDecodeError:
            doc = {"status": "error", "error": f"HTTP {code}: {body[:200]}"}
        return doc

    def samples(self, expr: str) -> list[tuple[dict, float]]:
        doc = self.query(expr)
        if doc.get("status") != "success":
            raise RuntimeError(f"query failed: {expr}: {doc.get('error')}")
        res = doc["data"]
        if res["resultType"] == "scalar":
            return [({}, float(res["result"][1]))]
        return [(s["metric"], float(s["value"][1])) for s in res["result"]]

    # --- the check ---------------------------------------------------------------------
    def run(self) -> None:
        env = {
            "TSL3_MODEL__DEVICE": "emulated",
            "TSL3_MODEL__EMULATE_DEVICE_TIME": "false",
            "TSL3_SERVER__ADMIN_TOKEN": TOKEN,
            "RUST_LOG": "warn",
        }
        base = free_port(2)
        single = free_port()
        prom_port = free_port()
        self.launch_api = f"http://127.0.0.1:{base}"
        self.single_api = f"http://127.0.0.1:{single}"
        self.prom = f"http://127.0.0.1:{prom_port}"
        self.start("launch", [self.binary, "launch", "--tp", "2", "--store", "local", "--store-dir",
                              str(self.work / "l3-replica"), "--listen", f"127.0.0.1:{base}"], env)
        self.start("serve", [self.binary, "serve", "--store", "local", "--store-dir",
                             str(self.work / "l3-single"), "--listen", f"127.0.0.1:{single}"], env)

        # The configuration gen-prometheus.sh generates for this launch, scraping every
        # second, plus the single host as one more target of the same job.
        gen = subprocess.run(["bash", str(ROOT / "deploy/observability/gen-prometheus.sh"), "2", str(base),
                              "127.0.0.1"], check=True, capture_output=True, text=True).stdout
        if "scrape_interval: 5s" not in gen or f'- "127.0.0.1:{base + 1}"' not in gen:
            raise RuntimeError("gen-prometheus.sh output changed shape: update prometheus_live.py")
        config = gen.replace("scrape_interval: 5s", f"scrape_interval: {SCRAPE_INTERVAL}")
        config = config.rstrip("\n") + f'\n          - "127.0.0.1:{single}"\n'
        (self.work / "prometheus.yml").write_text(config)
        subprocess.run(["promtool", "check", "config", str(self.work / "prometheus.yml")], check=True,
                       capture_output=True)
        self.start("prometheus", [shutil.which("prometheus") or "prometheus",
                                  f"--config.file={self.work / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={self.work / 'tsdb'}",
                                  f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])

        targets = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}", f"127.0.0.1:{single}"]
        for t in targets:
            self.wait_for(f"{t}/health/ready", lambda t=t: http("GET", f"http://{t}/health/ready", timeout=2)[0] == 200, 60)
        self.wait_for("Prometheus ready", lambda: http("GET", f"{self.prom}/-/ready", timeout=2)[0] == 200, 30)
        # A scrape of every target before the load, so Prometheus sees the counters rise from
        # their zeros (a counter first seen at its final value has a rate of 0).
        def up_all() -> bool:
            try:
                return len(self.samples('up{job="tsl3-engine-host"} == 1')) == 3
            except RuntimeError:
                return False
        self.wait_for("a first scrape of every target", up_all, 30)

        for api in (self.launch_api, self.single_api):
            self.load(api)

        # Until Prometheus has scraped the load on every target (snapshots refresh at most
        # once a second): an L3 hit on both replicas, then two more scrapes for the rates.
        def scraped() -> bool:
            try:
                up = self.samples('up{job="tsl3-engine-host"} == 1')
                l3 = self.samples('sum by (replica) (tsl3_prefix_tokens_total{tier="l3"}) > 0')
                puts = self.samples('sum by (replica, tp_rank) (tsl3_l3_operations_total{kind="put", outcome="completed"}) > 0')
            except RuntimeError:
                return False
            return len(up) == 3 and len(l3) == 2 and len(puts) == 3
        self.wait_for("Prometheus to scrape the load on every target", scraped, 30)
        time.sleep(2.5)
        # Scrapes time out after the 1 s interval; on a loaded machine one may: evaluate
        # once the latest scrape of every target succeeded.
        self.wait_for("the latest scrape of every target to succeed", up_all, 15)

        self.check_ranks(base)
        self.check_queries()
        self.self_test(base)

    def load(self, api: str) -> None:
        def complete(prompt: list[int]) -> dict:
            code, body = http("POST", f"{api}/v1/completions", {"prompt": prompt, "max_tokens": 4})
            if code != 200:
                raise RuntimeError(f"{api}/v1/completions answered {code}: {body}")
            return json.loads(body)["tsl3"]

        def reset(body: str | None) -> None:
            code, text = http("POST", f"{api}/admin/reset_local", json.loads(body) if body else None, TOKEN)
            if code != 200:
                raise RuntimeError(f"{api}/admin/reset_local answered {code}: {text}")

        prompt = [(i * 7 + 3) % 1000 for i in range(64)]
        got = {"miss": complete(prompt)}
        got["device"] = complete(prompt)
        reset('{"host": false}')
        got["host"] = complete(prompt)
        reset(None)  # waits for the backups: L3 has the prefix
        got["l3"] = complete(prompt)
        complete(list(range(500, 540)))
        # A tail: a prompt ending mid-block, then the next turn one token longer reuses
        # that nonaligned end (the tail panels).
        turn = [(i * 11 + 5) % 1000 for i in range(66)]
        complete(turn)
        got["tail"] = complete(turn + [7])
        if got["tail"].get("device") != 66:
            self.failures.append(f"{api}: the next turn did not reuse the tail: {got['tail']}")
        for tier in ("device", "host", "l3"):
            if not got[tier].get(tier):
                self.failures.append(f"{api}: the {tier} pass reused no {tier} tokens: {got[tier]}")

    def rank_problem(self, expr: str) -> str | None:
        """None when the series of expr carry exactly TP ranks 0 and 1."""
        ranks = sorted({s.get("tp_rank") for s, _ in self.samples(expr)})
        return None if ranks == ["0", "1"] else f"TP ranks {ranks} of the launch replica, expected ['0', '1']"

    def check_ranks(self, base: int) -> None:
        up = {s["instance"]: v for s, v in self.samples('up{job="tsl3-engine-host"}')}
        for rank in (0, 1):
            inst = f"127.0.0.1:{base + rank}"
            if up.get(inst) != 1:
                self.failures.append(f"TP rank {rank} ({inst}) not up in Prometheus: up = {up}")
        # The launch replica's series, by the replica label its ranks derive (HOST:base).
        sel = f'replica=~".*:{base}"'
        for name, expr in [
            ("tsl3_rounds_total (the TP-rank variable)", f"tsl3_rounds_total{{{sel}}}"),
            ("shard-local L3 PUTs", f'tsl3_l3_operations_total{{{sel}, kind="put", outcome="completed"}} > 0'),
        ]:
            problem = self.rank_problem(expr)
            if problem:
                self.failures.append(f"{name}: {problem}")
        instances = sorted({s.get("instance") for s, _ in self.samples(f"tsl3_rounds_total{{{sel}}}")})
        if instances != sorted([f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]):
            self.failures.append(f"the launch replica's series come from {instances}")
        not_scraped = self.samples('count(up{job="tsl3-engine-host"} == 0) or vector(0)')
        if [v for _, v in not_scraped] != [0.0]:
            self.failures.append(f"'Ranks not scraped' is {not_scraped}, expected 0")

    def judge(self, expr: str, may_be_zero: bool) -> str | None:
        """Why a dashboard query fails under the load (None: it passes): an error, no
        series, or (unless it may be zero) no sample that is neither 0 nor NaN."""
        doc = self.query(expr)
        if doc.get("status") != "success":
            return f"error {doc.get('errorType')}: {doc.get('error')}"
        data = doc["data"]
        values = [float(s["value"][1]) for s in data["result"]] if data["resultType"] == "vector" \
            else [float(data["result"][1])]
        if not values:
            return "no series"
        if not may_be_zero and not any(v != 0 and not math.isnan(v) for v in values):
            return f"every sample is 0 or NaN under load: {values}"
        return None

    def self_test(self, base: int) -> None:
        """The judgement and the rank check fail on broken inputs, against the same
        Prometheus (so a check that cannot fail does not pass unnoticed)."""
        cases = [
            ("invalid PromQL", "sum by (kind (tsl3_rounds_total)", False, "error"),
            ("absent metric", "sum(rate(tsl3_no_such_metric_total[2m]))", False, "no series"),
            ("zero under load", "sum(tsl3_l3_ready_holds)", False, "every sample is 0"),
            ("NaN under load", "sum(tsl3_l3_ready_holds) / sum(tsl3_l3_ready_holds)", False, "every sample is 0"),
        ]
        for name, expr, may_be_zero, want in cases:
            got = self.judge(expr, may_be_zero)
            if not got or want not in got:
                self.failures.append(f"self-test '{name}': judge({expr!r}) = {got!r}, expected {want!r}")
        if self.judge("sum(tsl3_l3_ready_holds)", True) is not None:
            self.failures.append("self-test: a may-be-zero query at 0 was failed")
        if self.rank_problem(f'tsl3_rounds_total{{replica=~".*:{base}", tp_rank="0"}}') is None:
            self.failures.append("self-test: series of rank 0 alone passed the TP-rank check")

    def check_queries(self) -> None:
        used = set()
        n = 0
        saved = dict(dashlib.BUILTINS)
        dashlib.BUILTINS.update(BUILTINS)
        try:
            for path in dashlib.dashboard_files():
                dash = dashlib.load(path)
                names = dashlib.variable_names(dash)
                for where, raw in dashlib.queries(dash):
                    n += 1
                    expr = dashlib.concrete(raw, names)
                    key = None
                    if where.startswith("panel "):
                        title = where.split("'")[1]
                        key = (path.name, title, where.rsplit(" ", 1)[1])
                    if key in MAY_BE_ZERO:
                        used.add(key)
                    problem = self.judge(expr, may_be_zero=key in MAY_BE_ZERO)
                    if problem:
                        self.failures.append(f"{path.name} {where}: {problem}\n     {expr}")
        finally:
            dashlib.BUILTINS.clear()
            dashlib.BUILTINS.update(saved)
        for key in sorted(MAY_BE_ZERO - used):
            self.failures.append(f"MAY_BE_ZERO names no dashboard query: {key}")
        self.n_queries = n


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    started = time.monotonic()
    check = Check(sys.argv[1])
    # A signal stops everything too (SystemExit runs the finally below).
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: sys.exit(128 + s))
    ok = False
    try:
        check.run()
        ok = not check.failures
    except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
        check.failures.append(f"{type(e).__name__}: {e}")
    finally:
        check.stop_all()
        if not ok:
            check.logs()
        shutil.rmtree(check.work, ignore_errors=True)
    for f in check.failures:
        print(f"FAIL {f}")
    if check.failures:
        return 1
    print(f"ok   {check.n_queries} dashboard queries valid, non-zero under load where required "
          f"({len(MAY_BE_ZERO)} may be zero), against Prometheus scraping a launch --tp 2 replica "
          f"(ranks 0 and 1 up and labelled) and a single host, in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
