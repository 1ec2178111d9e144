"""``specobs load`` and :func:`run_load` against the real demo server (real uvicorn, real engine),
a dead URL, and bad flags."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from specobs.cli import main  # noqa: E402
from specobs.tools._load import (  # noqa: E402
    LoadSummary,
    _count_tokens,
    completions_url,
    run_load,
)
from tests import test_demo_server  # noqa: E402
from tests.test_demo_server import Served  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

#: The demo server's module-scoped fixture: one real server for this module too.
served = test_demo_server.served


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def load(url: str, **kwargs: object) -> LoadSummary:
    return asyncio.run(run_load(url, **kwargs))  # type: ignore[arg-type]


def test_a_fixed_number_of_requests_counts_every_token(served: Served) -> None:
    before = served.engine.stats()
    summary = load(served.server.url, requests=12, concurrency=3, max_tokens=8,
                   prompt_tokens=(2, 10), seed=1)  # fmt: skip
    after = served.engine.stats()
    assert summary.requests_ok == 12 and summary.requests_failed == 0, summary.lines()
    assert after.requests_submitted - before.requests_submitted == 12
    # usage.completion_tokens of each answer, summed, is what the engine emitted.
    assert summary.completion_tokens == after.emitted_tokens - before.emitted_tokens
    assert 12 <= summary.completion_tokens <= 12 * 8
    assert summary.tokens_counted_from_text == 0
    assert len(summary.latencies_seconds) == 12
    p50, p99 = summary.latency_quantile(0.5), summary.latency_quantile(0.99)
    assert p50 is not None and p99 is not None and 0 < p50 <= p99
    assert summary.tokens_per_second > 0
    text = "\n".join(summary.lines())
    assert "12 ok, 0 failed" in text and "tokens/s" in text and "p99" in text


def test_duration_rate_and_stop_event(served: Served) -> None:
    summary = load(served.server.url, duration_seconds=1.5, concurrency=2, max_tokens=4)
    assert summary.requests_ok > 0 and summary.requests_failed == 0
    assert 1.5 <= summary.elapsed_seconds < 15

    # Open loop, evenly spaced: 8 requests at 20/s take at least 7 gaps of 50 ms.
    summary = load(served.server.url, requests=8, rate=20.0, arrival="fixed", max_tokens=4)
    assert summary.requests_ok == 8
    assert summary.elapsed_seconds >= 0.35

    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    summary = load(served.server.url, stop_event=stop, concurrency=2, max_tokens=4,
                   rate=10.0)  # fmt: skip
    assert summary.requests_ok > 0 and summary.elapsed_seconds < 15


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/completions"])
def test_base_url_or_endpoint(served: Served, suffix: str) -> None:
    summary = load(served.server.url + suffix, requests=2, concurrency=1, max_tokens=3)
    assert summary.requests_ok == 2
    assert summary.url == served.server.url + "/v1/completions"


def test_http_errors_are_counted_by_kind_with_the_servers_message(served: Served) -> None:
    summary = load(served.server.url, requests=3, concurrency=1, max_tokens=10**6)
    assert summary.requests_ok == 0 and summary.requests_failed == 3
    assert summary.errors == {"http_400": 3}
    assert "max_tokens" in summary.error_examples["http_400"]
    # The server is unharmed.
    assert load(served.server.url, requests=1, max_tokens=2).requests_ok == 1


def test_a_dead_url_counts_connection_errors() -> None:
    summary = load(dead_url(), requests=5, concurrency=2)
    assert summary.requests_ok == 0 and summary.requests_failed == 5
    assert summary.errors == {"connect_error": 5}
    assert summary.latency_quantile(0.5) is None
    assert "connect_error 5" in "\n".join(summary.lines())


def test_tokens_fall_back_to_counting_words_without_usage() -> None:
    assert _count_tokens({"usage": {"completion_tokens": 7}, "choices": []}) == (7, False)
    assert _count_tokens({"choices": [{"text": " one two  three"}]}) == (3, True)
    with pytest.raises(ValueError, match="neither usage"):
        _count_tokens({"id": "x"})


def test_credentials_in_the_url_are_left_out_of_the_summary_and_errors() -> None:
    summary = LoadSummary(url="http://alice:S3CRET@127.0.0.1:8000/v1/completions", requests_ok=1)
    text = "\n".join(summary.lines()) + repr(summary.as_dict())
    assert "S3CRET" not in text and "alice" not in text
    assert "http://127.0.0.1:8000/v1/completions" in text
    with pytest.raises(ValueError) as exc:
        completions_url("ftp://alice:S3CRET@h:1")
    assert "S3CRET" not in str(exc.value) and "ftp://h:1" in str(exc.value)


def test_completions_url() -> None:
    assert completions_url("http://h:1") == "http://h:1/v1/completions"
    assert completions_url("https://h/api/v1/") == "https://h/api/v1/completions"
    assert completions_url("http://h:1/v1/completions") == "http://h:1/v1/completions"
    with pytest.raises(ValueError, match="http:// or https://"):
        completions_url("h:1")


def _specobs(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "specobs.cli", *args], capture_output=True, text=True,
        timeout=timeout, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_the_command_prints_a_summary(served: Served) -> None:
    result = _specobs("load", served.server.url, "--requests", "6", "--concurrency", "2",
                      "--max-tokens", "5", "--prompt-tokens", "3:8")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "model specobs-demo" in out  # found through GET /v1/models
    assert "6 ok, 0 failed" in out
    assert "tokens/s" in out and "p50" in out and "p99" in out


def test_the_command_against_a_dead_url_exits_1() -> None:
    result = _specobs("load", dead_url(), "--requests", "3")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "0 ok, 3 failed" in result.stdout
    assert "connect_error 3" in result.stdout


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--concurrency", "0"], "expected an integer >= 1, got 0"),
        (["--duration", "-5"], "expected a number > 0"),
        (["--duration", "nan"], "expected a number > 0"),
        (["--rate", "fast"], "expected a number > 0"),
        (["--requests", "0"], "expected an integer >= 1"),
        (["--prompt-tokens", "9:3"], "1 <= MIN <= MAX"),
        (["--prompt-tokens", "a:b"], "MIN:MAX"),
        (["--max-tokens", "-1"], "expected an integer >= 1"),
        (["--duration", "5", "--requests", "3"], "not allowed with argument"),
        (["--arrival", "bursty"], "invalid choice"),
    ],
)
def test_bad_flags_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["load", "http://127.0.0.1:1", *argv])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("url", ["ftp://host/x", "127.0.0.1:8000", "http://"])
def test_a_bad_url_exits_2(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["load", url])
    assert exc.value.code == 2
    assert "expected an http:// or https:// URL" in capsys.readouterr().err
