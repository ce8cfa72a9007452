"""The Grafana dashboard: valid JSON, queries that promtool parses, and only metric names the code exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "helm" / "dashboards" / "waltz.json"
SOURCES = [REPO / "services", REPO / "clients" / "python", REPO / "common" / "waltz_common"]  # waltz_build_info
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def _panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def _expressions() -> list[str]:
    return [t["expr"] for p in _panels() for t in p["targets"]]


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_dashboard_is_grafana_json_with_the_required_panels():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 30
    titles = " | ".join(p["title"].lower() for p in _panels())
    for topic in ("append rate", "append latency", "lock failure", "high-water mark", "replica lag", "fsync latency",
                  "client lag", "client append latency"):
        assert topic in titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels():
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])


def test_dashboard_uses_only_metrics_the_code_exports():
    exported: set[str] = set()
    for root in SOURCES:
        for path in root.rglob("*.py"):
            exported.update(_base(m) for m in re.findall(r"[\"'](waltz_[a-z0-9_]+)[\"']", path.read_text()))
    used = {_base(m) for e in _expressions() for m in re.findall(r"\bwaltz_[a-z0-9_]+", e)}
    assert used, "the dashboard queries no waltz metric"
    assert used - exported == set(), f"not exported by any component: {sorted(used - exported)}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is missing (scripts/bootstrap installs it)")
def test_every_query_parses_as_promql(tmp_path):
    rules = []
    for i, expr in enumerate(_expressions()):
        concrete = expr.replace("$__rate_interval", "5m").replace("$partition", ".*")
        rules.append({"record": f"waltz:dashboard_query_{i}", "expr": concrete})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
