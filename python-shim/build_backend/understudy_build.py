"""The build backend pip runs for understudy (pyproject.toml): scikit-build-core,
which drives CMake, behind a check that torch can be imported.

libunderstudy.so is built against the torch of the Python that will load it,
and understudy never installs torch. pip builds in an isolated environment
by default, where the installed torch is not importable: the build then
stops here, before CMake and before anything is downloaded for it, with a
message saying to build with --no-build-isolation.

Progress: pip captures a backend's output and shows it only with -v, so a
build would otherwise be a spinner for its whole length. While a wheel is
built from a terminal by a pip that is not verbose, the build's own lines
(the GPU backend chosen and why, CMake's steps, ninja's [n/N] lines) are
also written to that terminal (/dev/tty); pip's log keeps all of them.
UNDERSTUDY_BUILD_PROGRESS=0 turns that off.
"""
import importlib.util
import os
import re
import sys
import threading

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


# The lines worth a terminal: scikit-build-core's steps, the configure step's
# own lines, ninja's progress, and errors.
_PROGRESS = re.compile(rb"^\s*(\*\*\* |-- understudy:|\[\d+/\d+\] |CMake Error|ninja: |FAILED: |.*error:)")


def _pip_is_verbose() -> bool:
    """Whether the pip that runs this backend (its parent process) shows the
    build's output itself (-v, --verbose, PIP_VERBOSE)."""
    if os.environ.get("PIP_VERBOSE", "0").strip() not in ("", "0", "false", "no", "off"):
        return True
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return any(a == b"--verbose" or re.fullmatch(rb"-[a-uw-zA-Z]*v[a-zA-Z]*", a) for a in args)


class _Progress:
    """Copies the build's output (this process's fd 1 and 2, which its
    children inherit) to where it went, and its progress lines to the
    terminal."""

    def __init__(self):
        self.tty = None
        if os.environ.get("UNDERSTUDY_BUILD_PROGRESS", "1").strip() == "0" or os.isatty(1) or _pip_is_verbose():
            return  # output already reaches a terminal, or pip shows it
        try:
            self.tty = os.open("/dev/tty", os.O_WRONLY | os.O_NOCTTY)
        except OSError:
            return  # no terminal: pip's log is where the output is read
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = os.dup(1), os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        self.first = True
        self.thread = threading.Thread(target=self._copy, args=(read,), daemon=True)
        self.thread.start()

    def _copy(self, read):
        with os.fdopen(read, "rb") as lines:
            for line in lines:
                try:
                    os.write(self.saved[0], line)
                    if _PROGRESS.match(line):  # at the line's start: over pip's spinner
                        os.write(self.tty, (b"\n" if self.first else b"\r") + b"  " + line.lstrip())
                        self.first = False
                except OSError:
                    pass

    def close(self):
        if self.tty is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.saved[0], 1)  # the pipe's last writers gone: the copier reads to its end
        os.dup2(self.saved[1], 2)
        self.thread.join(timeout=10)
        for fd in (*self.saved, self.tty):
            os.close(fd)
        self.tty = None


def _checked(hook, progress=False):
    def run(*args, **kwargs):
        _require_torch()
        shown = _Progress() if progress else None
        try:
            return hook(*args, **kwargs)
        finally:
            if shown is not None:
                shown.close()

    run.__name__ = hook.__name__
    run.__doc__ = hook.__doc__
    return run


# An sdist needs no torch; everything that compiles does.
build_sdist = _skbuild.build_sdist
get_requires_for_build_sdist = _skbuild.get_requires_for_build_sdist
build_wheel = _checked(_skbuild.build_wheel, progress=True)
build_editable = _checked(_skbuild.build_editable, progress=True)
get_requires_for_build_wheel = _checked(_skbuild.get_requires_for_build_wheel)
get_requires_for_build_editable = _checked(_skbuild.get_requires_for_build_editable)
prepare_metadata_for_build_wheel = _checked(_skbuild.prepare_metadata_for_build_wheel)
prepare_metadata_for_build_editable = _checked(_skbuild.prepare_metadata_for_build_editable)
