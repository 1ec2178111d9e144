"""Kubernetes as kube-prometheus-stack applies it: the PodMonitor and PrometheusRule carry its
`release` label and watch every namespace; the remote-write patch appends to an existing list."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "deploy/k8s/examples/remote-write/prometheus-remote-write.yaml"


def _kubectl(*args: str) -> str:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on PATH")
    result = subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=120,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_kustomize_selects_under_kube_prometheus_stack_defaults() -> None:
    docs = _docs(_kubectl("kustomize", str(ROOT / "deploy/k8s")))
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    rule = kinds[("PrometheusRule", "specobs-rules")]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    monitor = kinds[("PodMonitor", "specobs-inference")]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    # The release label must not leak into selectors (it would select nothing).
    assert "release" not in monitor["spec"]["selector"]["matchLabels"]


def test_remote_write_patch_appends_to_an_existing_list(tmp_path: Path) -> None:
    prometheus = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": "kube-prometheus-stack-prometheus"},
        "spec": {"remoteWrite": [{"url": "http://existing.example/api/v1/write"}]},
    }
    path = tmp_path / "prometheus.yaml"
    path.write_text(yaml.safe_dump(prometheus))
    out = _kubectl("patch", "--local", "-f", str(path), "--type", "json", "--patch-file",
                   str(PATCH), "-o", "yaml")  # fmt: skip
    urls = [entry["url"] for entry in yaml.safe_load(out)["spec"]["remoteWrite"]]
    assert urls[0] == "http://existing.example/api/v1/write" and len(urls) == 2
    entry = yaml.safe_load(out)["spec"]["remoteWrite"][1]
    keep = entry["writeRelabelConfigs"][0]
    assert keep["sourceLabels"] == ["__name__", "job"] and keep["action"] == "keep"
