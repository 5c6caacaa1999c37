"""understudy: sits in PyTorch's dispatcher and observes (then shadows, canaries
and scores) the kernels that serve each operator and input shape.

    import understudy
    understudy.enable({"operators": {"gemm": "observe"}, "report": {"path": "r.json"}})
    ...  # run the model
    print(understudy.report())   # the live report as a dict
    understudy.disable()         # writes the final report

The native library does the work; this package loads it into the running
torch, passes the config, and reads reports back. Installed with pip, it
also enables itself without code changes where $UNDERSTUDY_CONFIG is set
(understudy.activation, understudy.plugins).
"""
from __future__ import annotations

import ctypes
import json
import os
import pathlib
import threading
from typing import Any, Mapping, Optional, Union

__all__ = [
    "UnderstudyError", "ConfigError", "ProblemError", "enable", "disable", "is_enabled",
    "set_mode", "report", "write_report", "flush", "library_path", "problems_dir",
    "register_candidate", "native", "sha256_of", "compare", "phase", "set_phase", "serve_metrics",
    "metrics_text", "derive", "expand_path", "activate", "candidate_from_file", "candidate_from_solution",
    "guard_kernelized", "__version__",
]

from ._version import __version__

_HERE = pathlib.Path(__file__).resolve().parent
_REPO = _HERE.parent.parent


class UnderstudyError(RuntimeError):
    """An understudy call failed; the message names what was wrong."""

    def __init__(self, code: int, name: str, message: str):
        super().__init__(message)
        self.code = code
        self.name = name


class ConfigError(UnderstudyError, ValueError):
    """The config is invalid (the message names the field)."""


class ProblemError(UnderstudyError, ValueError):
    """An operator definition is invalid (the message names the file and field)."""


_lib = None
_lib_lock = threading.Lock()


def _package_dirs():
    """The folders this package is read from (an editable install has two)."""
    seen = []
    for d in [_HERE, *map(pathlib.Path, globals().get("__path__", []))]:
        if d not in seen:
            seen.append(d)
    return seen


def library_path() -> pathlib.Path:
    """Where libunderstudy.so is taken from: $UNDERSTUDY_LIB, else the one
    installed in this package (pip), else the build tree of a clone."""
    env = os.environ.get("UNDERSTUDY_LIB")
    if env:
        return pathlib.Path(env)
    for cand in [d / "libunderstudy.so" for d in _package_dirs()] + [_REPO / "build" / "libunderstudy.so"]:
        if cand.exists():
            return cand
    raise UnderstudyError(-7, "UST_ENOTFOUND",
                          "libunderstudy.so not found: install the package with pip or build the clone "
                          "(see README), or set UNDERSTUDY_LIB")


def problems_dir() -> pathlib.Path:
    """The operator definitions shipped with understudy ($UNDERSTUDY_PROBLEMS
    overrides): the package's own (pip), else the clone's problems/."""
    env = os.environ.get("UNDERSTUDY_PROBLEMS")
    if env:
        return pathlib.Path(env)
    for cand in [d / "problems" for d in _package_dirs()] + [_REPO / "problems"]:
        if cand.is_dir():
            return cand
    raise UnderstudyError(-7, "UST_ENOTFOUND", "the problems/ directory was not found; set UNDERSTUDY_PROBLEMS")


def _load():
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        try:
            import torch  # the seam links against the torch already loaded
        except ImportError as e:
            raise UnderstudyError(-7, "UST_ENOTFOUND",
                                  f"torch cannot be imported ({e}); libunderstudy.so links against it") from None
        path = library_path()
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise UnderstudyError(-7, "UST_ENOTFOUND", f"libunderstudy.so cannot be loaded from '{path}': {e}") from None
        try:
            lib.ust_enable.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
            lib.ust_set_mode.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
            lib.ust_set_route_mode.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_double]
            lib.ust_reload.argtypes = [ctypes.c_char_p]
            lib.ust_report_write.argtypes = [ctypes.c_char_p]
            lib.ust_report_json.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            lib.ust_report_derive.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
            lib.ust_expand_path.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
            lib.ust_free.argtypes = [ctypes.c_void_p]
            lib.ust_metrics_new.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
            lib.ust_metrics_free.argtypes = [ctypes.c_void_p]
            lib.ust_metrics_free.restype = None
            lib.ust_metrics_read.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
            lib.ust_graph_bind.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p]
            lib.ust_graph_capture_hosted.argtypes = [ctypes.c_void_p]
            lib.ust_graph_capture_hosted.restype = ctypes.c_ulonglong
            lib.ust_graph_replay.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            lib.ust_graph_replay.restype = ctypes.c_int
            lib.ust_graph_replayed.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            lib.ust_graph_replayed.restype = None
            lib.ust_graph_unbind.argtypes = [ctypes.c_void_p]
            lib.ust_graph_unbind.restype = None
            lib.ust_graph_unseen.argtypes = []
            lib.ust_graph_unseen.restype = ctypes.c_int
            for fn in ("ust_graph_capture_begun", "ust_graph_capture_ended", "ust_pool_alloc_begun",
                       "ust_pool_alloc_ended"):
                getattr(lib, fn).argtypes = []
                getattr(lib, fn).restype = ctypes.c_int
            lib.ust_graph_capture_id.argtypes = [ctypes.c_void_p]
            lib.ust_graph_capture_id.restype = ctypes.c_ulonglong
            lib.ust_graph_exposed.argtypes = [ctypes.c_ulonglong]
            lib.ust_graph_exposed.restype = ctypes.c_int
            for fn in ("ust_last_error", "ust_err_name", "ust_version", "ust_torch_version", "ust_strerror"):
                getattr(lib, fn).restype = ctypes.c_char_p
            lib.ust_err_name.argtypes = [ctypes.c_int]
        except AttributeError as e:  # ctypes names the missing symbol
            raise UnderstudyError(-7, "UST_ENOTFOUND",
                                  f"'{path}' lacks a function this package calls ({e}): rebuild it (see README)") from None
        built = lib.ust_torch_version().decode()
        if built and built.split("+")[0] != torch.__version__.split("+")[0]:
            raise UnderstudyError(-8, "UST_ETORCH",
                                  f"libunderstudy.so was built against torch {built}, but torch "
                                  f"{torch.__version__} is loaded: rebuild it with this Python")
        _lib = lib
        return lib


def _check(rc: int) -> None:
    if rc == 0:
        return
    lib = _load()
    name = lib.ust_err_name(rc).decode()
    msg = lib.ust_last_error().decode() or lib.ust_strerror(rc).decode()
    cls = {"UST_ECONFIG": ConfigError, "UST_EPROBLEM": ProblemError}.get(name, UnderstudyError)
    raise cls(rc, name, msg)


ConfigLike = Union[None, str, os.PathLike, Mapping[str, Any]]


def _config_text(config: ConfigLike) -> str:
    if config is None:
        config = os.environ.get("UNDERSTUDY_CONFIG") or None
        if config is None:
            return ""
    if isinstance(config, Mapping):
        try:
            return json.dumps(config)
        except (ValueError, TypeError, RecursionError) as e:
            raise ConfigError(-2, "UST_ECONFIG", f"config: cannot be written as JSON: {e}") from None
    text = os.fspath(config)
    if not text.lstrip().startswith("{"):
        text = _read_config_file(text)
    # the library reads a C string: whatever follows a NUL would go unread
    if "\x00" in text:
        raise ConfigError(-2, "UST_ECONFIG", f"config: holds a NUL character at offset {text.index(chr(0))} "
                          "(what follows it would not be read)")
    return text


_CONFIG_MAX = 16 << 20


def _read_config_file(path: str) -> str:
    """A config file: a regular file (a FIFO planted at the path must not
    block), of at most 16 MiB."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(-2, "UST_ECONFIG", f"config file '{path}' cannot be read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(-2, "UST_ECONFIG", f"config file '{path}' is not a regular file")
        if st.st_size > _CONFIG_MAX:
            raise ConfigError(-2, "UST_ECONFIG",
                              f"config file '{path}' is {st.st_size} bytes, more than the {_CONFIG_MAX} read at most")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(_CONFIG_MAX + 1)
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:  # where, never the bytes: the file may be one the user did not write
        raise ConfigError(-2, "UST_ECONFIG", f"config file '{path}' is not UTF-8 (byte {e.start})") from None


def enable(config: ConfigLike = None, *, problems: Optional[Union[str, os.PathLike]] = None) -> None:
    """Enable understudy in this process.

    config: a dict, a JSON string, a path to a JSON file, or None for
    $UNDERSTUDY_CONFIG (a path or inline JSON), else the defaults (observe
    every shipped operator). problems: a directory of operator definitions
    (default: the config's "problems_dir", else the shipped problems/).

    Raises ConfigError / ProblemError naming the offending field; torch is
    then untouched.
    """
    lib = _load()
    given = _config_text(config)
    text = sources.resolve(given, problems)  # file, Solution and hub candidates made torch ops
    pdir = problems
    if pdir is None:
        has_dir = False
        if isinstance(config, Mapping) and text is given:
            has_dir = "problems_dir" in config
        elif text:
            try:
                has_dir = "problems_dir" in json.loads(text)
            except (ValueError, TypeError, RecursionError):
                has_dir = False  # the library reports the JSON error with its position
        pdir = None if has_dir else problems_dir()
    _check(lib.ust_enable(text.encode(), None if pdir is None else os.fsencode(os.fspath(pdir))))
    sources.remember(config, problems, given)
    activation.note_report(text)  # under `understudy run`: the run names this process's report at its end
    global _enabled_with
    _enabled_with = config if config is not None else os.environ.get("UNDERSTUDY_CONFIG")
    metrics._on_enable(text)  # the config's "metrics" section; warns, never raises
    graphs.set_keep(graphs.wants_keep(text))  # graphs made from now on kept, so their replays can be gated
    graphs.set_enabled(True)  # graphs captured from now on are seen
    graphs.install(lib)  # replays of torch's CUDA graphs gated from the host (never raises)
    from . import hf_phases

    hf_phases.install()  # prefill and decode read from transformers' generate and continuous batching


_enabled_with: ConfigLike = None


def disable() -> None:
    """Unregister every interceptor and write the final report (if configured)."""
    if _lib is None:
        return
    metrics._on_disable()  # a multiprocess export writes its last figures while the report is there
    graphs.set_keep(False)
    graphs.set_enabled(False)
    _check(_lib.ust_disable())


def is_enabled() -> bool:
    return _lib is not None and bool(_lib.ust_is_enabled())


def set_mode(operator: Optional[str] = None, mode: str = "observe", *, key: Optional[str] = None,
             canary: Optional[float] = None) -> None:
    """Change a mode while running: "off", "observe", "shadow", "canary" or
    "live" (the last three need the candidate named in the config).

    set_mode("rms_norm", "shadow") sets an operator's mode (its routes that
    have no mode of their own follow it); set_mode(mode="canary", canary=0.2,
    key="_C::rms_norm|cuda|bf16,bf16,bf16|M=8,N=4096") sets one route's, by
    its shape key as the report spells it (a key not seen yet takes it at
    its first call; recorded in the state file when one is configured)."""
    lib = _load()
    if key is not None:
        if operator is not None:
            raise ValueError("set_mode: give an operator or a key, not both")
        if mode == "canary" and canary is None:
            raise ValueError("set_mode: canary mode on a key needs canary=<share of calls in (0, 1)>")
        _check(lib.ust_set_route_mode(key.encode(), mode.encode(), float(canary or 0.0)))
        return
    if operator is None:
        raise ValueError("set_mode: an operator or a key is required")
    if canary is not None:
        raise ValueError("set_mode: an operator's canary share is set in its config ('canary'); reload() changes it")
    _check(lib.ust_set_mode(operator.encode(), mode.encode()))


def reload(config: ConfigLike = None) -> None:
    """Apply a changed config while running: operators' mode, canary, strict,
    promotion and routes. config: as for enable(); None reads again what
    enable() was given (a file is read anew). Any other field that differs
    from the running config raises ConfigError naming it, and nothing is
    applied."""
    text = sources.resolve(_config_text(config if config is not None else _enabled_with), sources._state.problems)
    _check(_load().ust_reload(text.encode()))


_PHASES = {"unknown": 0, "prefill": 1, "decode": 2}


def set_phase(name: str) -> str:
    """Set the calling thread's serving phase ("prefill", "decode" or "unknown");
    returns the previous one. Calls are keyed, weighted and scored per phase."""
    if name not in _PHASES:
        raise ValueError(f"phase must be one of {', '.join(_PHASES)}, not {name!r}")
    lib = _load()
    prev = lib.ust_set_phase(_PHASES[name])
    return {v: k for k, v in _PHASES.items()}[prev]


class phase:
    """with understudy.phase("decode"): ... - the phase of the calls made inside."""

    def __init__(self, name: str):
        self.name = name
        self.prev = "unknown"

    def __enter__(self):
        self.prev = set_phase(self.name)
        return self

    def __exit__(self, *exc):
        set_phase(self.prev)
        return False


def flush() -> None:
    """Wait until every device timing recorded so far is in the statistics.

    Synchronises with the device: for tests and reports, not the serving path."""
    if _lib is not None:
        _check(_lib.ust_flush_sync())


def report(*, flush_timings: bool = True) -> dict:
    """The live report as a dict (see README, "Report")."""
    lib = _load()
    if flush_timings:
        flush()
    out = ctypes.c_void_p()
    _check(lib.ust_report_json(ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.ust_free(out)


def derive(report: Mapping[str, Any]) -> dict:
    """A report's derived figures computed from its additive ones by the
    library (ust_report_derive), the rules the in-process report uses.

    report: a report as a dict (or a combination of many: counts, sums and
    histogram buckets added; see understudy.merge), not modified. Returns a
    new dict: the report with latency quantiles, device-time estimates,
    weights, speedups, S per shape, operator and phase, and S_agg computed.
    Needs the library, not an enabled engine; raises UnderstudyError when
    libunderstudy.so cannot be loaded or the report has no operators."""
    lib = _load()
    out = ctypes.c_void_p()
    _check(lib.ust_report_derive(json.dumps(report).encode(), ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.ust_free(out)


def expand_path(template: Union[str, os.PathLike]) -> str:
    """A path template with its placeholders expanded as the config's
    report.path and state.path are (ust_expand_path): {pid}, {rank},
    {local_rank}; '{{' and '}}' for braces. Raises ConfigError naming an
    unknown placeholder, an unmatched brace or a rank the environment does
    not give."""
    lib = _load()
    out = ctypes.c_void_p()
    _check(lib.ust_expand_path(os.fsencode(os.fspath(template)), ctypes.byref(out)))
    try:
        return os.fsdecode(ctypes.string_at(out.value))
    finally:
        lib.ust_free(out)


def write_report(path: Optional[Union[str, os.PathLike]] = None) -> None:
    """Write the report atomically to path (default: the configured report.path)."""
    lib = _load()
    flush()
    _check(lib.ust_report_write(None if path is None else os.fsencode(os.fspath(path))))


from .candidates import compare, native, register_candidate, sha256_of  # noqa: E402
from . import activation, graphs, metrics, sources  # noqa: E402
from .files import from_file as candidate_from_file  # noqa: E402
from .hub import guard_kernelized  # noqa: E402
from .solutions import from_solution as candidate_from_solution  # noqa: E402
from .metrics import metrics_text, serve_metrics  # noqa: E402
from .activation import activate  # noqa: E402
