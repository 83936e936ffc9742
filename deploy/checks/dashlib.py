"""Shared helpers of the dashboard checks: load the dashboards, walk their panels and
queries, turn a Grafana query into plain PromQL, and find the metric names a PromQL
expression selects. Standard library only (the checks run before any venv exists).

This module only reads; it never writes a dashboard or talks to a server."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"

# Concrete stand-ins for Grafana's built-in interval variables.
BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "30s",
    "__range": "1h",
}
# Stand-in for every template variable (all of ours are label regexes).
VARIABLE_VALUE = ".*"


def dashboard_files(paths: list[str] | None = None) -> list[pathlib.Path]:
    if paths:
        return [pathlib.Path(p) for p in paths]
    return sorted(DASHBOARDS.glob("*.json"))


def load(path: pathlib.Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def walk_panels(panels: list[dict]) -> Iterator[dict]:
    """Every panel, including those nested in collapsed rows."""
    for p in panels or []:
        yield p
        yield from walk_panels(p.get("panels", []))


def queries(dash: dict) -> Iterator[tuple[str, str]]:
    """(where, raw PromQL with Grafana variables) for every panel target and every
    query variable of the dashboard."""
    for p in walk_panels(dash.get("panels", [])):
        for t in p.get("targets", []) or []:
            if "expr" in t:
                yield f"panel {p.get('id')} '{p.get('title')}' target {t.get('refId')}", t["expr"]
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", q or "", re.S)
        if m:
            yield f"variable ${v.get('name')}", m.group(1)
        elif q:
            yield f"variable ${v.get('name')}", q


_VAR = re.compile(r"\$\{([A-Za-z0-9_]+)(?::[A-Za-z]+)?\}|\[\[([A-Za-z0-9_]+)\]\]|\$([A-Za-z0-9_]+)")


def variable_names(dash: dict) -> set[str]:
    return {v.get("name") for v in dash.get("templating", {}).get("list", [])}


def concrete(expr: str, variables: set[str]) -> str:
    """Replace Grafana built-ins and template variables by concrete values. An unknown
    variable raises ValueError (a typo would otherwise reach Grafana unnoticed)."""

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name.isdigit():
            return m.group(0)  # a regex group reference ($1) of label_replace
        if name in BUILTINS:
            return BUILTINS[name]
        if name in variables:
            return VARIABLE_VALUE
        raise ValueError(f"unknown variable ${name}")

    return _VAR.sub(sub, expr)


KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan", "start", "end",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def selectors(expr: str) -> list[tuple[str, list[str]]]:
    """(metric name, label names of its matchers) for every vector selector of a PromQL
    expression. Functions, aggregations, keywords, grouping labels, durations and numbers
    are not metric names."""
    s = _STRING.sub('""', expr)
    s = _GROUPING.sub(" ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range and subquery durations
    s = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", s)
    out: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "{":
            # A selector without a leading name: {__name__="..."} — not used by us.
            j = s.index("}", i)
            i = j + 1
            continue
        if c.isdigit() or (c == "." and i + 1 < len(s) and s[i + 1].isdigit()):
            m = re.match(r"0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?", s[i:])
            i += len(m.group(0)) if m else 1
            continue
        m = _IDENT.match(s, i)
        if not m:
            i += 1
            continue
        name = m.group(0)
        j = m.end()
        k = j
        while k < len(s) and s[k].isspace():
            k += 1
        if k < len(s) and s[k] == "(":
            i = j  # a function or an aggregation
            continue
        if name.lower() in KEYWORDS:
            i = j
            continue
        labels: list[str] = []
        if k < len(s) and s[k] == "{":
            end = s.index("}", k)
            labels = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", s[k + 1 : end])
            j = end + 1
        out.append((name, labels))
        i = j
    return out


def exposition_samples(text: str) -> dict[str, set[str]]:
    """Sample name -> label names seen on it, from a Prometheus text exposition."""
    seen: dict[str, set[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})?\s", line)
        if not m:
            continue
        labels = set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', _STRING.sub('""', m.group(3) or "")))
        # _STRING blanked the values; recover names from `name=""`.
        seen.setdefault(m.group(1), set()).update(labels)
    return seen
