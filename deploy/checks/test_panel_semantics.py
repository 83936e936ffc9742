#!/usr/bin/env python3
"""Panel queries compute what their titles say, on synthetic series of 2 DP replicas x 2 TP
owners, evaluated by Prometheus's own engine (`promtool test rules`).

Proves the aggregation rules of seed 000: shard-local L3 I/O is summed over ranks, while
StorageTransferManager mirrors (Ready holds, soft timeouts, ...) and scheduler serving
counters are counted once per DP replica (max over TP owners), never summed across TP.
Expressions are read from the dashboards, not copied, so editing a panel re-tests it.

Usage: test_panel_semantics.py [DASHBOARD_DIR]   Exit 0 pass, 1 fail, 2 promtool missing."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import dashlib  # noqa: E402

RANKS = [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]  # (dp_rank, tp_rank)


def replica_of(dp: str) -> str:
    return f"host{dp}:8000"


def labels(dp: str, tp: str, **extra: str) -> str:
    d = {"model": "tiny", "role": "fused", "dp_rank": dp, "replica": replica_of(dp), "tp_rank": tp,
         **extra}
    return "{" + ", ".join(f'{k}="{v}"' for k, v in d.items()) + "}"


def series(metric: str, values, **extra: str) -> list[dict]:
    """One series per rank; values(dp, tp) gives its promtool expanding notation."""
    return [{"series": metric + labels(dp, tp, **extra), "values": values(dp, tp)} for dp, tp in RANKS]


def counter(per_second):
    # samples every 15s (interval below); 41 samples = 10 minutes
    return lambda dp, tp: f"0+{per_second(dp, tp) * 15}x40"


def gauge(value):
    return lambda dp, tp: f"{value(dp, tp)}x40"


def find(dashboards: dict, title: str, ref: str = "A") -> str:
    for dash in dashboards.values():
        variables = dashlib.variable_names(dash)
        for p in dashlib.walk_panels(dash["panels"]):
            if p.get("title") == title:
                for t in p.get("targets", []):
                    if t.get("refId") == ref:
                        return dashlib.concrete(t["expr"], variables)
    raise KeyError(f"no panel {title!r} target {ref}")


def replica(dp: str, **extra: str) -> str:
    d = {"model": "tiny", "role": "fused", "dp_rank": dp, "replica": replica_of(dp), **extra}
    return "{" + ", ".join(f'{k}="{v}"' for k, v in d.items()) + "}"


def cases(d: dict) -> tuple[list[dict], list[dict]]:
    inputs: list[dict] = []
    tests: list[dict] = []

    def expect(title, ref, samples):
        tests.append({"expr": find(d, title, ref), "eval_time": "5m",
                      "exp_samples": [{"labels": lb, "value": v} for lb, v in samples]})

    # Shard-local I/O: every rank's operations add up (1+2+3+4 = 10 ops/s).
    inputs += series("tsl3_l3_operations_total", counter(lambda dp, tp: 1 + int(tp) + 2 * int(dp)),
                     kind="get", outcome="completed")
    expect("L3 operations by kind and outcome", "A", [('{kind="get", outcome="completed"}', 10)])
    # Latency: 0.5 queue seconds per second over 1 completed job per second per rank -> 0.5 s/job.
    inputs += series("tsl3_l3_queue_seconds_total", counter(lambda dp, tp: 0.5), kind="put")
    inputs += series("tsl3_l3_completed_jobs_total", counter(lambda dp, tp: 1), kind="put")
    expect("Queue time per job", "A", [('{kind="put"}', 0.5)])
    # Mirrored gauge: both TP owners report the replica's 3 (dp0) / 5 (dp1) Ready holds.
    inputs += series("tsl3_l3_ready_holds", gauge(lambda dp, tp: 3 if dp == "0" else 5))
    expect("Ready holds and quarantine", "A", [(replica("0"), 3), (replica("1"), 5)])
    inputs += series("tsl3_l3_credits_in_use", gauge(lambda dp, tp: 7), credit="operation")
    expect("Credits in use", "A", [(replica("0", credit="operation"), 7),
                                   (replica("1", credit="operation"), 7)])
    # Mirrored counter: 2 soft timeouts/s per replica, seen on both TP owners.
    inputs += series("tsl3_l3_soft_timeouts_total", counter(lambda dp, tp: 2))
    expect("Soft timeouts vs Ready expirations", "A", [(replica("0"), 2), (replica("1"), 2)])
    # Serving: each replica serves 1 l3 prefix token/s (mirrored on TP): fleet total 2, not 4.
    inputs += series("tsl3_prefix_tokens_total", counter(lambda dp, tp: 1), tier="l3")
    inputs += series("tsl3_prefix_tokens_total", counter(lambda dp, tp: 3), tier="computed")
    expect("Prefix tokens by tier", "A", [('{tier="l3"}', 2), ('{tier="computed"}', 6)])
    expect("Prefix token share by tier (time range)", "A", [('{tier="l3"}', 0.25), ('{tier="computed"}', 0.75)])
    inputs += series("tsl3_requests_total", counter(lambda dp, tp: 1), fallback_reason="none")
    expect("Requests by fallback reason", "A", [('{fallback_reason="none"}', 2),
                                                  ('{fallback_reason="miss"}', 3)])
    # Two replicas left at the default dp_rank 0 (1 and 2 misses/s, mirrored on their 2 TP
    # owners) stay apart by their replica label: 3, not max(1, 2) = 2.
    for name, per_s in (("a:8000", 1), ("b:8000", 2)):
        for tp in ("0", "1"):
            inputs.append({"series": "tsl3_requests_total" + labels("0", tp, fallback_reason="miss")
                           .replace(f'replica="{replica_of("0")}"', f'replica="{name}"'),
                           "values": f"0+{per_s * 15}x40"})
    # TTFT: every observation in the (0.01, 0.025] bucket -> p50 inside it, mean from sum/count.
    for le, per_s in (("0.01", 0), ("0.025", 4), ("+Inf", 4)):
        inputs += series("tsl3_ttft_seconds_bucket", counter(lambda dp, tp, v=per_s: v), le=le)
    inputs += series("tsl3_ttft_seconds_sum", counter(lambda dp, tp: 0.125))
    inputs += series("tsl3_ttft_seconds_count", counter(lambda dp, tp: 4))
    expect("TTFT quantiles", "A", [("{}", 0.0175)])
    expect("TTFT mean per replica", "A", [(replica("0"), 0.03125), (replica("1"), 0.03125)])
    # Promotion is rank-local: the funnel sums ranks (1+1+1+1 attempted per second, half commit).
    inputs += series("tsl3_promotion_attempted_total", counter(lambda dp, tp: 1))
    inputs += series("tsl3_promotion_committed_total", counter(lambda dp, tp: 0.5))
    expect("Promotion rates and failures by reason", "A", [("{}", 4)])
    expect("Promotion rates and failures by reason", "B", [("{}", 2)])
    # Scrape health: 3 targets, one of them failing its scrape -> 1 rank not scraped.
    for inst, v in (("127.0.0.1:8000", 1), ("127.0.0.1:8001", 0), ("127.0.0.1:8100", 1)):
        inputs.append({"series": f'up{{job="tsl3-engine-host", instance="{inst}"}}',
                       "values": f"{v}x40"})
    expect("Ranks not scraped", "A", [("{}", 1)])
    # Health is per rank: no summing of states.
    inputs += series("tsl3_l3_health_state", gauge(lambda dp, tp: 3 if (dp, tp) == ("1", "1") else 0))
    expect("Health state", "A", [(labels(dp, tp), 3 if (dp, tp) == ("1", "1") else 0) for dp, tp in RANKS])
    return inputs, tests


def main(argv: list[str]) -> int:
    promtool = shutil.which("promtool")
    if not promtool:
        print("promtool not found; run deploy/checks/setup.sh", file=sys.stderr)
        return 2
    files = dashlib.dashboard_files([str(p) for p in sorted(pathlib.Path(argv[0]).glob("*.json"))]
                                    if argv else None)
    dashboards = {f.name: dashlib.load(f) for f in files}
    try:
        inputs, tests = cases(dashboards)
    except KeyError as e:
        print(f"FAIL {e}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "panels.test.yml"
        path.write_text(json.dumps({
            "rule_files": [],
            "evaluation_interval": "15s",
            "tests": [{"interval": "15s", "input_series": inputs, "promql_expr_test": tests}],
        }, indent=1), encoding="utf-8")
        res = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        print("FAIL panel semantics (promtool test rules):")
        print((res.stdout + res.stderr).strip())
        return 1
    print(f"ok   {len(tests)} panel queries compute the expected values on 2 DP x 2 TP series")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
