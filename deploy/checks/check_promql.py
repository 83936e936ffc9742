#!/usr/bin/env python3
"""Check (b): every dashboard query is valid PromQL, as Prometheus 2.42's parser says.

Each panel `expr` (and each `label_values(...)` variable selector) has Grafana's
`$__rate_interval`, `$__interval`, `$__range` and the template variables replaced by
concrete values, becomes one recording rule of a generated rules file, and
`promtool check rules` parses that file. A failure names the panel and target of the
offending expression.

Usage: check_promql.py [--keep RULES_FILE] [DASHBOARD.json ...]
Exit 0 clean, 1 findings, 2 promtool missing. Never writes a dashboard."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import dashlib  # noqa: E402


def rules_for(files: list[pathlib.Path]) -> tuple[dict, dict[str, str], list[str]]:
    """(rules document, record name -> where, substitution errors)."""
    groups = []
    where_of: dict[str, str] = {}
    errors: list[str] = []
    for f in files:
        dash = dashlib.load(f)
        variables = dashlib.variable_names(dash)
        rules = []
        for n, (where, expr) in enumerate(dashlib.queries(dash)):
            try:
                promql = dashlib.concrete(expr, variables)
            except ValueError as e:
                errors.append(f"{f.name} {where}: {e}")
                continue
            record = "dashboard_check:" + re.sub(r"[^A-Za-z0-9_]", "_", f"{dash.get('uid', f.stem)}_{n}")
            where_of[record] = f"{f.name} {where}"
            rules.append({"record": record, "expr": promql})
        groups.append({"name": f"dashboard_{f.stem}", "rules": rules})
    return {"groups": groups}, where_of, errors


def check_one(promtool: str, path: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)


def main(argv: list[str]) -> int:
    keep = None
    if argv[:1] == ["--keep"]:
        keep, argv = pathlib.Path(argv[1]), argv[2:]
    promtool = shutil.which("promtool")
    if not promtool:
        print("promtool not found; run deploy/checks/setup.sh", file=sys.stderr)
        return 2
    files = dashlib.dashboard_files(argv)
    doc, where_of, errors = rules_for(files)
    for e in errors:
        print(f"FAIL {e}")
    with tempfile.TemporaryDirectory() as tmp:
        path = keep or pathlib.Path(tmp) / "dashboards.rules.yml"
        # JSON is YAML: promtool reads it as is.
        path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        res = check_one(promtool, path)
        if res.returncode != 0:
            # Name every bad query: check each rule alone (only on failure, so the clean
            # path stays one promtool call).
            named = 0
            for g in doc["groups"]:
                for r in g["rules"]:
                    single = pathlib.Path(tmp) / "single.rules.yml"
                    single.write_text(json.dumps({"groups": [{"name": "one", "rules": [r]}]}),
                                      encoding="utf-8")
                    one = check_one(promtool, single)
                    if one.returncode != 0:
                        msg = (one.stderr or one.stdout).strip().splitlines()
                        named += 1
                        print(f"FAIL {where_of[r['record']]}: {r['expr']}")
                        for line in msg[-3:]:
                            print(f"  {line}")
            if not named:
                print("FAIL promtool check rules: " + (res.stdout + res.stderr).strip())
            return 1
    n = sum(len(g["rules"]) for g in doc["groups"])
    if errors:
        return 1
    print(f"ok   {n} dashboard queries parse (promtool check rules)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
