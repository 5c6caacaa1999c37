"""One report.path configured in several processes at once (a server's
processes share one config: vLLM's API server and its engine both load the
plugin). Each case runs real processes (subprocess) on one path and follows
the file while they run: a report with calls is never replaced by one
without, and never by another running process's report; a process that
cannot take the path writes to a name of its own and says so, once."""
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

from conftest import ROOT, bound_ops, load_report

# A process that enables understudy on the shared path, makes `calls` calls
# of torch.mm, says "ready", and waits for a line on stdin before it exits
# (the final report is written at disable()).
CHILD = """
    import json, sys
    import torch, understudy
    path, calls, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    understudy.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}},
                       "report": {"path": path, "interval_s": interval}})
    a = torch.ones(8, 8)
    for _ in range(calls):
        torch.mm(a, a)
    print("ready", flush=True)
    sys.stdin.readline()
    understudy.disable()
"""


def start(path, calls, interval=0.02):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    env.pop("UNDERSTUDY_CONFIG", None)
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), str(path), str(calls), str(interval)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    assert line.strip() == "ready", p.stderr.read() if p.poll() is not None else line
    return p


def finish(p):
    out, err = p.communicate("\n", timeout=120)
    assert p.returncode == 0, err
    return err


class Watch:
    """Reads the file at path every millisecond or so while processes run:
    the (pid, calls) of every report seen there, in order."""

    def __init__(self, path):
        self.path, self.seen, self.stop = path, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                rep = json.loads(self.path.read_text())
                mark = (rep["pid"], rep["totals"]["calls"])
                if not self.seen or self.seen[-1] != mark:
                    self.seen.append(mark)
            except (OSError, ValueError):
                pass
            time.sleep(0.001)

    def done(self):
        self.stop.set()
        self.thread.join()
        return self.seen


def never_emptied(seen):
    """No report with calls is followed by one without."""
    had = False
    for pid, calls in seen:
        assert not (had and calls == 0), seen
        had = had or calls > 0


def test_an_idle_process_that_exits_last_leaves_the_workers_report(tmp_path):
    """The API server (no call) starts first and exits last; the worker's
    report with its calls is what stays at the path, from the moment it is
    written, and the idle process says once why it wrote nothing."""
    path = tmp_path / "shared.json"
    watch = Watch(path)
    idle = start(path, 0)
    time.sleep(0.1)  # the idle process's periodic reports hold the path first
    worker = start(path, 25)
    time.sleep(0.2)
    finish(worker)
    time.sleep(0.1)
    err = finish(idle)
    seen = watch.done()
    never_emptied(seen)
    rep = load_report(path)
    assert rep["pid"] == worker.pid and bound_ops(rep) == {"aten::mm": 25}, seen
    assert (idle.pid, 0) in seen  # the idle process did write while the path held no calls
    lines = [ln for ln in err.splitlines() if "observed no call" in ln]
    assert len(lines) == 1, err
    assert f"process {idle.pid} observed no call" in lines[0] and f"process {worker.pid}" in lines[0]
    assert not list(tmp_path.glob("shared-*.json")), "the idle process needs no name of its own"
    assert not [p for p in os.listdir(tmp_path) if ".tmp." in p]


def test_two_processes_with_calls_each_keep_their_own_report(tmp_path):
    """Both observe: the first to write holds the path, the other writes its
    report to the path with -PID before the extension from then on and says
    so once; nothing is replaced by the other process's report, and the two
    merge to every call."""
    path = tmp_path / "shared.json"
    watch = Watch(path)
    first = start(path, 11)
    time.sleep(0.1)
    second = start(path, 7)
    time.sleep(0.2)
    err_first = finish(first)
    err_second = finish(second)
    seen = watch.done()
    assert {pid for pid, _ in seen} == {first.pid}, seen
    assert bound_ops(load_report(path)) == {"aten::mm": 11}
    own = tmp_path / f"shared-{second.pid}.json"
    rep = load_report(own)
    assert rep["pid"] == second.pid and bound_ops(rep) == {"aten::mm": 7}
    lines = [ln for ln in err_second.splitlines() if "writes its own" in ln]
    assert len(lines) == 1, err_second
    assert f"process {first.pid}" in lines[0] and str(own) in lines[0] and "{pid}" in lines[0]
    assert "understudy" not in err_first
    merged = tmp_path / "merged.json"
    r = subprocess.run([sys.executable, "-m", "understudy", "merge", str(merged), str(path), str(own)],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "python-shim")))
    assert r.returncode == 0, r.stderr
    assert bound_ops(load_report(merged)) == {"aten::mm": 18}


def test_a_report_of_an_ended_process_is_replaced_only_by_one_with_calls(tmp_path):
    """Run again on the same path: a process that observed something replaces
    the report an ended process left; one that observed nothing leaves it and
    says so."""
    path = tmp_path / "again.json"
    old = start(path, 5, interval=0)
    finish(old)
    assert load_report(path)["pid"] == old.pid
    idle = start(path, 0, interval=0)
    err = finish(idle)
    rep = load_report(path)
    assert rep["pid"] == old.pid and bound_ops(rep) == {"aten::mm": 5}
    assert "observed no call" in err
    new = start(path, 3, interval=0)
    finish(new)
    rep = load_report(path)
    assert rep["pid"] == new.pid and bound_ops(rep) == {"aten::mm": 3}
    assert not list(tmp_path.glob("again-*.json"))


def test_one_process_writes_over_its_own_report(tmp_path, us):
    """The rule is about other processes: this process's later reports on
    the same path (a second enable, write_report) replace its own, even with
    fewer calls."""
    import torch

    path = tmp_path / "mine.json"
    us.enable({"operators": {"gemm": "observe"}, "report": {"path": str(path), "interval_s": 0}})
    torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    us.disable()
    assert bound_ops(load_report(path)) == {"aten::mm": 1}
    us.enable({"operators": {"gemm": "observe"}, "report": {"path": str(path), "interval_s": 0}})
    us.disable()
    assert load_report(path)["totals"]["calls"] == 0
