"""``python SCRIPT ARGS``, run many times over from one warm interpreter.

Most of a short run of a dsconf script (one that stops at a config mistake) is its interpreter importing torch: about
2 of its 3 s on a 2-core machine. A server, started on first use and kept for the test session (one per pytest-xdist
worker), imports torch, Hydra and OmegaConf once; for each run it forks a child that does what a fresh ``python
SCRIPT ARGS`` does after start-up: the run's working directory, environment and argv, ``sys.path`` as that
interpreter would build it (the script's folder, then PYTHONPATH, then the interpreter's own entries), the script run
as ``__main__``, atexit handlers at the end, and the exit status Python would give (a traceback and 1 for an uncaught
exception). Only those three (and what they import) are imported before the script: dsconf, its plugins and the rest
are imported by the script itself, as in a fresh process.

For runs that start no rank and no job; runs that start ranks or sweeps stay plain subprocesses.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

SERVER = r'''
import atexit, json, os, runpy, sys, tempfile, traceback

import hydra  # noqa: F401  the imports every run shares
import omegaconf  # noqa: F401
import torch  # noqa: F401

BASE_PATH = sys.path[1:]  # started as `python -c` without PYTHONPATH: the interpreter's own entries


def child(job, out, err):
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdin = open(0, closefd=False)
    argv = job["argv"]
    sys.argv = list(argv)
    extra = [p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(os.path.realpath(argv[0]))] + extra + BASE_PATH
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


for line in sys.stdin:
    job = json.loads(line)
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            child(job, out, err)
        finally:
            os._exit(70)
    sys.stdout.write(json.dumps({"pid": pid}) + "\n")
    sys.stdout.flush()
    _, status = os.waitpid(pid, 0)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode("utf-8", "replace"))
        f.close()
    sys.stdout.write(json.dumps({"code": os.waitstatus_to_exitcode(status), "stdout": texts[0],
                                 "stderr": texts[1]}) + "\n")
    sys.stdout.flush()
'''

_server: Optional[subprocess.Popen] = None


def _start() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        log = tempfile.TemporaryFile(mode="w+")  # the server's own errors; a file, so no pipe fills
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        _server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=log, text=True, env=env)
        _server.log = log  # type: ignore[attr-defined]
    return _server


def _stop() -> None:
    if _server is not None and _server.poll() is None:
        _server.stdin.close()  # the server ends at end of input
        try:
            _server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _server.kill()


atexit.register(_stop)


def _read(server: subprocess.Popen, timeout: float) -> Optional[Dict[str, Any]]:
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    line = server.stdout.readline() if ready else ""
    return json.loads(line) if line else None


def _broken(server: subprocess.Popen) -> AssertionError:
    server.kill()
    server.wait()
    server.log.seek(0)
    return AssertionError(f"the warm python server died:\n{server.log.read()[-3000:]}")


def run(argv: List[str], *, cwd: str, env: Dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """What ``subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout)`` returns, for ``argv`` = a script and its arguments."""
    server = _start()
    try:
        server.stdin.write(json.dumps({"argv": [os.path.abspath(os.path.join(cwd, argv[0])), *argv[1:]],
                                       "cwd": str(cwd), "env": dict(env)}) + "\n")
        server.stdin.flush()
    except BrokenPipeError:
        raise _broken(server) from None
    started = _read(server, 60)
    if started is None:
        raise _broken(server)
    done = _read(server, timeout)
    if done is None:
        if server.poll() is not None:
            raise _broken(server)
        os.kill(started["pid"], signal.SIGKILL)
        _read(server, 60)
        raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
    return subprocess.CompletedProcess([sys.executable, *argv], done["code"], done["stdout"], done["stderr"])
