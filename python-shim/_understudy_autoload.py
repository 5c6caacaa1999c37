"""Activation at start-up, installed with the understudy package.

understudy-autoload.pth (in site-packages) imports this module at interpreter
start-up only when UNDERSTUDY_CONFIG is set, and install() then waits for
torch: it puts a finder at the head of sys.meta_path that, when torch is
imported, lets the import run as usual and, once torch's module has finished
executing, calls understudy.activation.activate(). A process that never
imports torch never loads understudy (nor torch). Nothing here raises into the
process: a failure is one line on stderr.

The finder stays in place until torch's module is executed, not until torch is
first looked up: libraries ask importlib.util.find_spec("torch") to learn
whether torch is installed long before they import it (HF transformers does,
at its own import), and such a look-up executes nothing.
"""
import sys


class _AfterTorch:
    """Wraps torch's loader for one exec_module call: runs the real one, puts
    the real loader back on the module, then activates understudy."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        _remove_watch()
        self.loader.exec_module(module)  # torch's own errors are torch's: they propagate
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        _activate()

    def __getattr__(self, name):
        return getattr(self.loader, name)


class _TorchWatch:
    """A meta-path finder that answers only for torch, by asking the finders
    after it and wrapping the loader they give. It leaves sys.meta_path when
    torch's module is executed, not while the import system walks the list."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        if "torch" in sys.modules:
            return None  # imported already (the watch leaves when torch's module runs)
        finders = sys.meta_path
        try:
            after = finders[finders.index(self) + 1:]
        except ValueError:
            after = list(finders)
        for finder in after:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module") and \
                        not isinstance(spec.loader, _AfterTorch):
                    spec.loader = _AfterTorch(spec.loader)
                return spec
        return None

    def invalidate_caches(self):
        pass


def _remove_watch():
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchWatch)]


def _activate():
    try:
        from understudy.activation import activate

        activate(source="import of torch")
    except Exception as e:  # never into the host
        try:
            sys.stderr.write(f"understudy: not enabled: {type(e).__name__}: {e}\n")
        except Exception:
            pass


def install():
    """Activate understudy when torch is imported (now, if it already is)."""
    try:
        if "torch" in sys.modules:
            _activate()
            return
        if not any(isinstance(f, _TorchWatch) for f in sys.meta_path):
            sys.meta_path.insert(0, _TorchWatch())
    except Exception as e:
        try:
            sys.stderr.write(f"understudy: the start-up hook failed: {type(e).__name__}: {e}\n")
        except Exception:
            pass
