"""Activation without code changes, from the clone: the start-up hook
(python-shim/understudy-autoload.pth, processed here by site.addsitedir from a
sitecustomize, as site-packages processes it once pip installed it), the
frameworks' plugin functions, the final report at exit and on SIGTERM, path
placeholders, and `understudy run`. Each case runs in a process of its own:
the ground truth is the calls that process's script made, and its exit
status. tests/python/test_packaging.py repeats the essentials against a pip
install."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import understudy
from conftest import ROOT, bound_ops, load_report

SHIM = ROOT / "python-shim"

# Variables of this test process that would change what the child does.
_CLEARED = ("UNDERSTUDY_CONFIG", "UNDERSTUDY_CANDIDATE_MODULES", "RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_LOCALID", "PYTHONPATH")


def child_env(tmp_path, config=None, hook=True, **extra):
    """The environment of a child Python: the hook processed at start-up
    (hook=True: a sitecustomize that runs site.addsitedir on python-shim,
    which executes its .pth) or only the package on the path."""
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    if hook:
        site_dir = tmp_path / "site"
        site_dir.mkdir(exist_ok=True)
        (site_dir / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(SHIM)!r})\n")
        env["PYTHONPATH"] = str(site_dir)
    else:
        env["PYTHONPATH"] = str(SHIM)
    if config is not None:
        env["UNDERSTUDY_CONFIG"] = config if isinstance(config, str) else json.dumps(config)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def script(*parts):
    """Python source from parts, each dedented on its own."""
    return "".join(textwrap.dedent(p) for p in parts)


def run_py(code, env, timeout=180, **kw):
    """Run code (a string, or a list of parts joined by script()) in a child."""
    code = script(*code) if isinstance(code, list) else textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, **kw)


def observe(report_path, **more):
    cfg = {"operators": {"gemm": "observe", "silu": "observe"},
           "report": {"path": str(report_path), "interval_s": 0}}
    cfg.update(more)
    return cfg


# The calls a plain script makes: the report must count exactly these.
CALLS = """
    import torch
    a = torch.ones(4, 4)
    for _ in range(7):
        torch.mm(a, a)
    for _ in range(3):
        torch.nn.functional.silu(a)
"""
EXPECTED = {"aten::mm": 7, "aten::silu": 3}


def test_hook_enables_at_torch_import_and_reports_at_exit(tmp_path):
    """With UNDERSTUDY_CONFIG set (inline JSON), a plain script that imports
    torch runs under understudy: neither understudy nor torch is imported
    before the script imports torch, understudy is enabled once torch's
    import has finished (torch's loader is torch's own again), and the report
    written at exit counts exactly the calls the script made."""
    rep = tmp_path / "r-{pid}.json"
    p = run_py(["""
        import sys
        assert "torch" not in sys.modules and "understudy" not in sys.modules, sorted(sys.modules)
        assert "_understudy_autoload" in sys.modules
    """, CALLS, """
        import understudy, importlib.machinery
        assert understudy.is_enabled()
        assert type(torch.__spec__.loader) is importlib.machinery.SourceFileLoader, torch.__spec__.loader
        assert torch.__loader__ is torch.__spec__.loader
        print("pid", __import__("os").getpid())
    """], child_env(tmp_path, observe(rep)))
    assert p.returncode == 0, p.stderr
    pid = int(p.stdout.split("pid ")[1])
    got = load_report(tmp_path / f"r-{pid}.json")
    assert bound_ops(got) == EXPECTED


def test_hook_reads_a_config_file(tmp_path):
    cfg = tmp_path / "understudy.json"
    cfg.write_text(json.dumps(observe(tmp_path / "r.json")))
    p = run_py(CALLS, child_env(tmp_path, str(cfg)))
    assert p.returncode == 0, p.stderr
    assert bound_ops(load_report(tmp_path / "r.json")) == EXPECTED


def test_without_config_the_hook_does_nothing(tmp_path):
    """No UNDERSTUDY_CONFIG (or a blank one): the .pth line imports nothing,
    and torch runs without understudy."""
    for blank in (None, "  "):
        p = run_py("""
            import sys
            import torch
            torch.mm(torch.ones(2, 2), torch.ones(2, 2))
            print(sorted(m for m in sys.modules if "understudy" in m))
        """, child_env(tmp_path, blank))
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "[]"


def test_a_process_that_never_imports_torch_never_loads_it(tmp_path):
    p = run_py("""
        import json, sys
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "understudy"))))
    """, child_env(tmp_path, observe(tmp_path / "r.json")))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == []
    assert not (tmp_path / "r.json").exists()


def test_a_bad_config_is_one_line_and_the_host_runs_on(tmp_path):
    """A config understudy refuses never raises into the host: the message
    names the field, torch works, the script ends normally."""
    p = run_py([CALLS, """
        import understudy
        print("enabled", understudy.is_enabled())
    """], child_env(tmp_path, {"operators": {"gemm": "observe"}, "report": {"path": "x.json", "intervall_s": 1}}))
    assert p.returncode == 0, p.stderr
    assert "enabled False" in p.stdout
    assert "unknown field 'report.intervall_s'" in p.stderr, p.stderr


def test_a_look_up_of_torch_before_its_import_leaves_the_hook_waiting(tmp_path):
    """Libraries ask importlib.util.find_spec("torch") whether torch is
    installed long before they import it (HF transformers does at its own
    import); the hook must still enable understudy when torch is imported
    later, and the report count the script's calls. (The hook used to leave
    at the first look-up, and understudy never came up in such a process.)"""
    rep = tmp_path / "r.json"
    p = run_py(["""
        import importlib.util, sys
        for _ in range(3):
            assert importlib.util.find_spec("torch") is not None
        assert "torch" not in sys.modules
    """, CALLS, """
        import understudy
        assert understudy.is_enabled()
        assert not any(type(f).__name__ == "_TorchWatch" for f in sys.meta_path)  # gone once torch ran
    """], child_env(tmp_path, observe(rep)))
    assert p.returncode == 0, p.stderr
    assert bound_ops(load_report(rep)) == EXPECTED


# ---- candidate modules ------------------------------------------------------------------

# A module that registers a torch-op candidate for aten::silu (silu itself, so
# every shadow call passes) and records whether understudy was enabled when
# it ran, through the environment's marker path.
CANDIDATE_MODULE = """
    import os, torch, understudy
    open(os.environ["MARKER"], "a").write(f"{__name__} enabled={understudy.is_enabled()}\\n")
    understudy.register_candidate("act_test::silu_copy", lambda x: torch.ops.aten.silu.default(x), like="aten::silu")
"""


def shadow_silu(report_path):
    return {"operators": {"silu": {"mode": "shadow", "sample": 1.0,
                                   "candidate": {"torch_op": "act_test::silu_copy", "target": "aten::silu"}}},
            "report": {"path": str(report_path), "interval_s": 0}}


def silu_shadow(rep):
    (op,) = [o for o in rep["operators"] if o["name"] == "silu"]
    return {k: sum(int(s["shadow"][k]) for s in op["shapes"]) for k in ("calls", "passed", "failed")}


@pytest.mark.parametrize("as_path", [True, False], ids=["path", "module-name"])
def test_candidate_modules_are_imported_before_enabling(tmp_path, as_path):
    """UNDERSTUDY_CANDIDATE_MODULES (a .py path, or a module name on the
    path): activation imports it once, before it enables understudy, so the
    torch-op candidate it registers is there when the config names it; the
    script's code has no understudy in it, and every silu call is shadowed
    and passes."""
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / "act_cands.py").write_text(textwrap.dedent(CANDIDATE_MODULE))
    marker = tmp_path / "marker"
    env = child_env(tmp_path, shadow_silu(tmp_path / "r.json"), MARKER=marker,
                    UNDERSTUDY_CANDIDATE_MODULES=str(moddir / "act_cands.py") if as_path else " act_cands ,")
    if not as_path:
        env["PYTHONPATH"] += os.pathsep + str(moddir)
    p = run_py(CALLS, env)
    assert p.returncode == 0, p.stderr
    assert "understudy:" not in p.stderr, p.stderr
    name = "_understudy_candidates_act_cands" if as_path else "act_cands"
    assert marker.read_text() == f"{name} enabled=False\n"  # imported once, before enable
    assert silu_shadow(load_report(tmp_path / "r.json")) == {"calls": 3, "passed": 3, "failed": 0}


def test_a_candidate_module_that_fails_is_one_line_and_understudy_runs(tmp_path):
    """A missing file, a module that does not exist, one that raises and one
    that calls sys.exit: one line on stderr each, naming the entry and the
    error; the good module after them is still imported, understudy is
    enabled, and the script runs to its end."""
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('broken on purpose')\n")
    quits = tmp_path / "quits.py"
    quits.write_text("import sys\nsys.exit(9)\n")
    good = tmp_path / "good.py"
    good.write_text(textwrap.dedent(CANDIDATE_MODULE))
    entries = [str(tmp_path / "absent.py"), "no_such_module_here", str(bad), str(quits), str(good)]
    p = run_py([CALLS, """
        import understudy
        print("enabled", understudy.is_enabled())
    """], child_env(tmp_path, shadow_silu(tmp_path / "r.json"), MARKER=tmp_path / "marker",
                    UNDERSTUDY_CANDIDATE_MODULES=",".join(entries)))
    assert p.returncode == 0, p.stderr
    assert "enabled True" in p.stdout
    lines = [line for line in p.stderr.splitlines() if line.startswith("understudy:")]
    assert len(lines) == 4, p.stderr
    for entry, error in zip(entries, ["FileNotFoundError", "ModuleNotFoundError", "RuntimeError: broken on purpose",
                                      "SystemExit: 9"]):
        assert any(f"candidate module '{entry}'" in line and error in line for line in lines), (entry, lines)
    assert silu_shadow(load_report(tmp_path / "r.json")) == {"calls": 3, "passed": 3, "failed": 0}


def test_candidate_modules_without_config_are_not_imported(tmp_path):
    """The variable alone does nothing: without UNDERSTUDY_CONFIG no module
    is imported (and understudy is not loaded)."""
    good = tmp_path / "good.py"
    good.write_text(textwrap.dedent(CANDIDATE_MODULE))
    p = run_py([CALLS, """
        import sys
        print(sorted(m for m in sys.modules if "understudy" in m or "cands" in m))
    """], child_env(tmp_path, None, MARKER=tmp_path / "marker", UNDERSTUDY_CANDIDATE_MODULES=str(good)))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
    assert not (tmp_path / "marker").exists()


# ---- SIGTERM --------------------------------------------------------------------------

SIGTERM_SCRIPT = script("""
    import os, signal, sys
    mode = sys.argv[1]
    marker = sys.argv[2]
    def host(signum, frame):
        open(marker, "w").write("host handler ran")
        sys.exit(3)
    if mode == "host-before":
        signal.signal(signal.SIGTERM, host)
    if mode == "ignored":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
""", CALLS, """
    if mode == "host-after":
        signal.signal(signal.SIGTERM, host)
    print("ready", os.getpid(), flush=True)
    # Until the test says (or a signal ends it): a loop, as a server's main
    # thread is. A Python handler runs when the main thread is back in
    # Python; one blocked in a single system call would see a signal that
    # arrived just before the call began only when the call returns.
    import time
    while not os.path.exists(marker + ".release"):
        time.sleep(0.02)
    print("released", flush=True)
""")


def sigterm_child(tmp_path, mode):
    script = tmp_path / "serve.py"
    script.write_text(SIGTERM_SCRIPT)
    marker = tmp_path / f"marker-{mode}"
    p = subprocess.Popen([sys.executable, str(script), mode, str(marker)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=child_env(tmp_path, observe(tmp_path / "r-{pid}.json")))
    line = p.stdout.readline()
    assert line.startswith("ready"), (line, p.stderr.read() if p.poll() is not None else "")
    return p, marker


def test_a_process_that_exits_enabled_stops_the_worker_first(tmp_path):
    """A script that takes understudy's log through a callback (a ctypes one,
    as a Python host would), enables understudy and exits without disable():
    at exit the worker thread is stopped before the libraries it uses are torn
    down; the handler says so on stderr, not through the callback (Python has
    shut down by then), and the process exits 0 with the calls it made
    counted."""
    p = run_py(["""
        import ctypes, understudy
        CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
        got = []
        cb = CB(lambda level, msg, user: got.append(msg))
        understudy._load().ust_set_log(cb, None, 2)  # info
        understudy.enable({"operators": {"gemm": "observe", "silu": "observe"}, "log_level": "info",
                           "defaults": {"sample": 1.0}})
    """, CALLS, """
        print(bool(got), {s["op"]: s["calls"] for o in understudy.report()["operators"] for s in o["shapes"]})
    """], child_env(tmp_path, hook=False))
    assert p.returncode == 0, (p.returncode, p.stderr)
    took_log, counted = p.stdout.strip().splitlines()[-1].split(" ", 1)
    assert took_log == "True"  # the callback had the enable's own lines
    assert eval(counted) == EXPECTED
    assert p.stderr.count("process exit: the worker stopped") == 1, p.stderr


def test_sigterm_default_action_writes_the_report_and_dies_of_sigterm(tmp_path):
    """The host had no handler: the final report is written and the process
    still dies of SIGTERM (-15), as it would have without understudy."""
    p, _ = sigterm_child(tmp_path, "default")
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=60)
    assert rc == -signal.SIGTERM, (rc, p.stderr.read())
    assert bound_ops(load_report(tmp_path / f"r-{p.pid}.json")) == EXPECTED


@pytest.mark.parametrize("host", ["host-before", "host-after"])
def test_sigterm_is_the_hosts_handler_and_the_report_is_written(tmp_path, host):
    """host-before: the host's handler installed before understudy is still
    called (here it exits with status 3); the report is written before it
    runs and again at exit. host-after: a handler the host installs later is
    the host's, and exit still reports."""
    p, marker = sigterm_child(tmp_path, host)
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=60)
    assert rc == 3, (rc, p.stderr.read())
    assert marker.read_text() == "host handler ran"
    assert bound_ops(load_report(tmp_path / f"r-{p.pid}.json")) == EXPECTED


def test_a_host_that_ignores_sigterm_keeps_ignoring_it(tmp_path):
    p, _ = sigterm_child(tmp_path, "ignored")
    p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert p.poll() is None, "SIGTERM ended a process that ignores it"
    (tmp_path / "marker-ignored.release").write_text("")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "released" in out
    assert bound_ops(load_report(tmp_path / f"r-{p.pid}.json")) == EXPECTED


# ---- the frameworks' plugin functions --------------------------------------------------

def test_plugin_functions_enable_once_per_process(tmp_path):
    """vLLM and SGLang call their plugin functions in each process they
    create, possibly more than once: understudy is enabled once (enable() is
    counted), every call returns None without raising, and the report counts
    the calls once."""
    p = run_py(["""
        import torch, understudy
        import understudy.plugins as plugins
        enables = []
        real = understudy.enable
        understudy.enable = lambda *a, **k: (enables.append(a), real(*a, **k))[1]
        assert plugins.vllm() is None and plugins.sglang() is None and plugins.vllm() is None
        assert understudy.activate() is True
        print("enables", len(enables), understudy.is_enabled())
    """, CALLS], child_env(tmp_path, observe(tmp_path / "r.json"), hook=False))
    assert p.returncode == 0, p.stderr
    assert "enables 1 True" in p.stdout
    assert bound_ops(load_report(tmp_path / "r.json")) == EXPECTED


def test_plugin_functions_without_config_do_nothing(tmp_path):
    p = run_py("""
        import torch, understudy, understudy.plugins as plugins
        plugins.vllm(); plugins.sglang()
        print(understudy.is_enabled(), understudy._lib is None)
    """, child_env(tmp_path, None, hook=False))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False", "True"]


def test_a_host_that_enabled_understudy_itself_keeps_its_engine(tmp_path):
    """activate() after the host's own enable() leaves the host's engine and
    config alone (its report path, not the environment's)."""
    p = run_py(f"""
        import torch, understudy
        understudy.enable({{"operators": {{"gemm": "observe"}}, "report": {{"path": {str(tmp_path / "host.json")!r}}}}})
        assert understudy.activate() is True
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        understudy.disable()
    """, child_env(tmp_path, observe(tmp_path / "env.json"), hook=False))
    assert p.returncode == 0, p.stderr
    assert bound_ops(load_report(tmp_path / "host.json")) == {"aten::mm": 1}
    assert not (tmp_path / "env.json").exists()


def test_a_forked_child_says_it_cannot_run_and_exits_cleanly(tmp_path):
    """A process forked after activation inherits the engine without its
    worker thread: activate() there says so and returns False, and its exit
    handlers leave the parent's engine alone (no hang, no report written
    for the child's pid). The parent's report counts the parent's calls."""
    p = run_py("""
        import os, sys, torch, understudy
        assert understudy.is_enabled()
        a = torch.ones(4, 4)
        torch.mm(a, a)
        pid = os.fork()
        if pid == 0:
            ok = understudy.activate(source="test")
            sys.stderr.write(f"child activate {ok}\\n")
            sys.exit(0)  # atexit runs in the child
        _, status = os.waitpid(pid, 0)
        print("child", pid, os.waitstatus_to_exitcode(status), flush=True)
        torch.mm(a, a)
    """, child_env(tmp_path, observe(tmp_path / "r-{pid}.json")), timeout=120)
    assert p.returncode == 0, p.stderr
    _, child, code = p.stdout.split()
    assert code == "0"
    assert "child activate False" in p.stderr
    assert "was forked from process" in p.stderr and "spawn" in p.stderr
    assert not (tmp_path / f"r-{child}.json").exists()
    reports = list(tmp_path.glob("r-*.json"))
    assert len(reports) == 1
    assert bound_ops(load_report(reports[0])) == {"aten::mm": 2}


# ---- placeholders ---------------------------------------------------------------------

def test_placeholders_name_report_and_state_files_per_process(tmp_path):
    """{pid}, {rank} and {local_rank} in report.path and state.path are
    expanded from the process's id and the launcher's environment (RANK and
    LOCAL_RANK as torchrun sets them); '{{' and '}}' are braces."""
    cfg = observe(tmp_path / "r-{rank}-{local_rank}-{pid}-{{x}}.json",
                  state={"path": str(tmp_path / "state-{rank}.json")})
    p = run_py("""
        import os, torch, understudy
        understudy.enable()
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        understudy.set_mode(key="aten::mm|cpu|f32,f32|M=2,K=2,N=2", mode="off")  # a row for the state file
        understudy.disable()
        print(os.getpid(), understudy.expand_path("{local_rank}/{rank}/{pid}"))
    """, child_env(tmp_path, cfg, hook=False, RANK=5, LOCAL_RANK=1))
    assert p.returncode == 0, p.stderr
    pid, expanded = p.stdout.split()
    assert expanded == f"1/5/{pid}"
    assert bound_ops(load_report(tmp_path / f"r-5-1-{pid}-{{x}}.json")) == {"aten::mm": 1}
    state = json.loads((tmp_path / "state-5.json").read_text())
    assert "aten::mm|cpu|f32,f32|M=2,K=2,N=2" in json.dumps(state)
    assert sorted(f.name for f in tmp_path.iterdir() if f.suffix == ".json") == \
        sorted([f"r-5-1-{pid}-{{x}}.json", "state-5.json"])


def test_rank_from_the_mpi_and_slurm_variables(tmp_path):
    """Without RANK / LOCAL_RANK the launchers' own variables give the rank,
    in order: OpenMPI, MPICH (Hydra), Slurm."""
    for env, want in [({"OMPI_COMM_WORLD_RANK": 7, "OMPI_COMM_WORLD_LOCAL_RANK": 3}, "7-3"),
                      ({"PMI_RANK": 2, "MPI_LOCALRANKID": 0}, "2-0"),
                      ({"SLURM_PROCID": 11, "SLURM_LOCALID": 1}, "11-1"),
                      ({"RANK": 4, "SLURM_PROCID": 11, "LOCAL_RANK": 2, "SLURM_LOCALID": 1}, "4-2")]:
        p = run_py("""
            import understudy
            print(understudy.expand_path("{rank}-{local_rank}"))
        """, child_env(tmp_path, None, hook=False, **env))
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == want, env


@pytest.mark.parametrize("path,message", [
    ("r-{host}.json", "config: 'report.path' has an unknown placeholder '{host}'"),
    ("r-{pid.json", "config: 'report.path' has a '{' at offset 2 that is never closed"),
    ("r-pid}.json", "config: 'report.path' has a single '}' at offset 5"),
    ("r-{}.json", "config: 'report.path' has an unknown placeholder '{}'"),
])
def test_a_bad_placeholder_is_a_config_error_naming_it(us, path, message):
    """Refused before anything is written (the paths are relative: nothing
    may appear in the working directory)."""
    with pytest.raises(understudy.ConfigError) as e:
        us.enable({"operators": {"gemm": "observe"}, "report": {"path": path}})
    assert message in str(e.value)
    assert not us.is_enabled()
    with pytest.raises(understudy.ConfigError) as e:
        us.enable({"operators": {"gemm": "observe"}, "state": {"path": path}})
    assert message.replace("report.path", "state.path") in str(e.value)


def test_a_rank_the_environment_does_not_give_is_a_config_error(tmp_path):
    p = run_py("""
        import understudy
        for cfg in ({"report": {"path": "r-{rank}.json"}}, {"state": {"path": "s-{local_rank}.json"}}):
            try:
                understudy.enable(cfg)
                print("enabled")
            except understudy.ConfigError as e:
                print(e)
    """, child_env(tmp_path, None, hook=False, SLURM_LOCALID="x1"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("config: 'report.path' uses {rank}, but none of RANK, OMPI_COMM_WORLD_RANK, PMI_RANK "
                               "or SLURM_PROCID is set"), lines
    assert lines[1] == "config: 'state.path' uses {local_rank}, but SLURM_LOCALID is 'x1', not a rank " \
                       "(a whole number >= 0)", lines


# ---- understudy run, --version --------------------------------------------------------

def cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "understudy", *args], capture_output=True, text=True, timeout=120,
                          env=env, **kw)


def test_run_passes_the_config_and_the_commands_exit_status(tmp_path):
    """`understudy run` hands the command the config through
    UNDERSTUDY_CONFIG (a file as an absolute path: the command may change
    directory) and exits as the command did: its status, or the signal it
    died of."""
    env = child_env(tmp_path, None, hook=False)
    inline = '{"report": {"path": "r-{pid}.json"}}'
    r = cli("run", "--config", inline, "--", "sh", "-c", 'printf %s "$UNDERSTUDY_CONFIG"; exit 7', env=env)
    assert r.returncode == 7, r.stderr
    assert r.stdout == inline
    (tmp_path / "c.json").write_text(inline)
    r = cli("run", "--config", "c.json", "--", "sh", "-c", 'printf %s "$UNDERSTUDY_CONFIG"', env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == str(tmp_path / "c.json")
    r = cli("run", "--", "sh", "-c", 'printf %s "$UNDERSTUDY_CONFIG"', env=env)
    assert r.stdout == '{"report": {"path": "understudy-report-{pid}.json"}}'
    r = cli("run", "--", "sh", "-c", 'kill -USR1 $$', env=env)
    assert r.returncode == -signal.SIGUSR1, r.stderr
    r = cli("run", "--config", "{not json", "--", "true", env=env)
    assert r.returncode == 2 and "run: the config is not JSON" in r.stderr
    r = cli("run", "--", "no-such-command-here", env=env)
    assert r.returncode == 127 and "cannot run 'no-such-command-here'" in r.stderr
    r = cli("run", env=env)
    assert r.returncode == 2 and "no command given" in r.stderr


def test_run_passes_sigterm_on_and_names_the_report(tmp_path):
    """SIGTERM sent to `understudy run` reaches the command (a server under a
    supervisor): its handler writes the report, and run says where at the
    end, in one line, then dies of the same signal."""
    script = tmp_path / "serve.py"
    script.write_text(textwrap.dedent(CALLS) + "print('ready', flush=True)\nimport time\nwhile True: time.sleep(0.02)\n")
    cfg = json.dumps(observe(tmp_path / "r-{pid}.json"))
    p = subprocess.Popen([sys.executable, "-m", "understudy", "run", "--config", cfg, "--", sys.executable, str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=child_env(tmp_path, None, hook=False), cwd=tmp_path)
    assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.poll() is not None else ""
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=60)
    err = p.stderr.read()
    assert rc == -signal.SIGTERM, err
    (rep,) = tmp_path.glob("r-*.json")
    assert bound_ops(load_report(rep)) == EXPECTED
    lines = [ln for ln in err.splitlines() if ln.startswith("understudy: run:")]
    assert lines == [f"understudy: run: report written to {rep.name} (10 calls); read it with: "
                     f"understudy report {rep.name}"], err


# A console script of another interpreter, as pip writes one: the calls of
# CALLS, then what its own metrics endpoint serves.
CONSOLE_SCRIPT = """#!{python}
import sys, urllib.request
{calls}
text = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
print("\\n".join(line for line in text.splitlines() if line.startswith("understudy_calls_total")))
"""


def another_interpreter(tmp_path):
    """A second interpreter path that sees this torch but holds no start-up
    hook: a venv with the system's site packages (on Python's own path the
    clone's hook is not installed either, but a venv is a path of its own)."""
    venv = tmp_path / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True,
                   timeout=120)
    return venv / "bin" / "python"


def test_run_enables_a_console_script_of_another_interpreter(tmp_path):
    """`understudy run -- CMD`, where CMD is a console script whose first
    line names another interpreter: its process enables understudy all the
    same (through the folder run puts first on PYTHONPATH), the report and
    the metrics are there, and run names the report in one line at the end.
    The interpreter's own sitecustomize still runs."""
    from conftest import free_port

    python = another_interpreter(tmp_path)
    port = free_port()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "tinytorch"
    tool.write_text(CONSOLE_SCRIPT.format(python=python, calls=textwrap.dedent(CALLS), port=port))
    tool.chmod(0o755)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(f"open({str(tmp_path / 'theirs-ran')!r}, 'w').close()\n")
    cfg = observe(tmp_path / "r-{pid}.json", metrics={"port": port})
    env = child_env(tmp_path, None, hook=False)
    del env["PYTHONPATH"]  # the command's interpreter finds understudy through run's folder alone
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    understudy_cli = f"import sys; sys.path.insert(0, {str(SHIM)!r}); from understudy.cli import main; sys.exit(main())"
    r = subprocess.run([sys.executable, "-c", understudy_cli, "run", "--config", json.dumps(cfg), "--", "sh", "-c",
                        f'PYTHONPATH="$PYTHONPATH:{theirs}" tinytorch'],
                       capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (rep,) = tmp_path.glob("r-*.json")
    assert bound_ops(load_report(rep)) == EXPECTED
    assert [ln for ln in r.stdout.splitlines()
            if ln.startswith("understudy_calls_total{") and 'operator="gemm"' in ln and ln.endswith(" 7.0")], r.stdout
    assert (tmp_path / "theirs-ran").exists()
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("understudy:")]
    assert lines == [f"understudy: run: report written to {rep.name} (10 calls); read it with: "
                     f"understudy report {rep.name}"], r.stderr


def test_run_where_understudy_cannot_load_says_so_once(tmp_path):
    """A process of the command that cannot take understudy (here its library
    cannot be loaded) says so on stderr once and runs on; run's last line says
    no report came."""
    python = another_interpreter(tmp_path)
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(CALLS) + "torch.mm(a, a)\nprint('done')\n")
    env = child_env(tmp_path, None, hook=False, UNDERSTUDY_LIB=str(tmp_path / "no-such-lib.so"))
    r = subprocess.run([sys.executable, "-m", "understudy", "run", "--config",
                        json.dumps(observe(tmp_path / "r.json")), "--", str(python), str(script)],
                       capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    said = [ln for ln in r.stderr.splitlines() if "not enabled" in ln]
    assert len(said) == 1 and "no-such-lib.so" in said[0], r.stderr
    assert r.stderr.splitlines()[-1].startswith("understudy: run: no process of the command enabled understudy")
    assert not (tmp_path / "r.json").exists()


def test_run_names_every_report_of_its_processes(tmp_path):
    """A command whose processes each write a report: run's one line names
    them all and how to merge them."""
    script = tmp_path / "two.py"
    script.write_text(textwrap.dedent(CALLS) + textwrap.dedent("""
        import subprocess, sys
        if len(sys.argv) == 1:
            subprocess.run([sys.executable, __file__, "child"], check=True)
    """))
    r = cli("run", "--config", json.dumps(observe(tmp_path / "r-{pid}.json")), "--", sys.executable, str(script),
            env=child_env(tmp_path, None, hook=False), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    reps = sorted(p.name for p in tmp_path.glob("r-*.json"))
    assert len(reps) == 2
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("understudy:")]
    assert line.startswith("understudy: run: 2 reports written: ")
    for name in reps:
        assert f"{name} (10 calls)" in line
    merge = line.split("; one report of them all: ")[1]
    assert merge.startswith("understudy merge merged.json ") and sorted(merge.split()[3:]) == reps, line


def test_doctor_tells_which_interpreters_enable_understudy(tmp_path):
    """`understudy doctor CMD`: for a console script, the interpreter it
    runs, and for each interpreter on PATH whether understudy comes on with
    UNDERSTUDY_CONFIG alone and under `understudy run`, or why not."""
    python = another_interpreter(tmp_path)
    bare = tmp_path / "bare-venv"  # no system site packages: no torch
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "tinytorch"
    tool.write_text(f"#!{python}\nimport torch\n")
    tool.chmod(0o755)
    env = child_env(tmp_path, None, hook=False)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(python.parent), str(bare / "bin"), env["PATH"]])
    r = cli("doctor", "tinytorch", "no-such-tool", env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"tinytorch ({tool}) runs {python}: Python " in out, out
    assert "no-such-tool: not found on PATH" in out
    block = out[out.index(str(python.parent / "python")):]
    assert "UNDERSTUDY_CONFIG set: no: no understudy-autoload.pth" in block.splitlines()[1], block
    assert block.splitlines()[2].split(":", 1)[1].strip() == "yes", block
    bare_block = out[out.index(str(bare / "bin" / "python")):].splitlines()
    assert "no torch" in bare_block[0]
    assert bare_block[1].endswith("no: no torch here (understudy enables itself when torch is imported)")
    assert bare_block[2].endswith("no: no torch here (understudy enables itself when torch is imported)")


def test_version_is_one_number_everywhere(tmp_path):
    """`understudy --version`, the package's __version__ (its one source),
    pip's metadata (read from it) and the library's ust_version() (CMake
    reads it) agree."""
    r = cli("--version", env=child_env(tmp_path, None, hook=False))
    assert r.returncode == 0, r.stderr
    ns = {}
    exec((SHIM / "understudy" / "_version.py").read_text(), ns)
    assert r.stdout.strip() == f"understudy {ns['__version__']}"
    assert understudy.__version__ == ns["__version__"]
    understudy._load()
    assert understudy._lib.ust_version().decode() == ns["__version__"]
    import tomllib
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["tool"]["scikit-build"]["metadata"]["version"]["input"] == "python-shim/understudy/_version.py"


def test_help_lists_every_subcommand(tmp_path):
    """`understudy --help` lists every subcommand; each subcommand's --help
    describes every argument and ends with an example of its use."""
    import argparse

    from understudy.cli import COMMANDS, parser

    env = child_env(tmp_path, None, hook=False)
    r = cli("--help", env=env)
    assert r.returncode == 0, r.stderr
    names = [c.name for c in COMMANDS]
    assert {"report", "merge", "calibrate", "export-atrex", "demo", "run", "doctor"} <= set(names)
    for n in names:
        assert f"    {n}" in r.stdout, n
    assert "\nexample:\n  understudy " in r.stdout
    (sub,) = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, p in sub.choices.items():
        undescribed = [a.dest for a in p._actions if not a.help]
        assert not undescribed, (name, undescribed)
        r = cli(name, "--help", env=env)
        assert r.returncode == 0, r.stderr
        example = r.stdout.split("\nexample:\n", 1)[1].strip()
        assert example.startswith(f"understudy {name} ") and "\n" not in example, (name, r.stdout)


def test_entry_points_name_the_plugin_functions():
    """pyproject.toml declares both groups, each pointing at a function of
    understudy.plugins that takes no argument (the frameworks call it so);
    test_packaging.py loads them through importlib.metadata once installed."""
    import inspect
    import tomllib

    import understudy.plugins as plugins

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert eps["vllm.general_plugins"] == {"understudy": "understudy.plugins:vllm"}
    assert eps["sglang.srt.plugins"] == {"understudy": "understudy.plugins:sglang"}
    for fn in (plugins.vllm, plugins.sglang):
        assert not inspect.signature(fn).parameters
