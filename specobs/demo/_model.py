"""The demo's target model: a small decoder-only transformer with a static, slot-indexed KV cache.

Also the synthetic language it is trained on and a tokenizer for text prompts.

The KV cache is pre-allocated as ``[layers, slots, heads, max_seq_len, head_dim]``. A sequence owns
a slot; how much of the slot is valid is a per-slot length that the caller keeps. Rolling back
rejected speculative tokens is therefore just resetting that length: stale entries beyond it are
never attended to (the causal mask only admits key positions ``<=`` the query's position) and are
overwritten by the next forward before it attends. Every forward takes a ``[batch, q_len]`` block of
new tokens at per-row positions, so sequences of different lengths share one batched forward, and
the same code runs eagerly on CPU and inside CUDA graph capture (no host syncs, no data-dependent
shapes when ``attend_len`` is fixed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "AttentionStep",
    "KVCache",
    "SyntheticLanguage",
    "TargetConfig",
    "TargetModel",
    "WordTokenizer",
    "greedy_generate",
    "serving_matmuls",
]


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """Shape of the target transformer. The defaults are small enough to serve and train on a
    laptop CPU (benchmarks/RESULTS.md has the rates).

    ``residual_growth``: block ``i`` (0-based) adds ``1 + residual_growth * i`` times its output
    to the residual stream, so the stream's norm grows with depth (about 9x from the first block
    to the last at the default 1.0), as hidden-state norms do in large LLMs. Without it the
    six layers of this small model are nearly alike (cosine 0.8-0.99 between any two), and a
    draft head fed the wrong layers hardly notices; with it, a mis-wired draft collapses as it
    does in real deployments (benchmarks/RESULTS.md). 0 gives a plain pre-norm transformer."""

    vocab_size: int = 512
    d_model: int = 128
    n_layers: int = 6
    n_heads: int = 4
    d_ff: int = 384
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    residual_growth: float = 1.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TargetConfig.{name} must be a positive int, got {value!r}")
        if self.vocab_size < WordTokenizer.FIRST_WORD_ID + 8:
            raise ValueError(
                f"TargetConfig.vocab_size must be at least {WordTokenizer.FIRST_WORD_ID + 8} "
                f"(specials + 256 bytes + a few words), got {self.vocab_size}"
            )
        growth = self.residual_growth
        if isinstance(growth, bool) or not isinstance(growth, int | float) or not growth >= 0:
            raise ValueError(
                f"TargetConfig.residual_growth must be a number >= 0, got {growth!r}"
            )
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"TargetConfig.d_model ({self.d_model}) must split into n_heads ({self.n_heads}) "
                "heads of an even size"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def digest(self) -> str:
        """A short stable hash of the config (names the cached weight files)."""
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class KVCache:
    """Static KV storage for ``n_slots`` sequences of up to ``max_len`` tokens each.

    ``lengths[slot]`` is the number of valid positions in the slot. It is bookkeeping for the
    caller; the forward never reads it (positions are passed explicitly), which is what makes a
    rollback a plain assignment.
    """

    def __init__(
        self,
        n_layers: int,
        n_slots: int,
        n_heads: int,
        max_len: int,
        head_dim: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (n_layers, n_slots, n_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.lengths = [0] * n_slots

    @property
    def n_slots(self) -> int:
        return self.k.shape[1]


def causal_mask(positions: torch.Tensor, attend_len: int) -> torch.Tensor:
    """``[B, 1, Q, T]`` bool mask: key position ``j`` is visible to a query at ``p`` iff
    ``j <= p``."""
    keys = torch.arange(attend_len, device=positions.device)
    return (keys.view(1, 1, -1) <= positions.unsqueeze(-1)).unsqueeze(1)


class AttentionStep(NamedTuple):
    """What every layer of one forward attends with: the rotary table at the block's positions,
    the mask, the cache slots ``[B]`` (None without a cache), the positions ``[B, Q]`` and how
    many of each slot's positions attention covers."""

    rope: tuple[torch.Tensor, torch.Tensor]
    mask: torch.Tensor
    slots: torch.Tensor | None
    positions: torch.Tensor
    attend_len: int


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(
        self, x: torch.Tensor, step: AttentionStep, cache: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        rope, mask, slots, positions, attend_len = step
        b, q_len, d = x.shape
        q, k, v = self.qkv(x).view(b, q_len, 3, self.n_heads, self.head_dim).unbind(2)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        if cache is None:
            keys, values = k.transpose(1, 2), v.transpose(1, 2)
        else:
            ck, cv = cache
            # Write the new keys first, then attend: positions being re-used after a rollback are
            # overwritten before anyone can see their stale contents.
            rows = slots.unsqueeze(1)
            ck[rows, :, positions] = k
            cv[rows, :, positions] = v
            keys, values = ck[slots, :, :attend_len], cv[slots, :, :attend_len]
        y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, q_len, d))


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary embedding on ``[B, Q, H, D]`` with per-row positions baked into ``rope``."""
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Block(nn.Module):
    """Pre-norm attention + MLP (SiLU) block; the draft head reuses it as its one decoder layer."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.mlp_norm = RMSNorm(d_model)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)
        self.gain = 1.0
        # Scale of this block's updates to the residual stream (TargetConfig.residual_growth).

    def forward(
        self, x: torch.Tensor, step: AttentionStep, cache: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        a = self.attn(self.attn_norm(x), step, cache)
        x = x + self.gain * a
        return x + self.gain * self.down(F.silu(self.up(self.mlp_norm(x))))


class RotaryTable(nn.Module):
    def __init__(self, head_dim: int, max_len: int, theta: float) -> None:
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.arange(max_len, dtype=torch.float64).unsqueeze(1) * inv.unsqueeze(0)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # [B, Q] -> [B, Q, 1, D/2], broadcasting over heads.
        return self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)


class TargetModel(nn.Module):
    """Decoder-only transformer: embedding, RoPE, pre-norm blocks, final norm, LM head."""

    def __init__(self, config: TargetConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.rope = RotaryTable(c.head_dim, c.max_seq_len, c.rope_theta)
        self.blocks = nn.ModuleList(Block(c.d_model, c.n_heads, c.d_ff) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
        for i, block in enumerate(self.blocks):
            nn.init.normal_(block.down.weight, std=0.02 / math.sqrt(2 * c.n_layers))
            nn.init.normal_(block.attn.out.weight, std=0.02 / math.sqrt(2 * c.n_layers))
            block.gain = 1.0 + float(c.residual_growth) * i

    def new_cache(self, n_slots: int, *, device: torch.device | str | None = None) -> KVCache:
        c = self.config
        dev = device if device is not None else self.lm_head.weight.device
        return KVCache(c.n_layers, n_slots, c.n_heads, c.max_seq_len, c.head_dim, device=dev)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        cache: KVCache | None = None,
        slots: torch.Tensor | None = None,
        attend_len: int | None = None,
        hidden_layers: Sequence[int] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ``tokens`` ``[B, Q]`` at ``positions`` ``[B, Q]`` (default ``0..Q-1``).

        With ``cache`` and ``slots`` ``[B]`` the new keys/values are written into those slots and
        attention covers the slot's first ``attend_len`` positions (default: up to the largest
        position in the block), masked causally per row. Without a cache the block attends to
        itself causally (training). Returns logits ``[B, Q, V]`` and, when ``hidden_layers`` is
        given, the outputs of those blocks concatenated on the last dim ``[B, Q, len * d_model]``.
        """
        b, q_len = tokens.shape
        if positions is None:
            positions = torch.arange(q_len, device=tokens.device).expand(b, q_len)
        if cache is None:
            attend_len = q_len
        elif attend_len is None:
            attend_len = int(positions.max()) + 1
        if cache is None:
            mask = causal_mask(torch.arange(q_len, device=tokens.device).unsqueeze(0), q_len)
        else:
            mask = causal_mask(positions, attend_len)
        step = AttentionStep(self.rope(positions), mask, slots, positions, attend_len)
        x = self.embed(tokens)
        wanted = {layer: None for layer in hidden_layers}
        for i, block in enumerate(self.blocks):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            x = block(x, step, kv)
            if i in wanted:
                wanted[i] = x
        logits = self.lm_head(self.norm(x))
        if not hidden_layers:
            return logits, None
        return logits, torch.cat([wanted[layer] for layer in hidden_layers], dim=-1)


def validate_prompt(prompt_ids: object, vocab_size: int, max_len: int) -> list[int]:
    """Return ``prompt_ids`` as a list of ints, or raise ValueError saying what was wrong."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 1:
            raise ValueError(
                f"prompt_ids must be a 1-D sequence of token ids, got a tensor of shape "
                f"{tuple(prompt_ids.shape)}"
            )
        prompt_ids = prompt_ids.tolist()
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Iterable):
        raise ValueError(
            f"prompt_ids must be a sequence of int token ids, got {type(prompt_ids).__name__}"
        )
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt_ids must contain at least 1 token id, got an empty sequence")
    for i, tok in enumerate(ids):
        if isinstance(tok, bool) or not isinstance(tok, int):
            raise ValueError(
                f"prompt_ids[{i}] must be an int token id, got {type(tok).__name__} {tok!r}"
            )
        if not 0 <= tok < vocab_size:
            raise ValueError(
                f"prompt_ids[{i}] = {tok} is out of range: expected token ids in [0, {vocab_size})"
            )
    if len(ids) > max_len:
        raise ValueError(
            f"prompt is too long: expected at most {max_len} tokens (max_seq_len), got {len(ids)}"
        )
    return ids


def validate_max_tokens(max_tokens: object) -> int:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise ValueError(f"max_tokens must be an int >= 1, got {type(max_tokens).__name__}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens}")
    return max_tokens


@contextlib.contextmanager
def serving_matmuls(device: torch.device) -> Iterator[None]:
    """Float32 matmuls on CUDA in TF32, as fp32 models are served, for the block inside.

    Every forward the demo runs on CUDA (its cycles, their CUDA-graph captures, the baseline's
    plain step, the greedy reference) runs inside this, so they compare alike. In full fp32,
    cuBLAS may pick a much slower kernel for 8 to 16 rows (a batch of 4 verifying k = 1..3) than
    for 4 or 20 rows, so the demo's verify cost far more at k <= 3 (benchmarks/RESULTS.md,
    benchmarks/diag/demo_forward_cost.py); in TF32 the forward costs the same from 4 to 36 rows.
    The setting is process-wide while the block runs (torch has no per-thread one); the previous
    one is restored after. CPU: unchanged."""
    if device.type != "cuda":
        yield
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@torch.inference_mode()
def greedy_generate(
    target: TargetModel,
    prompt_ids: Sequence[int],
    max_tokens: int,
    *,
    eos_id: int | None = None,
) -> list[int]:
    """Plain (non-speculative) greedy decoding, one token per forward: the reference output.

    Stops after ``max_tokens`` tokens, or when ``eos_id`` is generated (the eos token is not part
    of the output), or when the sequence fills ``max_seq_len``.
    """
    c = target.config
    ids = validate_prompt(prompt_ids, c.vocab_size, c.max_seq_len)
    max_tokens = validate_max_tokens(max_tokens)
    device = target.lm_head.weight.device
    cache = target.new_cache(1)
    slots = torch.zeros(1, dtype=torch.long, device=device)
    tokens = torch.tensor([ids], device=device)
    positions = torch.arange(len(ids), device=device).unsqueeze(0)
    out: list[int] = []
    length = len(ids)
    with serving_matmuls(device):
        while True:
            logits, _ = target(tokens, positions, cache=cache, slots=slots)
            nxt = int(logits[0, -1].argmax())
            if nxt == eos_id:
                break
            out.append(nxt)
            if len(out) >= max_tokens or length >= c.max_seq_len:
                break
            tokens = torch.tensor([[nxt]], device=device)
            positions = torch.tensor([[length]], device=device)
            length += 1
    return out


class WordTokenizer:
    """Word-level tokenizer over the synthetic language's words, with a byte fallback.

    Ids: 0 ``<pad>``, 1 ``<bos>``, 2 ``<eos>``, 3..258 the bytes 0..255, then one id per word of
    the language. Any text encodes (unknown words become bytes); text made of the language's words
    decodes back exactly (single spaces). Two word tokens are joined by a space; a space between
    anything else is an explicit byte token.
    """

    PAD_ID = 0
    BOS_ID = 1
    EOS_ID = 2
    FIRST_BYTE_ID = 3
    FIRST_WORD_ID = 3 + 256
    _PIECE = re.compile(r"\w+|[^\w\s]")

    def __init__(self, words: Sequence[str]) -> None:
        self.words = list(words)
        self.word_to_id = {w: self.FIRST_WORD_ID + i for i, w in enumerate(self.words)}
        if len(self.word_to_id) != len(self.words):
            raise ValueError("WordTokenizer words must be unique")
        self.vocab_size = self.FIRST_WORD_ID + len(self.words)

    @property
    def eos_id(self) -> int:
        return self.EOS_ID

    def byte_id(self, byte: int) -> int:
        return self.FIRST_BYTE_ID + byte

    def is_word(self, token_id: int) -> bool:
        return token_id >= self.FIRST_WORD_ID

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        out: list[int] = []
        for chunk in text.split():
            for j, piece in enumerate(self._PIECE.findall(chunk)):
                word = self.word_to_id.get(piece)
                ids = [word] if word is not None else [self.byte_id(b) for b in piece.encode()]
                if j == 0 and out and not (self.is_word(out[-1]) and word is not None):
                    out.append(self.byte_id(0x20))
                out.extend(ids)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        parts: list[str] = []
        pending = bytearray()
        prev_word = False
        for tok in ids:
            tok = int(tok)
            if self.FIRST_BYTE_ID <= tok < self.FIRST_WORD_ID:
                pending.append(tok - self.FIRST_BYTE_ID)
                prev_word = False
            elif self.FIRST_WORD_ID <= tok < self.vocab_size:
                if pending:
                    parts.append(pending.decode("utf-8", errors="replace"))
                    pending.clear()
                parts.append((" " if prev_word else "") + self.words[tok - self.FIRST_WORD_ID])
                prev_word = True
        if pending:
            parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)


class SyntheticLanguage:
    """A seeded stochastic grammar over pseudo-words: the "language" the target is trained on.

    Sentences follow a small phrase-structure grammar (determiner, optional adjectives, noun,
    verb, optional object, prepositional phrase and adverb, ending in "."); the choice of each word
    depends on the previous word through a seeded successor table per word class (12 candidates,
    probabilities falling as rank ** -0.8). The tables are flat enough that the trained target's
    greedy choice between close candidates depends on more than the last word, which is what
    makes its continuations worth predicting from its hidden states (as EAGLE does) rather than
    from token n-grams; a sentence's first word depends on the last word of the sentence before
    it, so greedy text walks through many different sentences.
    """

    CLASSES = {"det": 8, "adj": 40, "noun": 80, "verb": 60, "adv": 25, "prep": 15, "conj": 6}
    SUCCESSORS = 12
    """Candidate next words per (previous word, class)."""
    ZIPF = 0.8
    """Skew of the candidates' probabilities (rank ** -ZIPF)."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        n_words = vocab_size - WordTokenizer.FIRST_WORD_ID
        rng = random.Random(seed)
        words = self._make_words(rng, n_words)
        self.tokenizer = WordTokenizer(words)
        ids = list(range(WordTokenizer.FIRST_WORD_ID, vocab_size))
        total = sum(self.CLASSES.values())
        self.classes: dict[str, list[int]] = {}
        start = 0
        for name, size in self.CLASSES.items():
            count = max(1, size * n_words // total)
            self.classes[name] = ids[start : start + count]
            start += count
        # Any words left over join the nouns.
        self.classes["noun"] += ids[start:]
        self.period = self.tokenizer.byte_id(ord("."))
        self.space = self.tokenizer.byte_id(ord(" "))
        self.comma = self.tokenizer.byte_id(ord(","))
        self._succ: dict[tuple[int, str], tuple[list[int], list[float]]] = {}
        self._rng = rng
        for prev in ids:
            for name, members in self.classes.items():
                order = members[:]
                rng.shuffle(order)
                top = order[: min(self.SUCCESSORS, len(order))]
                weights = [1.0 / (r + 1) ** self.ZIPF for r in range(len(top))]
                self._succ[(prev, name)] = (top, weights)

    @staticmethod
    def _make_words(rng: random.Random, n: int) -> list[str]:
        onsets = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh", "tr"]
        vowels = ["a", "e", "i", "o", "u", "ai", "ou"]
        seen: set[str] = set()
        words: list[str] = []
        while len(words) < n:
            syllables = rng.choice((1, 2, 2, 3))
            word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(syllables))
            if word not in seen:
                seen.add(word)
                words.append(word)
        return words

    def _word(self, rng: random.Random, prev: int, cls: str) -> int:
        top, weights = self._succ[(prev, cls)]
        return rng.choices(top, weights)[0]

    def sentence(self, rng: random.Random, prev: int) -> list[int]:
        """One sentence; ``prev`` is the last word (not punctuation) before it."""
        out: list[int] = []
        last = [prev]

        def add(cls: str) -> None:
            word = self._word(rng, last[0], cls)
            out.append(word)
            last[0] = word

        def noun_phrase() -> None:
            add("det")
            for _ in range(rng.choices((0, 1, 2), (0.4, 0.45, 0.15))[0]):
                add("adj")
            add("noun")

        noun_phrase()
        add("verb")
        if rng.random() < 0.6:
            noun_phrase()
        if rng.random() < 0.35:
            add("prep")
            noun_phrase()
        if rng.random() < 0.3:
            add("adv")
        if rng.random() < 0.2:
            out.extend((self.comma, self.space))
            add("conj")
            noun_phrase()
            add("verb")
        out.append(self.period)
        return out

    def stream(self, n_tokens: int, seed: int) -> list[int]:
        """``n_tokens`` of running text: sentences separated by an explicit space token."""
        rng = random.Random(seed)
        out: list[int] = []
        prev = rng.choice(self.classes["noun"])
        while len(out) < n_tokens:
            sentence = self.sentence(rng, prev)
            out.extend(sentence)
            out.append(self.space)
            prev = [t for t in sentence if self.tokenizer.is_word(t)][-1]
        return out[:n_tokens]

    def held_out_prompts(self) -> list[list[int]]:
        """24 fixed prompts of 1..60 tokens cut from text the models never train on (lengths 1,
        2, 3 and 60 first, then seeded random ones): what acceptance is measured on, by the tests
        and ``benchmarks/demo_recipes.py`` alike."""
        text = self.stream(20_000, seed=12_345)
        rng = random.Random(7)
        out = []
        for i in range(24):
            n = [1, 2, 3, 60][i] if i < 4 else rng.randint(1, 60)
            start = rng.randrange(0, len(text) - n)
            out.append(text[start : start + n])
        return out
