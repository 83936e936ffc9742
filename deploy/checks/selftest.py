#!/usr/bin/env python3
"""Self-tests of the dashboard checks: each check passes on the real dashboards and fails,
naming the culprit, on a deliberately broken copy. Run with the venv's python (the SDK
check needs grafana-foundation-sdk). Prints `N passed, M failed`; exit 1 on any failure."""

from __future__ import annotations

import copy
import http.server
import json
import pathlib
import subprocess
import sys
import tempfile
import threading

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dashlib  # noqa: E402

FIXTURE = HERE / "fixtures" / "engine-host-metrics.txt"
NAMES_RS = dashlib.ROOT / "actors" / "src" / "names.rs"
REAL = {f.name: dashlib.load(f) for f in dashlib.dashboard_files()}


def run(script: str, *args: str) -> tuple[int, str]:
    res = subprocess.run([sys.executable, str(HERE / script), *map(str, args)],
                         capture_output=True, text=True)
    return res.returncode, res.stdout + res.stderr


def panel(d: dict, title: str) -> dict:
    for p in dashlib.walk_panels(d["panels"]):
        if p.get("title") == title:
            return p
    raise KeyError(title)


def broken(tmp: pathlib.Path, name: str, mutate) -> pathlib.Path:
    """A copy of the serving or L3 dashboard with one defect, in its own directory."""
    base = "tsl3-serving.json" if name.startswith("serving") else "tsl3-l3.json"
    d = copy.deepcopy(REAL[base])
    mutate(d)
    out = tmp / name
    out.mkdir()
    path = out / base
    path.write_text(json.dumps(d), encoding="utf-8")
    return path


def live(text_file: pathlib.Path) -> tuple[int, str]:
    """Run deploy/checks/live.sh's check_live_metrics against a throwaway local server."""
    body = text_file.read_bytes()

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            if self.path == "/metrics":
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        res = subprocess.run(["bash", "-c", f'source "{HERE / "live.sh"}" && check_live_metrics "{url}"'],
                             capture_output=True, text=True)
        return res.returncode, res.stdout + res.stderr
    finally:
        server.shutdown()
        server.server_close()


def main() -> int:
    passed = failed = 0

    def case(label: str, rc_out: tuple[int, str], want_rc: int, want: str) -> None:
        nonlocal passed, failed
        rc, out = rc_out
        if rc == want_rc and want in out:
            passed += 1
            print(f"ok   {label}")
        else:
            failed += 1
            print(f"FAIL {label}: rc={rc} (want {want_rc}), want {want!r} in output:\n{out}")

    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        reals = [str(f) for f in dashlib.dashboard_files()]
        # Positive controls: the real dashboards pass each check.
        case("real dashboards round-trip", run("check_dashboards.py", *reals), 0, "round-trip")
        case("real dashboards parse", run("check_promql.py", *reals), 0, "parse")
        case("real dashboards use fixture metrics",
             run("check_metrics_used.py", FIXTURE, *reals), 0, "promtool check metrics clean")
        case("real dashboards use declared metrics",
             run("check_metrics_used.py", "--declared", NAMES_RS, *reals), 0, "declared")
        case("real panels compute expected values", run("test_panel_semantics.py"), 0, "expected values")

        # (a) unknown keys, at the top, in panel options and in a Prometheus target.
        p = broken(tmp, "serving-unknown-key",
                   lambda d: panel(d, "TTFT quantiles")["options"]["legend"].update(showLegnd=True))
        case("unknown options key fails", run("check_dashboards.py", p), 1,
             ".options.legend.showLegnd: unknown key")
        p = broken(tmp, "l3-unknown-target-key",
                   lambda d: panel(d, "Oldest job age")["targets"][0].update(exprr="up"))
        case("unknown target key fails", run("check_dashboards.py", p), 1, ".exprr: unknown key")
        p = broken(tmp, "serving-unknown-top", lambda d: d.update(refreshh="5s"))
        case("unknown dashboard key fails", run("check_dashboards.py", p), 1, "$.refreshh: unknown key")
        p = broken(tmp, "serving-bad-datasource",
                   lambda d: panel(d, "Scheduler rounds").update(datasource={"type": "loki", "uid": "x"}))
        case("non-Prometheus datasource fails", run("check_dashboards.py", p), 1, "datasource must be")

        # (b) bad PromQL and an undefined variable, each named by panel.
        p = broken(tmp, "l3-bad-promql", lambda d: panel(d, "Queue time per job")["targets"][0].update(
            expr="sum by (kind) (rate(tsl3_l3_queue_seconds_total[$__rate_interval])"))
        case("bad PromQL fails", run("check_promql.py", p), 1, "'Queue time per job' target A")
        p = broken(tmp, "l3-bad-variable", lambda d: panel(d, "Health epoch")["targets"][0].update(
            expr='tsl3_l3_health_epoch{tp_rank=~"$tp"}'))
        case("undefined variable fails", run("check_promql.py", p), 1, "unknown variable $tp")

        # (c) a metric absent from the exposition, a label the metric lacks, a lint error,
        # and a metric names.rs does not declare.
        p = broken(tmp, "l3-absent-metric", lambda d: panel(d, "Pressure bypasses")["targets"][0].update(
            expr="sum(rate(tsl3_l3_pressure_bypass_total[$__rate_interval]))"))
        case("absent metric fails", run("check_metrics_used.py", FIXTURE, p), 1,
             "tsl3_l3_pressure_bypass_total absent")
        case("undeclared metric fails", run("check_metrics_used.py", "--declared", NAMES_RS, p), 1,
             "tsl3_l3_pressure_bypass_total is not declared")
        p = broken(tmp, "serving-absent-label", lambda d: panel(d, "Scheduler rounds")["targets"][0].update(
            expr='sum(rate(tsl3_rounds_total{kind="get"}[$__rate_interval]))'))
        case("label the metric lacks fails", run("check_metrics_used.py", FIXTURE, p), 1,
             "tsl3_rounds_total has no label(s) kind")
        bad_text = tmp / "bad-exposition.txt"
        bad_text.write_text(FIXTURE.read_text(encoding="utf-8")
                            + "# HELP tsl3_bad Counter without suffix\n# TYPE tsl3_bad counter\ntsl3_bad 1\n",
                            encoding="utf-8")
        case("exposition lint error fails", run("check_metrics_used.py", bad_text), 1,
             "promtool check metrics")

        # Semantics: summing a mirrored gauge across TP owners double-counts.
        d = copy.deepcopy(REAL["tsl3-l3.json"])
        tgt = panel(d, "Ready holds and quarantine")["targets"][0]
        tgt["expr"] = tgt["expr"].replace("max by", "sum by", 1)
        sem = tmp / "semantics"
        sem.mkdir()
        (sem / "tsl3-l3.json").write_text(json.dumps(d), encoding="utf-8")
        (sem / "tsl3-serving.json").write_text(json.dumps(REAL["tsl3-serving.json"]), encoding="utf-8")
        case("summing a mirrored gauge over TP fails", run("test_panel_semantics.py", sem), 1,
             'role="fused"} 6E+00')  # 3 Ready holds seen on 2 TP owners, shown as 6

        # A hand edit of a generated dashboard is caught.
        drift = tmp / "drift"
        drift.mkdir()
        for name, d in REAL.items():
            d = copy.deepcopy(d)
            if name == "tsl3-l3.json":
                panel(d, "Health epoch")["title"] = "Health epochs"
            (drift / name).write_text(json.dumps(d, indent=2) + "\n", encoding="utf-8")
        gen = dashlib.ROOT / "deploy" / "observability" / "gen_dashboards.py"
        res = subprocess.run([sys.executable, str(gen), "--check", str(drift)], capture_output=True, text=True)
        case("hand-edited dashboard differs from generator", (res.returncode, res.stdout + res.stderr), 1,
             "differ from deploy/observability/gen_dashboards.py output: tsl3-l3.json")
        res = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True)
        case("checked-in dashboards equal generator", (res.returncode, res.stdout + res.stderr), 0, "")

        # The live hook, against a local HTTP server serving the fixture, then a broken text.
        case("check_live_metrics passes on a served exposition", live(FIXTURE), 0, "promtool check metrics clean")
        case("check_live_metrics fails on a served broken exposition", live(bad_text), 1, "tsl3_bad")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
