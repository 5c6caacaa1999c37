"""`understudy merge` over files: the reports read one at a time and one
shape at a time, giving what merge() gives for the same reports as dicts;
memory that does not grow with the number of reports; a FIFO or a device
refused at once; a figure that is not a number named in one line."""
import json
import os
import subprocess
import sys
import tracemalloc

import pytest
import torch

import understudy
from conftest import ROOT
from understudy.merge import MergeError, merge, merge_files
from test_shadow import native, rms_inputs, run_rms_norm

ENV = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))


@pytest.fixture(scope="module")
def report():
    """A report with shadowed, observed and unscored routes in two phases."""
    understudy.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
                                     "gemm": {"sample": 1.0}}, "hardware": {"profile": "H200"}})
    try:
        for ph in ("prefill", "decode"):
            with understudy.phase(ph):
                run_rms_norm(rms_inputs(), repeat=2)
                for n in range(1, 40):
                    torch.mm(torch.randn(n, 8), torch.randn(8, 3))
        return understudy.report()
    finally:
        understudy.disable()


def copies(report, n, tmp_path):
    """n reports of n processes (their pids differ), as files and as dicts."""
    paths, dicts = [], []
    for i in range(n):
        r = dict(report, pid=report["pid"] + 1 + i)
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
        dicts.append(r)
    return paths, dicts


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "understudy", "merge", *map(str, args)], capture_output=True,
                          text=True, env=ENV, timeout=timeout)


def test_files_merge_as_the_dicts_do(report, tmp_path):
    paths, dicts = copies(report, 3, tmp_path)
    text, totals = merge_files(paths)
    want = merge(dicts)
    assert json.loads(text) == want
    assert totals == want["totals"] and totals["calls"] == 3 * report["totals"]["calls"]
    out = tmp_path / "merged.json"
    r = cli(out, *paths)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text()) == want
    assert f"{3 * report['totals']['calls']:.0f} calls" in r.stdout


def test_fields_after_the_operators_and_a_pretty_printed_file_are_read(report, tmp_path):
    """json.dump with an indent, the top-level keys in another order: the walk reads it."""
    a, b = dict(report, pid=1), dict(report, pid=2)
    reordered = {k: b[k] for k in sorted(b, key=lambda k: k != "totals")}  # totals first
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a, indent=2))
    pb.write_text(json.dumps(reordered, indent=1))
    text, _ = merge_files([str(pa), str(pb)])
    assert json.loads(text) == merge([a, b])


def peak_of(paths):
    tracemalloc.start()
    try:
        merge_files(paths)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_follows_one_report_not_their_number(report, tmp_path):
    """Eight reports take about what two take: one is read at a time (merge()
    of the dicts holds them all)."""
    paths, _ = copies(report, 8, tmp_path)
    two, eight = peak_of(paths[:2]), peak_of(paths)
    one_text = os.path.getsize(paths[0])
    assert eight < two + 2 * one_text, (two, eight, one_text)


def test_a_fifo_or_a_device_is_refused_at_once(report, tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    (good,), _ = copies(report, 1, tmp_path)
    for bad in (fifo, "/dev/zero"):
        r = cli(tmp_path / "out.json", good, bad)
        assert r.returncode == 2 and not (tmp_path / "out.json").exists()
        assert r.stderr.count("\n") == 1 and "is not a regular file" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(MergeError, match="not a regular file"):
        merge_files([str(fifo)])


@pytest.mark.parametrize("where, value, field", [
    (("shape", "calls"), "many", "'calls' is \"many\", not a number"),
    (("shape", "latency_ns"), {"sum": 5, "buckets": [[3, "x"]]}, "'latency_ns.buckets' is \"x\", not a number"),
    (("shape", "latency_ns"), "fast", "'latency_ns' is \"fast\", not a histogram"),
    (("operator", "untracked"), [1], "'untracked' is [1], not a number"),
    (("report", "started_unix_ms"), "yesterday", "'started_unix_ms' is \"yesterday\", not a number"),
])
def test_a_figure_that_is_not_a_number_is_one_line(report, tmp_path, where, value, field):
    paths, dicts = copies(report, 2, tmp_path)
    bad = json.loads(json.dumps(dicts[1]))
    op = next(o for o in bad["operators"] if o["shapes"])
    target = {"shape": op["shapes"][0], "operator": op, "report": bad}[where[0]]
    target[where[1]] = value
    with open(paths[1], "w") as f:
        json.dump(bad, f)
    r = cli(tmp_path / "out.json", *paths)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and field in r.stderr and paths[1] in r.stderr, r.stderr
    with pytest.raises(MergeError, match="not a"):
        merge([dicts[0], bad])


def test_text_that_is_not_a_report_is_named(tmp_path):
    cut = '{"schema": "understudy.report", "version": 1, "histogram": {"scheme": "log2-sub16-ns"}, "operators": ['
    for text, what in ((cut, "not a JSON report"),
                       ("[1, 2]", "not a JSON report"), ("{\"schema\": \"x\"}", "is not an understudy.report")):
        p = tmp_path / "r.json"
        p.write_text(text)
        r = cli(tmp_path / "out.json", p)
        assert r.returncode == 2 and what in r.stderr and "Traceback" not in r.stderr, r.stderr
