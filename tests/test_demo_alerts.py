"""The generated alerts fire on the REAL demo engine: Prometheus 2.42 with the generated rules
(windows shortened through :class:`MixinConfig`) scrapes the engine while built-in load runs;
healthy, then ``wrong-hidden-layers`` through ``POST /admin/fault`` fires
``SpecobsAcceptanceRateDrop``; then ``stall`` with requests waiting fires
``SpecobsDecodingStalled``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
yaml = pytest.importorskip("yaml")

from specobs.mixin import MixinConfig, render_all  # noqa: E402
from specobs.tools._load import LoadSummary, run_load  # noqa: E402
from tests.test_demo_server import Served  # noqa: E402

pytestmark = pytest.mark.slow

RULES = "deploy/prometheus/rules/specobs-rules.yml"
CONFIG = MixinConfig(
    rate_window="4s",
    history_window="12s",
    history_offset="4s",
    history_step="2s",
    acceptance_drop_for="2s",
    stall_after="3s",
    stall_for="2s",
)


class Loaded:
    """The served engine plus closed-loop load from :func:`run_load` on a background thread."""

    def __init__(self) -> None:
        # The default training: its wrong-hidden-layers fault collapses acceptance.
        self.served = Served(train_settings=None)
        self.stop = threading.Event()
        self.summary = LoadSummary("")
        lang = self.served.engine.models.language

        def prompt_source(rng: Any, n: int) -> list[int]:
            return lang.stream(n + 8, seed=rng.randrange(1 << 30))[:n]

        def main() -> None:
            asyncio.run(run_load(
                self.served.server.url, concurrency=4, max_tokens=48, prompt_tokens=(4, 24),
                prompt_source=prompt_source, stop_event=self.stop, summary=self.summary,
                timeout_seconds=600,
            ))  # fmt: skip

        self.thread = threading.Thread(target=main, name="load", daemon=True)
        self.thread.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.served.sink.port}"

    def close(self) -> None:
        self.served.engine.fault = None
        self.stop.set()
        self.thread.join(30)
        self.served.close()


@pytest.fixture
def loaded() -> Iterator[Loaded]:
    with contextlib.closing(Loaded()) as lo:
        yield lo


def test_acceptance_and_stall_alerts_fire_on_the_real_engine(
    prometheus_server: Callable[..., Any], loaded: Loaded, tmp_path: Path
) -> None:
    rules_path = tmp_path / "specobs-rules.yml"
    rules_path.write_text(render_all(CONFIG)[RULES])
    assert yaml.safe_load(rules_path.read_text())["groups"]
    server = prometheus_server([loaded.target], rule_files=[rules_path])
    server.wait_for_target_up(timeout_seconds=20)
    client = loaded.served.client

    # A healthy past: the history rule the drop alert averages reaches back over the history
    # window plus its offset (12 s + 4 s, in 2 s steps).
    healthy = server.wait_for(
        "instance:specobs_acceptance:ratio_rate4s", lambda r: bool(r), timeout_seconds=30
    )
    server.wait_for_history("cohort:specobs_acceptance:avg2s_ratio_rate4s", seconds=16,
                            step_seconds=2, timeout_seconds=60)
    assert server.firing("SpecobsAcceptanceRateDrop") == []
    assert server.firing("SpecobsDecodingStalled") == []
    healthy = server.query("instance:specobs_acceptance:ratio_rate4s")
    assert float(healthy[0]["value"][1]) >= 0.4, healthy
    assert loaded.summary.requests_ok > 0 and loaded.summary.requests_failed == 0

    r = client.post("/admin/fault", json={"fault": "wrong-hidden-layers"})
    assert r.status_code == 200 and r.json()["fault"] == "wrong-hidden-layers"
    alert = server.wait_for_firing("SpecobsAcceptanceRateDrop", timeout_seconds=40)
    assert "instance" not in alert["labels"]  # a cohort alert
    assert alert["labels"]["severity"] == "warning"
    dropped = server.query("instance:specobs_acceptance:ratio_rate4s")
    assert float(dropped[0]["value"][1]) < 0.7 * float(healthy[0]["value"][1])

    r = client.post("/admin/fault", json={"fault": "stall"})
    assert r.json() == {
        "fault": "stall",
        "previous": "wrong-hidden-layers",
        "faults": r.json()["faults"],
    }
    alert = server.wait_for_firing("SpecobsDecodingStalled", timeout_seconds=40)
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["host"] == "127.0.0.1"
    stats = loaded.served.engine.stats()
    assert stats.active + stats.waiting > 0

    # Back to healthy: the stalled requests complete.
    client.post("/admin/fault", json={"fault": None})
    before = loaded.summary.requests_ok
    deadline = time.monotonic() + 30
    while loaded.summary.requests_ok <= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert loaded.summary.requests_ok > before
