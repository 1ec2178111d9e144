"""TransformersInstrumentor against REAL transformers assisted generation on CPU.

Tiny Llama- and GPT-2-style models are built from configs (no downloads, seeded). The assistant
is the target with seeded noise on its weights, so some drafts are accepted and some are not.
The loop's iterations and its real ``n_matches`` are counted independently of specobs, by
wrapping the candidate generator's class methods with pytest's monkeypatch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.generation import candidate_generator as cg  # noqa: E402
from transformers.generation.utils import GenerationMixin  # noqa: E402

import specobs  # noqa: E402
from specobs.instrument._base import PackageRange  # noqa: E402
from specobs.instrument.transformers import TransformersInstrumentor  # noqa: E402

PHASES = ("draft", "verify", "bookkeeping")
MAX_NEW_TOKENS = 40
NUM_ASSISTANT_TOKENS = 4


#: What the target and the assistant share for assisted generation: one tokenizer's vocabulary
#: and special tokens.
_VOCAB: dict[str, Any] = {"vocab_size": 64, "pad_token_id": 0, "bos_token_id": 1,
                          "eos_token_id": None}  # fmt: skip


def _llama_config() -> Any:
    return transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        **_VOCAB,
    )


def _gpt2_config() -> Any:
    return transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, n_positions=256, **_VOCAB
    )


MODELS = {
    "llama": (_llama_config, transformers.LlamaForCausalLM),
    "gpt2": (_gpt2_config, transformers.GPT2LMHeadModel),
}


def _build_pair(kind: str, noise: float = 0.03) -> tuple[Any, Any]:
    make_config, model_class = MODELS[kind]
    torch.manual_seed(0)
    target = model_class(make_config()).eval()
    assistant = model_class(make_config()).eval()
    assistant.load_state_dict(target.state_dict())
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in assistant.parameters():
            parameter.add_(noise * torch.randn(parameter.shape, generator=generator))
    config = assistant.generation_config
    config.num_assistant_tokens = NUM_ASSISTANT_TOKENS
    # "heuristic" would carry the draft length over from one generate() to the next.
    config.num_assistant_tokens_schedule = "constant"
    return target, assistant


def _prompt() -> Any:
    return torch.tensor([[1, 17, 5, 42, 9, 33, 8]])


def _generate(target: Any, assistant: Any, *, do_sample: bool) -> Any:
    torch.manual_seed(1234)
    prompt = _prompt()
    kwargs: dict[str, Any] = {"do_sample": do_sample}
    if do_sample:
        kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
    with torch.no_grad():
        return target.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            assistant_model=assistant,
            max_new_tokens=MAX_NEW_TOKENS,
            min_new_tokens=MAX_NEW_TOKENS,
            pad_token_id=0,
            **kwargs,
        )


@dataclass
class LoopCounter:
    """The assisted loop's own numbers, seen from the candidate generator's class."""

    iterations: int = 0
    drafted: int = 0
    matches: list[int] = field(default_factory=list)


@pytest.fixture
def loop_counter(monkeypatch: pytest.MonkeyPatch) -> LoopCounter:
    counter = LoopCounter()
    original_get = cg.AssistedCandidateGenerator.get_candidates
    original_update = cg.AssistedCandidateGenerator.update_candidate_strategy

    def get_candidates(self: Any, input_ids: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_get(self, input_ids, *args, **kwargs)
        counter.iterations += 1
        counter.drafted += int(result[0].shape[-1] - input_ids.shape[-1])
        return result

    def update_candidate_strategy(self: Any, input_ids: Any, scores: Any, n_matches: Any) -> Any:
        counter.matches.append(int(n_matches))
        return original_update(self, input_ids, scores, n_matches)

    monkeypatch.setattr(cg.AssistedCandidateGenerator, "get_candidates", get_candidates)
    monkeypatch.setattr(
        cg.AssistedCandidateGenerator, "update_candidate_strategy", update_candidate_strategy
    )
    return counter


@pytest.fixture
def observer() -> Any:
    obs = specobs.configure(phases=PHASES, sinks=[specobs.MemorySink()])
    yield obs
    obs.shutdown(timeout_seconds=5.0)


@pytest.fixture
def instrumentor() -> Any:
    inst = TransformersInstrumentor()
    inst.uninstrument()
    yield inst
    inst.uninstrument()


def _snapshot(obs: Any) -> Any:
    obs.force_flush(timeout_seconds=5.0)
    return obs.snapshot()


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_assisted_generation_is_counted_exactly_and_unchanged(
    kind: str, do_sample: bool, loop_counter: LoopCounter, observer: Any, instrumentor: Any
) -> None:
    target, assistant = _build_pair(kind)
    plain = _generate(target, assistant, do_sample=do_sample)
    plain_counts = (loop_counter.iterations, loop_counter.drafted, list(loop_counter.matches))
    loop_counter.iterations, loop_counter.drafted, loop_counter.matches = 0, 0, []

    assert instrumentor.instrument(observer=observer) is True
    instrumented = _generate(target, assistant, do_sample=do_sample)

    assert torch.equal(plain, instrumented), "instrumentation changed the generated ids"
    assert (loop_counter.iterations, loop_counter.drafted, loop_counter.matches) == plain_counts
    assert plain.shape[-1] == _prompt().shape[-1] + MAX_NEW_TOKENS

    snap = _snapshot(observer)
    assert loop_counter.iterations > 1
    assert snap.cycles_total == loop_counter.iterations
    assert snap.accepted_tokens_total == sum(loop_counter.matches)
    assert snap.draft_tokens_total == loop_counter.drafted
    assert snap.emitted_tokens_total == MAX_NEW_TOKENS
    # The seeded noise makes acceptance partial: neither every draft nor none.
    assert 0 < sum(loop_counter.matches) < loop_counter.drafted
    assert not any(snap.errors.values()), snap.errors
    for phase in PHASES:
        assert snap.phase_count(phase, "host") == loop_counter.iterations, phase
        assert snap.phase_seconds_sum(phase, "host") > 0.0, phase


def test_instrument_uninstrument_instrument_restores_and_reapplies(
    loop_counter: LoopCounter, observer: Any, instrumentor: Any
) -> None:
    originals = {
        name: vars(GenerationMixin)[name]
        for name in ("_assisted_decoding", "_get_candidate_generator")
    }
    target, assistant = _build_pair("llama")

    assert instrumentor.instrument(observer=observer) is True
    assert instrumentor.instrument(observer=observer) is True  # idempotent
    patched = {name: vars(GenerationMixin)[name] for name in originals}
    assert all(patched[name] is not originals[name] for name in originals)
    assert TransformersInstrumentor() is instrumentor  # one per process, like OpenTelemetry's
    first = _generate(target, assistant, do_sample=False)
    cycles_first = _snapshot(observer).cycles_total
    assert cycles_first == loop_counter.iterations > 0

    instrumentor.uninstrument()
    instrumentor.uninstrument()  # idempotent
    assert {name: vars(GenerationMixin)[name] for name in originals} == originals
    assert not instrumentor.is_instrumented
    second = _generate(target, assistant, do_sample=False)
    assert _snapshot(observer).cycles_total == cycles_first  # nothing counted while off
    assert not target._forward_hooks, "the verify hook outlived the call"

    assert instrumentor.instrument(observer=observer) is True
    third = _generate(target, assistant, do_sample=False)
    assert _snapshot(observer).cycles_total == 2 * cycles_first
    assert torch.equal(first, second) and torch.equal(second, third)
    assert not target._forward_hooks


def test_a_release_below_the_floor_warns_once_and_leaves_transformers_untouched(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, instrumentor: Any
) -> None:
    monkeypatch.setattr(
        TransformersInstrumentor, "package", PackageRange("transformers", "99", "100")
    )
    monkeypatch.setattr(instrumentor, "_warned", False)
    before = dict(vars(GenerationMixin))
    with caplog.at_level(logging.WARNING, logger="specobs.instrument"):
        assert instrumentor.instrument() is False
        assert instrumentor.instrument() is False
    assert dict(vars(GenerationMixin)) == before
    warnings = [r for r in caplog.records if r.name == "specobs.instrument"]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "works with transformers >= 99" in message and transformers.__version__ in message


def test_opentelemetry_entry_point_contract(instrumentor: Any) -> None:
    # opentelemetry-instrument loads the entry point, instantiates it and calls
    # instrument(skip_dep_check=True) after checking instrumentation_dependencies().
    from importlib.metadata import EntryPoint

    entry_point = EntryPoint(
        name="specobs_transformers",
        value="specobs.instrument.transformers:TransformersInstrumentor",
        group="opentelemetry_instrumentor",
    )
    loaded = entry_point.load()
    assert loaded is TransformersInstrumentor
    # The floor only: the hook contract, not a ceiling, decides (instrument() without
    # skip_dep_check runs it).
    assert list(loaded().instrumentation_dependencies()) == ["transformers >= 4.57"]
    assert loaded().instrument(skip_dep_check=True) is True
    assert instrumentor.is_instrumented


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_assisted_generation_on_cuda_gets_gpu_phase_times(
    do_sample: bool, loop_counter: LoopCounter, instrumentor: Any
) -> None:
    obs = specobs.configure(
        phases=PHASES, sinks=[specobs.MemorySink()], clock="cuda", sample_every=1
    )
    try:
        target, assistant = (m.to("cuda") for m in _build_pair("llama"))

        def generate() -> Any:
            torch.manual_seed(1234)
            prompt = _prompt().to("cuda")
            kwargs: dict[str, Any] = {"do_sample": do_sample}
            if do_sample:
                kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
            with torch.no_grad():
                return target.generate(
                    prompt, attention_mask=torch.ones_like(prompt), assistant_model=assistant,
                    max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS,
                    pad_token_id=0, **kwargs,
                )  # fmt: skip

        plain = generate()
        loop_counter.iterations, loop_counter.drafted, loop_counter.matches = 0, 0, []
        assert instrumentor.instrument(observer=obs) is True
        instrumented = generate()
        assert torch.equal(plain, instrumented)
        snap = _snapshot(obs)
        assert snap.cycles_total == loop_counter.iterations > 1
        assert snap.accepted_tokens_total == sum(loop_counter.matches)
        assert snap.draft_tokens_total == loop_counter.drafted
        assert not any(snap.errors.values()), snap.errors
        for phase in PHASES:
            assert snap.phase_count(phase, "gpu") == loop_counter.iterations, phase
            assert snap.phase_seconds_sum(phase, "gpu") > 0.0, phase
    finally:
        obs.shutdown(timeout_seconds=5.0)
