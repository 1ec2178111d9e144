"""``specobs demo`` end to end on CPU: the real command as a subprocess, scraped by a real
Prometheus, with its terminal output; and bad flags."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from specobs.cli import main
from tests._prometheus_server import free_port
from tests.test_demo_server import QUICK_TRAINING, WEIGHTS_DIR, quick_engine

ROOT = Path(__file__).resolve().parent.parent
DURATION_SECONDS = 20


@pytest.fixture(scope="module")
def weights() -> Path:
    """The demo's default models (shipped with specobs), as the command loads them."""
    quick_engine()
    assert QUICK_TRAINING is None  # the demo's default training, as the command uses
    return WEIGHTS_DIR


def _demo_env() -> dict[str, str]:
    """This environment without its SPECOBS_ and OTEL_ settings, importing specobs from here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECOBS_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


@contextlib.contextmanager
def _running_demo(
    args: list[str], log: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    """``specobs demo args`` started with its output in ``log``; killed on the way out if it
    still runs."""
    argv = [sys.executable, "-m", "specobs.cli", "demo", *args]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_demo_runs_serves_and_is_scraped_by_prometheus(
    weights: Path, prometheus_server: Callable[..., Any], tmp_path: Path
) -> None:
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "demo.out"
    args = [
        "--duration", str(DURATION_SECONDS),
        "--port", str(port), "--metrics-port", str(metrics_port), "--plain",
        "--cache-dir", str(weights), "--concurrency", "3",
    ]  # fmt: skip
    with _running_demo(args, log, _demo_env()) as proc:
        server = prometheus_server([f"127.0.0.1:{metrics_port}"])
        cycles = server.wait_for(
            "specobs_cycles_total", lambda r: r and float(r[0]["value"][1]) > 0,
            timeout_seconds=90,
        )  # fmt: skip
        # The labels the generated rules and dashboards group by (vLLM's `engine` is an index).
        assert cycles[0]["metric"]["model_name"] == "specobs-demo"
        assert cycles[0]["metric"]["serving_engine"] == "specobs-demo"
        assert "model" not in cycles[0]["metric"] and "engine" not in cycles[0]["metric"]
        server.wait_for(
            "specobs_emitted_tokens_total", lambda r: r and float(r[0]["value"][1]) > 0,
            timeout_seconds=20,
        )  # fmt: skip
        phases = server.wait_for(
            'count by (phase) (specobs_phase_duration_seconds_count{clock="host"})',
            lambda r: len(r) == 3, timeout_seconds=20,
        )  # fmt: skip
        assert {r["metric"]["phase"] for r in phases} == {"draft", "verify", "bookkeeping"}
        baseline = server.wait_for("specobs_baseline_sequence_tokens_per_second",
                                   timeout_seconds=20)
        assert float(baseline[0]["value"][1]) > 0, baseline
        assert baseline[0]["metric"]["source"] == "demo_measured", baseline
        code = proc.wait(DURATION_SECONDS + 60)
    text = log.read_text()
    assert code == 0, text
    assert "loading the demo target and draft head shipped with specobs" in text
    assert "first run" not in text
    assert "baseline is measured while serving" in text
    assert "(measured while serving, same batch): speedup" in text
    assert f"http://127.0.0.1:{port}/v1/completions" in text
    assert f"http://127.0.0.1:{metrics_port}/metrics" in text
    assert "job_name: specobs" in text and "docker compose up" in text
    # The periodic lines and the final summary show the breakdown by phase.
    lines = [line for line in text.splitlines() if line.startswith("[")]
    assert lines, text
    assert "draft" in lines[-1] and "verify" in lines[-1] and "bookkeeping" in lines[-1]
    assert "cycles/s" in lines[-1] and "acceptance" in lines[-1]
    final = text[text.index("specobs demo ran"):]
    assert "acceptance rate" in final and "mean acceptance length" in final
    assert "host: draft" in final and "gpu : n/a" in final
    assert "measured while serving, same batch" in final


def _demo_with_a_taken_port(
    weights: Path, flag: str
) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run the demo with ``flag`` (``--port`` or ``--metrics-port``) on a port another socket
    holds, the other port free; returns that port and the finished process."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        ports = {"--port": "0", "--metrics-port": "0", flag: str(port)}
        result = subprocess.run(
            [sys.executable, "-m", "specobs.cli", "demo", "--duration", "5",
             *(a for kv in ports.items() for a in kv), "--plain", "--cache-dir", str(weights),
             "--baseline-tokens-per-second", "50"],
            capture_output=True, text=True, timeout=120, env=_demo_env(), cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    return port, result


def test_demo_stops_with_a_clear_error_when_its_port_is_taken(weights: Path) -> None:
    port, result = _demo_with_a_taken_port(weights, "--port")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"cannot serve completions on 127.0.0.1:{port}" in result.stderr


def test_a_taken_metrics_port_names_the_flag_that_chose_it(weights: Path) -> None:
    port, result = _demo_with_a_taken_port(weights, "--metrics-port")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"cannot serve specobs metrics on port {port}: " in result.stderr, result.stderr
    assert "pick another --metrics-port" in result.stderr
    assert "SPECOBS_PROMETHEUS_PORT" not in result.stderr


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--duration", "-5"], "expected a number > 0"),
        (["--duration", "soon"], "expected a number > 0"),
        (["--concurrency", "0"], "expected an integer >= 1, got 0"),
        (["--port", "70000"], "expected a port number 0..65535"),
        (["--metrics-port", "x"], "expected a port number"),
        (["--k", "0"], "expected an integer >= 1"),
        (["--k", "99"], "expected a draft length 1..16"),
        (["--device", "tpu"], "invalid choice"),
        (["--fault", "melt"], "invalid choice"),
        (["--seed", "-1"], "expected an integer >= 0"),
        (["--baseline-tokens-per-second", "0"], "expected a number > 0"),
        (["--max-requests", "0"], "expected an integer >= 1, got 0"),
        (["--max-request-bytes", "lots"], "bad size 'lots'"),
        (["--max-request-bytes", "0"], "size must be at least 1 byte"),
        (["--read-timeout", "0"], "expected a number > 0"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_flags_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", *argv])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_first_run_serves_while_the_draft_head_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cold cache: the command serves once the target is trained, trains the draft head in the
    background, finishes and caches it by the end, and the next start loads it. (Tiny training
    settings stand in for the default's 75 s; the path through the command is the same.)"""
    import signal

    from specobs.demo import TrainSettings
    from specobs.demo import _cli as demo_cli

    tiny = TrainSettings(target_steps=20, distill_sequences=16, draft_steps=60)
    monkeypatch.setattr(demo_cli, "_train_settings", lambda quick: tiny)
    cache = tmp_path / "weights"
    argv = [
        "demo", "--duration", "3", "--plain", "--cache-dir", str(cache), "--concurrency", "2",
        "--baseline-tokens-per-second", "100",
    ]  # fmt: skip
    old_handler = signal.getsignal(signal.SIGTERM)
    try:
        first = main([*argv, "--port", str(free_port()), "--metrics-port", str(free_port())])
        text = capsys.readouterr().out
        second = main([*argv, "--port", str(free_port()), "--metrics-port", str(free_port())])
        again = capsys.readouterr().out
    finally:
        signal.signal(signal.SIGTERM, old_handler)
    assert first == 0, text
    assert "first run: training the demo target" in text
    assert "target trained in" in text and "the draft head trains next" in text
    assert "draft head training in the background (60 steps" in text
    assert "draft head trained and cached in" in text
    assert len(list(cache.glob("demo-*.pt"))) == 1
    assert "specobs demo ran" in text and "host: draft" in text
    assert second == 0, again
    assert "loading the demo target and draft head from the weight cache" in again
    assert "draft head training" not in again


# -- the admin endpoints and the server's limits ----------------------------------------------

ADMIN_TOKEN = "cli-admin-token-0f1e2d3c4b5a6978"


def test_default_seed_is_the_shipped_models_seed() -> None:
    import argparse

    from specobs.demo import _cli as demo_cli
    from specobs.demo._train import DEFAULT_SEED

    parser = argparse.ArgumentParser()
    demo_cli.add_arguments(parser)
    assert parser.parse_args([]).seed == DEFAULT_SEED


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, None, None),
        (None, "", None),
        (None, "   ", None),
        (None, ADMIN_TOKEN, ADMIN_TOKEN),
        ("flag-token-0123456789", ADMIN_TOKEN, "flag-token-0123456789"),
        ("", ADMIN_TOKEN, None),  # an empty flag turns a token in the environment off
    ],
)
def test_admin_token_comes_from_the_flag_then_the_environment(
    flag: str | None, env: str | None, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from specobs.demo import _cli as demo_cli

    if env is None:
        monkeypatch.delenv(demo_cli.SPECOBS_DEMO_ADMIN_TOKEN, raising=False)
    else:
        monkeypatch.setenv(demo_cli.SPECOBS_DEMO_ADMIN_TOKEN, env)
    assert demo_cli._admin_token(argparse.Namespace(admin_token=flag)) == expected


@pytest.mark.parametrize("where", ["flag", "env"])
def test_a_short_admin_token_exits_2_before_anything_starts(
    where: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "--port", "1", "--cache-dir", "/nonexistent"]
    if where == "flag":
        argv += ["--admin-token", "secret"]
    else:
        monkeypatch.setenv("SPECOBS_DEMO_ADMIN_TOKEN", "secret")
    assert main(argv) == 2
    err = capsys.readouterr().err
    name = "--admin-token" if where == "flag" else "SPECOBS_DEMO_ADMIN_TOKEN"
    assert f"{name} must have at least 16 characters, got 6" in err


def test_the_command_wires_the_admin_token_and_the_limits(weights: Path, tmp_path: Path) -> None:
    port = free_port()
    env = _demo_env()
    env["SPECOBS_DEMO_ADMIN_TOKEN"] = ADMIN_TOKEN
    log = tmp_path / "demo.out"
    args = [
        "--duration", "60", "--port", str(port),
        "--metrics-port", "0", "--plain", "--cache-dir", str(weights), "--no-load",
        "--baseline-tokens-per-second", "50", "--max-request-bytes", "4KiB",
        "--max-requests", "3",
    ]  # fmt: skip
    import httpx

    with _running_demo(args, log, env) as proc:
        deadline = time.monotonic() + 90
        while "serving completions" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/admin/fault").status_code == 401
            r = client.get("/admin/fault", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert r.status_code == 200 and r.json()["fault"] is None
            r = client.post("/v1/completions", json={"prompt": "a " * 4096, "max_tokens": 2})
            assert r.status_code == 413 and "limit of 4096 bytes" in r.json()["error"]["message"]
        proc.terminate()  # SIGTERM: shut down as cleanly as Ctrl-C
        code = proc.wait(60)
    text = log.read_text()
    assert code == 0, text
    assert f"admin endpoints on {base}/admin/fault" in text
    assert ADMIN_TOKEN not in text, "the token must not be printed"


def test_the_container_image_leaves_the_admin_endpoints_off() -> None:
    """No token in the image: /admin/* answers 404 in every container started from it (a token
    can still be given at `docker run -e SPECOBS_DEMO_ADMIN_TOKEN=...`)."""
    text = (ROOT / "Dockerfile").read_text()
    instructions = [line for line in text.replace("\\\n", " ").splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
    cmd = next(line for line in instructions if line.startswith("CMD "))
    assert json.loads(cmd[4:])[:2] == ["specobs", "demo"]
    assert "--admin-token" not in cmd
    assert not any("SPECOBS_DEMO_ADMIN_TOKEN" in line for line in instructions)
    assert "/admin/fault is off" in text  # and the file says so


def test_where_lines_point_at_the_fault_endpoint_only_when_admin_is_on():
    from specobs.demo import _summary

    off = _summary.where_lines(None, "http://127.0.0.1:8000", None)
    on = _summary.where_lines(None, "http://127.0.0.1:8000", None, admin=True)
    assert not any("/admin/fault" in line for line in off)
    assert any("POST http://127.0.0.1:8000/admin/fault" in line for line in on)
