"""The loop of an out-of-memory sweep, for the scripts test_hostile.py runs
in processes of their own with tests/c/fail_new.cpp's library preloaded."""
import ctypes
import os

import understudy

fail = ctypes.CDLL(os.environ["UST_FAIL_NEW"])
fail.fail_new_failed_at.restype = ctypes.c_ulong
if fail.fail_new_through() == 0:
    raise SystemExit("no allocation came to the preloaded library: LD_PRELOAD did not take")


def sweep(name, act, check=None, before=None):
    """act(k) with libunderstudy.so's k-th allocation on this thread failing,
    for k = 0, 1, ... until a run makes no more than k allocations (so none
    failed); before() ahead of each run and check(k, what act returned)
    after it, all allocations back. Returns what the runs in which an
    allocation failed returned."""
    got = []
    for k in range(100000):
        if before is not None:
            before()
        if fail.fail_new_arm(k) != 0:
            raise SystemExit("libunderstudy.so is not mapped")
        try:
            try:
                out = act(k)
            finally:
                seen = fail.fail_new_seen()
                fail.fail_new_arm(-1)
            if check is not None:
                check(k, out)
        except AssertionError as e:
            raise SystemExit(f"{name}: allocation {k} failed (libunderstudy.so+{fail.fail_new_failed_at():#x}): {e}")
        if seen <= k:
            return got
        got.append(out)
    raise SystemExit(f"{name}: more than 100000 allocations")


def refused(fn):
    """False when fn() returned; True when it raised understudy's error saying
    what ran out of memory; any other error is the sweep's failure."""
    try:
        fn()
        return False
    except understudy.UnderstudyError as e:
        assert "out of memory" in str(e), f"it said {e!r}"
        return True
