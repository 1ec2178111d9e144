"""Run the real Debian ``prometheus`` binary (2.42) for tests, and ``promtool``.

:class:`PrometheusServer` writes a config (one scrape job, default name ``"specobs"``, with static
targets such as ``"127.0.0.1:9477"``; more jobs through ``extra_jobs``, such as the engines' own
endpoints; plus optional rule files) into a directory, starts::

    prometheus --config.file=DIR/prometheus.yml --storage.tsdb.path=DIR/data
               --web.listen-address=127.0.0.1:FREEPORT --enable-feature=exemplar-storage
               --web.enable-lifecycle

waits for ``/-/ready`` and wraps the HTTP API. Prometheus's stderr goes to ``DIR/prometheus.log``;
every :class:`PrometheusError` carries its tail.

The query helpers return the API's ``data`` payload (``data.result`` for queries) and raise
:class:`PrometheusError` with Prometheus's own ``errorType``/``error`` text on failure. The waiting
helpers (``wait_for``, ``wait_for_target_up``, ``wait_for_rule_evaluations``, ``wait_for_history``)
poll with a deadline and raise ``TimeoutError`` that shows the last value seen, so a failing test
says what Prometheus actually had.

Pytest: the fixture factory :func:`prometheus_server` returns ``start(targets, rule_files=(),
**kwargs) -> PrometheusServer`` and stops every server it started at teardown; it skips the test
when ``prometheus`` is not on PATH. :func:`promtool` runs ``promtool`` (skipping likewise). Load
this module as a plugin (``-p tests._prometheus_server``) to use the fixture.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from specobs.mixin import MixinConfig

__all__ = [
    "PrometheusError",
    "PrometheusServer",
    "prometheus_path",
    "prometheus_server",
    "promtool",
    "promtool_path",
    "short_windows",
]

_SKIP_REASON = (
    "the `{name}` binary is not on PATH; install Debian's prometheus package "
    "(`apt-get install -y prometheus`, 2.42, ships promtool) to run this test"
)
_STDERR_TAIL_LINES = 30
_READY_TIMEOUT_SECONDS = 30.0
_STOP_TIMEOUT_SECONDS = 10.0
_POLL_INTERVAL_SECONDS = 0.1
_START_ATTEMPTS = 3  # a freed port can be taken again before prometheus binds it


class PrometheusError(RuntimeError):
    """Prometheus failed to start, exited, or answered an API call with an error."""


def prometheus_path() -> str:
    """Path of the ``prometheus`` binary; skips the calling test if it is not installed."""
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip(_SKIP_REASON.format(name="prometheus"))
    return path


def promtool_path() -> str:
    """Path of the ``promtool`` binary; skips the calling test if it is not installed."""
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(_SKIP_REASON.format(name="promtool"))
    return path


def promtool(
    *args: str | os.PathLike[str],
    input: str | None = None,
    timeout_seconds: float = 240.0,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``promtool ARGS...`` and return the completed process (text, output captured).

    The timeout is a safety net, not a bound on speed: ``promtool test rules`` evaluates every
    group of the generated rules over hours of test series, which takes seconds on a quiet
    machine and over a minute on a shared one (load 7 on 2 cores); it stays under the tests'
    own 300 s.

    It does not raise on a non-zero exit: assert on ``returncode``, ``stdout`` and ``stderr``.
    ``input`` feeds stdin, e.g. ``promtool("check", "metrics", input=exposition_text)``.
    """
    return subprocess.run(
        [promtool_path(), *(os.fspath(a) for a in args)],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout_seconds,
        cwd=cwd,
        check=False,
    )


def free_port() -> int:
    """A free TCP port on loopback (for servers a test starts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def short_windows(**windows: str) -> MixinConfig:
    """The mixin's config with the rate and history windows short enough for a test to wait
    through: rates over 4 s, a 12 s history offset by 4 s in 2 s steps, and the acceptance-drop
    alert pending 2 s; ``windows`` sets the rest (``stall_after="3s"``, ``cohort_for="2s"``)."""
    return MixinConfig(
        rate_window="4s",
        history_window="12s",
        history_offset="4s",
        history_step="2s",
        acceptance_drop_for="2s",
        **windows,
    )


def _unix_seconds(rfc3339: str) -> float:
    """``"2026-01-02T03:04:05.123456789Z"`` (Prometheus's API times, nanoseconds or none, ``Z`` or
    an offset) -> Unix seconds; ``0001-01-01T00:00:00Z`` (never) is far in the past."""
    m = re.fullmatch(r"(.+?T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", rfc3339)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {rfc3339!r}")
    whole, fraction, zone = m.groups()
    zone = "+00:00" if zone == "Z" else zone
    seconds = datetime.fromisoformat(whole + zone).timestamp()
    return seconds + (float(f"0.{fraction}") if fraction else 0.0)


class PrometheusServer:
    """A real ``prometheus`` process scraping ``targets``; see the module docstring.

    ``directory`` holds the config, the TSDB and ``prometheus.log``; when omitted a temporary
    directory is created and removed by :meth:`stop`. The server is started by the constructor
    (``start=False`` defers it to :meth:`start`). Usable as a context manager.
    """

    def __init__(
        self,
        targets: Sequence[str],
        rule_files: Iterable[str | os.PathLike[str]] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        extra_args: Sequence[str] = (),
        *,
        job_name: str = "specobs",
        extra_jobs: Mapping[str, Sequence[str]] | None = None,
        scrape_timeout: str | None = None,
        directory: str | os.PathLike[str] | None = None,
        start: bool = True,
    ) -> None:
        self.scrape_targets = list(targets)
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.scrape_timeout = scrape_timeout or scrape_interval
        self.extra_args = list(extra_args)
        self.job_name = job_name
        self.extra_jobs = {name: list(t) for name, t in (extra_jobs or {}).items()}
        if self.job_name in self.extra_jobs:
            raise ValueError(f"extra_jobs repeats the job name {self.job_name!r}; Prometheus "
                             "refuses two scrape configs of one job")
        self._own_tempdir: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._own_tempdir = tempfile.TemporaryDirectory(prefix="specobs-prometheus-")
            directory = self._own_tempdir.name
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_path = self.directory / "prometheus.yml"
        self.log_path = self.directory / "prometheus.log"
        self.port = 0
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._client: httpx.Client | None = None
        if start:
            try:
                self.start()
            except BaseException:
                self.stop()  # the error already carries the stderr tail
                raise

    # -- lifecycle ---------------------------------------------------------------------------

    def write_config(self) -> None:
        """Write ``prometheus.yml`` from the current attributes (JSON is valid YAML)."""
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_timeout,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {"job_name": name, "static_configs": [{"targets": targets}]}
                for name, targets in {self.job_name: self.scrape_targets,
                                      **self.extra_jobs}.items()
            ],
        }
        self.config_path.write_text(json.dumps(config, indent=2) + "\n")

    def start(self) -> PrometheusServer:
        if self._process is not None:
            raise PrometheusError("PrometheusServer.start() called twice; create a new server.")
        binary = prometheus_path()
        self.write_config()
        for attempt in range(1, _START_ATTEMPTS + 1):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            argv = [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--enable-feature=exemplar-storage",
                "--web.enable-lifecycle",
                *self.extra_args,
            ]
            with open(self.log_path, "ab") as log:
                self._process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd=self.directory,
                )
            self._client = httpx.Client(base_url=self.url, timeout=10.0)
            try:
                self._wait_ready()
                return self
            except PrometheusError:
                port_taken = "address already in use" in self.stderr_tail().lower()
                self._terminate()
                if not port_taken or attempt == _START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _wait_ready(self) -> None:
        assert self._process is not None and self._client is not None
        deadline = time.monotonic() + _READY_TIMEOUT_SECONDS
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise self._error(
                    f"prometheus exited with code {self._process.returncode} before it was ready"
                )
            try:
                response = self._client.get("/-/ready")
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}: {response.text.strip()}"
            except httpx.TransportError as exc:
                last = repr(exc)
            time.sleep(_POLL_INTERVAL_SECONDS)
        raise self._error(
            f"prometheus was not ready at {self.url}/-/ready after {_READY_TIMEOUT_SECONDS}s "
            f"(last: {last})"
        )

    def stop(self) -> None:
        """Terminate prometheus (SIGTERM, then SIGKILL after a bound); idempotent."""
        self._terminate()
        if self._own_tempdir is not None:
            self._own_tempdir.cleanup()
            self._own_tempdir = None

    def _terminate(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(_STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(_STOP_TIMEOUT_SECONDS)
        elif process is not None:
            process.wait()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stderr_tail(self, lines: int = _STDERR_TAIL_LINES) -> str:
        """The last ``lines`` lines prometheus wrote to stderr."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _error(self, message: str) -> PrometheusError:
        return PrometheusError(
            f"{message}\n--- prometheus stderr ({self.log_path}), last lines ---\n"
            f"{self.stderr_tail()}"
        )

    # -- HTTP API ----------------------------------------------------------------------------

    def _api(self, method: str, path: str, params: dict[str, Any] | None = None) -> Any:
        if self._client is None:
            raise PrometheusError(f"PrometheusServer at {self.url!r} is not running.")
        try:
            if method == "GET":
                response = self._client.get(path, params=params)
            else:
                response = self._client.post(path, data=params)
        except httpx.TransportError as exc:
            raise self._error(f"{method} {path} failed: {exc!r}") from exc
        try:
            payload = response.json()
        except ValueError:
            raise self._error(
                f"{method} {path} {params or ''} answered HTTP {response.status_code} "
                f"with a non-JSON body: {response.text[:500]!r}"
            ) from None
        if payload.get("status") != "success":
            raise self._error(
                f"{method} {path} {params or ''} failed (HTTP {response.status_code}): "
                f"{payload.get('errorType')}: {payload.get('error')}"
            )
        return payload.get("data")

    def query(self, promql: str, time: float | str | None = None) -> list[dict[str, Any]]:
        """Instant query; returns ``data.result`` (for a vector: ``[{"metric", "value"}]``)."""
        params: dict[str, Any] = {"query": promql}
        if time is not None:
            params["time"] = time
        data = self._api("GET", "/api/v1/query", params)
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(
        self, promql: str, start: float | str, end: float | str, step: float | str = 1.0
    ) -> list[dict[str, Any]]:
        """Range query; returns ``data.result`` (a matrix: ``[{"metric", "values"}]``)."""
        data = self._api(
            "GET",
            "/api/v1/query_range",
            {"query": promql, "start": start, "end": end, "step": step},
        )
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_exemplars(
        self, promql: str, start: float | str, end: float | str
    ) -> list[dict[str, Any]]:
        """Exemplar query; returns ``data`` (``[{"seriesLabels", "exemplars"}]``)."""
        data = self._api(
            "GET", "/api/v1/query_exemplars", {"query": promql, "start": start, "end": end}
        )
        return list(data or [])

    def targets(self) -> list[dict[str, Any]]:
        """``data.activeTargets`` from ``/api/v1/targets``."""
        data = self._api("GET", "/api/v1/targets")
        return list(data["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        """``data.alerts`` from ``/api/v1/alerts`` (pending and firing)."""
        data = self._api("GET", "/api/v1/alerts")
        return list(data["alerts"])

    def firing(self, name: str) -> list[dict[str, Any]]:
        """The alerts named ``name`` that are firing now (not pending)."""
        return [
            a for a in self.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"
        ]

    def wait_for_firing(self, name: str, timeout_seconds: float) -> dict[str, Any]:
        """Poll until alert ``name`` fires; raise ``TimeoutError`` listing the alerts if not."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            firing = self.firing(name)
            if firing:
                return firing[0]
            time.sleep(0.5)
        raise TimeoutError(
            f"{name} did not fire within {timeout_seconds}s; alerts: {self.alerts()}"
        )

    def rules(self, type: str | None = None) -> list[dict[str, Any]]:
        """``data.groups`` from ``/api/v1/rules``; ``type`` is ``"alert"`` or ``"record"``."""
        data = self._api("GET", "/api/v1/rules", {"type": type} if type else None)
        return list(data["groups"])

    def reload(
        self,
        targets: Sequence[str] | None = None,
        rule_files: Iterable[str | os.PathLike[str]] | None = None,
    ) -> None:
        """Rewrite the config (with new targets/rule files if given) and POST ``/-/reload``."""
        if targets is not None:
            self.scrape_targets = list(targets)
        if rule_files is not None:
            self.rule_files = [Path(p).resolve() for p in rule_files]
        self.write_config()
        if self._client is None:
            raise PrometheusError(f"PrometheusServer at {self.url!r} is not running.")
        response = self._client.post("/-/reload")
        if response.status_code != 200:
            raise self._error(
                f"POST /-/reload answered HTTP {response.status_code}: {response.text.strip()}"
            )

    # -- waiting -----------------------------------------------------------------------------

    def wait_for_target_up(self, timeout_seconds: float = 15.0) -> list[dict[str, Any]]:
        """Wait until every active target has ``health == "up"``; returns the targets.

        Raises ``TimeoutError`` listing each target's health and ``lastError``.
        """
        deadline = time.monotonic() + timeout_seconds
        while True:
            targets = self.targets()
            if targets and all(t.get("health") == "up" for t in targets):
                return targets
            if time.monotonic() >= deadline:
                summary = [
                    f"{t.get('scrapeUrl')}: health={t.get('health')!r} "
                    f"lastError={t.get('lastError')!r}"
                    for t in targets
                ] or ["no active targets"]
                raise TimeoutError(
                    f"targets not all up after {timeout_seconds}s: " + "; ".join(summary)
                )
            time.sleep(_POLL_INTERVAL_SECONDS)

    def wait_for_rule_evaluations(
        self,
        after: float,
        max_interval_seconds: float = 60.0,
        timeout_seconds: float = 60.0,
    ) -> list[dict[str, Any]]:
        """Wait until every rule group has been evaluated after Unix time ``after``; returns the
        groups (``data.groups`` of ``/api/v1/rules``).

        A recording rule read right after its inputs appeared can still be empty: each group runs
        on its own schedule, and a group that reads another group's rules sees them only at its
        own next evaluation. So a test that saw one rule get a value at ``after`` and then reads
        rules of other groups waits here first. Groups evaluated less often than every
        ``max_interval_seconds`` (a long history step) are not waited for. Raises
        ``TimeoutError`` naming the groups still behind and their last evaluation.
        """
        deadline = time.monotonic() + timeout_seconds
        while True:
            groups = [g for g in self.rules() if float(g["interval"]) <= max_interval_seconds]
            behind = [g for g in groups if _unix_seconds(g["lastEvaluation"]) <= after]
            if groups and not behind:
                return groups
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"rule groups not evaluated after {after:.3f} within {timeout_seconds}s: "
                    + ", ".join(f"{g['name']} (last {g['lastEvaluation']})" for g in behind)
                    + ("" if groups else "no rule groups loaded")
                )
            time.sleep(_POLL_INTERVAL_SECONDS)

    def wait_for_history(
        self, series: str, seconds: float, step_seconds: float, timeout_seconds: float = 60.0
    ) -> None:
        """Wait until ``series`` (a metric or recording-rule selector) reaches ``seconds`` back:
        it has a sample in the oldest ``step_seconds`` of that span.

        For alerts that compare now with a past window (``... offset 4s`` over ``[12s]``): the
        past exists once the series is that old, which on a busy machine is later than that many
        seconds after the series first appeared.
        """
        older = max(0.0, seconds - step_seconds)
        self.wait_for(
            f"count_over_time({series}[{round(step_seconds * 1000)}ms] "
            f"offset {round(older * 1000)}ms)",
            timeout_seconds=timeout_seconds,
        )

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout_seconds: float = 15.0,
    ) -> list[dict[str, Any]]:
        """Poll ``query(promql)`` until ``predicate(result)`` holds; returns that result.

        The default predicate waits for a non-empty result. Raises ``TimeoutError`` with the last
        result (or the last query error) when the deadline passes.
        """
        deadline = time.monotonic() + timeout_seconds
        last: object = None
        while True:
            try:
                result = self.query(promql)
            except PrometheusError as exc:
                last = exc
            else:
                if predicate(result):
                    return result
                last = result
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{promql!r} did not satisfy the predicate within {timeout_seconds}s; "
                    f"last: {last}"
                )
            time.sleep(_POLL_INTERVAL_SECONDS)


@pytest.fixture
def prometheus_server(
    tmp_path: Path,
) -> Iterator[Callable[..., PrometheusServer]]:
    """Factory: ``start(targets, rule_files=(), **kwargs) -> PrometheusServer``.

    Each server lives in its own ``tmp_path/prometheus-N`` (config, TSDB, ``prometheus.log``);
    all are stopped at teardown. Skips when ``prometheus`` is not on PATH.
    """
    prometheus_path()
    started: list[PrometheusServer] = []

    def start(
        targets: Sequence[str],
        rule_files: Iterable[str | os.PathLike[str]] = (),
        **kwargs: Any,
    ) -> PrometheusServer:
        kwargs.setdefault("directory", tmp_path / f"prometheus-{len(started)}")
        server = PrometheusServer(targets, rule_files, start=False, **kwargs)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
