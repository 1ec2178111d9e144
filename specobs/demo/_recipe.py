"""The demo models' training recipe: the target learns a synthetic language, the draft head learns
the target by self-distillation. Both are seeded and run on CPU.

1. Target: next-token cross-entropy on running text of :class:`SyntheticLanguage` (a few hundred
   Adam steps), so its greedy continuations are grammatical, prompt-dependent text.
2. Self-distillation data: seeded prompts cut from held-out text, continued by the target's own
   greedy decoding; one more target forward over each whole sequence yields the three hidden
   layers the draft reads and the target's argmax at every position (the labels).
3. Draft: cross-entropy against the target's argmax, unrolled over 3 chain steps per position
   (EAGLE-3's "training-time test": steps after the first feed the draft its own hidden state),
   with step weights 1, 0.8, 0.64. 60% of the input tokens are replaced by random ones during
   training, so the head learns to read the target's features instead of memorising token
   n-grams of a small language. Even so, how far acceptance falls when the head is fed the
   wrong layers depended on the training run (wrong / healthy 0.35-0.94 over seeds) until the
   target's residual stream was made to grow with depth (``TargetConfig.residual_growth``):
   now 0.27-0.72, median 0.49, over 8 seeds (benchmarks/RESULTS.md).

:mod:`._train` decides when to train (a cold cache) and keeps the weights; this module only
trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from ._draft import DraftConfig, DraftHead
from ._model import SyntheticLanguage, TargetConfig, TargetModel

__all__ = [
    "TrainSettings",
    "distill_data",
    "initial_draft",
    "target_progress",
    "train_draft",
    "train_target",
]

# The progress callback of target training on this thread (see target_progress).
_progress = threading.local()


@contextlib.contextmanager
def target_progress(callback: Callable[[int, int, float], None]) -> Iterator[None]:
    """Within the block, target training on this thread calls ``callback(step, total,
    elapsed_seconds)`` after every optimizer step (``specobs demo`` shows steps, elapsed time
    and an estimate during the first run's training). Not part of the cache key."""
    previous = getattr(_progress, "callback", None)
    _progress.callback = callback
    try:
        yield
    finally:
        _progress.callback = previous


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """How long and on what the demo models train (part of the cache key)."""

    target_steps: int = 300
    target_batch: int = 24
    target_seq_len: int = 48
    target_lr: float = 2.5e-3
    distill_sequences: int = 192
    distill_seq_len: int = 64
    draft_steps: int = 250
    draft_batch: int = 24
    draft_lr: float = 3e-3
    draft_unroll: int = 3
    draft_token_noise: float = 0.6



class _Adam:
    """Plain Adam with linear warm-up and linear decay.

    Hand-rolled because ``torch.optim`` imports ``torch._dynamo`` on first use, which costs
    seconds of start-up on a small CPU, more than the training itself."""

    def __init__(
        self,
        params: list[torch.Tensor],
        lr: float,
        total_steps: int,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-8,
        warmup: int = 20,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.total, self.warmup = lr, total_steps, warmup
        self.b1, self.b2, self.eps = betas[0], betas[1], eps
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        t = self.t
        lr = self.lr * min(1.0, t / self.warmup) * max(0.05, 1.0 - (t - 1) / self.total)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        torch._foreach_mul_(self.m, self.b1)
        torch._foreach_add_(self.m, grads, alpha=1 - self.b1)
        torch._foreach_mul_(self.v, self.b2)
        torch._foreach_addcmul_(self.v, grads, grads, value=1 - self.b2)
        denom = torch._foreach_sqrt(self.v)
        torch._foreach_div_(denom, (1 - self.b2**t) ** 0.5)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(self.params, self.m, denom, value=-lr / (1 - self.b1**t))


def train_target(
    config: TargetConfig, language: SyntheticLanguage, seed: int, s: TrainSettings
) -> tuple[TargetModel, dict[str, float]]:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = TargetModel(config)
    model.train()
    stream = torch.tensor(language.stream(max(20_000, s.target_steps * 200), seed=seed + 1))
    opt = _Adam(list(model.parameters()), s.target_lr, s.target_steps)
    span = s.target_seq_len + 1
    offsets = torch.arange(span)
    t0 = time.perf_counter()
    loss = torch.zeros(())
    progress: Callable[[int, int, float], None] | None = getattr(_progress, "callback", None)
    for step in range(1, s.target_steps + 1):
        starts = torch.randint(0, len(stream) - span, (s.target_batch,), generator=gen)
        batch = stream[starts.unsqueeze(1) + offsets]
        logits, _ = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if progress is not None:
            progress(step, s.target_steps, time.perf_counter() - t0)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, {"target_loss": float(loss.detach()), "target_seconds": time.perf_counter() - t0}


@torch.inference_mode()
def _greedy_batch(target: TargetModel, prompts: torch.Tensor, n_new: int) -> torch.Tensor:
    """Greedy continuation of equal-length prompts ``[B, P]`` -> ``[B, P + n_new]``."""
    b, p = prompts.shape
    cache = target.new_cache(b)
    slots = torch.arange(b)
    seq = prompts
    tokens, positions = prompts, torch.arange(p).expand(b, p)
    for i in range(n_new):
        logits, _ = target(tokens, positions, cache=cache, slots=slots)
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat((seq, nxt), dim=1)
        tokens = nxt
        positions = torch.full((b, 1), p + i)
    return seq


@torch.inference_mode()
def distill_data(
    target: TargetModel,
    language: SyntheticLanguage,
    layer_ids: tuple[int, ...],
    seed: int,
    s: TrainSettings,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequences of seeded prompts + the target's greedy continuation; returns the sequences'
    next tokens ``[N, T-1]``, the target's hidden features ``[N, T-1, 3d]`` and its argmax labels
    ``[N, T-1]`` (label ``t`` is the target's prediction for position ``t + 1``)."""
    rng = random.Random(seed + 2)
    text = language.stream(s.distill_sequences * 40, seed=seed + 3)
    groups = 4
    per = s.distill_sequences // groups
    seqs = []
    for g in range(groups):
        plen = 4 + g * 6  # prompts of 4, 10, 16, 22 tokens
        starts = [rng.randrange(0, len(text) - plen) for _ in range(per)]
        prompts = torch.tensor([text[i : i + plen] for i in starts])
        seqs.append(_greedy_batch(target, prompts, s.distill_seq_len - plen))
    seq = torch.cat(seqs)
    logits, hidden = target(seq, hidden_layers=layer_ids)
    assert hidden is not None
    labels = logits.argmax(-1)
    # Draft input at t is (g_t, x_{t+1}); its label is the target's prediction at t + 1.
    return seq[:, 1:], hidden[:, :-1], labels[:, 1:]


def initial_draft(target: TargetModel, config: DraftConfig, seed: int) -> DraftHead:
    """The untrained draft head training starts from (seeded)."""
    torch.manual_seed(seed + 4)
    return DraftHead(config, target)


def train_draft(
    target: TargetModel,
    config: DraftConfig,
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    seed: int,
    s: TrainSettings,
    on_step: Callable[[int, DraftHead], None] | None = None,
) -> tuple[DraftHead, dict[str, float]]:
    """Train the draft head; ``on_step(step, draft)`` is called after every optimizer step
    (1-based), from this thread."""
    next_tokens, features, labels = data
    draft = initial_draft(target, config, seed)
    gen = torch.Generator().manual_seed(seed + 5)
    draft.train()
    opt = _Adam(list(draft.parameters()), s.draft_lr, s.draft_steps)
    vocab = target.config.vocab_size
    t0 = time.perf_counter()
    accs = [0.0] * s.draft_unroll
    for _ in range(s.draft_steps):
        rows = torch.randint(0, next_tokens.shape[0], (s.draft_batch,), generator=gen)
        tokens = next_tokens[rows]
        if s.draft_token_noise > 0:
            # Replace some input tokens with random ones so the head cannot lean on token
            # n-grams alone and learns to read the target's features (what EAGLE relies on).
            noisy = torch.rand(tokens.shape, generator=gen) < s.draft_token_noise
            random_ids = torch.randint(0, vocab, tokens.shape, generator=gen)
            tokens = torch.where(noisy, random_ids, tokens)
        outs = draft.train_forward(features[rows], tokens, s.draft_unroll)
        loss = torch.zeros(())
        for step, logits in enumerate(outs, start=1):
            # Entry t of step s predicts label t (the target's guess for x_{t+2}); valid for
            # t >= s - 1 (a verified position exists).
            lo = step - 1
            pred = logits[:, lo:].reshape(-1, vocab)
            want = labels[rows][:, lo:].reshape(-1)
            loss = loss + (0.8 ** (step - 1)) * F.cross_entropy(pred, want)
            accs[step - 1] = float((pred.argmax(-1) == want).float().mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_step is not None:
            on_step(opt.t, draft)
    draft.eval()
    for p in draft.parameters():
        p.requires_grad_(False)
    info = {"draft_seconds": time.perf_counter() - t0, "draft_loss": float(loss.detach())}
    for i, acc in enumerate(accs, start=1):
        info[f"draft_train_top1_step{i}"] = acc
    return draft, info
