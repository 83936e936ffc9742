#!/usr/bin/env python3
"""Generates the Grafana dashboards in dashboards/ (tsl3-l3.json, tsl3-serving.json).

This script owns the dashboards' content: edit it, run it, commit both. It never reads
metric values; names come from actors/src/names.rs (deploy/checks verify each one used
here is exported). Standard library only.

Aggregation rules (seed 000, Observability):
- L3 executor I/O is shard-local: per-rank series may be summed.
- StorageTransferManager values (Ready holds, quarantined references, admission gate,
  credits, soft timeouts, Ready expirations, pressure bypasses, dropped backup keys) and
  the scheduler's serving counters are mirrored on every TP owner of a DP replica: take
  `max by (model, role, dp_rank, replica)` over TP first, never sum across TP owners; then
  sum over replicas where a fleet total is wanted. The `replica` label (distinct per replica
  by default) keeps two replicas with the same dp_rank apart.

Usage: gen_dashboards.py [--check] [DIR]   (DIR defaults to dashboards/; --check: exit 1
if the dashboards in DIR differ from this script's output, writing nothing)
"""

from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "dashboards"

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = ('model=~"$model", role=~"$role", replica=~"$replica", dp_rank=~"$dp_rank", '
       'tp_rank=~"$tp_rank"')
REPLICA = "model, role, dp_rank, replica"  # a replica: mirrored values are max'ed over TP here
RANK_KEYS = "model, role, dp_rank, replica, tp_rank"  # one engine host
RATE = "$__rate_interval"
# Prometheus's own per-target scrape health, for the job gen-prometheus.sh writes.
UP = 'up{job="tsl3-engine-host"}'


def sel(extra: str = "") -> str:
    return "{" + SEL + (", " + extra if extra else "") + "}"


def rate(metric: str, extra: str = "") -> str:
    return f"rate({metric}{sel(extra)}[{RATE}])"


def mirrored_rate(metric: str, by: str = "") -> str:
    """Rate of a counter mirrored on every TP owner: one value per DP replica."""
    keys = REPLICA + (", " + by if by else "")
    return f"max by ({keys}) ({rate(metric)})"


def mirrored_gauge(metric: str, by: str = "") -> str:
    keys = REPLICA + (", " + by if by else "")
    return f"max by ({keys}) ({metric}{sel()})"


def target(expr: str, legend: str, ref: str) -> dict:
    return {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend, "range": True}


def panel(kind: str, title: str, desc: str, targets: list[tuple[str, str]], unit: str = "short",
          w: int = 8, h: int = 8, stack: bool = False, mappings: list | None = None,
          thresholds: list | None = None, instant: bool = False) -> dict:
    tg = []
    for i, (expr, legend) in enumerate(targets):
        t = target(expr, legend, chr(ord("A") + i))
        if instant:
            t["range"] = False
            t["instant"] = True
        tg.append(t)
    defaults: dict = {"unit": unit}
    if mappings:
        defaults["mappings"] = mappings
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    p: dict = {
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": tg,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "_w": w,
        "_h": h,
    }
    if kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10 if stack else 0,
            "showPoints": "never",
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        }
        p["options"] = {
            "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom", "calcs": []},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif kind == "stat":
        p["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "value_and_name",
            "justifyMode": "auto",
            "orientation": "auto",
        }
    elif kind == "state-timeline":
        p["options"] = {
            "showValue": "auto",
            "mergeValues": True,
            "rowHeight": 0.9,
            "alignValue": "left",
            "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom", "calcs": []},
            "tooltip": {"mode": "single", "sort": "none"},
        }
    elif kind == "bargauge":
        p["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
        }
    return p


def layout(sections: list[tuple[str, list[dict]]]) -> list[dict]:
    """Rows of panels on Grafana's 24-column grid; assigns ids and gridPos."""
    out: list[dict] = []
    pid = 1
    y = 0
    for row_title, panels in sections:
        out.append({"type": "row", "id": pid, "title": row_title, "collapsed": False,
                    "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []})
        pid += 1
        y += 1
        x = 0
        row_h = 0
        for p in panels:
            w, h = p.pop("_w"), p.pop("_h")
            if x + w > 24:
                x = 0
                y += row_h
                row_h = 0
            p["id"] = pid
            p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
            pid += 1
            x += w
            row_h = max(row_h, h)
            out.append(p)
        y += row_h
    return out


def variables() -> list[dict]:
    base = "tsl3_rounds_total"
    chain = [
        ("model", "Model", base),
        ("role", "Role", base + '{model=~"$model"}'),
        ("replica", "Replica", base + '{model=~"$model", role=~"$role"}'),
        ("dp_rank", "DP rank", base + '{model=~"$model", role=~"$role", replica=~"$replica"}'),
        ("tp_rank", "TP rank",
         base + '{model=~"$model", role=~"$role", replica=~"$replica", dp_rank=~"$dp_rank"}'),
    ]
    out: list[dict] = [{
        "type": "datasource",
        "name": "datasource",
        "label": "Prometheus",
        "query": "prometheus",
        "current": {"text": "tsl3-prometheus", "value": "tsl3-prometheus"},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
    }]
    for name, label, metric in chain:
        out.append({
            "type": "query",
            "name": name,
            "label": label,
            "datasource": DS,
            "query": f"label_values({metric}, {name})",
            "refresh": 2,
            "includeAll": True,
            "allValue": ".*",
            "multi": True,
            "sort": 3 if name.endswith("rank") else 1,
            "current": {"text": ["All"], "value": ["$__all"]},
            "hide": 0,
            "regex": "",
            "skipUrlSync": False,
        })
    return out


def dashboard(uid: str, title: str, desc: str, sections: list[tuple[str, list[dict]]]) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": desc,
        "tags": ["tsl3"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": variables()},
        "annotations": {"list": []},
        "links": [{"title": "tsl3", "type": "dashboards", "tags": ["tsl3"], "asDropdown": True,
                   "includeVars": True, "keepTime": True, "icon": "external link",
                   "targetBlank": False, "tooltip": "", "url": ""}],
        "panels": layout(sections),
    }


HEALTH = [{"type": "value", "options": {
    "0": {"text": "healthy", "color": "green", "index": 0},
    "1": {"text": "cooldown", "color": "yellow", "index": 1},
    "2": {"text": "probing", "color": "orange", "index": 2},
    "3": {"text": "quarantined", "color": "red", "index": 3},
}}]
GATE = [{"type": "value", "options": {
    "0": {"text": "closed", "color": "red", "index": 0},
    "1": {"text": "open", "color": "green", "index": 1},
}}]
RETIREMENT = [{"type": "value", "options": {
    "0": {"text": "proven", "color": "green", "index": 0},
    "1": {"text": "unproven: restart required", "color": "red", "index": 1},
}}]
GREEN_RED = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
RANK = "{{role}} {{replica}} dp{{dp_rank}} tp{{tp_rank}}"
REPL = "{{model}} {{role}} {{replica}} dp{{dp_rank}}"


def l3() -> dict:
    ops = [
        panel("timeseries", "L3 operations by kind and outcome",
              "Completed query/GET/PUT operations per second, summed over the selected ranks "
              "(I/O is shard-local).",
              [(f"sum by (kind, outcome) ({rate('tsl3_l3_operations_total')})", "{{kind}} {{outcome}}")],
              unit="ops", stack=True),
        panel("timeseries", "Payload bytes by kind",
              "Successful adapter payload bytes per second. Includes idempotent PUT hits and "
              "detached GET results: neither network traffic nor published cache hits.",
              [(f"sum by (kind) ({rate('tsl3_l3_payload_bytes_total')})", "{{kind}}")], unit="Bps"),
        panel("timeseries", "Backend calls by kind",
              "Store adapter invocations per second by kind (a call carries a batch of rows). "
              "A create-only PUT can finish after its existence check without a native PUT call.",
              [(f"sum by (kind) ({rate('tsl3_l3_backend_calls_total')})", "calls {{kind}}")],
              unit="ops"),
        panel("timeseries", "PUT new writes",
              "PUT rows per second that wrote a new object (rows, not calls: a batch call writes "
              "many), summed over ranks.",
              [(f"sum({rate('tsl3_l3_put_new_writes_total')})", "PUT new writes")], unit="wps"),
    ]
    latency = [
        panel("timeseries", "Queue time per job",
              "Mean seconds an L3 job waited in its queue: rate of cumulative queue seconds over "
              "rate of completed jobs, by kind.",
              [(f"sum by (kind) ({rate('tsl3_l3_queue_seconds_total')}) / "
                f"sum by (kind) ({rate('tsl3_l3_completed_jobs_total')})", "{{kind}}")], unit="s"),
        panel("timeseries", "Backend time per job",
              "Mean seconds spent in store calls per completed L3 job, by kind.",
              [(f"sum by (kind) ({rate('tsl3_l3_backend_seconds_total')}) / "
                f"sum by (kind) ({rate('tsl3_l3_completed_jobs_total')})", "{{kind}}")], unit="s"),
        panel("timeseries", "Completed jobs",
              "L3 jobs completed and polled per second, by kind.",
              [(f"sum by (kind) ({rate('tsl3_l3_completed_jobs_total')})", "{{kind}}")], unit="ops"),
    ]
    queue = [
        panel("timeseries", "Jobs queued and running",
              "L3 jobs queued or running, by kind and state, summed over the selected ranks.",
              [(f"sum by (kind, state) (tsl3_l3_jobs{sel()})", "{{kind}} {{state}}")], stack=True),
        panel("timeseries", "Queued payload bytes",
              "Payload bytes of queued L3 jobs, by kind.",
              [(f"sum by (kind) (tsl3_l3_queued_payload_bytes{sel()})", "{{kind}}")], unit="bytes"),
        panel("timeseries", "Oldest job age",
              "Age of the oldest queued or running L3 job on each rank.",
              [(f"max by ({RANK_KEYS}) (tsl3_l3_oldest_job_age_seconds{sel()})", RANK)], unit="s"),
    ]
    health = [
        panel("state-timeline", "Health state",
              "L3 backend health per rank: 0 healthy, 1 cooldown, 2 probing, 3 quarantined. "
              "Reading health never consumes a recovery probe.",
              [(f"max by ({RANK_KEYS}) (tsl3_l3_health_state{sel()})", RANK)],
              mappings=HEALTH, w=8),
        panel("timeseries", "Health epoch",
              "L3 backend health epoch per rank; a step marks a health transition.",
              [(f"max by ({RANK_KEYS}) (tsl3_l3_health_epoch{sel()})", RANK)], w=8),
        panel("stat", "Unproven retirement",
              "1 when native I/O retirement is unproven on a rank: that rank accepts no new L3 "
              "work and needs a process restart to reclaim its storage.",
              [(f"max by ({RANK_KEYS}) (tsl3_l3_unproven_retirement{sel()})", RANK)],
              mappings=RETIREMENT, thresholds=GREEN_RED, w=8, instant=True),
    ]
    sched = [
        panel("state-timeline", "Admission gate",
              "L3 pressure admission gate per DP replica (mirrored scheduler gauge: max over TP).",
              [(mirrored_gauge("tsl3_l3_admission_gate_open"), REPL)], mappings=GATE),
        panel("timeseries", "Credits in use",
              "Storage credits in use per DP replica and credit (operation | host); mirrored: max over TP.",
              [(mirrored_gauge("tsl3_l3_credits_in_use", "credit"), REPL + " {{credit}}")]),
        panel("timeseries", "Ready holds and quarantine",
              "Ready holds protecting newly read blocks, and Host references kept by quarantined "
              "storage operations, per DP replica (mirrored: max over TP, never summed).",
              [(mirrored_gauge("tsl3_l3_ready_holds"), "ready holds " + REPL),
               (mirrored_gauge("tsl3_l3_quarantined_references"), "quarantined refs " + REPL)]),
        panel("timeseries", "Soft timeouts vs Ready expirations",
              "Waiting L3 preparations that hit their soft deadline, and Ready holds that expired "
              "before admission, per second. Client detachment increments neither.",
              [(mirrored_rate("tsl3_l3_soft_timeouts_total"), "soft timeouts " + REPL),
               (mirrored_rate("tsl3_l3_ready_expirations_total"), "ready expirations " + REPL)],
              unit="ops"),
        panel("timeseries", "Read admission gate closed",
              "Fraction of time the shared read/write admission gate was closed (seconds closed "
              "per second); backups yield from the low watermark on, so a slow PUT backlog "
              "sheds backups before it closes reads.",
              [(mirrored_rate("tsl3_l3_admission_gate_closed_seconds_total"), REPL)],
              unit="percentunit"),
        panel("timeseries", "Pressure bypasses",
              "Requests per second that skipped L3 preparation because the pressure gate was closed.",
              [(mirrored_rate("tsl3_l3_pressure_bypasses_total"), REPL)], unit="reqps"),
        panel("timeseries", "Dropped backup keys by reason",
              "Dropped backup candidate keys (occurrences, not unique objects) per second, by reason.",
              [(mirrored_rate("tsl3_l3_dropped_backup_keys_total", "reason"), REPL + " {{reason}}")],
              unit="ops"),
    ]
    promo = [
        panel("bargauge", "Promotion funnel (time range)",
              "DFS to MEMORY promotions over the dashboard time range: admitted = committed + "
              "failed + expired + cancelled + in flight.",
              [(f"sum(increase(tsl3_promotion_attempted_total{sel()}[$__range]))", "attempted"),
               (f"sum(increase(tsl3_promotion_committed_total{sel()}[$__range]))", "committed"),
               (f"sum(increase(tsl3_promotion_failed_total{sel()}[$__range]))", "failed"),
               (f"sum(increase(tsl3_promotion_expired_total{sel()}[$__range]))", "expired"),
               (f"sum(increase(tsl3_promotion_cancelled_total{sel()}[$__range]))", "cancelled")],
              instant=True),
        panel("timeseries", "Promotion rates and failures by reason",
              "DFS to MEMORY promotions per second: admitted, committed, failures by reason, and "
              "refusals before admission by capacity reason.",
              [(f"sum({rate('tsl3_promotion_attempted_total')})", "attempted"),
               (f"sum({rate('tsl3_promotion_committed_total')})", "committed"),
               (f"sum by (reason) ({rate('tsl3_promotion_failed_total')})", "failed {{reason}}"),
               (f"sum by (reason) ({rate('tsl3_promotion_rejected_total')})", "rejected {{reason}}")],
              unit="ops"),
        panel("timeseries", "Promotions in flight and staging",
              "Promotions in flight and bytes of promotion staging in use, per rank.",
              [(f"max by ({RANK_KEYS}) (tsl3_promotion_in_flight{sel()})", "in flight " + RANK),
               (f"max by ({RANK_KEYS}) (tsl3_promotion_staging_bytes{sel()})", "staging bytes " + RANK)]),
        panel("timeseries", "Local store GETs by tier",
              "Local store GETs per second served from MEMORY or from the DFS tier, summed over ranks.",
              [(f"sum by (tier) ({rate('tsl3_local_get_total')})", "{{tier}}")], unit="ops"),
        panel("timeseries", "DFS tier reads and PUT keys by outcome",
              "DFS object reads per second (QUERY's header reads included) and PUT keys per "
              "second, by outcome, summed over ranks (DFS I/O is shard-local). A full disk shows "
              "as PUT capacity, never as failed reads.",
              [(f"sum by (outcome) ({rate('tsl3_dfs_reads_total')})", "read {{outcome}}"),
               (f"sum by (outcome) ({rate('tsl3_dfs_puts_total')})", "put {{outcome}}")],
              unit="ops"),
        panel("timeseries", "Invalid DFS objects by reason",
              "Objects found invalid per second (never used as KV), by reason, and those removed so "
              "that the key's next backup lands, summed over ranks.",
              [(f"sum by (reason) ({rate('tsl3_dfs_invalid_objects_total')})", "invalid {{reason}}"),
               (f"sum({rate('tsl3_dfs_invalid_removed_total')})", "removed")],
              unit="ops"),
    ]
    return dashboard(
        "tsl3-l3", "tsl3 / L3 tier",
        "L3 executor (rank-local I/O) and StorageTransferManager (mirrored per DP replica) of tsl3 "
        "engine hosts. Counters are not unique remote objects or saved prefill tokens.",
        [("Operations and bytes", ops), ("Latency", latency), ("Queue depth and age", queue),
         ("Health", health), ("Scheduler: gate, credits, holds (mirrored: max over TP)", sched),
         ("DFS to MEMORY promotion", promo)])


def serving() -> dict:
    def q(p: str) -> str:
        return (f"histogram_quantile({p}, sum by (le) (max by ({REPLICA}, le) "
                f"({rate('tsl3_ttft_seconds_bucket')})))")

    scrape = [
        panel("stat", "Ranks not scraped",
              "Engine-host targets whose last scrape failed (a rank down, or not serving /metrics "
              "on its address). Every rank of every replica is a target (gen-prometheus.sh).",
              [(f'count({UP} == 0) or vector(0)', "down")], w=6, thresholds=GREEN_RED,
              instant=True),
        panel("timeseries", "Scrape health per target",
              "1 while Prometheus scrapes a rank's /metrics, 0 when that scrape fails: a rank "
              "missing here is missing from every other panel.",
              [(UP, "{{instance}}")], w=18),
    ]
    ttft = [
        panel("timeseries", "TTFT quantiles",
              "End-to-end time to first token, p50/p90/p99 over the selected replicas (buckets are "
              "taken once per DP replica: max over TP, then summed).",
              [(q("0.5"), "p50"), (q("0.9"), "p90"), (q("0.99"), "p99")], unit="s", w=12),
        panel("timeseries", "TTFT mean per replica",
              "Mean time to first token per DP replica.",
              [(f"max by ({REPLICA}) ({rate('tsl3_ttft_seconds_sum')}) / "
                f"max by ({REPLICA}) ({rate('tsl3_ttft_seconds_count')})", REPL)], unit="s", w=12),
    ]
    tokens = [
        panel("timeseries", "Prefix tokens by tier",
              "Prompt tokens per second by where their KV came from (device | host | l3 | computed).",
              [(f"sum by (tier) ({mirrored_rate('tsl3_prefix_tokens_total', 'tier')})", "{{tier}}")],
              stack=True, w=12),
        panel("bargauge", "Prefix token share by tier (time range)",
              "Share of prompt tokens from each tier over the dashboard time range.",
              [(f"sum by (tier) (max by ({REPLICA}, tier) "
                f"(increase(tsl3_prefix_tokens_total{sel()}[$__range]))) / ignoring (tier) group_left "
                f"sum(max by ({REPLICA}, tier) (increase(tsl3_prefix_tokens_total{sel()}[$__range])))",
                "{{tier}}")], unit="percentunit", w=12, instant=True),
        panel("timeseries", "Tail tokens reused by tier",
              "Prompt tokens per second above the aligned boundary reused through a tail "
              "(a nonaligned prompt end: partial history blocks, SWA lookback, State "
              "checkpoint), by the tier that supplied the tail.",
              [(f"sum by (tier) ({mirrored_rate('tsl3_tail_tokens_reused_total', 'tier')})",
                "{{tier}}")], stack=True, w=12),
        panel("timeseries", "Tail blocks queried and reused by group kind",
              "Tail blocks per second asked by issued QUERY operations and reused at "
              "admission, by cache group kind (full | sliding_window | state).",
              [(f"sum by (kind) ({mirrored_rate('tsl3_tail_blocks_queried_total', 'kind')})",
                "queried {{kind}}"),
               (f"sum by (kind) ({mirrored_rate('tsl3_tail_blocks_reused_total', 'kind')})",
                "reused {{kind}}")], w=12),
    ]
    requests = [
        panel("timeseries", "Requests by fallback reason",
              "Finished requests per second by L3 fallback reason.",
              [(f"sum by (fallback_reason) ({mirrored_rate('tsl3_requests_total', 'fallback_reason')})",
                "{{fallback_reason}}")], unit="reqps", stack=True, w=12),
        panel("timeseries", "Scheduler rounds",
              "Scheduler rounds per second per DP replica (every TP owner runs the same rounds).",
              [(mirrored_rate("tsl3_rounds_total"), REPL)], unit="ops", w=12),
    ]
    return dashboard(
        "tsl3-serving", "tsl3 / Serving",
        "Serving view of tsl3 engine hosts: scrape health, TTFT, prefix reuse by tier, L3 "
        "fallback, rounds.",
        [("Scrape health", scrape), ("Time to first token", ttft), ("Prefix reuse", tokens),
         ("Requests and rounds", requests)])


def render() -> dict[str, str]:
    return {name: json.dumps(d, indent=2) + "\n"
            for name, d in (("tsl3-l3.json", l3()), ("tsl3-serving.json", serving()))}


def main() -> int:
    args = sys.argv[1:]
    check = "--check" in args
    dirs = [a for a in args if a != "--check"]
    out = pathlib.Path(dirs[0]).resolve() if dirs else OUT
    stale = []
    for name, text in render().items():
        path = out / name
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            out.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"dashboards in {out} differ from deploy/observability/gen_dashboards.py output: "
              + ", ".join(stale) + " (run it and commit)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
