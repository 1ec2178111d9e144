"""Stress: force_flush after 60,000 cycles beside a worker that lets go of the GIL, N times; on a
hang, the resolver's state and every thread's stack (faulthandler). PYTHONPATH=. python
benchmarks/diag/pump_stress.py N"""
import specobs, hashlib, faulthandler, sys, time
if len(sys.argv) > 2 and sys.argv[2] == 'cuda':
    import torch
    torch.zeros(1, device='cuda')  # the default clock is CUDA's once CUDA is initialised
faulthandler.dump_traceback_later(40, exit=True)
_WORK=bytes(1<<16)
for k in range(int(sys.argv[1])):
    obs = specobs.configure(sinks=[], poll_interval_seconds=0.001, queue_size=1<<15)
    acc=[1,2,0,3,4,1,0,2]
    for i in range(60000):
        with obs.cycle(batch_size=8) as c:
            c.mark("verify"); c.mark("bookkeeping"); c.accept(acc, draft_length=4)
        if i % 4 == 0: hashlib.sha256(_WORK).digest()
    t=time.time(); ok=obs.force_flush(10)
    r=obs._resolver; ring=r.rec.ring
    if not ok:
        print("HANG", k, "consumed", r.consumed, "enq", r.rec.enqueued, "len", len(ring), "drains", r.drains, "pumping", ring.pumping, r.pump_returns, "alive", r._thread.is_alive(), flush=True)
        print("begun", ring.begun, "drained", ring.drained, "pump_walked", ring.pump_walked, "nogil", ring.nogil_cycles, "held", ring.held_cycles, "cycles_total", obs.snapshot().cycles_total, "deferred", ring.deferred, "current", ring.current, flush=True)
        print("pending", ring.pending(100), flush=True)
        faulthandler.dump_traceback(all_threads=True)
        sys.exit(1)
    obs.shutdown(5)
print("ok")
