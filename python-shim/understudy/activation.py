"""Activation without code changes.

activate() enables understudy in this process from $UNDERSTUDY_CONFIG (a path
to a JSON config, or inline JSON), at most once per process, and arranges a
final report: at normal exit (atexit) and on SIGTERM. Three things call it:
the start-up hook installed with the package (understudy-autoload.pth, once
torch is imported), vLLM's and SGLang's plugin loaders (understudy.plugins, in
each of their processes), and a host that wants to call it itself.

It never raises into the host: a config that is wrong, a library that cannot
be loaded, anything else, is one line on stderr naming what is wrong, and the
process goes on without understudy.

SIGTERM: the handler is installed only from the main thread, and only when
the host has not chosen to ignore SIGTERM or installed a handler from outside
Python. It writes the report, then hands the signal to what was there
before: the host's own handler is called; with the default action understudy
is disabled first (the final report and the state file written) and the
process then dies of SIGTERM as it would have. A handler the host installs
later replaces this one, which is the host's right; a host that exits through
SystemExit still gets the final report from atexit. Like every Python signal
handler it runs when the main thread is back in Python: a SIGTERM that lands
just before the main thread blocks in one system call waits for that call
to return (the default action would have ended the process at once).

Candidate modules: $UNDERSTUDY_CANDIDATE_MODULES lists Python modules (names,
or paths of .py files) separated by commas. Activation imports each, once per
process, just before it enables understudy, so that the torch-op candidates
they register (understudy.register_candidate) are defined in every process the
config reaches, with no change to the host's code. A module that cannot be
imported is one line on stderr; understudy is enabled all the same, and a
torch-op candidate never defined waits for its op (the engine says so).

A process forked from one where understudy is enabled has none of the
engine's threads: the library leaves that engine behind there (calls pass
through, enable() would start afresh); activate() there says so and does
nothing, and the exit handlers do nothing in it (start such workers with
spawn to observe them).
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Optional

__all__ = ["activate", "config_from_env", "candidate_modules_from_env", "import_candidate_modules", "own_report_name",
           "note_report"]

# Set by `understudy run`: a file where each process that enables understudy
# adds a line naming its report, which the run reads when the command ends.
RUN_REPORTS = "UNDERSTUDY_RUN_REPORTS"

_lock = threading.RLock()  # reentrant: a candidate module imported under it may call activate()


class _State:
    pid: Optional[int] = None        # the process that activated (or tried to)
    enabled = False                  # activation enabled understudy in that process
    sigterm_prev = None              # the SIGTERM disposition before ours
    sigterm_installed = False
    has_report = False               # the config names a report path


_state = _State()


def config_from_env() -> Optional[str]:
    """$UNDERSTUDY_CONFIG, or None when it is unset or blank."""
    text = os.environ.get("UNDERSTUDY_CONFIG", "")
    return text if text.strip() else None


def candidate_modules_from_env() -> list:
    """The entries of $UNDERSTUDY_CANDIDATE_MODULES (comma-separated, blanks
    dropped); [] when it is unset."""
    text = os.environ.get("UNDERSTUDY_CANDIDATE_MODULES", "")
    return [part.strip() for part in text.split(",") if part.strip()]


def import_candidate_modules(entries, *, source: str = "activate()") -> list:
    """Import each entry: a module name (import_module), or the path of a .py
    file (executed as a module of its own, named after the file). Returns
    the modules imported; one that fails is one line on stderr naming it
    and the error, and the others are still imported. Never raises."""
    done = []
    for entry in entries:
        try:
            done.append(_import_one(entry))
        except BaseException as e:  # SystemExit from a module's top level too: never into the host
            if isinstance(e, KeyboardInterrupt):
                raise
            _say(f"candidate module '{entry}' ($UNDERSTUDY_CANDIDATE_MODULES, {source}) could not be imported: "
                 f"{type(e).__name__}: {e}; the torch-op candidates it defines wait for their op")
    return done


def _import_one(entry: str):
    import importlib
    import importlib.util

    if not (entry.endswith(".py") or os.sep in entry):
        return importlib.import_module(entry)
    path = os.path.abspath(entry)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no file {path}")
    stem = os.path.splitext(os.path.basename(path))[0]
    name = "_understudy_candidates_" + "".join(c if c.isalnum() else "_" for c in stem)
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == path:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _say(msg: str) -> None:
    try:
        sys.stderr.write(f"understudy: {msg}\n")
        sys.stderr.flush()
    except Exception:
        pass


def activate(config: Optional[str] = None, *, source: str = "activate()") -> bool:
    """Enable understudy in this process, once; True when it is enabled.

    config: a JSON text or a path to a JSON file; None reads
    $UNDERSTUDY_CONFIG, and when that is unset nothing happens (False). The
    first call in a process decides: later calls return what it did. A
    process where the host enabled understudy itself is left as it is (True,
    and no exit handlers: the host disables it). source names the caller in
    messages. Never raises (an Exception is reported on stderr)."""
    try:
        return _activate(config, source)
    except Exception as e:
        _say(f"not enabled ({source}): {type(e).__name__}: {e}")
        return False


def _activate(config: Optional[str], source: str) -> bool:
    text = config if config is not None else config_from_env()
    if text is None:
        return False
    pid = os.getpid()
    with _lock:
        if _state.pid == pid:
            return _state.enabled
        inherited_from = _state.pid if _state.enabled else None
        _state.pid, _state.enabled = pid, False
        import understudy

        if inherited_from is None:
            import_candidate_modules(candidate_modules_from_env(), source=source)
        if inherited_from is not None:
            # the library left the parent's engine behind in this child: its calls pass through
            _say(f"process {pid} was forked from process {inherited_from} after understudy was enabled there; "
                 f"understudy is off in it (the engine's threads stayed in the parent; its files stay the "
                 f"parent's): start this process with spawn to observe it (vLLM: VLLM_WORKER_MULTIPROC_METHOD=spawn)")
            return False
        if understudy.is_enabled():
            return True  # the host enabled it itself, and disables it itself
        try:
            understudy.enable(text)
        except understudy.UnderstudyError as e:
            _say(f"not enabled in process {pid} ({source}): {e}")
            return False
        _state.enabled = True
        _state.has_report = _names_report(text)
    atexit.register(_at_exit)
    _install_sigterm()
    return True


def own_report_name(path: str, pid: int) -> str:
    """The name process pid writes its report to when the configured path
    holds the report of another process that still runs (the library's rule,
    plugin/report.c): the path with -PID before its extension."""
    head, base = os.path.split(path)
    dot = base.rfind(".")
    stem, ext = (base[:dot], base[dot:]) if dot > 0 else (base, "")
    return os.path.join(head, f"{stem}-{pid}{ext}")


def note_report(config_text: str) -> None:
    """Under `understudy run` ($UNDERSTUDY_RUN_REPORTS set): adds a line for
    this process to the run's list: its pid and, where the config names a
    report, the absolute path it is written to (and the name of its own it
    would take). Called by understudy.enable(); never raises."""
    record = os.environ.get(RUN_REPORTS)
    if not record:
        return
    try:
        import json

        import understudy

        entry = {"pid": os.getpid()}
        section = json.loads(config_text).get("report")
        if isinstance(section, dict) and section.get("path"):
            path = os.path.abspath(understudy.expand_path(section["path"]))
            entry.update(path=path, own=own_report_name(path, os.getpid()))
        fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())  # one write: lines of processes never mix
        finally:
            os.close(fd)
    except Exception:
        pass


def _names_report(text: str) -> bool:
    import json

    import understudy

    try:
        report = json.loads(understudy._config_text(text)).get("report")
        return isinstance(report, dict) and bool(report.get("path"))
    except Exception:
        return False


def _ours() -> bool:
    return _state.enabled and _state.pid == os.getpid()


def _final_report(why: str) -> None:
    """Disable understudy (the final report and the state file are written)."""
    try:
        import understudy

        understudy.disable()
    except Exception as e:
        _say(f"final report ({why}) in process {os.getpid()}: {e}")


def _at_exit() -> None:
    if _ours():
        _final_report("exit")


def _install_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works only there; atexit still writes the final report
    try:
        prev = signal.getsignal(signal.SIGTERM)
    except Exception:
        return
    if prev is signal.SIG_IGN or prev is None or prev is _on_sigterm:
        return  # ignored by the host, or a handler installed from C that Python cannot call on
    _state.sigterm_prev = prev
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
        _state.sigterm_installed = True
    except Exception:
        pass


def _on_sigterm(signum, frame):
    prev = _state.sigterm_prev
    if callable(prev):
        if _ours() and _state.has_report:
            try:
                import understudy

                understudy.write_report()  # the host's handler decides what follows; atexit writes the final one
            except Exception as e:
                _say(f"report on SIGTERM in process {os.getpid()}: {e}")
        return prev(signum, frame)
    if _ours():
        _final_report("SIGTERM")
    # the default action: die of SIGTERM, as the process would have
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    except Exception:
        os._exit(128 + signal.SIGTERM)
