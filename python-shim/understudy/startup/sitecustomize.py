"""understudy's start-up hook for any interpreter: `understudy run` puts this
folder first on PYTHONPATH, so every Python process the command starts runs
this module at start-up, whichever interpreter its console script names,
including one whose site-packages hold no understudy-autoload.pth.

It does what the .pth does where pip installed it (_understudy_autoload:
enable understudy once torch is imported), and then runs the sitecustomize
this one stands in front of, if the interpreter has one. The understudy
package beside this folder is importable from then on where the interpreter
has none of its own; nothing else of the folder that holds it is put on the
path. A process that cannot take understudy says so on stderr, once; one
that never imports torch never loads it.
"""
import os
import sys


def _say(msg):
    try:
        sys.stderr.write("understudy: not enabled in process %d (%s): %s\n" % (os.getpid(), sys.executable, msg))
        sys.stderr.flush()
    except Exception:
        pass


def _start():
    if not os.environ.get("UNDERSTUDY_CONFIG", "").strip():
        return
    if sys.version_info < (3, 9):
        _say("Python %d.%d is older than the 3.9 understudy needs" % sys.version_info[:2])
        return
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(os.path.dirname(here))  # the folder that holds the understudy package
    if importlib.util.find_spec("understudy") is None:
        sys.meta_path.append(_Package(top))  # last: an understudy of the interpreter's own comes first
    hook = sys.modules.get("_understudy_autoload")  # the .pth's, where pip installed one here
    if hook is None:
        spec = importlib.util.spec_from_file_location("_understudy_autoload",
                                                      os.path.join(top, "_understudy_autoload.py"))
        hook = importlib.util.module_from_spec(spec)
        sys.modules["_understudy_autoload"] = hook
        spec.loader.exec_module(hook)
    hook.install()


class _Package:
    """Finds the understudy package (and through its __path__, its modules)
    in one folder, without putting that folder on sys.path."""

    def __init__(self, top):
        self.top = top

    def find_spec(self, name, path=None, target=None):
        if name != "understudy":
            return None
        import importlib.machinery

        return importlib.machinery.PathFinder.find_spec(name, [self.top])

    def invalidate_caches(self):
        pass


def _next_sitecustomize():
    """Runs the sitecustomize that the interpreter would have run without
    this folder first on its path."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _start()
except Exception as e:  # never into the host
    _say("%s: %s" % (type(e).__name__, e))
_next_sitecustomize()  # its errors are its own, as they would have been
