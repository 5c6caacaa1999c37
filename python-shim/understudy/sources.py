"""Candidate sources named in a config, made into what the engine reads.

The engine takes a candidate as a native shared object or a torch op. A
config may also name where a Python kernel comes from; enable() and
reload() make each such entry a torch-op candidate first (registering its
ops in this process) and hand the engine the result:

    {"file": "kernels/rms.py::ModelNew", "sha256": HEX, "target": "_C::rms_norm"}   understudy.files
    {"solution": "sol.json", "definition": "def.json", "hash": SHA1, "target": ...}  understudy.solutions
    {"hub": {"layer": "RMSNorm"}}                                                    understudy.hub

A hub entry stands for every op guard_kernelized lifted for that layer:
one operator each, defined in a folder made for the process beside the
shipped definitions. While understudy runs with hub entries, ops lifted
later take effect by enabling it again with the same config.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import threading
from typing import Any, Optional, Tuple

from . import hub as _hub

_FORMS = ("file", "solution", "hub")
_lock = threading.RLock()


class _State:
    config: Any = None       # what enable() was given, as given
    problems: Any = None
    text = ""
    uses_hub = False


_state = _State()


def _config_error(msg: str):
    from . import ConfigError
    return ConfigError(-2, "UST_ECONFIG", msg)


def resolve(text: str, problems=None) -> str:
    """The config text with every file, solution and hub candidate made
    into a torch-op candidate; text unchanged when it names none (or is not
    JSON: the library reports that). Raises ConfigError naming the field."""
    if not text or not any(f'"{f}"' in text for f in _FORMS):
        return text
    try:
        cfg = json.loads(text)
    except (ValueError, RecursionError):
        return text
    ops = cfg.get("operators") if isinstance(cfg, dict) else None
    if not isinstance(ops, dict):
        return text
    out, changed, hub = {}, False, False
    for name, entry in ops.items():
        cand = entry.get("candidate") if isinstance(entry, dict) else None
        form = next((f for f in _FORMS if isinstance(cand, dict) and f in cand), None)
        if form is None:
            out[name] = entry
            continue
        changed = True
        path = f"operators.{name}.candidate"
        try:
            if form == "hub":
                hub = True
                out.update(_hub.expand(name, entry, path))
            elif form == "file":
                out[name] = {**entry, "candidate": _file(cand, entry, path)}
            else:
                from . import solutions
                guard = entry.get("guard") if isinstance(entry.get("guard"), dict) else {}
                out[name] = {**entry, "candidate": solutions.from_config(
                    cand, path, deadline_ms=float(guard.get("deadline_ms", 10000)))}
        except ValueError as e:
            msg = str(e)
            raise _config_error(msg if msg.startswith("config:") else f"config: '{path}': {msg}") from None
        except Exception as e:  # whatever making it raised (an import, torch refusing a definition): named
            raise _config_error(f"config: '{path}': {type(e).__name__}: {e}") from None
    if not changed:
        return text
    cfg["operators"] = out
    if hub:
        recs = [r for r in _hub.lifted() if r.alive()]
        if recs:
            base = cfg.get("problems_dir") or problems
            if base is None:
                from . import problems_dir
                base = problems_dir()
            cfg["problems_dir"] = str(_hub.write_definitions(pathlib.Path(base), recs))
    return json.dumps(cfg)


_FILE_KEYS = {"file", "entry", "sha256", "target", "args", "style", "init", "qualify", "qualify_calls", "when"}


def _file(cand: dict, entry: dict, path: str) -> dict:
    from . import files

    unknown = set(cand) - _FILE_KEYS
    if unknown:
        raise ValueError(f"config: '{path}' has no field '{sorted(unknown)[0]}' with 'file' "
                         f"(it takes {', '.join(sorted(_FILE_KEYS))})")
    ref = cand["file"]
    if not isinstance(ref, str) or not ref:
        raise ValueError(f"config: '{path}.file' must be a path, FILE or FILE::ENTRY")
    fpath, fentry = files.split_ref(ref)
    sha = cand.get("sha256")
    if not isinstance(sha, str) or len(sha) != 64:
        raise ValueError(f"config: '{path}.sha256' must be the 64 hex digits of the file's SHA-256 (a file "
                         "candidate runs only from the bytes it pins; `understudy candidate add` writes it)")
    target = cand.get("target")
    if not isinstance(target, str) or "::" not in target:
        raise ValueError(f"config: '{path}.target' must name the op the file stands in for (\"_C::rms_norm\")")
    guard = entry.get("guard") if isinstance(entry.get("guard"), dict) else {}
    spec = files.FileSpec(path=fpath, entry=cand.get("entry") or fentry, target=target, sha256=sha.lower(),
                          args=dict(cand.get("args") or {}), style=cand.get("style"), init=cand.get("init"),
                          qualify=cand.get("qualify", "process"), qualify_calls=int(cand.get("qualify_calls", 3)),
                          deadline_ms=float(guard.get("deadline_ms", 10000)))
    if files._defined(target):
        out = files.register(spec).entry()
    else:
        out = files.register_later(spec)  # its target comes later: registered once it is defined
    if "when" in cand:
        out["when"] = cand["when"]
    return out


def remember(config, problems, text: str) -> None:
    """What enable() was given, to enable again when hub ops are lifted."""
    with _lock:
        _state.config, _state.problems, _state.text = config, problems, text
        _state.uses_hub = '"hub"' in (text or "") and resolve_uses_hub(text)
        _hub.running.pending = False
    if _state.uses_hub:
        _watch_kernelize()


def resolve_uses_hub(text: str) -> bool:
    try:
        ops = json.loads(text).get("operators") or {}
    except (ValueError, AttributeError, RecursionError):
        return False
    return any(isinstance(e, dict) and isinstance(e.get("candidate"), dict) and "hub" in e["candidate"]
               for e in ops.values())


_patched = False


def _watch_kernelize() -> None:
    """Modules kernelized from now on are lifted as kernelize swaps their
    forward (kernels' kernelize_layer, which transformers' kernelize=True
    reaches too); the running config takes them at their first call."""
    global _patched
    with _lock:
        if _patched:
            return
        try:
            import importlib
            kz = importlib.import_module("kernels._internals.layer.kernelize")  # the module, not the function
        except Exception:
            return  # no kernels package: nothing can be kernelized
        original = getattr(kz, "kernelize_layer", None)
        if original is None:
            return

        def kernelize_layer(module, *args, **kwargs):
            result = original(module, *args, **kwargs)
            from . import is_enabled
            if not (_state.uses_hub and is_enabled()):
                return result  # understudy is not running a config with hub candidates: left to the host
            try:
                layer = str(getattr(type(module), "kernel_layer_name", ""))
                _hub.guard_kernelized(module, now=False, reverse=_hub.reverse_for(_state.text, layer))
            except Exception as e:  # the host's kernelize goes on whatever understudy makes of the module
                sys.stderr.write(f"understudy: {type(module).__name__} kernelized but not guarded: {e}\n")
            return result

        kz.kernelize_layer = kernelize_layer
        _patched = True


def hub_lifted(now: bool = True) -> None:
    """guard_kernelized lifted new ops: with understudy running a config
    that names hub candidates, enable it again (now, or at the first call
    of a lifted module)."""
    from . import is_enabled

    with _lock:
        if not (_state.uses_hub and is_enabled()):
            return
        _hub.running.pending = True
    if now:
        refresh_hub()


def refresh_hub() -> None:
    from . import disable, enable, is_enabled

    with _lock:
        if not _hub.running.pending:
            return
        _hub.running.pending = False
        if not is_enabled():
            return
        config, problems = _state.config, _state.problems
        disable()
        enable(config, problems=problems)


_hub.running.on_lifted = hub_lifted
_hub.running.refresh = refresh_hub
