"""The demo's non-speculative baseline probe: plain decode steps of the served batch, measured
between cycles (specobs/demo/_baseline.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from specobs import catalog  # noqa: E402
from specobs.demo import greedy_generate  # noqa: E402
from specobs.demo._baseline import DEMO_MEASURED, BaselineCollector, BaselineProbe  # noqa: E402
from tests.test_demo_server import quick_engine  # noqa: E402


@pytest.fixture(scope="module")
def engine():
    return quick_engine()


def test_reading_is_one_over_the_mean_step_over_the_window(engine) -> None:
    probe = BaselineProbe(engine.target, 4, window_seconds=10, min_samples=3)
    probe.record(2, 0.010, now=100.0)
    probe.record(4, 0.020, now=101.0)
    assert probe.reading(now=101.0) is None  # too few probes yet
    probe.record(3, 0.030, now=102.0)
    r = probe.reading(now=102.0)
    assert r is not None
    assert r.tokens_per_second == pytest.approx(3 / 0.060)
    assert r.samples == 3 and r.batch_size_mean == pytest.approx(3.0)
    # Older than the window: forgotten, so the baseline follows the current load and batch.
    probe.record(3, 0.001, now=111.5)
    probe.record(3, 0.001, now=111.6)
    r = probe.reading(now=111.6)
    assert r is not None and r.samples == 3
    assert r.tokens_per_second == pytest.approx(3 / 0.032)


def test_collector_exports_the_baseline_with_its_source_and_the_constant_labels(engine) -> None:
    probe = BaselineProbe(engine.target, 4, min_samples=1)
    registry = CollectorRegistry()
    registry.register(BaselineCollector(probe, {"model_name": "m", "serving_engine": "e"}))
    assert catalog.BASELINE_SEQUENCE_TOKENS.name not in generate_latest(registry).decode()
    probe.record(2, 0.004)
    labels = {"source": DEMO_MEASURED, "model_name": "m", "serving_engine": "e"}
    value = registry.get_sample_value(catalog.BASELINE_SEQUENCE_TOKENS.name, labels)
    assert value == pytest.approx(250.0)


def test_the_engine_probes_every_nth_cycle_without_changing_the_output(engine) -> None:
    probe = BaselineProbe(engine.target, engine.max_batch, every_cycles=2, min_samples=1,
                          device=engine.device)  # fmt: skip
    prompts = [engine.models.language.stream(24, seed=700 + i)[:12] for i in range(3)]
    engine.baseline_probe = probe
    try:
        handles = [engine.submit(p, max_tokens=24) for p in prompts]
        cycles_before = engine.stats().cycles
        while not all(h.done for h in handles):
            engine.step()
        cycles = engine.stats().cycles - cycles_before
    finally:
        engine.baseline_probe = None
    r = probe.reading()
    assert r is not None
    assert r.samples == cycles // 2
    assert 1 <= r.batch_size_mean <= 3
    assert r.tokens_per_second > 0
    # The probe writes into its own KV cache: the served sequences are plain greedy decoding.
    for p, h in zip(prompts, handles, strict=True):
        assert h.wait(5) == greedy_generate(engine.target, p, 24, eos_id=engine.eos_id)


@pytest.mark.gpu
def test_the_cuda_graph_plain_step_replays_the_eager_step() -> None:
    """Each bucket's captured plain step gives the eager step's tokens, also after the memory
    freed around the capture has been handed out again (a graph reads fixed addresses)."""
    from specobs.demo._baseline import _PlainStepGraph
    from specobs.demo._model import TargetConfig, TargetModel

    torch.manual_seed(0)
    target = TargetModel(TargetConfig()).to("cuda").eval()
    probe = BaselineProbe(target, 4, min_samples=1, device="cuda", cuda_graph_buckets=(2, 4))
    # Take back whatever the capture left to the allocator, and scribble over it.
    scribble = [torch.full((4096,), 10**6, dtype=torch.long, device="cuda") for _ in range(64)]
    tokens = torch.tensor([5, 17, 99], device="cuda")
    positions = [3, 8, 40]
    graph = probe._graphs[4]
    assert isinstance(graph, _PlainStepGraph)
    # The eager reference runs on a copy of the probe's cache as the replay will find it.
    cache = target.new_cache(4, device="cuda")
    cache.k.copy_(probe._cache.k)
    cache.v.copy_(probe._cache.v)
    got = graph.replay(tokens, positions)
    with torch.inference_mode():
        logits, _ = target(tokens.reshape(3, 1), torch.tensor(positions, device="cuda")
                           .unsqueeze(1), cache=cache, slots=torch.arange(3, device="cuda"),
                           attend_len=target.config.max_seq_len)
        want = logits[:, -1].argmax(-1).tolist()
    assert got == want
    assert probe.measure(tokens, positions) > 0.0
    torch.cuda.synchronize()  # a device-side assert would surface here
    del scribble
