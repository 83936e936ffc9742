#!/usr/bin/env python3
"""Check (a): every dashboard round-trips through grafana-foundation-sdk without loss.

The SDK's `Dashboard.from_json` keeps only the keys its schema knows (for panels of a
registered type and Prometheus queries, down to options, fieldConfig and targets), so a key
that is present in the file but absent after `from_json` -> `to_json` is unknown to
Grafana's schema: a typo or a misplaced option. A value that changes on the way is
reported too. On top of that, structural rules Grafana would only show at render time:
unique panel ids, known panel types, every query on the `${datasource}` Prometheus
variable, unique refIds with an expression, panels inside the 24-column grid, unique uids,
and no reference to an undefined template variable.

Usage: check_dashboards.py [DASHBOARD.json ...]   (default: dashboards/*.json, plus a check
that they equal deploy/observability/gen_dashboards.py output). Exit 0 clean, 1 findings,
2 SDK missing. Never writes a dashboard."""

from __future__ import annotations

import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import dashlib  # noqa: E402

try:
    from grafana_foundation_sdk.cog import runtime as cogruntime
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard
except ImportError as e:  # pragma: no cover - environment problem, not a finding
    print(f"grafana-foundation-sdk is not importable ({e}); run deploy/checks/setup.sh",
          file=sys.stderr)
    sys.exit(2)

register_default_plugins()


def roundtrip(data: dict) -> dict:
    return json.loads(json.dumps(Dashboard.from_json(data), cls=JSONEncoder))


def lost(orig, back, path: str, out: list[str]) -> None:
    """Everything in `orig` must come back from the SDK unchanged (defaults may be added)."""
    if isinstance(orig, dict):
        if not isinstance(back, dict):
            out.append(f"{path}: object became {type(back).__name__}")
            return
        for k, v in orig.items():
            if k not in back:
                out.append(f"{path}.{k}: unknown key (dropped by the SDK schema)")
            else:
                lost(v, back[k], f"{path}.{k}", out)
    elif isinstance(orig, list):
        if not isinstance(back, list) or len(back) != len(orig):
            out.append(f"{path}: list changed on round trip")
            return
        for i, (a, b) in enumerate(zip(orig, back)):
            lost(a, b, f"{path}[{i}]", out)
    elif type(orig) is bool or type(back) is bool:
        if orig is not back:
            out.append(f"{path}: {orig!r} came back as {back!r}")
    elif orig != back:
        out.append(f"{path}: {orig!r} came back as {back!r}")


def structure(dash: dict, out: list[str]) -> None:
    known_types = set(cogruntime.Runtime().panelcfg_variants) | {"row"}
    variables = dashlib.variable_names(dash)
    ids: set = set()
    for p in dashlib.walk_panels(dash.get("panels", [])):
        where = f"panel {p.get('id')} '{p.get('title')}'"
        if p.get("id") in ids or p.get("id") is None:
            out.append(f"{where}: missing or duplicate id")
        ids.add(p.get("id"))
        if p.get("type") not in known_types:
            out.append(f"{where}: unknown panel type {p.get('type')!r}")
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in "xywh") or g["x"] < 0 or g["x"] + g["w"] > 24:
            out.append(f"{where}: gridPos missing or outside the 24-column grid")
        if p.get("type") == "row":
            continue
        if p.get("datasource") != {"type": "prometheus", "uid": "${datasource}"}:
            out.append(f"{where}: datasource must be the ${{datasource}} Prometheus variable")
        targets = p.get("targets") or []
        if not targets:
            out.append(f"{where}: no query")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or None in refs:
            out.append(f"{where}: missing or duplicate refId")
        for t in targets:
            if not (t.get("expr") or "").strip():
                out.append(f"{where} target {t.get('refId')}: empty expr")
    for where, expr in dashlib.queries(dash):
        try:
            dashlib.concrete(expr, variables)
        except ValueError as e:
            out.append(f"{where}: {e}")


def provisioning(files: list[pathlib.Path]) -> int:
    """The provisioned datasource uid is the one every dashboard's `datasource` variable
    defaults to. Returns the number of failures."""
    prov = dashlib.ROOT / "deploy/observability/grafana/provisioning/datasources/tsl3.yml"
    uids = re.findall(r"^\s*uid:\s*(\S+)\s*$", prov.read_text(encoding="utf-8"), re.M)
    bad = 0
    for f in files:
        var = next((v for v in dashlib.load(f)["templating"]["list"] if v.get("name") == "datasource"), {})
        if var.get("current", {}).get("value") not in uids:
            print(f"FAIL {f.name}: datasource variable default is not a uid in {prov.name} ({uids})")
            bad += 1
    if not bad:
        print(f"ok   dashboards default to the provisioned datasource {uids}")
    return bad


def main(argv: list[str]) -> int:
    files = dashlib.dashboard_files(argv)
    if not files:
        print("no dashboards found", file=sys.stderr)
        return 1
    failed = 0
    uids: dict[str, pathlib.Path] = {}
    for f in files:
        out: list[str] = []
        try:
            dash = dashlib.load(f)
        except (OSError, json.JSONDecodeError) as e:
            print(f"FAIL {f}: {e}")
            failed += 1
            continue
        try:
            lost(dash, roundtrip(dash), "$", out)
        except Exception as e:  # the SDK raises on shapes it cannot parse
            out.append(f"SDK could not parse the dashboard: {type(e).__name__}: {e}")
        structure(dash, out)
        uid = dash.get("uid")
        if not uid:
            out.append("no uid")
        elif uid in uids:
            out.append(f"uid {uid!r} also used by {uids[uid]}")
        else:
            uids[uid] = f
        panels = sum(1 for p in dashlib.walk_panels(dash.get("panels", [])) if p.get("type") != "row")
        if out:
            failed += 1
            print(f"FAIL {f}")
            for line in out:
                print(f"  {line}")
        else:
            print(f"ok   {f.name}: {panels} panels round-trip through grafana-foundation-sdk")
    if not argv:
        sys.path.insert(0, str(dashlib.ROOT / "deploy" / "observability"))
        import gen_dashboards

        sys.argv = [sys.argv[0], "--check"]
        if gen_dashboards.main() != 0:
            failed += 1
        else:
            print("ok   dashboards/ equals gen_dashboards.py output")
        failed += provisioning(files)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
