"""Render the helm/waltz chart offline (Helm's Go SDK through helm-python-sdk) and pick objects from the result."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "waltz"
VALUE_SETS = sorted(CHART.glob("ci/*-values.yaml"))
KUBE_VERSION = "1.30.0"
RELEASE, NAMESPACE = "rel", "ns"


def helm() -> Any:
    """The helm_python module, quiet."""
    import helm_python

    helm_python.disable_logging()
    return helm_python


def values_of(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def render(values: dict[str, Any], upgrade: bool = False) -> dict[str, str]:
    """Template path -> rendered text, as `helm install` (or upgrade) would send it."""
    chart = helm().Chart.load(str(CHART))
    try:
        rendered: dict[str, str] = chart.render(
            values, name=RELEASE, namespace=NAMESPACE, is_install=not upgrade, is_upgrade=upgrade
        )
    finally:
        chart.close()
    return rendered


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object rendered (NOTES.txt and empty documents left out)."""
    out = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        out.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return out


def find(objects: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The one object of a kind whose name ends with name_suffix."""
    hits = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} {kind} objects named *{name_suffix}")
    return hits[0]


def containers(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The containers and init containers of a workload's pod template."""
    spec = obj["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def config_file(objects: list[dict[str, Any]], component: str) -> str:
    """The configuration file a component's ConfigMap carries (storage.yaml, server.yaml, or the Job's cli.yaml)."""
    return str(find(objects, "ConfigMap", f"-{component}")["data"][f"{component}.yaml"])
