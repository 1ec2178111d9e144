"""A new user's first run: the README's first command on a fresh venv and a cold cache.

    python benchmarks/first_run.py             # idle
    python benchmarks/first_run.py --burn 2    # both cores loaded by two `while True: pass` burners

What it does, as a user would:

1. copies this checkout's files (tracked and untracked-but-not-ignored, nothing built) into a
   scratch folder, as a fresh clone;
2. creates a plain venv there (``python -m venv``, no system site-packages: a missing dependency
   must fail, not be found outside);
3. runs the README's first command (read from README.md: the first ``bash`` block that runs
   ``specobs demo``) in that folder with the venv first on ``PATH``, ``HOME`` and
   ``XDG_CACHE_HOME`` pointing to an empty folder (a cold specobs cache, and a cold pip cache;
   only the user's pip configuration files are copied in); the install part is timed on its
   own;
4. times ``specobs demo`` from its start to its first served request: the first ``200`` answer
   to a completion this script sends as soon as the demo says it serves (its banner
   ``serving completions on URL``); the demo gets ``--port 0 --metrics-port 0`` so it never
   collides with another server (it prints the ports it took); it must exit 0 after its
   ``--duration``.

Only the torch index is adapted to the machine: where ``https://download.pytorch.org/whl/cpu``
cannot be reached (the CI VM has no route to it), the command is given a local PEP 503 index
holding the CPU wheel found in pip's configured ``find-links`` instead. Everything else comes
from the indexes pip is configured with (the system's and the user's pip.conf, ``PIP_*``), as
for any pip on that machine.

``tests/test_first_run.py`` runs the same code and asserts on it; this script prints the
figures (benchmarks/RESULTS.md keeps them).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
"""The index the README's CPU line installs torch from."""
SERVING = re.compile(r"^serving completions on (http://\S+)/v1/completions")
FINISHED = re.compile(r"requests \d+ running, \d+ waiting, (\d+) finished; load (\d+) ok")
INSTALL_TIMEOUT_SECONDS = 900.0
START_TIMEOUT_SECONDS = 600.0
"""Start-up of ``specobs demo`` at most (training, were the shipped weights not found)."""
EXIT_AFTER_DURATION_SECONDS = 180.0
"""After its ``--duration`` the demo finishes background training, shuts down and prints."""


class FirstRunError(RuntimeError):
    """A step of the first run failed; the message holds the command and its output's tail."""


@dataclasses.dataclass
class FirstRun:
    command: str
    """The README's command as run (after the index adaptation, if any)."""
    index_note: str
    """How the torch index was adapted to this machine ("" when the README's was used)."""
    venv_seconds: float
    install_seconds: float
    torch_version: str
    cuda_packages: list[str]
    """``nvidia-*`` distributions in the venv: a CPU install has none."""
    serving_seconds: float
    """From the start of ``specobs demo`` to its banner ``serving completions on``."""
    first_served_seconds: float
    """From the start of ``specobs demo`` to the first 200 answer to a completion."""
    first_completion: dict[str, object]
    exit_code: int
    demo_seconds: float
    """The whole ``specobs demo`` process, start to exit."""
    requests_finished: int
    load_ok: int
    output: list[tuple[float, str]]
    """The demo's stdout and stderr lines with seconds since its start."""


def first_command(readme: str) -> list[str]:
    """The README's first command: the lines of the first ``bash`` block that runs ``specobs
    demo``, up to that line (comments and blank lines left out)."""
    for block in re.findall(r"^```bash\n(.*?)^```", readme, flags=re.M | re.S):
        lines: list[str] = []
        for raw in block.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            lines.append(line)
            if "specobs demo" in line:
                return lines
    raise FirstRunError("README.md has no ```bash block that runs `specobs demo`")


def split_command(lines: list[str]) -> tuple[str, str]:
    """(the install part, the ``specobs demo ...`` part) of :func:`first_command`'s lines."""
    *before, last = lines
    head, sep, demo = last.partition("specobs demo")
    head = head.strip()
    if head and not head.endswith("&&"):
        raise FirstRunError(f"expected `... && specobs demo ...` in the README, got {last!r}")
    parts = [*before, head.removesuffix("&&").strip()] if head else before
    install = " && ".join(p for p in parts if p)
    return install, (sep + demo).strip()


def _reachable(url: str, timeout: float = 10.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return bool(answer.status == 200)
    except urllib.error.HTTPError as exc:
        exc.close()
        return False
    except (OSError, ValueError):
        return False


def _pip_find_links() -> list[Path]:
    """The folders pip's configuration (files and ``PIP_FIND_LINKS``) lists as find-links."""
    folders: list[str] = os.environ.get("PIP_FIND_LINKS", "").split()
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            folders += value.strip().strip("'\"").split()
    return [Path(f.removeprefix("file://")) for f in dict.fromkeys(folders)]


def adapt_torch_index(install: str, scratch: Path) -> tuple[str, str]:
    """(the install command for this machine, a note saying what changed, or "").

    The README's torch index where it can be reached; otherwise a local PEP 503 index of the
    torch CPU wheels in pip's find-links, written under ``scratch``."""
    if TORCH_CPU_INDEX not in install or _reachable(f"{TORCH_CPU_INDEX}/torch/"):
        return install, ""
    wheels = sorted(w for d in _pip_find_links() if d.is_dir()
                    for w in d.glob("torch-*+cpu-*.whl"))  # fmt: skip
    if not wheels:
        raise FirstRunError(
            f"{TORCH_CPU_INDEX} cannot be reached and pip's find-links hold no torch CPU wheel"
        )
    index = scratch / "torch-cpu-index"
    (index / "torch").mkdir(parents=True, exist_ok=True)
    links = "".join(f'<a href="{w.as_uri()}">{w.name}</a>\n' for w in wheels)
    (index / "torch" / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}"
                                                "</body></html>\n")
    note = (f"{TORCH_CPU_INDEX} cannot be reached here: the command used {index.as_uri()}, "
            f"a local index of {', '.join(w.name for w in wheels)}")
    return install.replace(TORCH_CPU_INDEX, index.as_uri()), note


def copy_checkout(dest: Path) -> None:
    """This checkout's files as a fresh clone has them: tracked and untracked-but-not-ignored
    (so nothing built here, no ``*.so`` and no egg-info, travels)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
        capture_output=True, check=True, timeout=60,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in names:
        src = REPO / name
        if name and src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def carry_pip_config(home: Path) -> list[Path]:
    """Copies this user's pip configuration files into ``home`` (the indexes and find-links this
    machine's pip is configured with: a user's own pip would have its own); returns them."""
    carried = []
    for name in (".config/pip/pip.conf", ".pip/pip.conf"):
        src = Path.home() / name
        if src.is_file():
            (home / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, home / name)
            carried.append(src)
    return carried


def user_env(home: Path, venv: Path) -> dict[str, str]:
    """A new user's shell with the venv activated: an empty home (cold caches), no specobs or
    OpenTelemetry settings, nothing of this process's Python path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPECOBS_", "OTEL_", "PYTHON", "VIRTUAL_ENV", "XDG_"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), VIRTUAL_ENV=str(venv),
               PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")  # fmt: skip
    return env


def _tail(text: str, n: int = 4000) -> str:
    return text[-n:]


@contextlib.contextmanager
def burners(n: int) -> Iterator[None]:
    """``n`` busy loops (``python3 -c "while True: pass"``), stopped afterwards by their pids."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(10)


def _read_lines(stream: object, t0: float, out: queue.Queue[tuple[float, str] | None]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        out.put((time.monotonic() - t0, line.rstrip("\n")))
    out.put(None)


def _first_completion(base: str, deadline: float) -> dict[str, object]:
    """The first completion the demo answers with 200, asked again until then (a 429 or a
    refused connection is retried)."""
    body = json.dumps({"prompt": "the", "max_tokens": 8}).encode()
    last: object = None
    while time.monotonic() < deadline:
        request = urllib.request.Request(f"{base}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                if answer.status == 200:
                    result: dict[str, object] = json.loads(answer.read())
                    return result
                last = answer.status
        except urllib.error.HTTPError as exc:  # 429 while the demo is full, say
            last = exc.code
            exc.close()
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(0.02)
    raise FirstRunError(f"no completion answered 200 before the deadline; last: {last!r}")


def run_first(scratch: Path, readme: str | None = None) -> FirstRun:
    """The whole first run in ``scratch`` (which should be empty); raises FirstRunError."""
    lines = first_command(README.read_text() if readme is None else readme)
    install, demo = split_command(lines)
    install, note = adapt_torch_index(install, scratch)
    src, home, venv = scratch / "specobs", scratch / "home", scratch / "specobs" / ".venv"
    home.mkdir(parents=True)
    carry_pip_config(home)
    copy_checkout(src)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    venv_seconds = time.monotonic() - t0
    env = user_env(home, venv)

    t0 = time.monotonic()
    done = subprocess.run(["bash", "-c", install], cwd=src, env=env, capture_output=True,
                          text=True, timeout=INSTALL_TIMEOUT_SECONDS, check=False)  # fmt: skip
    install_seconds = time.monotonic() - t0
    if done.returncode != 0:
        raise FirstRunError(f"`{install}` failed (exit {done.returncode}):\n"
                            + _tail(done.stdout + done.stderr))
    python = str(venv / "bin" / "python")
    torch_version = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], env=env, capture_output=True,
        text=True, timeout=120, check=True,
    ).stdout.strip()  # fmt: skip
    frozen = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], env=env,
                            capture_output=True, text=True, timeout=120, check=True).stdout
    cuda = [ln.split("==")[0] for ln in frozen.splitlines() if ln.lower().startswith("nvidia-")]

    # exec: the shell becomes the demo, so its exit status and signals are the demo's own.
    command = f"exec {demo} --port 0 --metrics-port 0"
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", command], cwd=src, env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    lines_q: queue.Queue[tuple[float, str] | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, t0, lines_q), daemon=True)
    reader.start()
    output: list[tuple[float, str]] = []
    try:
        base = None
        while base is None:
            left = t0 + START_TIMEOUT_SECONDS - time.monotonic()
            try:
                item = lines_q.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise FirstRunError(f"`{demo}` did not serve within {START_TIMEOUT_SECONDS} s"
                                    ) from None
            if item is None:
                proc.wait(30)
                raise FirstRunError(f"`{demo}` exited ({proc.returncode}) before serving:\n"
                                    + "\n".join(text for _, text in output[-40:]))
            output.append(item)
            match = SERVING.match(item[1])
            if match:
                base = match.group(1)
        serving_seconds = output[-1][0]
        completion = _first_completion(base, t0 + START_TIMEOUT_SECONDS)
        first_served_seconds = time.monotonic() - t0
        proc.wait(START_TIMEOUT_SECONDS + EXIT_AFTER_DURATION_SECONDS)
        demo_seconds = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        reader.join(30)
        if proc.stdout is not None:
            proc.stdout.close()
    while not lines_q.empty() and (item := lines_q.get_nowait()) is not None:
        output.append(item)
    # The final summary's requests line, the last one printed.
    counts = [(int(m.group(1)), int(m.group(2))) for _, text in output
              if (m := FINISHED.search(text))] or [(0, 0)]  # fmt: skip
    return FirstRun(
        command=" && ".join([install, demo]), index_note=note, venv_seconds=venv_seconds,
        install_seconds=install_seconds, torch_version=torch_version, cuda_packages=cuda,
        serving_seconds=serving_seconds, first_served_seconds=first_served_seconds,
        first_completion=completion, exit_code=proc.returncode, demo_seconds=demo_seconds,
        requests_finished=counts[-1][0], load_ok=counts[-1][1], output=output,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burn", type=int, default=0, metavar="N",
                        help="busy loops loading the cores during the whole run (default 0)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the scratch folder (venv, copy, home) and print where")
    parser.add_argument("--show-output", action="store_true",
                        help="print the demo's output with its timestamps")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="specobs-first-run-"))
    try:
        with burners(args.burn):
            run = run_first(scratch)
    finally:
        if args.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.show_output:
        for at, text in run.output:
            print(f"  {at:7.2f} s  {text[:160]}")
    models_at = next((f"{at:.2f}" for at, text in run.output if text.startswith("models ")), "-")
    print(f"command: {run.command}")
    if run.index_note:
        print(f"  ({run.index_note})")
    print(f"cpu count {os.cpu_count()}, burners {args.burn}; torch {run.torch_version}, "
          f"nvidia-* packages: {len(run.cuda_packages)}")
    print(f"venv created in {run.venv_seconds:.1f} s; install {run.install_seconds:.1f} s")
    print(f"specobs demo: models ready at {models_at} s, "
          f"serving banner at {run.serving_seconds:.2f} s, first served request at "
          f"{run.first_served_seconds:.2f} s; exit {run.exit_code} after "
          f"{run.demo_seconds:.1f} s; {run.requests_finished} requests finished "
          f"(load {run.load_ok} ok)")
    print(f"first run, install + time to the first served request: "
          f"{run.install_seconds + run.first_served_seconds:.1f} s")
    return 0 if run.exit_code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
