"""The process a file or Solution candidate qualifies in (understudy.files.ChildRunner).

    python -m understudy.filehost FD

FD is its end of a socket pair. The first message names the candidate and
the target's schema: a file, its pin and the entry, or a FlashInfer-Bench
Solution with its Definition and content hash; the candidate is loaded and
adapted here, and the answer says what it is or why it cannot be. Each later message
is one call's arguments in schema order; the answer carries the arguments
the target writes, as the entry left them, and what it returned, or the
error it raised. The process ends when the socket closes. It runs the
candidate and nothing of understudy's engine, confined as a native
candidate's qualifying process is: it cannot signal another process, trace
one, or leave its process group.
"""
from __future__ import annotations

import socket
import sys
import traceback


def confine() -> None:
    """This process confined as a native candidate's qualifying process is
    (ust_confine_qualifying_process): the file it loads next cannot signal
    the serving process or leave this process group. Where the library
    cannot be loaded here, the process runs unconfined and says so."""
    import understudy

    try:
        understudy._load().ust_confine_qualifying_process()
    except Exception as e:  # the library or its symbol is missing: the qualification still runs
        print(f"understudy: a file candidate's qualifying process runs unconfined: {e}", file=sys.stderr)


def main(argv) -> int:
    from understudy import adapt, files

    sock = socket.socket(fileno=int(argv[1]))
    confine()  # before the candidate's file runs any code
    spec_msg = files._recv(sock)
    if spec_msg is None:
        return 0
    try:
        target = adapt.target_of(spec_msg["schema"])
        if spec_msg.get("kind") == "solution":
            from understudy import solutions

            impl, info = solutions.build_impl(spec_msg["solution"], spec_msg["definition"], target,
                                              spec_msg.get("args"), pin=spec_msg["hash"])
        else:
            spec = files.FileSpec(path=spec_msg["path"], entry=spec_msg.get("entry"), target=target.name,
                                  sha256=spec_msg.get("sha256"), args=spec_msg.get("args") or {},
                                  style=spec_msg.get("style"), init=spec_msg.get("init"))
            impl, info = files.build_impl(spec, target)
    except Exception as e:
        files._send(sock, {"ok": False, "error": str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"})
        return 0
    files._send(sock, {"ok": True, "info": info})
    written = target.written
    while True:
        msg = files._recv(sock)
        if msg is None:
            return 0
        vals = msg["args"]
        try:
            ret = impl(*vals)
        except Exception as e:
            last = traceback.extract_tb(e.__traceback__)[-1:]
            where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
            files._send(sock, {"ok": False, "error": f"{type(e).__name__}: {e}{where}"})
            continue
        files._send(sock, {"ok": True, "written": {str(i): vals[i] for i in written}, "ret": ret})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
