"""The build backend pip runs for understudy (pyproject.toml): scikit-build-core,
which drives CMake, behind a check that torch can be imported.

libunderstudy.so is built against the torch of the Python that will load it,
and understudy never installs torch. pip builds in an isolated environment
by default, where the installed torch is not importable: the build then
stops here, before CMake and before anything is downloaded for it, with a
message saying to build with --no-build-isolation.
"""
import importlib.util
import sys

from scikit_build_core import build as _skbuild

__all__ = ["build_sdist", "build_wheel", "build_editable", "get_requires_for_build_sdist",
           "get_requires_for_build_wheel", "get_requires_for_build_editable",
           "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable"]

NO_TORCH = """understudy: this build cannot import torch.
libunderstudy.so is built against the torch installed in the Python that will
load it, and understudy never installs torch. pip builds in an isolated
environment by default, which hides the installed torch: in the environment
whose torch you serve with, install the build backend and build without
isolation:

    pip install scikit-build-core
    pip install --no-build-isolation .
"""


def _require_torch():
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        sys.stderr.write(NO_TORCH)
        sys.stderr.flush()
        raise SystemExit(1)


def _checked(hook):
    def run(*args, **kwargs):
        _require_torch()
        return hook(*args, **kwargs)

    run.__name__ = hook.__name__
    run.__doc__ = hook.__doc__
    return run


# An sdist needs no torch; everything that compiles does.
build_sdist = _skbuild.build_sdist
get_requires_for_build_sdist = _skbuild.get_requires_for_build_sdist
build_wheel = _checked(_skbuild.build_wheel)
build_editable = _checked(_skbuild.build_editable)
get_requires_for_build_wheel = _checked(_skbuild.get_requires_for_build_wheel)
get_requires_for_build_editable = _checked(_skbuild.get_requires_for_build_editable)
prepare_metadata_for_build_wheel = _checked(_skbuild.prepare_metadata_for_build_wheel)
prepare_metadata_for_build_editable = _checked(_skbuild.prepare_metadata_for_build_editable)
