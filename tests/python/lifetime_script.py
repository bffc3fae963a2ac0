"""Binding lifetimes (issue 28): contexts, caches, plans and device arrays closed or collected in
any order must never crash or free twice. Run by test_lifetimes.py in a child interpreter (a
crash is then a failing exit status, not a dead test runner), under `-X dev`; with the library
built with ASan, also with libasan preloaded (docs/RELIABILITY.md). Usage: lifetime_script.py
SCENARIO; exits 0 when the scenario ran to its end."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np

import kvarn

CONFIG = kvarn.Config.from_preset("k4v2_g64", head_dim=64)


class Holder:
    """An object that refers to itself and holds what it is given."""

    def __init__(self, *things):
        self.things = things
        self.me = self


def make_all(ctx):
    """A cache with a token, an attention plan and a device array on ctx."""
    cache = kvarn.Cache(CONFIG, num_kv_heads=1, max_tokens=256, max_sequences=2, ctx=ctx)
    cache.add_sequence(1)
    kv = np.ones((1, 1, 64), np.float32)
    cache.append(1, 0, kv, kv)
    plan = kvarn.AttentionPlan(ctx, CONFIG, batch=2, num_kv_heads=1, max_blocks_per_seq=2,
                               num_q_heads=1)
    array = kvarn.DeviceArray(ctx, (16,), "f32")
    return cache, plan, array


def cycles():
    # The context and its dependents in reference cycles, collected together: the collector
    # may finalize them in any order (the context used to go first and its caches after it).
    for _ in range(50):
        ctx = kvarn.Context("cpu", num_threads=1)
        cache, plan, array = make_all(ctx)
        ctx.keep = (cache, plan, array)
        cache.keep = ctx
        plan.keep = ctx
        array.keep = ctx
        Holder(ctx, cache)
        del ctx, cache, plan, array
    gc.collect()


def exit_cycles():
    # Cycles left for interpreter exit, and a module-level context with live dependents.
    global KEEP
    for _ in range(20):
        ctx = kvarn.Context("cpu", num_threads=1)
        cache, plan, array = make_all(ctx)
        ctx.keep = (cache, plan, array)
        cache.keep = ctx
    ctx = kvarn.Context("cpu", num_threads=1)
    KEEP = (ctx, make_all(ctx))


def context_first():
    # The context closed while its dependents live: they are closed with it and then refuse
    # calls; closing or collecting them after is a no-op.
    ctx = kvarn.Context("cpu", num_threads=1)
    cache, plan, array = make_all(ctx)
    ctx.close()
    for call in (lambda: cache.add_sequence(2), lambda: cache.stats(), lambda: array.numpy()):
        try:
            call()
        except kvarn.Error:
            pass
        else:
            raise AssertionError("a call on a closed context's object succeeded")
    cache.close()
    plan.close()
    del cache, plan, array
    gc.collect()
    ctx.close()


def dependents_first():
    ctx = kvarn.Context("cpu", num_threads=1)
    cache, plan, array = make_all(ctx)
    cache.close()
    cache.close()
    plan.close()
    array.free()
    array.free()
    try:
        array.numpy()
    except kvarn.Error:
        pass
    else:
        raise AssertionError("a freed DeviceArray was read")
    del array
    gc.collect()
    ctx.close()
    ctx.close()


def threads():
    # Closes from other threads racing calls and other closes: every call either works or
    # raises, nothing is freed twice.
    for _ in range(20):
        ctx = kvarn.Context("cpu", num_threads=2)
        cache, plan, array = make_all(ctx)
        stop = threading.Event()

        def work():
            while not stop.is_set():
                try:
                    cache.stats()
                    array.numpy()
                    cache.append(1, 0, np.ones((1, 1, 64), np.float32),
                                 np.ones((1, 1, 64), np.float32))
                except kvarn.Error:
                    return

        workers = [threading.Thread(target=work) for _ in range(2)]
        closers = [threading.Thread(target=f) for f in (cache.close, plan.close, ctx.close,
                                                          ctx.close, cache.close)]
        for t in workers + closers:
            t.start()
        for t in closers:
            t.join()
        stop.set()
        for t in workers:
            t.join()
    gc.collect()


SCENARIOS = {
    "cycles": cycles,
    "exit_cycles": exit_cycles,
    "context_first": context_first,
    "dependents_first": dependents_first,
    "threads": threads,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    print("ok", sys.argv[1])
