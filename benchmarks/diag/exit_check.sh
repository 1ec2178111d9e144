# Which part of `specobs demo --device cuda` ends the process with "terminate called without an
# active exception"? A: autograd in a Python thread with CUDA initialised; B: the demo with warm
# weights (no background training); C: the demo from a cold cache (background training).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
python3 - <<'PY'
import threading, torch
torch.cuda.init()
def f():
    x = torch.randn(64, 64, requires_grad=True)
    (x @ x).sum().backward()
t = threading.Thread(target=f, daemon=True); t.start(); t.join()
print("A done")
PY
echo "A rc=$?"
export SPECOBS_CACHE_DIR=$(mktemp -d)
python3 -m specobs.cli demo --device cuda --duration 4 --plain --port 18002 --metrics-port 19479 > /tmp/c.log 2>&1
echo "C rc=$? $(grep -c terminate /tmp/c.log) terminate lines"; tail -n 3 /tmp/c.log
python3 -m specobs.cli demo --device cuda --duration 4 --plain --port 18003 --metrics-port 19480 > /tmp/b.log 2>&1
echo "B rc=$? $(grep -c terminate /tmp/b.log) terminate lines"; tail -n 3 /tmp/b.log
