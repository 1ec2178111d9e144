"""The deployment files, checked by the real tools (no Docker engine here).

* docker-compose.yml: Debian's ``docker-compose config`` and the Compose Specification schema.
* Prometheus and Alertmanager configs: ``promtool check config`` / ``check rules``, ``amtool``.
* deploy/k8s: ``kubectl kustomize`` renders it; the PrometheusRule carries every generated rule
  and the dashboard ConfigMaps the generated JSON; the derived files are in sync.
* yamllint over every YAML file of ours.
* Cross-file consistency: every file a config refers to exists (through the compose mounts), and
  every port agrees (compose <-> Prometheus targets <-> collector <-> Tempo <-> Grafana <->
  Dockerfile <-> Kubernetes).
* scripts/stack-local.sh end to end: the real Prometheus and Alertmanager scraping a real specobs
  recorder (slow).

A test whose tool is not installed skips and names the package that provides it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
import pytest
import yaml

from specobs import catalog
from tests._prometheus_server import free_port
from tests._sink_recorder import SinkRecorder

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
RULES = ROOT / "deploy/prometheus/rules/specobs-rules.yml"
PROMETHEUS_CONFIGS = ["deploy/prometheus/prometheus.yml", "deploy/prometheus/prometheus-local.yml"]
ALERTMANAGER_CONFIG = ROOT / "deploy/alertmanager/alertmanager.yml"
COLLECTOR_CONFIG = ROOT / "deploy/otel-collector/config.yaml"
TEMPO_CONFIG = ROOT / "deploy/tempo/tempo.yaml"
GRAFANA_DATASOURCES = ROOT / "deploy/grafana/provisioning/datasources/specobs.yml"
GRAFANA_DASHBOARDS = ROOT / "deploy/grafana/provisioning/dashboards/specobs.yml"
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
K8S = ROOT / "deploy/k8s"
K8S_OVERLAYS = ["deploy/k8s", "deploy/k8s/examples/remote-write"]
STACK_LOCAL = ROOT / "scripts/stack-local.sh"
COMPOSE_SCHEMA = ROOT / "tests/data/compose-spec.json"

#: Debian package of each tool, for the skip message.
_PACKAGES = {
    "docker-compose": "docker-compose",
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "amtool": "prometheus-alertmanager",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "kubectl": "kubectl (with its built-in kustomize)",
    "yamllint": "yamllint",
    "curl": "curl",
}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        package = _PACKAGES.get(name, name)
        pytest.skip(f"`{name}` is not on PATH; install {package} to run this test")
    return path


def run(*argv: str, timeout: float = 60.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = load_yaml(COMPOSE)
    return doc


@pytest.fixture(scope="module")
def kustomized() -> dict[str, list[dict[str, Any]]]:
    """``kubectl kustomize`` of each overlay: path -> rendered objects."""
    kubectl = tool("kubectl")
    out = {}
    for overlay in K8S_OVERLAYS:
        result = run(kubectl, "kustomize", overlay)
        assert result.returncode == 0, f"kubectl kustomize {overlay} failed:\n{result.stderr}"
        out[overlay] = [d for d in yaml.safe_load_all(result.stdout) if d]
    return out


def objects(rendered: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in rendered if o["kind"] == kind}


# -- docker-compose.yml ----------------------------------------------------------------------------


def test_docker_compose_config_accepts_the_compose_file() -> None:
    docker_compose = tool("docker-compose")
    result = run(docker_compose, "-f", str(COMPOSE), "config", "-q")
    assert result.returncode == 0, f"docker-compose config rejected the file:\n{result.stderr}"


def test_compose_file_validates_against_the_compose_spec_schema() -> None:
    import jsonschema

    schema = json.loads(COMPOSE_SCHEMA.read_text(encoding="utf-8"))
    assert "docker-compose 1.29.2" in schema["$comment"]  # where it came from
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(compose()), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors
    )


def test_compose_runs_a_fleet_of_demo_engines_and_the_whole_stack() -> None:
    services = compose()["services"]
    engines = sorted(n for n in services if n.startswith("engine-"))
    assert len(engines) >= 3, engines
    for name in engines:
        svc = services[name]
        assert svc["build"] == {"context": ".", "dockerfile": "Dockerfile"}, name
        env = svc["environment"]
        assert env["SPECOBS_PROMETHEUS_ADDR"] == "0.0.0.0", name  # scraped from another container
        assert env["OTEL_SERVICE_NAME"] == "specobs", name  # the job label on the OTLP path
        # The labels the generated rules group by (MixinConfig.model_label, engine_label).
        assert "model_name=" in env["SPECOBS_LABELS"], name
        assert "serving_engine=" in env["SPECOBS_LABELS"], name
        # The demo measures its own baseline at the served batch (source="demo_measured").
        assert "SPECOBS_BASELINE_TOKENS_PER_SECOND" not in env, name
    for name in ("prometheus", "alertmanager", "grafana", "otel-collector", "tempo"):
        assert name in services, f"docker-compose.yml has no {name} service"
    command = services["prometheus"]["command"]
    assert "--enable-feature=exemplar-storage" in command
    assert "--web.enable-remote-write-receiver" in command


def test_every_image_is_pinned() -> None:
    images = [svc["image"] for svc in compose()["services"].values() if "build" not in svc]
    for path in sorted(K8S.rglob("*.yaml")):
        images += re.findall(r"^\s*image:\s*(\S+)", path.read_text(), re.M)
    base = re.search(r"^FROM (\S+)", DOCKERFILE.read_text(), re.M)
    assert base is not None
    images.append(base.group(1))
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and re.search(r"\d", tag), (
            f"{image} is not pinned to a version tag"
        )


# -- Dockerfile ------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_builds_the_demo_engine_as_documented() -> None:
    instructions = dockerfile_instructions()
    by = {}
    for word, rest in instructions:
        by.setdefault(word, []).append(rest)
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", by["FROM"][0]), by["FROM"]
    runs = " ".join(by["RUN"])
    torch_arg = next(a for a in by["ARG"] if a.startswith("TORCH_VERSION="))
    assert re.fullmatch(r"TORCH_VERSION=\d+\.\d+\.\d+", torch_arg)
    assert "--index-url https://download.pytorch.org/whl/cpu" in runs
    assert '"torch==${TORCH_VERSION}"' in runs
    assert 'pip install ".[demo,otlp]"' in runs
    # torch from the CPU index is installed before the project, so pip keeps it.
    assert runs.index("whl/cpu") < runs.index(".[demo,otlp]")
    user = by["USER"][-1]
    assert user not in ("root", "0"), "the engine must not run as root"
    assert instructions.index(("USER", user)) < instructions.index(("CMD", by["CMD"][0]))
    assert set(by["EXPOSE"][0].split()) == {"8000", "9477"}
    cmd = json.loads(by["CMD"][0])
    assert cmd[:2] == ["specobs", "demo"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert "127.0.0.1:8000/health" in by["HEALTHCHECK"][0]
    assert cmd[cmd.index("--port") + 1] == "8000"


def test_dockerfile_copy_sources_exist_and_reach_the_build_context() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore  # deny by default, then allow what the Dockerfile copies
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for word, rest in dockerfile_instructions():
        if word != "COPY":
            continue
        *sources, _dest = [a for a in shlex.split(rest) if not a.startswith("--")]
        matched = []
        for source in sources:
            hits = list(ROOT.glob(source))
            assert hits or any(c in source for c in "*?["), f"COPY source {source} does not exist"
            matched += hits
            assert source.rstrip("*?") in allowed or source in allowed, (
                f"COPY {source}: .dockerignore keeps it out of the build context"
            )
        assert matched, f"COPY {rest}: no source exists"


# -- Prometheus, Alertmanager ----------------------------------------------------------------------


@pytest.mark.parametrize("config", PROMETHEUS_CONFIGS)
def test_promtool_checks_the_prometheus_config_and_its_rule_files(config: str) -> None:
    result = run(tool("promtool"), "check", "config", config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr
    rule_files = load_yaml(ROOT / config)["rule_files"]
    assert [(ROOT / config).parent / p for p in rule_files] == [RULES]


def test_promtool_checks_the_generated_rules() -> None:
    result = run(tool("promtool"), "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("config", PROMETHEUS_CONFIGS)
def test_prometheus_scrapes_specobs_under_the_job_the_rules_select(config: str) -> None:
    jobs = {j["job_name"]: j for j in load_yaml(ROOT / config)["scrape_configs"]}
    assert 'job="specobs"' in RULES.read_text()
    targets = [t for sc in jobs["specobs"]["static_configs"] for t in sc["targets"]]
    assert targets and all(t.endswith(":9477") for t in targets), targets


def test_amtool_checks_the_alertmanager_config() -> None:
    result = run(tool("amtool"), "check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


# -- Grafana, collector, Tempo ---------------------------------------------------------------------


def test_grafana_links_exemplars_to_the_tempo_datasource() -> None:
    sources = {d["type"]: d for d in load_yaml(GRAFANA_DATASOURCES)["datasources"]}
    destinations = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    # The label the Prometheus sink puts the trace id in (tests/test_prometheus_sink.py reads
    # it back from a real Prometheus).
    assert destinations == [
        {"name": catalog.EXEMPLAR_TRACE_ID_LABEL, "datasourceUid": sources["tempo"]["uid"]}
    ]
    for path in DASHBOARDS:
        variables = json.loads(path.read_text())["templating"]["list"]
        ds = [v for v in variables if v["name"] == "datasource"]
        assert ds and ds[0]["type"] == "datasource" and ds[0]["query"] == "prometheus", path


def test_collector_pipelines_use_only_defined_components() -> None:
    for path in (
        COLLECTOR_CONFIG,
        K8S / "base/otel-collector-config.yaml",
        K8S / "examples/remote-write/otel-collector-config.yaml",
    ):
        config = load_yaml(path)
        service = config["service"]
        assert set(service["extensions"]) <= set(config["extensions"]), path
        used: dict[str, set[str]] = {"receivers": set(), "processors": set(), "exporters": set()}
        for name, pipeline in service["pipelines"].items():
            for kind in used:
                missing = set(pipeline.get(kind, [])) - set(config.get(kind) or {})
                assert not missing, f"{path}: pipeline {name} uses undefined {kind} {missing}"
                used[kind] |= set(pipeline.get(kind, []))
        for kind, names in used.items():
            assert names == set(config.get(kind) or {}), f"{path}: unused {kind}"
        assert set(service["pipelines"]) == {"traces", "metrics"}, path
        # Same names on the OTLP path as on a scrape: no namespace, resource labels kept.
        for name, exporter in config["exporters"].items():
            if name.startswith(("prometheus", "prometheusremotewrite")):
                assert "namespace" not in exporter, f"{path}: {name} would prefix specobs_*"
                assert exporter["resource_to_telemetry_conversion"] == {"enabled": True}
                assert exporter.get("add_metric_suffixes", True), f"{path}: {name}"


def test_collector_drops_metrics_of_engines_prometheus_already_scrapes() -> None:
    services = compose()["services"]
    collector = load_yaml(COLLECTOR_CONFIG)
    condition = collector["processors"]["filter/scraped"]["metrics"]["metric"][0]
    assert condition == 'resource.attributes["specobs.scraped"] == "true"'
    scraped = {
        t.split(":")[0]
        for j in load_yaml(ROOT / PROMETHEUS_CONFIGS[0])["scrape_configs"]
        if j["job_name"] == "specobs"
        for sc in j["static_configs"]
        for t in sc["targets"]
    }
    for name, svc in services.items():
        if not name.startswith("engine-"):
            continue
        env = svc["environment"]
        exporters = env["SPECOBS_EXPORTERS"].split(",")
        marked = "specobs.scraped=true" in env["OTEL_RESOURCE_ATTRIBUTES"]
        assert ("prometheus" in exporters) == (name in scraped), (
            f"{name}: exports {exporters} but is {'' if name in scraped else 'not '}scraped"
        )
        assert marked == (name in scraped and "otlp" in exporters), name
        assert f"service.instance.id={name}" in env["OTEL_RESOURCE_ATTRIBUTES"], name


# -- files a config refers to, ports ---------------------------------------------------------------


def mounts(service: dict[str, Any]) -> dict[PurePosixPath, Path]:
    """Container path -> host path of the service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            out[PurePosixPath(target)] = (ROOT / source).resolve()
    return out


def host_path(service: dict[str, Any], container_path: str) -> Path | None:
    path = PurePosixPath(container_path)
    for target, source in mounts(service).items():
        if path == target or target in path.parents:
            return source / path.relative_to(target)
    return None


def test_every_file_a_config_refers_to_exists() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        for target, source in mounts(svc).items():
            assert source.exists(), f"{name}: mounts {source} (at {target}), which does not exist"
        if "build" in svc:
            context = ROOT / svc["build"]["context"]
            assert (context / svc["build"]["dockerfile"]).is_file(), name
        # Every absolute path a command line names must come from a mount (or the image).
        for arg in svc.get("command", []):
            value = arg.split("=", 1)[-1]
            if value.startswith("/etc/"):
                resolved = host_path(svc, value)
                assert resolved is not None and resolved.is_file(), f"{name}: {arg} has no file"

    prometheus = services["prometheus"]
    config = host_path(prometheus, "/etc/prometheus/prometheus.yml")
    assert config == ROOT / PROMETHEUS_CONFIGS[0]
    for rule_file in load_yaml(config)["rule_files"]:
        in_container = PurePosixPath("/etc/prometheus") / rule_file
        assert host_path(prometheus, str(in_container)) == RULES, rule_file

    grafana = services["grafana"]
    provisioning = {
        "datasources": host_path(grafana, "/etc/grafana/provisioning/datasources"),
        "dashboards": host_path(grafana, "/etc/grafana/provisioning/dashboards"),
    }
    assert provisioning["datasources"] == GRAFANA_DATASOURCES.parent
    assert provisioning["dashboards"] == GRAFANA_DASHBOARDS.parent
    for provider in load_yaml(GRAFANA_DASHBOARDS)["providers"]:
        folder = host_path(grafana, provider["options"]["path"])
        assert folder == ROOT / "dashboards", provider
        assert sorted(folder.glob("*.json")) == DASHBOARDS and DASHBOARDS
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    home_path = host_path(grafana, home)
    assert home_path is not None and home_path.is_file(), home


def listening(service: dict[str, Any]) -> set[int]:
    """Container ports a compose service declares (published or exposed)."""
    ports = {int(str(p).split(":")[-1].split("/")[0]) for p in service.get("ports", [])}
    return ports | {int(p) for p in service.get("expose", [])}


def host_port(endpoint: str) -> tuple[str, int]:
    endpoint = re.sub(r"^\w+://", "", endpoint).split("/")[0]
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def test_every_port_matches_across_files() -> None:
    services = compose()["services"]

    def assert_served(endpoint: str, where: str) -> None:
        host, port = host_port(endpoint)
        assert host in services, f"{where}: {endpoint} names no compose service"
        declared = sorted(listening(services[host]))
        assert port in declared, f"{where}: {endpoint}, but {host} declares only ports {declared}"

    # Prometheus scrape targets and Alertmanager.
    prom = load_yaml(ROOT / PROMETHEUS_CONFIGS[0])
    for job in prom["scrape_configs"]:
        for sc in job["static_configs"]:
            for target in sc["targets"]:
                if target.startswith("localhost:"):
                    assert target == "localhost:9090"  # itself: Prometheus's default port
                    assert 9090 in listening(services["prometheus"])
                else:
                    assert_served(target, f"prometheus.yml job {job['job_name']}")
    for am in prom["alerting"]["alertmanagers"]:
        for target in am["static_configs"][0]["targets"]:
            assert_served(target, "prometheus.yml alerting")

    # Collector: what it listens on is what compose declares, where it sends is served.
    collector = load_yaml(COLLECTOR_CONFIG)
    own = {
        host_port(p["endpoint"])[1] for p in collector["receivers"]["otlp"]["protocols"].values()
    }
    own.add(host_port(collector["service"]["telemetry"]["metrics"]["address"])[1])
    own.add(host_port(collector["extensions"]["health_check"]["endpoint"])[1])
    assert own == listening(services["otel-collector"])
    assert_served(collector["exporters"]["otlp/tempo"]["endpoint"], "collector otlp/tempo")
    remote_write = collector["exporters"]["prometheusremotewrite"]["endpoint"]
    assert_served(remote_write, "collector remote write")
    assert remote_write.endswith("/api/v1/write")

    # Tempo.
    tempo = load_yaml(TEMPO_CONFIG)
    tempo_ports = {tempo["server"]["http_listen_port"]} | {
        host_port(p["endpoint"])[1]
        for p in tempo["distributor"]["receivers"]["otlp"]["protocols"].values()
    }
    assert tempo_ports <= listening(services["tempo"])

    # Grafana datasources.
    for ds in load_yaml(GRAFANA_DATASOURCES)["datasources"]:
        assert_served(ds["url"], f"grafana datasource {ds['name']}")

    # Engines: the Dockerfile's ports, the exporter port, the OTLP endpoint.
    dockerfile = dict(dockerfile_instructions())
    exposed = {int(p) for p in dockerfile["EXPOSE"].split()}
    for name, svc in services.items():
        if not name.startswith("engine-"):
            continue
        env = svc["environment"]
        assert listening(svc) <= exposed, name
        assert int(env["SPECOBS_PROMETHEUS_PORT"]) in exposed
        assert_served(env["OTEL_EXPORTER_OTLP_ENDPOINT"], f"{name} OTEL_EXPORTER_OTLP_ENDPOINT")
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
        assert host_port(env["OTEL_EXPORTER_OTLP_ENDPOINT"])[1] == 4317  # the gRPC receiver

    # Published host ports never collide.
    published = [str(p).rsplit(":", 1)[0] for s in services.values() for p in s.get("ports", [])]
    assert len(published) == len(set(published)), published


def test_kubernetes_ports_match(kustomized: dict[str, list[dict[str, Any]]]) -> None:
    rendered = kustomized["deploy/k8s"]
    deployment = objects(rendered, "Deployment")["specobs-otel-collector"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service = objects(rendered, "Service")["specobs-otel-collector"]
    for port in service["spec"]["ports"]:
        assert ports[port["targetPort"]] == port["port"], port
    config_map = next(
        o
        for o in rendered
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("specobs-otel-collector")
    )
    mounted = deployment["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    assert mounted == config_map["metadata"]["name"]  # kustomize rewrote the hashed name
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    listens = {
        host_port(p["endpoint"])[1] for p in config["receivers"]["otlp"]["protocols"].values()
    }
    listens.add(host_port(config["exporters"]["prometheus"]["endpoint"])[1])
    listens.add(host_port(config["service"]["telemetry"]["metrics"]["address"])[1])
    listens.add(host_port(config["extensions"]["health_check"]["endpoint"])[1])
    assert listens == set(ports.values())
    monitors = objects(rendered, "PodMonitor")
    for endpoint in monitors["specobs-otel-collector"]["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in ports


# -- Kubernetes ------------------------------------------------------------------------------------


def test_kustomize_renders_the_generated_rules(
    kustomized: dict[str, list[dict[str, Any]]],
) -> None:
    generated = load_yaml(RULES)
    alerts = {r["alert"] for g in generated["groups"] for r in g["rules"] if "alert" in r}
    assert len(alerts) >= 5
    for overlay, rendered in kustomized.items():
        rules = objects(rendered, "PrometheusRule")
        assert list(rules) == ["specobs-rules"], overlay
        spec = rules["specobs-rules"]["spec"]
        assert spec == generated, f"{overlay}: the PrometheusRule differs from {RULES.name}"
        rendered_alerts = {r["alert"] for g in spec["groups"] for r in g["rules"] if "alert" in r}
        assert rendered_alerts == alerts


def test_kustomize_renders_the_generated_dashboards(
    kustomized: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay, rendered in kustomized.items():
        maps = [
            o
            for o in rendered
            if o["kind"] == "ConfigMap" and o["metadata"].get("labels", {}).get("grafana_dashboard")
        ]
        assert len(maps) == len(DASHBOARDS), overlay
        found = {}
        for cm in maps:
            assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
            ((key, text),) = cm["data"].items()
            found[key] = text
        for path in DASHBOARDS:
            assert found[path.name] == path.read_text(encoding="utf-8"), (
                f"{overlay}: ConfigMap {path.name} differs from dashboards/{path.name}; "
                "run: specobs generate"
            )


def test_podmonitor_selects_inference_pods_as_job_specobs(
    kustomized: dict[str, list[dict[str, Any]]],
) -> None:
    monitor = objects(kustomized["deploy/k8s"], "PodMonitor")["specobs-inference"]
    spec = monitor["spec"]
    assert spec["selector"] == {"matchLabels": {"app.kubernetes.io/component": "inference"}}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "specobs-metrics"
    assert {"action": "replace", "targetLabel": "job", "replacement": "specobs"} in endpoint[
        "relabelings"
    ]
    collector = objects(kustomized["deploy/k8s"], "PodMonitor")["specobs-otel-collector"]
    assert collector["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    for rendered in kustomized.values():  # namespace-agnostic: `kubectl apply -n NS -k` picks it
        assert all("namespace" not in o["metadata"] for o in rendered)


def test_remote_write_overlay_pushes_and_scrapes_nothing_dead(
    kustomized: dict[str, list[dict[str, Any]]],
) -> None:
    rendered = kustomized["deploy/k8s/examples/remote-write"]
    config_map = next(
        o
        for o in rendered
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("specobs-otel-collector")
    )
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["service"]["pipelines"]["metrics"]["exporters"] == ["prometheusremotewrite"]
    env = {
        e["name"]: e["value"]
        for e in objects(rendered, "Deployment")["specobs-otel-collector"]["spec"]["template"][
            "spec"
        ]["containers"][0]["env"]
    }
    assert env["REMOTE_WRITE_URL"].startswith("http")
    ports = [
        e["port"]
        for e in objects(rendered, "PodMonitor")["specobs-otel-collector"]["spec"][
            "podMetricsEndpoints"
        ]
    ]
    assert "prom-export" not in ports
    # A JSON patch that appends one entry (tests/test_fleet_deploy.py applies it).
    (op,) = load_yaml(K8S / "examples/remote-write/prometheus-remote-write.yaml")
    assert op["op"] == "add" and op["path"] == "/spec/remoteWrite/-"
    remote = op["value"]
    assert remote["url"].startswith("http") and remote["sendExemplars"] is True


def test_derived_k8s_files_are_in_sync_with_the_generated_files() -> None:
    from specobs.mixin import check_all

    drifted = [p for p in check_all(ROOT) if p.startswith("deploy/k8s/")]
    assert not drifted, (
        "deploy/k8s/base is out of date with the generated files: "
        + ", ".join(drifted)
        + "\nRegenerate: specobs generate"
    )


def test_render_deploy_is_pure_and_says_what_it_needs() -> None:
    from specobs.mixin._deploy import render_deploy

    generated = {
        "deploy/prometheus/rules/specobs-rules.yml": "# header\ngroups:\n- name: g\n  rules:\n"
        "  - record: a:b:c\n    expr: |-\n      sum(x)\n\n      / 2\n",
        "dashboards/one.json": '{"uid": "one"}\n',
        "docs/metrics.md": "ignored\n",
    }
    files = render_deploy(generated)
    assert files == render_deploy(dict(generated))
    assert sorted(files) == [
        "deploy/k8s/base/dashboards/kustomization.yaml",
        "deploy/k8s/base/dashboards/one.json",
        "deploy/k8s/base/prometheusrule.yaml",
    ]
    rule = yaml.safe_load(files["deploy/k8s/base/prometheusrule.yaml"])
    assert rule["spec"] == yaml.safe_load(generated["deploy/prometheus/rules/specobs-rules.yml"])
    assert files["deploy/k8s/base/dashboards/one.json"] == '{"uid": "one"}\n'
    with pytest.raises(KeyError, match=r"specobs-rules\.yml"):
        render_deploy({"dashboards/one.json": "{}"})
    with pytest.raises(KeyError, match=r"dashboards/\*\.json"):
        render_deploy({"deploy/prometheus/rules/specobs-rules.yml": "groups: []\n"})
    with pytest.raises(ValueError, match="groups"):
        render_deploy({**generated, "deploy/prometheus/rules/specobs-rules.yml": "x: 1\n"})


def test_generate_rewrites_the_derived_k8s_files_and_removes_stale_copies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specobs.cli import main

    assert main(["generate", "--root", str(tmp_path)]) == 0
    assert main(["generate", "--root", str(tmp_path), "--check"]) == 0
    for path in DASHBOARDS:
        copy = tmp_path / "deploy/k8s/base/dashboards" / path.name
        assert copy.read_text() == path.read_text()
    assert (tmp_path / "deploy/k8s/base/prometheusrule.yaml").exists()
    # A copy whose dashboard is gone (renamed) and a changed copy are both drift ...
    stale = tmp_path / "deploy/k8s/base/dashboards/old.json"
    stale.write_text("{}")
    changed = tmp_path / "deploy/k8s/base/dashboards" / DASHBOARDS[0].name
    changed.write_text("{}\n")
    assert main(["generate", "--root", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"deploy/k8s/base/dashboards/{DASHBOARDS[0].name}\n" in err
    assert "None of them" not in err
    assert main(["generate", "--root", str(tmp_path), "--check", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {"check": True, "drifted": sorted([
        f"deploy/k8s/base/dashboards/{DASHBOARDS[0].name}", "deploy/k8s/base/dashboards/old.json"])}
    # ... and generate rewrites the one and removes the other.
    assert main(["generate", "--root", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "written": [f"deploy/k8s/base/dashboards/{DASHBOARDS[0].name}"],
        "removed": ["deploy/k8s/base/dashboards/old.json"]}
    assert not stale.exists()
    assert changed.read_text() == DASHBOARDS[0].read_text()
    assert main(["generate", "--root", str(tmp_path), "--check"]) == 0


def test_generate_check_outside_a_checkout_says_where_it_looked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specobs.cli import main

    assert main(["generate", "--root", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/metrics.md (missing)" in err
    assert f"None of them is under {tmp_path.resolve()}: run it from the checkout's root" in err


# -- yamllint --------------------------------------------------------------------------------------


def test_yamllint_is_clean() -> None:
    result = run(
        tool("yamllint"), "--strict", "-c", ".yamllint", "docker-compose.yml", "deploy", ".yamllint"
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- scripts/stack-local.sh ------------------------------------------------------------------------


def test_stack_local_help_and_bad_flags() -> None:
    result = run("bash", str(STACK_LOCAL), "--help")
    assert result.returncode == 0, result.stderr
    for option in ("--target", "--demo", "--prometheus-port", "--alertmanager-port", "--dir"):
        assert option in result.stdout
    for bad, message in (
        (["--bogus"], "unknown option '--bogus'"),
        (["--target", "nope"], "--target expects HOST:PORT"),
        (["--prometheus-port", "99999"], "a port must be 1-65535"),
        (["--scrape-interval", "soon"], "--scrape-interval expects a Prometheus duration"),
        (["--", "--device", "cuda"], "arguments after -- are for --demo"),
    ):
        result = run("bash", str(STACK_LOCAL), *bad)
        assert result.returncode == 2 and message in result.stderr, (bad, result.stderr)


class _Recorder(SinkRecorder):
    """A real specobs observer and PrometheusSink, fed speculative cycles on a fake GPU."""

    def __init__(self) -> None:
        super().__init__(
            name="deploy-test-engine",
            pool_size=1024,
            max_draft_length=4,
            labels={"model": "tiny", "engine": "fake"},
            pause_seconds=0.005,
        )

    def step(self) -> None:
        self.cycle([3, 1], draft_length=4)


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    try:
        import specobs

        specobs.PrometheusSink  # noqa: B018 - prometheus_client installed?
    except (ImportError, AttributeError) as exc:
        pytest.skip(f"needs specobs's Prometheus sink ({exc}): pip install -e '.[prometheus]'")
    with _Recorder() as rec:
        yield rec


def _start_script(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Any:
    """Start ``argv`` from the repository root, its output in ``log``, in a session of its own
    so that a failing test can still end everything it started."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def _wait(predicate: Any, what: str, timeout: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(
        f"{what} within {timeout}s; last: {last!r}\n--- script output ---\n"
        + (log.read_text() if log.exists() else "")
    )


@pytest.mark.slow
def test_stack_local_runs_prometheus_and_alertmanager_against_a_specobs_endpoint(
    recorder: _Recorder, tmp_path: Path
) -> None:
    tool("prometheus")
    tool("prometheus-alertmanager")
    tool("curl")
    state = tmp_path / "state"
    log = tmp_path / "stack-local.out"
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS", "ALERTMANAGER")}
    for attempt in range(3):  # a free port can be taken again before the server binds it
        prometheus_port, alertmanager_port = free_port(), free_port()
        argv = [
            "bash",
            str(STACK_LOCAL),
            "--target",
            recorder.target,
            "--prometheus-port",
            str(prometheus_port),
            "--alertmanager-port",
            str(alertmanager_port),
            "--scrape-interval",
            "1s",
            "--dir",
            str(state),
        ]
        script = _start_script(argv, log, env)
        _wait(
            lambda p=script: p.poll() is not None or "stack is up" in log.read_text(),
            "the script neither reported the stack up nor exited",
            60,
            log,
        )
        if script.poll() is None or "address already in use" not in log.read_text() or attempt == 2:
            break
    api = httpx.Client(base_url=f"http://127.0.0.1:{prometheus_port}", timeout=5)
    try:
        text = log.read_text()
        assert script.poll() is None and "stack is up" in text, text
        assert f"Prometheus    http://127.0.0.1:{prometheus_port}" in text
        assert f"Alertmanager  http://127.0.0.1:{alertmanager_port}" in text

        def query(promql: str) -> list[Any]:
            result: list[Any] = api.get("/api/v1/query", params={"query": promql}).json()["data"][
                "result"
            ]
            return result

        series = _wait(
            lambda: query("specobs_cycles_total"),
            "Prometheus did not get specobs_cycles_total",
            40,
            log,
        )
        assert series[0]["metric"]["job"] == "specobs"
        assert series[0]["metric"]["instance"] == recorder.target
        assert float(series[0]["value"][1]) > 0

        generated = load_yaml(RULES)
        groups = api.get("/api/v1/rules").json()["data"]["groups"]
        assert {g["name"] for g in groups} == {g["name"] for g in generated["groups"]}
        loaded = {r["name"] for g in groups for r in g["rules"]}
        wanted = {r.get("alert") or r["record"] for g in generated["groups"] for r in g["rules"]}
        assert loaded == wanted
        assert all(Path(g["file"]).resolve() == RULES for g in groups)
        # The recording rules evaluate against the scraped data.
        _wait(lambda: query("instance:specobs_up:max"), "no recording rule output", 20, log)

        managers = api.get("/api/v1/alertmanagers").json()["data"]["activeAlertmanagers"]
        assert managers == [{"url": f"http://127.0.0.1:{alertmanager_port}/api/v2/alerts"}]
        status = httpx.get(f"http://127.0.0.1:{alertmanager_port}/api/v2/status", timeout=5)
        assert status.json()["cluster"]["status"] == "disabled"  # no gossip port opened
        flags = api.get("/api/v1/status/flags").json()["data"]
        assert flags["enable-feature"] == "exemplar-storage"
        assert flags["web.listen-address"] == f"127.0.0.1:{prometheus_port}"
    finally:
        api.close()
        # Ctrl-C, as a user would (SIGTERM where this run ignores SIGINT: bash could not trap it).
        sig = signal.SIGINT
        if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
            sig = signal.SIGTERM
        if script.poll() is None:
            script.send_signal(sig)
        try:
            code = script.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait(10)
            raise
        finally:
            try:  # anything of the script's session still alive is a leak; end it, then fail
                os.killpg(script.pid, 0)
                leaked = True
                os.killpg(script.pid, signal.SIGKILL)
            except ProcessLookupError:
                leaked = False
    assert code == (130 if sig == signal.SIGINT else 143), log.read_text()
    assert "stopped alertmanager prometheus" in log.read_text()
    assert not leaked, "the script left processes running"
    assert (state / "prometheus.yml").is_file() and (state / "prometheus.log").is_file()


@pytest.mark.slow
@pytest.mark.timeout(420)  # above its own 360 s wait for a demo that may train first
def test_stack_local_starts_the_demo_itself(tmp_path: Path) -> None:
    # The script runs `specobs` from PATH, as a user's shell does: the one installed beside the
    # interpreter running these tests comes first, as with its virtual environment activated
    # (else another interpreter's `specobs` would serve a demo of another tree, or none).
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if (importlib.util.find_spec("specobs.demo._cli") is None
            or shutil.which("specobs", path=path) is None):
        pytest.skip(
            "`specobs demo` is not there yet (specobs.demo._cli); "
            "the recorder-based test above covers the script meanwhile"
        )
    tool("prometheus")
    tool("curl")
    metrics_port, prometheus_port, completions_port = free_port(), free_port(), free_port()
    log = tmp_path / "stack-local.out"
    argv = [
        "bash",
        str(STACK_LOCAL),
        "--no-alertmanager",
        "--demo",
        "400",
        "--target",
        f"127.0.0.1:{metrics_port}",
        "--prometheus-port",
        str(prometheus_port),
        "--scrape-interval",
        "1s",
        "--dir",
        str(tmp_path / "state"),
        "--",
        "--port",
        str(completions_port),
        "--device",
        "cpu",
    ]
    script = _start_script(argv, log, env={**os.environ, "PATH": path})
    api = httpx.Client(base_url=f"http://127.0.0.1:{prometheus_port}", timeout=5)
    try:

        def cycles() -> Any:
            return api.get("/api/v1/query", params={"query": "specobs_cycles_total"}).json()[
                "data"
            ]["result"]

        # Generous: if no earlier test trained the demo's weights, this demo trains them first.
        series = _wait(cycles, "Prometheus got no specobs_cycles_total from the demo", 360, log)
        assert series[0]["metric"]["job"] == "specobs"
    finally:
        api.close()
        if script.poll() is None:
            script.send_signal(signal.SIGTERM)
        try:
            script.wait(30)
        finally:
            try:
                os.killpg(script.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("module", ["yaml", "grafanalib"])
def test_generate_without_its_extra_names_the_extra_in_one_line(module: str) -> None:
    """grafanalib and pyyaml are the 'gen' extra: without either, one line on stderr names it
    and the exit status is 1 -- no traceback."""
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from specobs.cli import main\n"
            "sys.exit(main(['generate', '--check']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=str(ROOT))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'specobs[gen]'" in lines[0], result.stderr
