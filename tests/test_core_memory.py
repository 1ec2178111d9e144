"""Memory safety of the native core (specobs/_core/*.c), checked by tools that see what a test's
assertions cannot: a use after free, a write past a slot, a reference dropped twice.

* ``python -X dev`` runs the random streams of tests/test_ring.py and an observer end to end
  with CPython's debug memory allocator (guard bytes around every block, freed memory filled,
  checked on every free) and the debug checks of the C API;
* a build of the core with AddressSanitizer and UndefinedBehaviorSanitizer runs the same, where
  the compiler ships them (gcc and clang do on Linux).

Each run must exit 0 with no sanitizer report; a deliberately broken build (an access one past
the end of the slots) must be caught, so a run that checks nothing fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from specobs import _ring

ROOT = Path(__file__).resolve().parent.parent
#: The native core's C files, built here as one shared object (setup.py builds the same).
SOURCES = sorted((ROOT / "specobs" / "_core").glob("*.c"))

pytestmark = [
    pytest.mark.skipif(not _ring.BUILT, reason="the native core is not built here"),
    pytest.mark.timeout(900),
]

#: What each run does: the differential streams (native and twin side by side, compared), then
#: an observer end to end on the native ring with a fake GPU clock and a memory sink.
DRIVER = textwrap.dedent(
    """
    import gc, importlib.util, sys
    core = sys.argv[1]
    if core != "-":  # load this build of the core in place of the installed one
        spec = importlib.util.spec_from_file_location("specobs._core", core)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["specobs._core"] = mod
        spec.loader.exec_module(mod)
    sys.modules["torch"] = None  # not under a sanitizer: the streams run without tensors
    sys.path.insert(0, sys.argv[2])
    import test_ring
    import specobs
    from specobs.timing import FakeDeviceArray, FakeEventClock, FakeGpu, FakeNativeCopyClock
    assert specobs._ring.NativeRing.__module__ == "specobs._core"
    for seed in range(int(sys.argv[3])):
        assert test_ring.run_stream("native", seed) == test_ring.run_stream("python", seed), seed
    gpu = FakeGpu()
    mem = specobs.MemorySink(max_cycles=100)
    obs = specobs.configure(sinks=[mem], clock=FakeEventClock(gpu, pool_size=256),
                            sample_every=3, queue_size=64, poll_interval_seconds=0.001)
    for i in range(5000):
        with obs.cycle(batch_size=4) as c:
            gpu.run(100)
            c.mark("verify")
            gpu.run(300)
            c.mark("bookkeeping")
            c.accept(FakeDeviceArray([1, 2, 0, 3]) if i % 7 == 0 else [i % 5, 1, 0, 2],
                     draft_length=4)
        if i % 100 == 0:
            gpu.complete()
    gpu.complete()
    assert obs.force_flush(30)
    s = obs.snapshot()
    assert s.cycles_total + s.dropped.get("queue_full", 0) == 5000, (s.cycles_total, s.dropped)
    obs.shutdown()
    # CUDA acceptance copies the core starts itself (fake runtime functions), some refused.
    gpu = FakeGpu()
    clock = FakeNativeCopyClock(gpu, pool_size=256, buffers=8)
    obs = specobs.configure(sinks=[mem], clock=clock, sample_every=3, queue_size=64,
                            poll_interval_seconds=0.001)
    for i in range(3000):
        clock.memcpy_rc = int(i % 97 == 0)
        clock.record_rc = int(i % 89 == 0)
        with obs.cycle(batch_size=2) as c:
            gpu.run(50)
            c.mark("verify")
            c.mark("bookkeeping")
            c.accept(FakeDeviceArray([i % 3, 1]), draft_length=4)
        gpu.complete()
    assert obs.force_flush(30)
    assert clock.memcpy_calls > 0 and obs.snapshot().cycles_total > 0
    obs.shutdown()
    assert len(clock.free) == 8, len(clock.free)
    del obs, mem, clock
    gc.collect()
    print("ok")
    """
)


def _run(
    core: str, env_extra: dict[str, str], seeds: int, *, dev: bool
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    env.pop("SPECOBS_CORE", None)
    args = [sys.executable, *(["-X", "dev"] if dev else []), "-c", DRIVER, core,
            str(ROOT / "tests"), str(seeds)]
    return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


def _build(tmp: Path, *, flags: list[str], defines: tuple[str, ...] = ()) -> Path:
    out = tmp / f"_core{sysconfig.get_config_var('EXT_SUFFIX')}"
    cmd = [os.environ.get("CC", "gcc"), "-shared", "-fPIC", "-g", "-O1", *flags, *defines,
           f"-I{sysconfig.get_paths()['include']}", *map(str, SOURCES), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return out


def test_the_core_under_the_debug_allocator_and_dev_mode():
    r = _run("-", {"PYTHONMALLOC": "debug"}, 20, dev=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")
    assert "Debug memory block" not in r.stderr


def _sanitizer_runtime() -> str | None:
    try:
        path = subprocess.run(
            [os.environ.get("CC", "gcc"), "-print-file-name=libasan.so"],
            capture_output=True, text=True, timeout=60,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return path if os.path.isabs(path) and os.path.exists(path) else None


ASAN = _sanitizer_runtime()
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
            "-fno-sanitize-recover=undefined"]
ASAN_ENV = {
    # Python itself is not built with the sanitizer: its arena allocator would hide our blocks
    # (malloc lets ASan see every one) and it frees little at exit (leaks are not ours).
    "PYTHONMALLOC": "malloc",
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=86",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=87",
}


@pytest.mark.skipif(ASAN is None, reason="the compiler ships no AddressSanitizer runtime")
def test_the_core_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    lib = _build(tmp_path, flags=SANITIZE)
    r = _run(str(lib), {**ASAN_ENV, "LD_PRELOAD": str(ASAN)}, 20, dev=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert r.stdout.strip().endswith("ok")
    assert "ERROR: AddressSanitizer" not in r.stderr
    assert "runtime error:" not in r.stderr


@pytest.mark.skipif(ASAN is None, reason="the compiler ships no AddressSanitizer runtime")
def test_the_sanitizer_run_catches_a_write_past_the_slots(tmp_path):
    """The same run on a core that reads one slot past the end of its array: reported."""
    lib = _build(tmp_path, flags=SANITIZE, defines=("-DSPECOBS_CORE_FAULT_OVERRUN=1",))
    r = _run(str(lib), {**ASAN_ENV, "LD_PRELOAD": str(ASAN)}, 2, dev=False)
    assert r.returncode != 0
    assert "AddressSanitizer" in r.stderr, r.stderr[-3000:]
