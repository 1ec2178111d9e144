"""The k schedules of ``specobs.tools._diagnosis._engine_config``, read by each engine's own code.

Every snippet :func:`render` writes is parsed the way the engine parses it and then looked up,
batch size by batch size from 1 to ``max_batch``, with the engine's own functions, taken from the
pinned wheels (fetched with ``pip download --no-deps`` into ``SPECOBS_CONTRACTS_CACHE``, default
``~/.cache/specobs-contracts``, as tests/test_instrument_contracts.py does; skipped with the
reason when the index cannot be reached). Nothing of the engines is imported: each function runs
from its own source, extracted with :mod:`ast` where its module imports the engine's runtime.

- vLLM 0.33.0 / 0.34.0: the JSON through ``SpeculativeConfig``'s field type (pydantic), then
  ``build_dynamic_sd_schedule_lookup`` (``vllm/v1/spec_decode/dynamic/utils.py``), which the
  scheduler indexes by the number of scheduled requests.
- SGLang 0.5.23: the tier file through ``resolve_candidate_steps_from_config`` and
  ``AdaptiveSpeculativeParams`` (``speculative/adaptive_spec_params.py``), routed through the decode
  CUDA-graph sizes the server would capture (``generate_decode_cuda_graph_batch_sizes``, or the
  snippet's own ``--cuda-graph-bs-decode``), and fed acceptance feedback to show a pinned tier
  never moves.
- TensorRT-LLM: PyPI's ``tensorrt-llm`` is a stub that downloads its multi-GB wheel from NVIDIA's
  own index while installing, so it is not fetched here. A ``tensorrt_llm-*.whl`` or a source tree
  at ``<cache>/tensorrt-llm-src`` is used when present (``DecodingBaseConfig``'s validator in
  ``llmapi/llm_args.py`` and ``get_draft_len_for_batch_size`` in ``_torch/speculative/utils.py``);
  otherwise those tests skip and say so.
"""

from __future__ import annotations

import ast
import bisect
import json
import logging
import math
import re
import shlex
import typing
import zipfile
from collections.abc import Callable, Sequence
from functools import cache, cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest
import yaml

from specobs.tools._diagnosis import _engine_config as ec
from specobs.tools._diagnosis._engine_config import ENGINES, Band, mapping, render
from tests import _pinned_wheels as pinned_wheels

CACHE = pinned_wheels.CACHE
VLLM_PINS = ("0.33.0", "0.34.0")
SGLANG_PIN = "0.5.23"
TRTLLM_SOURCE_DIR = "tensorrt-llm-src"

# Schedules that exercise every rule: equal neighbours to merge, a one-size band, a band end that
# is not one of SGLang's default CUDA-graph sizes (17), k = 0 in the middle and at the top, a
# last band that still speculates at max_batch, and bands reaching past max_batch.
SCHEDULES = {
    "three-bands": [Band(1, 32, 4, True), Band(33, 128, 2, True), Band(129, None, 0, False)],
    "fine": [Band(1, 1, 5, True), Band(2, 7, 3, True), Band(8, 17, 2, True),
             Band(18, 100, 1, False), Band(101, None, 1, False)],
    "zero-in-middle": [Band(1, 8, 4, True), Band(9, 40, 0, True), Band(41, None, 2, False)],
    "one-k": [Band(1, 64, 3, True), Band(65, None, 3, False)],
    "past-max": [Band(1, 50, 2, True), Band(51, 300, 1, False), Band(301, None, 0, False)],
}
MAX_BATCHES = (256, 100)


def expected(bands: Sequence[Band], max_batch: int) -> dict[int, int]:
    """k at each batch size as the bands define it (independent of the module under test)."""
    return {
        size: next(b.k for b in bands if b.lo <= size and (b.hi is None or size <= b.hi))
        for size in range(1, max_batch + 1)
    }


# -- the pinned wheels -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pinned_wheel() -> Callable[[str, str], Path]:
    """``(dist, version) -> wheel``: the cached wheel, downloaded once when missing."""
    return pinned_wheels.wheel


def _read(wheel: Path, member: str) -> str:
    text = pinned_wheels.member(wheel, member)
    assert text is not None, f"{wheel.name} has no {member}"
    return text


_class = pinned_wheels.class_def


def _field(cls: ast.ClassDef, name: str) -> ast.AnnAssign:
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and (
            node.target.id == name
        ):
            return node
    raise AssertionError(f"{cls.name}.{name} is missing")


def _annotation(cls: ast.ClassDef, name: str) -> str:
    return ast.unparse(_field(cls, name).annotation)


def _adapter(cls: ast.ClassDef, name: str) -> pydantic.TypeAdapter[Any]:
    """A pydantic field of an engine's config class, its type and its ``Field(...)`` constraints
    as the engine's source declares them."""
    node = _field(cls, name)
    kind = _type(ast.unparse(node.annotation))
    value = node.value
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "Field":
        info = eval(ast.unparse(value), {"Field": pydantic.Field})
        return pydantic.TypeAdapter(typing.Annotated[kind, info])
    return pydantic.TypeAdapter(kind)


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _run_functions(source: str, names: Sequence[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Execute the named top-level functions of ``source`` (decorators dropped) in
    ``namespace``; the engine's module, whose imports need its runtime, is never run."""
    tree = ast.parse(source)
    body = []
    for name in names:
        fn = _function(tree, name)
        assert fn is not None, f"{name} is missing"
        fn.decorator_list = []
        body.append(fn)
    module = ast.Module(body=body, type_ignores=[])
    exec(compile(module, "<engine source>", "exec"), namespace)
    return namespace


def _type(annotation: str) -> Any:
    """An engine's field annotation as a type pydantic validates against."""
    names = {**vars(typing), "NonNegativeInt": pydantic.NonNegativeInt,
             "PositiveInt": pydantic.PositiveInt}
    return eval(annotation, names)


def _strip_comments(snippet: str) -> str:
    return "\n".join(line for line in snippet.splitlines() if not line.startswith("#"))


# -- vLLM ------------------------------------------------------------------------------------------


@cache
def _vllm_lookup(wheel: Path) -> tuple[Callable[..., list[int]], Any, Any]:
    """vLLM's own ``build_dynamic_sd_schedule_lookup`` and the pydantic fields
    ``SpeculativeConfig.num_speculative_tokens`` and ``num_speculative_tokens_per_batch_size``."""
    namespace: dict[str, Any] = {}
    # The module imports nothing: run it whole.
    exec(compile(_read(wheel, "vllm/v1/spec_decode/dynamic/utils.py"), "utils.py", "exec"),
         namespace)
    config = _class(ast.parse(_read(wheel, "vllm/config/speculative.py")), "SpeculativeConfig")
    return (namespace["build_dynamic_sd_schedule_lookup"],
            _adapter(config, "num_speculative_tokens"),
            _adapter(config, "num_speculative_tokens_per_batch_size"))


def vllm_mapping(wheel: Path, snippet: str, max_num_seqs: int) -> dict[int, int]:
    """What vLLM's scheduler schedules at each batch size under the snippet."""
    arg_utils = _read(wheel, "vllm/engine/arg_utils.py")
    assert '"--speculative-config"' in arg_utils and "optional_type(json.loads)" in arg_utils
    fragment = json.loads(_strip_comments(snippet))
    assert set(fragment) == {"num_speculative_tokens", "num_speculative_tokens_per_batch_size"}
    build, tokens_field, schedule_field = _vllm_lookup(wheel)
    tokens = tokens_field.validate_python(fragment["num_speculative_tokens"])
    schedule = schedule_field.validate_python(fragment["num_speculative_tokens_per_batch_size"])
    dense = build(schedule, max_num_seqs, tokens)
    return {size: dense[size] for size in range(1, max_num_seqs + 1)}


@pytest.mark.parametrize("max_batch", MAX_BATCHES)
@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("version", VLLM_PINS)
def test_vllm_schedules_every_batch_size_as_the_bands_say(
    pinned_wheel: Callable[[str, str], Path], version: str, name: str, max_batch: int
) -> None:
    bands = SCHEDULES[name]
    wheel = pinned_wheel("vllm", version)
    snippet = render(bands, "vllm", max_batch=max_batch)
    assert snippet.startswith("# vLLM: add these two keys to the JSON of --speculative-config")
    assert vllm_mapping(wheel, snippet, max_batch) == expected(bands, max_batch)
    # A larger max_num_seqs than the schedule was rendered for carries the last band's k on.
    wider = vllm_mapping(wheel, snippet, 2 * max_batch)
    assert set(wider.values()) - set(expected(bands, max_batch).values()) == set()
    assert wider[2 * max_batch] == expected(bands, max_batch)[max_batch]


@pytest.mark.parametrize("version", VLLM_PINS)
def test_vllm_keeps_a_configured_num_speculative_tokens(
    pinned_wheel: Callable[[str, str], Path], version: str
) -> None:
    bands = SCHEDULES["three-bands"]
    snippet = render(bands, "vllm", num_speculative_tokens=6)
    assert json.loads(_strip_comments(snippet))["num_speculative_tokens"] == 6
    assert vllm_mapping(pinned_wheel("vllm", version), snippet, 256) == expected(bands, 256)


# -- SGLang ----------------------------------------------------------------------------------------


@cache
def _sglang_code(wheel: Path) -> dict[str, Any]:
    """SGLang's own tier loading, routing and step policy, and its decode CUDA-graph sizes."""
    namespace: dict[str, Any] = {
        "bisect": bisect, "json": json, "math": math, "logging": logging,
        "cached_property": cached_property, "logger": logging.getLogger("sglang-under-test"),
        "log_info_on_rank0": lambda logger, message: None,
    }
    source = _read(wheel, "sglang/srt/speculative/adaptive_spec_params.py")
    tree = ast.parse(source)
    wanted = {"DEFAULT_ADAPTIVE_CONFIG", "_load_adaptive_config",
              "resolve_candidate_steps_from_config", "AdaptiveStepSlot",
              "AdaptiveSpeculativeParams"}

    def name(node: ast.stmt) -> str | None:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return node.name
        if isinstance(node, ast.AnnAssign):
            return ast.unparse(node.target)
        if isinstance(node, ast.Assign):
            return ast.unparse(node.targets[0])
        return None

    keep = [node for node in tree.body if name(node) in wanted]
    assert {name(node) for node in keep} == wanted
    exec(compile(ast.Module(body=keep, type_ignores=[]), "adaptive_spec_params.py", "exec"),
         namespace)
    # resolving_view(server_args) is SGLang's read of the resolved arguments; a namespace stands in.
    namespace["resolving_view"] = lambda server_args: server_args
    _run_functions(_read(wheel, "sglang/srt/arg_groups/cuda_graph_hook.py"),
                   ["generate_decode_cuda_graph_batch_sizes"], namespace)
    return namespace


def _sglang_field_names(wheel: Path) -> set[str]:
    names: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist()
                   if m.startswith("sglang/srt/arg_groups/fields/") and m.endswith(".py")]
        for member in members:
            for node in ast.walk(ast.parse(archive.read(member).decode())):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
    return names


def _sglang_parts(snippet: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The tier file the snippet writes and its flags (each with its values)."""
    match = re.search(r"^cat > (\S+) <<'EOF'\n(.*?)\nEOF$", snippet, re.M | re.S)
    assert match is not None and match.group(1) == ec.SGLANG_CONFIG_FILE, snippet
    tiers = json.loads(match.group(2))
    flags: dict[str, list[str]] = {}
    words = shlex.split(snippet.rstrip("\n").splitlines()[-1])
    for word in words:
        if word.startswith("--"):
            flags[word] = []
            current = flags[word]
        else:
            current.append(word)
    return tiers, flags


def sglang_mapping(wheel: Path, snippet: str, max_batch: int, tmp_path: Path,
                   graphs: bool = True) -> dict[int, int]:
    """The k SGLang's adaptive worker activates at each batch size under the snippet, with the
    decode CUDA graphs it would capture (``graphs``) or without any."""
    code = _sglang_code(wheel)
    tiers, flags = _sglang_parts(snippet)
    fields = _sglang_field_names(wheel)
    for flag in flags:
        assert flag[2:].replace("-", "_") in fields, f"SGLang 0.5.23 has no {flag}"
    assert flags["--speculative-adaptive"] == []
    path = tmp_path / flags["--speculative-adaptive-config"][0]
    path.write_text(json.dumps(tiers))
    steps = int(flags["--speculative-num-steps"][0])
    # _init_adaptive_speculative_params (arg_groups/speculative_hook.py) refuses a
    # --speculative-num-steps that is not one of the candidates.
    assert steps in code["resolve_candidate_steps_from_config"](str(path))
    params = code["AdaptiveSpeculativeParams"](initial_steps=steps, cfg_path=str(path))
    if graphs:
        sizes = ([int(v) for v in flags["--cuda-graph-bs-decode"]]
                 if "--cuda-graph-bs-decode" in flags else
                 code["generate_decode_cuda_graph_batch_sizes"](
                     SimpleNamespace(disable_cuda_graph_padding=False,
                                     speculative_algorithm="EAGLE3"), max_batch))
        params.set_cuda_graph_bs(sizes)
    return {size: params.get_steps_for_batch(size) for size in range(1, max_batch + 1)}


@pytest.mark.parametrize("max_batch", MAX_BATCHES)
@pytest.mark.parametrize("name", SCHEDULES)
def test_sglang_activates_every_batch_size_as_the_bands_say(
    pinned_wheel: Callable[[str, str], Path], tmp_path: Path, name: str, max_batch: int
) -> None:
    bands = SCHEDULES[name]
    wheel = pinned_wheel("sglang", SGLANG_PIN)
    snippet = render(bands, "sglang", max_batch=max_batch)
    want = expected(bands, max_batch)
    assert sglang_mapping(wheel, snippet, max_batch, tmp_path) == want
    assert sglang_mapping(wheel, snippet, max_batch, tmp_path, graphs=False) == want


def test_sglang_needs_the_band_end_among_its_graph_sizes(
    pinned_wheel: Callable[[str, str], Path], tmp_path: Path
) -> None:
    """17 ends a band but SGLang's default graphs jump from 16 to 18: without the added size a
    batch of 17 is padded to 18 and runs the next band's k."""
    bands = SCHEDULES["fine"]
    snippet = render(bands, "sglang")
    assert "--cuda-graph-bs-decode" in snippet and " 16 17 18 " in snippet
    without = re.sub(r" --cuda-graph-bs-decode[ 0-9]*$", "", snippet.rstrip("\n"))
    wheel = pinned_wheel("sglang", SGLANG_PIN)
    got = sglang_mapping(wheel, without, 256, tmp_path)
    assert got[17] == 1 and expected(bands, 256)[17] == 2
    assert "--cuda-graph-bs-decode" not in render(SCHEDULES["three-bands"], "sglang")


def test_sglang_pinned_tiers_never_move(
    pinned_wheel: Callable[[str, str], Path], tmp_path: Path
) -> None:
    """Acceptance feedback, all drafts accepted or none, cannot switch a one-candidate tier."""
    code = _sglang_code(pinned_wheel("sglang", SGLANG_PIN))
    bands = SCHEDULES["zero-in-middle"]
    tiers, flags = _sglang_parts(render(bands, "sglang"))
    path = tmp_path / "tiers.json"
    path.write_text(json.dumps(tiers))
    params = code["AdaptiveSpeculativeParams"](
        initial_steps=int(flags["--speculative-num-steps"][0]), cfg_path=str(path))
    for size in (1, 8, 9, 40, 41, 200):
        for accepted in (0, 4) * 40:
            assert params.on_verify_complete([accepted] * size, batch_size=size) is None
        assert params.get_steps_for_batch(size) == expected(bands, 256)[size]


@pytest.mark.parametrize("max_bs", [1, 7, 17, 64, 100, 256, 300, 512])
def test_sglang_default_graph_sizes_match_sglang(
    pinned_wheel: Callable[[str, str], Path], max_bs: int
) -> None:
    generate = _sglang_code(pinned_wheel("sglang", SGLANG_PIN))[
        "generate_decode_cuda_graph_batch_sizes"]
    spec = SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm="EAGLE")
    assert ec.sglang_default_graph_sizes(max_bs) == generate(spec, max_bs)


# -- TensorRT-LLM ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def trtllm_source() -> Callable[[str], str]:
    """``path -> text`` of a TensorRT-LLM wheel or source tree found in the cache."""
    wheels = sorted(CACHE.glob("tensorrt_llm-*.whl"))
    tree = CACHE / TRTLLM_SOURCE_DIR
    if wheels:
        return lambda path: _read(wheels[-1], path)
    if (tree / "tensorrt_llm" / "llmapi" / "llm_args.py").is_file():
        return lambda path: (tree / path).read_text()
    pytest.skip(
        f"no TensorRT-LLM wheel (tensorrt_llm-*.whl) or source tree ({TRTLLM_SOURCE_DIR}/) in "
        f"{CACHE}: PyPI's tensorrt-llm is a stub that downloads its multi-GB wheel from NVIDIA's "
        "own index while installing, so these tests do not fetch it"
    )


@cache
def _trtllm_code(read: Callable[[str], str]) -> tuple[Callable[..., Any], Callable[..., int], Any]:
    """TensorRT-LLM's ``draft_len_schedule`` validator, its runtime lookup and the field type."""
    args = read("tensorrt_llm/llmapi/llm_args.py")
    config = _class(ast.parse(args), "DecodingBaseConfig")
    _field(config, "max_draft_len")
    field = pydantic.TypeAdapter(_type(_annotation(config, "draft_len_schedule")))
    validate = _run_functions(args, ["validate_draft_len_schedule_and_sort"],
                              {"logger": logging.getLogger("trtllm-under-test")})
    utils = read("tensorrt_llm/_torch/speculative/utils.py")
    if _function(ast.parse(utils), "get_draft_len_for_batch_size") is None:
        pytest.skip("this TensorRT-LLM is 1.2 or older: its draft_len_schedule keys are first "
                    "batch sizes, which the renderer does not target")
    lookup = _run_functions(utils, ["get_draft_len_for_batch_size"],
                            {"bisect_left": bisect.bisect_left, **vars(typing)})
    return (validate["validate_draft_len_schedule_and_sort"],
            lookup["get_draft_len_for_batch_size"], field)


def trtllm_mapping(read: Callable[[str], str], snippet: str, max_batch: int) -> dict[int, int]:
    validate, lookup, field = _trtllm_code(read)
    config = yaml.safe_load(snippet)["speculative_config"]
    assert set(config) == {"max_draft_len", "draft_len_schedule"}
    max_draft_len = config["max_draft_len"]
    schedule = validate(None, field.validate_python(config["draft_len_schedule"]),
                        SimpleNamespace(data={"max_draft_len": max_draft_len}))
    return {size: lookup(schedule, size, max_draft_len) for size in range(1, max_batch + 1)}


@pytest.mark.parametrize("max_batch", MAX_BATCHES)
@pytest.mark.parametrize("name", SCHEDULES)
def test_trtllm_drafts_every_batch_size_as_the_bands_say(
    trtllm_source: Callable[[str], str], name: str, max_batch: int
) -> None:
    bands = SCHEDULES[name]
    snippet = render(bands, "trtllm", max_batch=max_batch)
    assert trtllm_mapping(trtllm_source, snippet, max_batch) == expected(bands, max_batch)


def test_trtllm_refuses_a_k_rising_with_batch_size() -> None:
    """TensorRT-LLM takes max_draft_len from the smallest key and caps every other k there."""
    with pytest.raises(ValueError, match=r"draft length at batch size 1 .* k=2 .* got k=3 for "
                                         r"batch sizes 9-256"):
        render([Band(1, 8, 2, True), Band(9, None, 3, True)], "trtllm")
    with pytest.raises(ValueError, match="got k=1 for batch sizes 5-256"):
        render([Band(1, 4, 0, True), Band(5, None, 1, True)], "trtllm")
    # The other engines take the same bands.
    for engine in ("vllm", "sglang", "table"):
        render([Band(1, 8, 2, True), Band(9, None, 3, True)], engine)


# -- a renderer with an off-by-one bound fails every engine's check --------------------------------


def _shifted_runs(bands: Sequence[Band], max_batch: int) -> list[tuple[int, int, int]]:
    """The real runs with every inner boundary one batch size lower."""
    runs = _real_runs(bands, max_batch)
    return [(first - (i > 0), last - (i < len(runs) - 1), k)
            for i, (first, last, k) in enumerate(runs)]


_real_runs = ec._runs


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_an_off_by_one_renderer_is_caught(
    pinned_wheel: Callable[[str, str], Path], request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine: str,
) -> None:
    bands = SCHEDULES["three-bands"]
    monkeypatch.setattr(ec, "_runs", _shifted_runs)
    snippet = render(bands, engine)
    if engine == "vllm":
        got = vllm_mapping(pinned_wheel("vllm", VLLM_PINS[-1]), snippet, 256)
    elif engine == "sglang":
        got = sglang_mapping(pinned_wheel("sglang", SGLANG_PIN), snippet, 256, tmp_path)
    else:
        got = trtllm_mapping(request.getfixturevalue("trtllm_source"), snippet, 256)
    want = expected(bands, 256)
    assert got != want
    assert {size for size in want if got[size] != want[size]} == {32, 128}


# -- input checks, all-zero schedules, the table ---------------------------------------------------


@pytest.mark.parametrize(
    ("bands", "kwargs", "message"),
    [
        ([], {}, r"bands: expected a non-empty sequence of Band, got \[\]"),
        ([(1, None, 2, True)], {}, r"bands\[0\]: expected a Band, got \(1, None, 2, True\)"),
        ([Band(2, None, 2, True)], {}, r"start at batch size 1; got lo=2"),
        ([Band(1, 10, 2, True), Band(12, None, 1, True)], {},
         r"bands\[1\]: .* right after the previous band, at 11; got lo=12"),
        ([Band(1, 10, 2, True), Band(10, None, 1, True)], {}, r"at 11; got lo=10"),
        ([Band(1, None, 2, True), Band(5, None, 1, True)], {},
         r"only the last band may be open-ended"),
        ([Band(1, 0, 2, True)], {}, r"expected hi >= lo=1 or None, got 0"),
        ([Band(1, None, -1, True)], {}, r"bands\[0\] \(1\+\): expected k >= 0, got -1"),
        ([Band(1, None, True, True)], {}, r"expected k >= 0, got True"),
        ([Band(1, None, 2, "yes")], {}, r"expected measured to be a bool, got 'yes'"),  # type: ignore[arg-type]
        ([Band(1, 200, 2, True)], {},
         r"cover batch sizes 1 to max_batch=256; they end at 200"),
        ([Band(1, None, 2, True)], {"max_batch": 0}, r"max_batch: expected an int >= 1, got 0"),
        ([Band(1, 8, 5, True), Band(9, None, 2, True)], {"num_speculative_tokens": 4},
         r"band 1-8 asks k=5, above num_speculative_tokens=4.* Raise num_speculative_tokens "
         r"to 5"),
        ([Band(1, None, 2, True)], {"num_speculative_tokens": 0},
         r"num_speculative_tokens: expected None or an int >= 1, got 0"),
    ],
)
def test_bad_input_says_what_was_expected_and_got(
    bands: list[Band], kwargs: dict[str, Any], message: str
) -> None:
    for engine in ENGINES:
        with pytest.raises(ValueError, match=message):
            render(bands, engine, **kwargs)


def test_unknown_engine() -> None:
    with pytest.raises(ValueError, match=r"engine: expected one of vllm, sglang, trtllm, "
                                         r"table; got 'tgi'"):
        render(SCHEDULES["three-bands"], "tgi")


def test_a_band_reaching_past_max_batch_is_enough() -> None:
    bands = [Band(1, 10, 3, True), Band(11, 300, 1, False)]
    assert mapping(bands) == expected(bands, 256)
    assert "[11, 256, 1]" in render(bands, "vllm")


@pytest.mark.parametrize("bands", [
    [Band(1, None, 0, True)],
    [Band(1, 16, 0, True), Band(17, None, 0, False)],
    # k > 0 only beyond max_batch: nothing up to it speculates.
    [Band(1, 300, 0, True), Band(301, None, 3, False)],
])
def test_all_zero_says_turn_speculation_off(bands: list[Band]) -> None:
    for engine in ("vllm", "sglang", "trtllm"):
        text = render(bands, engine)
        assert "turn speculation off" in text
        assert all(line.startswith("#") for line in text.splitlines()), text
    assert "start vLLM without --speculative-config" in render(bands, "vllm")
    assert yaml.safe_load(render(bands, "trtllm")) is None
    table = render(bands, "table")
    assert table.splitlines()[-1] == (
        "No batch size from 1 to 256 gains from speculation: turn speculation off.")


def test_table() -> None:
    assert render(SCHEDULES["fine"], "table") == (
        "batch size  k  source\n"
        "1           5  measured\n"
        "2-7         3  measured\n"
        "8-17        2  measured\n"
        "18-100      1  extrapolated\n"
        "101+        1  extrapolated\n"
    )


def test_mapping_is_the_bands() -> None:
    for bands in SCHEDULES.values():
        for max_batch in MAX_BATCHES:
            assert mapping(bands, max_batch) == expected(bands, max_batch)
