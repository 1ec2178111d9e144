"""``specobs load``: a load generator for any OpenAI-style ``/v1/completions`` endpoint.

    specobs load http://127.0.0.1:8000 --concurrency 8 --duration 60
    specobs load http://host:8000/v1/completions --rate 5 --requests 200 --prompt-tokens 8:64

Closed loop by default (``--concurrency`` workers, each sending its next request when the last one
answered); with ``--rate`` requests arrive open loop (Poisson, or evenly spaced with ``--arrival
fixed``), at most ``--concurrency`` in flight. It stops after ``--duration`` seconds or
``--requests`` requests, or at Ctrl-C, and prints requests ok/failed, tokens generated, tokens/s,
latency p50/p99 and errors by kind. Tokens come from the answer's ``usage.completion_tokens``,
else from counting the words of its text.

:func:`run_load` is the importable coroutine behind it (``specobs demo`` runs it against its own
server). Only the standard library is imported until the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import random
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specobs.tools._client import display_url

if TYPE_CHECKING:
    import httpx

__all__ = ["LoadProgress", "LoadSummary", "add_arguments", "completions_url", "run", "run_load"]

PromptSource = Callable[[random.Random, int], "str | list[int]"]

# A neutral English vocabulary for servers other than the demo (their tokenizers differ, so the
# prompt length in tokens is approximate: one word is about one token).
_WORDS = (
    "the a of and to in is for on that with as it by at from this be are was or an which have "
    "model token draft verify cycle server request speed time graph layer cache batch queue "
    "river mountain city light water music story garden window morning evening summer winter "
    "quick slow bright quiet small large early late open simple clear strong gentle ancient "
    "runs reads writes builds moves finds keeps turns holds brings carries follows explains"
).split()


def _word_prompt(rng: random.Random, n_tokens: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, n_tokens)))


@dataclasses.dataclass
class LoadProgress:
    """Counts so far, handed to the ``on_progress`` callback about once a second."""

    elapsed_seconds: float
    requests_ok: int
    requests_failed: int
    in_flight: int
    completion_tokens: int
    target_requests: int | None
    duration_seconds: float | None

    @property
    def fraction(self) -> float | None:
        if self.target_requests:
            return min(1.0, (self.requests_ok + self.requests_failed) / self.target_requests)
        if self.duration_seconds:
            return min(1.0, self.elapsed_seconds / self.duration_seconds)
        return None


@dataclasses.dataclass
class LoadSummary:
    """What a load run did. Latencies are per successful request, in seconds."""

    url: str
    requests_ok: int = 0
    requests_failed: int = 0
    completion_tokens: int = 0
    elapsed_seconds: float = 0.0
    latencies_seconds: list[float] = dataclasses.field(default_factory=list)
    errors: Counter[str] = dataclasses.field(default_factory=Counter)
    error_examples: dict[str, str] = dataclasses.field(default_factory=dict)
    tokens_counted_from_text: int = 0

    @property
    def requests(self) -> int:
        return self.requests_ok + self.requests_failed

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.elapsed_seconds if self.elapsed_seconds else 0.0

    @property
    def requests_per_second(self) -> float:
        return self.requests_ok / self.elapsed_seconds if self.elapsed_seconds else 0.0

    def latency_quantile(self, q: float) -> float | None:
        """Nearest-rank quantile of the successful requests' latency, or ``None``."""
        if not self.latencies_seconds:
            return None
        ordered = sorted(self.latencies_seconds)
        rank = max(1, math.ceil(q * len(ordered)))
        return ordered[rank - 1]

    def lines(self) -> list[str]:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1000:.0f} ms"

        out = [
            f"load against {display_url(self.url)}: {self.elapsed_seconds:.1f} s",
            f"  requests   {self.requests_ok} ok, {self.requests_failed} failed "
            f"({self.requests_per_second:.2f} ok/s)",
            f"  tokens     {self.completion_tokens} generated ({self.tokens_per_second:.1f} "
            "tokens/s)"
            + (
                f", {self.tokens_counted_from_text} of them counted from text words (no usage)"
                if self.tokens_counted_from_text
                else ""
            ),
            f"  latency    p50 {ms(self.latency_quantile(0.5))}, "
            f"p99 {ms(self.latency_quantile(0.99))}",
        ]
        if self.errors:
            kinds = ", ".join(f"{k} {v}" for k, v in self.errors.most_common())
            out.append(f"  errors     {kinds}")
            for kind, example in self.error_examples.items():
                out.append(f"    {kind}: {example}")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": display_url(self.url),
            "requests_ok": self.requests_ok,
            "requests_failed": self.requests_failed,
            "completion_tokens": self.completion_tokens,
            "elapsed_seconds": self.elapsed_seconds,
            "tokens_per_second": self.tokens_per_second,
            "latency_p50_seconds": self.latency_quantile(0.5),
            "latency_p99_seconds": self.latency_quantile(0.99),
            "errors": dict(self.errors),
        }


def completions_url(url: str) -> str:
    """``http://h:p`` or ``http://h:p/v1`` → ``http://h:p/v1/completions``; a URL that already
    ends in ``/completions`` is kept. Raises ``ValueError`` for anything but http(s)."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            "expected an http:// or https:// URL such as http://127.0.0.1:8000, got "
            f"{display_url(url)!r}"
        )
    path = parts.path.rstrip("/")
    if not path.endswith("/completions"):
        path = path + "/completions" if path.endswith("/v1") else path + "/v1/completions"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _error_kind(exc: BaseException) -> str:
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect_error"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "protocol_error"
    if isinstance(exc, httpx.TransportError):
        return "transport_error"
    return type(exc).__name__


def _count_tokens(body: Any) -> tuple[int, bool]:
    """(completion tokens, whether they were counted from text)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if isinstance(usage, dict):
        n = usage.get("completion_tokens")
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            return n, False
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices:
        raise ValueError("the answer has neither usage.completion_tokens nor choices")
    words = 0
    for choice in choices:
        text = choice.get("text") if isinstance(choice, dict) else None
        if not isinstance(text, str):
            raise ValueError("the answer's choices carry no text")
        words += len(text.split())
    return words, True


async def run_load(
    url: str,
    *,
    concurrency: int = 4,
    rate: float | None = None,
    arrival: str = "poisson",
    duration_seconds: float | None = None,
    requests: int | None = None,
    prompt_tokens: tuple[int, int] = (4, 32),
    max_tokens: int = 32,
    seed: int = 0,
    model: str | None = None,
    timeout_seconds: float = 60.0,
    prompt_source: PromptSource | None = None,
    stop_event: threading.Event | None = None,
    on_progress: Callable[[LoadProgress], None] | None = None,
    progress_interval_seconds: float = 1.0,
    summary: LoadSummary | None = None,
) -> LoadSummary:
    """Send completions to ``url`` (server base or the completions endpoint) until
    ``duration_seconds`` pass, ``requests`` requests are done, or ``stop_event`` is set (from any
    thread); neither limit nor an event: until cancelled. Returns the :class:`LoadSummary`.

    ``prompt_source(rng, n_tokens)`` makes each prompt (text or token ids); the default is
    ``n_tokens`` English words. Pass ``summary`` to watch counts grow while it runs.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    if arrival not in ("poisson", "fixed"):
        raise ValueError(f"arrival must be 'poisson' or 'fixed', got {arrival!r}")
    lo, hi = prompt_tokens
    if not 1 <= lo <= hi:
        raise ValueError(f"prompt_tokens must be MIN:MAX with 1 <= MIN <= MAX, got {lo}:{hi}")
    endpoint = completions_url(url)
    out = summary if summary is not None else LoadSummary(endpoint)
    out.url = endpoint
    run = _LoadRun(
        endpoint, out, concurrency=concurrency, rate=rate, poisson=arrival == "poisson",
        duration_seconds=duration_seconds, requests=requests, prompt_tokens=(lo, hi),
        max_tokens=max_tokens, rng=random.Random(seed), model=model,
        make_prompt=prompt_source or _word_prompt, stop_event=stop_event,
    )  # fmt: skip
    await run.run(timeout_seconds, on_progress, progress_interval_seconds)
    return out


@dataclasses.dataclass
class _LoadRun:
    """One load run's settings and counts; :func:`run_load` validates what it is given."""

    endpoint: str
    out: LoadSummary
    concurrency: int
    rate: float | None
    poisson: bool
    duration_seconds: float | None
    requests: int | None
    prompt_tokens: tuple[int, int]
    max_tokens: int
    rng: random.Random
    model: str | None
    make_prompt: PromptSource
    stop_event: threading.Event | None
    issued: int = 0
    in_flight: int = 0
    start: float = dataclasses.field(default_factory=time.monotonic)
    deadline: float | None = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.deadline = (None if self.duration_seconds is None
                         else self.start + self.duration_seconds)

    def more(self) -> bool:
        """Whether to send another request: no stop, no deadline passed, requests left."""
        if self.stop_event is not None and self.stop_event.is_set():
            return False
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return False
        return self.requests is None or self.issued < self.requests

    def fail(self, kind: str, detail: str) -> None:
        self.out.requests_failed += 1
        self.out.errors[kind] += 1
        self.out.error_examples.setdefault(kind, detail[:200])

    async def one(self, client: httpx.AsyncClient) -> bool:
        """One request; returns whether it succeeded."""
        body: dict[str, Any] = {
            "prompt": self.make_prompt(self.rng, self.rng.randint(*self.prompt_tokens)),
            "max_tokens": self.max_tokens,
            "temperature": 0,
        }
        if self.model is not None:
            body["model"] = self.model
        self.in_flight += 1
        t0 = time.monotonic()
        try:
            resp = await client.post(self.endpoint, json=body)
        except Exception as exc:
            self.fail(_error_kind(exc), f"{type(exc).__name__}: {exc}")
            return False
        finally:
            self.in_flight -= 1
        latency = time.monotonic() - t0
        if resp.status_code != 200:
            detail = resp.text
            try:
                detail = resp.json()["error"]["message"]
            except Exception:
                pass
            self.fail(f"http_{resp.status_code}", detail)
            return False
        try:
            tokens, from_text = _count_tokens(resp.json())
        except ValueError as exc:
            self.fail("bad_response", str(exc))
            return False
        out = self.out
        out.requests_ok += 1
        out.completion_tokens += tokens
        if from_text:
            out.tokens_counted_from_text += tokens
        out.latencies_seconds.append(latency)
        return True

    async def closed_loop(self, client: httpx.AsyncClient) -> None:
        """One of ``concurrency`` workers, each sending its next request when one answers."""
        while self.more():
            self.issued += 1
            if not await self.one(client):
                # A dead server answers at once: do not spin.
                await asyncio.sleep(0.05)

    async def open_loop(self, client: httpx.AsyncClient) -> None:
        """Requests at ``rate`` (Poisson or fixed gaps), at most ``concurrency`` in flight."""
        assert self.rate is not None
        slots = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Task[Any]] = set()
        next_at = time.monotonic()
        while self.more():
            next_at += self.rng.expovariate(self.rate) if self.poisson else 1.0 / self.rate
            while self.more() and time.monotonic() < next_at:
                await asyncio.sleep(min(0.05, max(0.0, next_at - time.monotonic())))
            if not self.more():
                break
            await slots.acquire()
            self.issued += 1

            async def fire() -> None:
                try:
                    await self.one(client)
                finally:
                    slots.release()

            task = asyncio.create_task(fire())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def progress(self) -> LoadProgress:
        return LoadProgress(
            elapsed_seconds=time.monotonic() - self.start,
            requests_ok=self.out.requests_ok,
            requests_failed=self.out.requests_failed,
            in_flight=self.in_flight,
            completion_tokens=self.out.completion_tokens,
            target_requests=self.requests,
            duration_seconds=self.duration_seconds,
        )

    async def run(
        self,
        timeout_seconds: float,
        on_progress: Callable[[LoadProgress], None] | None,
        progress_interval_seconds: float,
    ) -> None:
        import httpx

        async def reporter() -> None:
            while True:
                await asyncio.sleep(progress_interval_seconds)
                if on_progress is not None:
                    on_progress(self.progress())

        n = self.concurrency
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        timeout = httpx.Timeout(timeout_seconds, connect=min(10.0, timeout_seconds))
        report = asyncio.create_task(reporter())
        try:
            async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
                if self.rate is None:
                    await asyncio.gather(*(self.closed_loop(client) for _ in range(n)))
                else:
                    await self.open_loop(client)
        finally:
            report.cancel()
            self.out.elapsed_seconds = time.monotonic() - self.start
        if on_progress is not None:
            on_progress(self.progress())


# -- command line -----------------------------------------------------------------------------


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {raw!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def positive_float(raw: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {raw!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {raw!r}")
    return value


def token_range(raw: str) -> tuple[int, int]:
    """argparse type: ``MIN:MAX`` (or one number N for N:N), 1 <= MIN <= MAX."""
    lo_s, sep, hi_s = raw.partition(":")
    try:
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected MIN:MAX token counts such as 8:64, got {raw!r}"
        ) from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(
            f"expected MIN:MAX with 1 <= MIN <= MAX, got {raw!r}"
        )
    return lo, hi


def http_url(raw: str) -> str:
    """argparse type: an http(s) URL."""
    try:
        completions_url(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return raw


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specobs load``."""
    parser.add_argument("url", type=http_url, metavar="URL",
                        help="server base URL (http://127.0.0.1:8000) or its /v1/completions "
                             "endpoint")
    parser.add_argument("--concurrency", "-c", type=positive_int, default=4, metavar="N",
                        help="requests in flight at most (default 4)")
    parser.add_argument("--rate", type=positive_float, default=None, metavar="R",
                        help="open loop: R requests/s arriving (default: closed loop, each of "
                             "the --concurrency workers sends when its last request answered)")
    parser.add_argument("--arrival", choices=("poisson", "fixed"), default="poisson",
                        help="with --rate: Poisson arrivals (default) or evenly spaced")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=positive_float, default=None, metavar="SECONDS",
                      help="stop after this many seconds (default: until Ctrl-C)")
    stop.add_argument("--requests", "-n", type=positive_int, default=None, metavar="N",
                      help="stop after N requests")
    parser.add_argument("--prompt-tokens", type=token_range, default=(4, 32), metavar="MIN:MAX",
                        help="prompt length, uniform in MIN..MAX (default 4:32; text prompts are "
                             "about one token per word)")
    parser.add_argument("--max-tokens", type=positive_int, default=32, metavar="N",
                        help="max_tokens of each request (default 32)")
    parser.add_argument("--model", default=None,
                        help="the request's model field (default: the first of GET /v1/models, "
                             "else left out)")
    parser.add_argument("--timeout", type=positive_float, default=60.0, metavar="SECONDS",
                        help="per-request timeout (default 60)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="seed of prompt lengths, texts and arrivals (default 0)")
    parser.add_argument("--plain", action="store_true",
                        help="plain progress lines instead of a progress bar (the default when "
                             "stdout is not a terminal)")


def _discover_model(url: str, timeout_seconds: float) -> str | None:
    import httpx

    endpoint = completions_url(url)
    models = endpoint.rsplit("/completions", 1)[0] + "/models"
    try:
        data = httpx.get(models, timeout=min(5.0, timeout_seconds)).json()["data"]
        name = data[0]["id"]
        return name if isinstance(name, str) else None
    except Exception:
        return None


def run(args: argparse.Namespace) -> int:
    """``specobs load``: exit 0 when at least one request succeeded, 1 when none did."""
    try:
        import httpx  # noqa: F401
    except ImportError:
        print("specobs load needs httpx: pip install 'specobs[cli]'", file=sys.stderr)
        return 1
    model = args.model or _discover_model(args.url, args.timeout)
    endpoint = completions_url(args.url)
    live = sys.stdout.isatty() and not args.plain
    summary = LoadSummary(endpoint)
    limit = (
        f"{args.requests} requests" if args.requests else
        f"{args.duration:g} s" if args.duration else "until Ctrl-C"
    )  # fmt: skip
    mode = f"{args.rate:g} req/s ({args.arrival})" if args.rate else "closed loop"
    print(f"specobs load: {endpoint}, {mode}, concurrency {args.concurrency}, {limit}, "
          f"model {model or '(none)'}", flush=True)

    progress_bar: Any = None
    task_id: Any = None
    last_line = [0.0]

    def on_progress(p: LoadProgress) -> None:
        tps = p.completion_tokens / p.elapsed_seconds if p.elapsed_seconds else 0.0
        text = (f"{p.requests_ok} ok, {p.requests_failed} failed, {p.in_flight} in flight, "
                f"{p.completion_tokens} tokens, {tps:.1f} tokens/s")
        if progress_bar is not None:
            total = 100.0
            done = 100.0 * p.fraction if p.fraction is not None else None
            progress_bar.update(task_id, completed=done, total=total if done is not None
                                else None, status=text)
        elif p.elapsed_seconds - last_line[0] >= 5.0:
            last_line[0] = p.elapsed_seconds
            print(f"[{p.elapsed_seconds:6.1f} s] {text}", flush=True)

    async def main() -> LoadSummary:
        return await run_load(
            args.url, concurrency=args.concurrency, rate=args.rate, arrival=args.arrival,
            duration_seconds=args.duration, requests=args.requests,
            prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, seed=args.seed,
            model=model, timeout_seconds=args.timeout, on_progress=on_progress, summary=summary,
        )  # fmt: skip

    interrupted = False
    try:
        if live:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(
                TextColumn("[bold]load"), BarColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"), transient=True,
            ) as progress_bar:  # fmt: skip
                task_id = progress_bar.add_task("load", total=None, status="starting")
                asyncio.run(main())
        else:
            asyncio.run(main())
    except KeyboardInterrupt:
        interrupted = True
    for line in summary.lines():
        print(line)
    if interrupted:
        print("(interrupted)")
    return 0 if summary.requests_ok else 1
