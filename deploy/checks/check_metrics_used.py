#!/usr/bin/env python3
"""Check (c): every metric a dashboard uses is exported, with the labels the panel matches on.

Given a Prometheus text exposition (an engine host's /metrics after a short workload, or the
fixture deploy/checks/fixtures/engine-host-metrics.txt), every vector selector of every
panel query and variable must name a sample present in it, and every label its matchers
name must appear on that sample. `promtool check metrics` lints the same text.

With --declared actors/src/names.rs instead of an exposition, the check is static: every
metric a panel uses (histogram `_bucket/_sum/_count` folded to the base name) is declared in
names.rs; names.rs metrics no dashboard shows are listed as a note.

Note: actors/src/metrics.rs pre-initializes every known label combination to zero, so a
live exposition has every series from the start; a miss is reported as "absent".

Usage: check_metrics_used.py [--no-lint] METRICS_TEXT_FILE [DASHBOARD.json ...]
       check_metrics_used.py --declared NAMES_RS [DASHBOARD.json ...]
Exit 0 clean, 1 findings, 2 tool or file missing. Reads only."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import dashlib  # noqa: E402

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Series Prometheus itself writes for every target (never in an engine host's exposition).
SCRAPE_GENERATED = {"up"}


def used(files: list[pathlib.Path]) -> list[tuple[str, str, list[str]]]:
    """(where, metric, matcher labels) for every selector of every dashboard query."""
    out = []
    for f in files:
        dash = dashlib.load(f)
        for where, expr in dashlib.queries(dash):
            for name, labels in dashlib.selectors(expr):
                if name not in SCRAPE_GENERATED:
                    out.append((f"{f.name} {where}", name, labels))
    return out


def against_exposition(text: str, files: list[pathlib.Path]) -> list[str]:
    samples = dashlib.exposition_samples(text)
    problems = []
    for where, name, labels in used(files):
        if name not in samples:
            problems.append(f"{where}: {name} absent from the exposition")
            continue
        missing = [lb for lb in labels if lb not in samples[name]]
        if missing:
            problems.append(f"{where}: {name} has no label(s) {', '.join(missing)}")
    return problems


def against_declared(names_rs: str, files: list[pathlib.Path]) -> tuple[list[str], list[str]]:
    # rustfmt may wrap a long declaration after the '='.
    declared = set(re.findall(r'pub const [A-Z0-9_]+: &str =\s*"(tsl3_[a-z0-9_]+)"', names_rs))
    problems, shown = [], set()
    for where, name, _ in used(files):
        base = name
        if name not in declared:
            for s in HISTOGRAM_SUFFIXES:
                if name.endswith(s) and name[: -len(s)] in declared:
                    base = name[: -len(s)]
        if base not in declared:
            problems.append(f"{where}: {name} is not declared in names.rs")
        shown.add(base)
    return problems, sorted(declared - shown)


def lint(promtool: str, text: str) -> list[str]:
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    if res.returncode == 0:
        return []
    return [f"promtool check metrics: {line}" for line in (res.stdout + res.stderr).strip().splitlines()]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--declared"] and len(argv) >= 2:
        try:
            names_rs = pathlib.Path(argv[1]).read_text(encoding="utf-8")
        except OSError as e:
            print(f"cannot read {argv[1]}: {e}", file=sys.stderr)
            return 2
        files = dashlib.dashboard_files(argv[2:])
        problems, unshown = against_declared(names_rs, files)
        for p in problems:
            print(f"FAIL {p}")
        for n in unshown:
            print(f"note {n} is declared in names.rs but shown on no dashboard")
        if not problems:
            print(f"ok   every metric the dashboards use is declared in {argv[1]}")
        return 1 if problems else 0
    do_lint = True
    if argv[:1] == ["--no-lint"]:
        do_lint, argv = False, argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        text = pathlib.Path(argv[0]).read_text(encoding="utf-8")
    except OSError as e:
        print(f"cannot read {argv[0]}: {e}", file=sys.stderr)
        return 2
    files = dashlib.dashboard_files(argv[1:])
    problems = against_exposition(text, files)
    if do_lint:
        promtool = shutil.which("promtool")
        if not promtool:
            print("promtool not found; run deploy/checks/setup.sh", file=sys.stderr)
            return 2
        problems += lint(promtool, text)
    for p in problems:
        print(f"FAIL {p}")
    if not problems:
        n = len({name for _, name, _ in used(files)})
        print(f"ok   all {n} metrics the dashboards use are in {argv[0]}"
              + (" (promtool check metrics clean)" if do_lint else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
