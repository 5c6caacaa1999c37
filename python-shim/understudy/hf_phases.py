"""Serving phases from Hugging Face transformers, with no change to the host.

Calls are keyed, weighted and scored per phase (prefill, decode), which the
host says with understudy.phase(). transformers says it by its own
structure, and enable() reads it there:

- generate(): a batch's first forward runs in GenerationMixin._prefill and
  every later one in the decoding loop, on the calling thread. generate()
  called on a thread whose phase is unknown runs in phase decode and its
  _prefill in phase prefill; the thread's phase is put back when generate()
  returns. A phase the host set itself is left as it is.
- Continuous batching (`transformers serve --continuous-batching`,
  generate_batch, init_continuous_batching): one generation thread schedules
  batches that mix requests, and hands each batch's requests, with their
  query lengths, to ContinuousBatchingIOs.prepare_batch_tensors just before
  the forward that runs them. A batch whose every query is one token long
  is decode; one holding a longer query (a prompt, or a chunk of one) is
  prefill, as the forward's shapes are then a prefill's. The generation
  thread's phase is set there, for that forward.

install() wraps those three methods where transformers is imported already,
and otherwise when it is (a finder at the head of sys.meta_path that answers
for these two modules only and wraps them once their code has run). It is
idempotent and never raises; a wrapper that cannot read the batch leaves the
phase as it was and calls the method it wraps.
"""
from __future__ import annotations

import functools
import sys
import threading

GENERATION = "transformers.generation.utils"
CONTINUOUS_IO = "transformers.generation.continuous_batching.input_outputs"
_WRAPPED = "__understudy_phase_wrapped__"
_lock = threading.Lock()
_tls = threading.local()  # .ours: this thread's phase was set by a generate() wrapper


def batch_phase(requests) -> str | None:
    """'decode' when every request of a continuous batch queries one token,
    'prefill' when one queries more; None when the batch cannot be read."""
    try:
        lengths = [int(r.query_length) for r in requests]
    except Exception:
        return None
    if not lengths:
        return None
    return "decode" if max(lengths) <= 1 else "prefill"


def _set(name: str):
    """Set this thread's phase; the previous one, or None when understudy
    cannot be reached (its library not loaded)."""
    import understudy

    try:
        return understudy.set_phase(name)
    except Exception:
        return None


def _wrap_prepare(orig):
    @functools.wraps(orig)
    def prepare_batch_tensors(self, *args, **kwargs):
        requests = kwargs.get("requests_in_batch", args[0] if args else None)
        ph = batch_phase(requests) if requests is not None else None
        if ph is not None:
            _set(ph)
        return orig(self, *args, **kwargs)

    setattr(prepare_batch_tensors, _WRAPPED, True)
    return prepare_batch_tensors


def _wrap_generate(orig):
    @functools.wraps(orig)
    def generate(self, *args, **kwargs):
        if getattr(_tls, "ours", False):
            return orig(self, *args, **kwargs)  # nested (an assistant model's): the outer call decides
        prev = _set("decode")
        if prev != "unknown":  # the host's own phase (or no library): left as it is
            if prev is not None:
                _set(prev)
            return orig(self, *args, **kwargs)
        _tls.ours = True
        try:
            return orig(self, *args, **kwargs)
        finally:
            _tls.ours = False
            _set(prev)

    setattr(generate, _WRAPPED, True)
    return generate


def _wrap_prefill(orig):
    @functools.wraps(orig)
    def _prefill(self, *args, **kwargs):
        if not getattr(_tls, "ours", False):
            return orig(self, *args, **kwargs)
        _set("prefill")
        try:
            return orig(self, *args, **kwargs)
        finally:
            _set("decode")

    setattr(_prefill, _WRAPPED, True)
    return _prefill


def _patch(cls, name: str, wrap) -> bool:
    fn = cls.__dict__.get(name)
    if fn is None or getattr(fn, _WRAPPED, False):
        return False
    setattr(cls, name, wrap(fn))
    return True


def _patch_module(module) -> None:
    try:
        if module.__name__ == GENERATION:
            cls = getattr(module, "GenerationMixin", None)
            if cls is not None and "_prefill" in cls.__dict__:  # transformers 5: the prefill has its own method
                _patch(cls, "generate", _wrap_generate)
                _patch(cls, "_prefill", _wrap_prefill)
        elif module.__name__ == CONTINUOUS_IO:
            cls = getattr(module, "ContinuousBatchingIOs", None)
            if cls is not None:
                _patch(cls, "prepare_batch_tensors", _wrap_prepare)
    except Exception as e:  # never into the host
        _say(f"phases of {module.__name__} not detected: {type(e).__name__}: {e}")


def _say(msg: str) -> None:
    try:
        sys.stderr.write(f"understudy: {msg}\n")
    except Exception:
        pass


class _AfterExec:
    """Wraps a module's loader for one exec_module call: runs the real one,
    puts it back on the module, then wraps the module's methods."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        _patch_module(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class _Watch:
    """A meta-path finder that answers only for the two modules, by asking
    the finders after it and wrapping the loader they give."""

    def find_spec(self, name, path=None, target=None):
        if name not in (GENERATION, CONTINUOUS_IO) or name in sys.modules:
            return None
        finders = sys.meta_path
        try:
            after = finders[finders.index(self) + 1:]
        except ValueError:
            after = [f for f in finders if not isinstance(f, _Watch)]
        for finder in after:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module") and \
                        not isinstance(spec.loader, _AfterExec):
                    spec.loader = _AfterExec(spec.loader)
                return spec
        return None

    def invalidate_caches(self):
        pass


def install() -> None:
    """Detect transformers' phases in this process, now and from the import
    of its generation modules on. Idempotent; never raises."""
    try:
        with _lock:
            for name in (GENERATION, CONTINUOUS_IO):
                module = sys.modules.get(name)
                if module is not None:
                    _patch_module(module)
            if not all(n in sys.modules for n in (GENERATION, CONTINUOUS_IO)) and \
                    not any(isinstance(f, _Watch) for f in sys.meta_path):
                sys.meta_path.insert(0, _Watch())
    except Exception as e:
        _say(f"transformers' phases not detected: {type(e).__name__}: {e}")
