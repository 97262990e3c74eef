"""What every rank dsconf runs sets up before the task: DeepSpeed's op builds neither repeat nor stall in silence, and
DeepSpeed's known-harmless lines stay out of the user's way.

DeepSpeed JIT-builds ops (its CPU Adam, its CPU communication op, ...) with ``torch.utils.cpp_extension``, which runs
the first ``ninja`` on PATH in ``$TORCH_EXTENSIONS_DIR/<op>`` (else ``~/.cache/torch_extensions/<python>_<device>/
<op>``). Three things go wrong there, each without a word from torch:

- another ninja (the system's, when a venv's python runs without the venv activated) does not read the build log
  of the one that built the op, and rebuilds it (minutes). ``use_environment_ninja`` puts the ninja of this
  interpreter's environment first on PATH, as activating the environment would;
- a build takes minutes. ``watch_op_builds`` asks ninja itself (``ninja -n``, a dry run of the very build torch is
  about to run) whether anything will be built, and if so says so in one line first;
- torch serialises builds with a ``lock`` file in the op's build dir and waits, silently and without end, while it
  exists: an interrupted build leaves it behind. After ``WAIT_NOTICE_S`` of waiting the rank says which file it
  waits for and what to do, and repeats it every ``WAIT_REPEAT_S``.

``quiet_deepspeed`` drops lines of DeepSpeed's that say nothing to the user: "DeepSpeed ... built successfully",
printed on every rank of every run; its warning "Attempting to get learning rate from scheduler before it has
started", which its own engine set-up triggers on every rank with a warm-up schedule; and torch's FutureWarning about
the collectives DeepSpeed calls by their deprecated names (only when DeepSpeed's own code made the call: the same
warning for the user's code is kept).

DeepSpeed's op builders ask py-cpuinfo for the CPU's architecture and SIMD width on every op load, and py-cpuinfo
answers each question by starting a Python interpreter (1.1 s of CPU each: two per op, per rank). ``share_cpu_info``
has the first rank that asks keep the answer in a file the launcher names (``SharedCpuInfo``: one per job, or one per
sweep, for all its batches and trials, removed when it ends); the other ranks, and later questions, read it.

A rank whose task returned with torch's default process group still up destroys it when the interpreter exits
(``end_process_group_at_exit``): left to interpreter finalization, gloo's worker threads now and then make the process
abort ("terminate called without an active exception", SIGABRT) after a run that succeeded, and the launcher (mpiexec,
srun, torchrun) then reports the rank failed. Never after an exception: a peer may still be in a collective.

torch's build functions are private: the two this module wraps (``cpp_extension._run_ninja_build`` and
``file_baton.FileBaton.wait``) are named in ``TORCH_PRIVATE`` and checked against the installed torch by
tests/launch/test_rank_setup.py. Nothing here imports torch or DeepSpeed: each wrapper is applied when the module it
wraps is first imported (``after_import``), so a rank that never builds an op pays nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import importlib.abc
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: each rank asks py-cpuinfo for itself
    fcntl = None  # type: ignore[assignment]

WAIT_NOTICE_S = 5.0  # a rank waiting on another build's lock says so after this long
WAIT_REPEAT_S = 60.0  # and again every this long
TORCH_PRIVATE = ("torch.utils.cpp_extension._run_ninja_build(build_directory, verbose, error_prefix)",
                 "torch.utils.file_baton.FileBaton.wait(self), .lock_file_path")
BUILT_LINE = re.compile(r"^DeepSpeed \S+ built successfully$")
DEPRECATED_COLLECTIVE = re.compile(r"`torch\.distributed\.\w+` is deprecated")
SCHEDULER_NOT_STARTED = "Attempting to get learning rate from scheduler before it has started"
CPU_INFO_FILE_ENV = "DSCONF_CPU_INFO_FILE"  # set by the launcher: where its ranks share py-cpuinfo's answer


def prepare_rank() -> None:
    """Everything above, in this process (a rank, before its task runs)."""
    use_environment_ninja()
    watch_op_builds()
    share_cpu_info()
    quiet_deepspeed()


# ---------------------------------------------------------------------------------------------------- ninja
def environment_ninja_dir() -> Optional[str]:
    """Where this interpreter's environment keeps its ninja: its scripts dir (a venv's ``bin``) when that holds one,
    else the dir of the executable the environment's ``ninja`` distribution installed (DeepSpeed requires it)."""
    exe = "ninja" + (sysconfig.get_config_var("EXE") or "")
    for folder in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        if folder and os.access(os.path.join(folder, exe), os.X_OK):
            return folder
    try:
        from importlib import metadata

        files = metadata.distribution("ninja").files or []
    except Exception:  # not installed, or metadata without a RECORD
        return None
    for file in files:
        if file.name == exe and file.parent.name in ("bin", "Scripts"):
            path = os.path.normpath(str(file.locate()))
            if os.access(path, os.X_OK):
                return os.path.dirname(path)
    return None


def use_environment_ninja(environ: Optional[Dict[str, str]] = None) -> Optional[str]:
    """Put the environment's ninja first on ``environ``'s PATH (default: this process's) unless the first ninja there
    is already that one; returns the dir put first, or None."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    folder = environment_ninja_dir()
    if folder is None:
        return None
    path = environ.get("PATH", "")
    first = shutil.which("ninja", path=path)
    if first is not None and os.path.realpath(os.path.dirname(first)) == os.path.realpath(folder):
        return None
    environ["PATH"] = os.pathsep.join([folder, *[p for p in path.split(os.pathsep) if p]])
    return folder


# ------------------------------------------------------------------------------------------------ op builds
def watch_op_builds() -> None:
    """Announce each op build before it starts, and tell about a lock that keeps this rank waiting."""
    after_import("torch.utils.cpp_extension", _wrap_cpp_extension)
    after_import("torch.utils.file_baton", _wrap_file_baton)


def _rank() -> str:
    return os.environ.get("RANK", "0")


def will_build(build_directory: str) -> bool:
    """Whether ninja has anything to do in ``build_directory`` (its dry run, with the ninja torch will run)."""
    try:
        dry = subprocess.run(["ninja", "-n"], cwd=build_directory, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return True  # no answer: the build itself will tell
    return "no work to do" not in dry.stdout


def build_notice(build_directory: str) -> str:
    name = os.path.basename(os.path.normpath(build_directory))
    return (f"dsconf: rank {_rank()}: building the torch extension '{name}' in {build_directory} (DeepSpeed's ops take "
            "minutes, once per torch and DeepSpeed version; later runs load the build)...")


def wait_notice(lock: str, waited: float) -> str:
    name = os.path.basename(os.path.dirname(lock))
    try:
        age = f", created {time.time() - os.path.getmtime(lock):.0f} s ago"
    except OSError:
        age = ""
    return (f"dsconf: rank {_rank()}: waited {waited:.0f} s for the build lock of the torch extension '{name}' "
            f"({lock}{age}): another process is building it, or an interrupted build left the file; if no build is "
            f"running, delete it (rm {lock})")


def _wrap_cpp_extension(module: Any) -> None:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def run_ninja_build(build_directory: str, *args: Any, **kwargs: Any) -> Any:
            if will_build(build_directory):
                print(build_notice(build_directory), flush=True)
            return original(build_directory, *args, **kwargs)

        return run_ninja_build

    replace_once(module, "_run_ninja_build", wrap)


def _wrap_file_baton(module: Any) -> None:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def wait(self: Any) -> Any:
            done = threading.Event()
            teller = threading.Thread(target=_tell_while_waiting, args=(self.lock_file_path, done), daemon=True)
            teller.start()
            try:
                return original(self)
            finally:
                done.set()

        return wait

    replace_once(getattr(module, "FileBaton", None), "wait", wrap)


def _tell_while_waiting(lock: str, done: threading.Event) -> None:
    start = time.monotonic()
    delay = WAIT_NOTICE_S
    while not done.wait(delay):
        print(wait_notice(lock, time.monotonic() - start), flush=True)
        delay = WAIT_REPEAT_S


# ------------------------------------------------------------------------------------------------ CPU facts
def share_cpu_info() -> None:
    """py-cpuinfo's answer asked once per job or sweep, where the launcher names a file for it."""
    path = os.environ.get(CPU_INFO_FILE_ENV)
    if path and fcntl is not None:
        after_import("cpuinfo", functools.partial(_share_cpu_info, path=path))


def _share_cpu_info(module: Any, path: str) -> None:
    def wrap(original: Callable[[], Any]) -> Callable[[], Any]:
        answer = functools.cache(lambda: shared_answer(path, original))
        return lambda: copy.deepcopy(answer())  # a caller may change the dict it gets

    replace_once(module, "get_cpu_info", wrap)


class SharedCpuInfo:
    """In the launcher: the file where the ranks of the jobs it starts share py-cpuinfo's answer. Its directory lives as
    long as this object (a sweep's lives as long as the sweep: every batch, every trial of a tuning study) and is
    removed by ``close``, when the object is collected, or at exit; never by a process forked from its owner."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="dsconf-")
        self.path = os.path.join(self.dir, "cpu-info.json")
        self.close = weakref.finalize(self, _remove_in_owner, self.dir, os.getpid())

    @contextlib.contextmanager
    def named(self) -> Iterator[str]:
        """``CPU_INFO_FILE_ENV`` names the file while the block runs: the processes it starts inherit it."""
        os.environ[CPU_INFO_FILE_ENV] = self.path
        try:
            yield self.path
        finally:
            os.environ.pop(CPU_INFO_FILE_ENV, None)


def _remove_in_owner(path: str, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def shared_cpu_info_file() -> Iterator[str]:
    """In the launcher of one job: an enclosing sweep's file (``CPU_INFO_FILE_ENV``), else a new one removed on exit."""
    enclosing = os.environ.get(CPU_INFO_FILE_ENV)
    if enclosing and os.path.isdir(os.path.dirname(enclosing)):  # not a stale value from a job that has ended
        yield enclosing
        return
    shared = SharedCpuInfo()
    try:
        with shared.named() as path:
            yield path
    finally:
        shared.close()


def shared_answer(path: str, ask: Callable[[], Any]) -> Any:
    """The JSON answer kept at ``path``, or ``ask()``'s, kept there for the next process: one process asks at a time."""
    try:
        lock = open(path + ".lock", "a")
    except OSError:  # the launcher's directory is gone: ask as DeepSpeed would
        return ask()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as fh:
            return json.load(fh)
        answer = ask()
        with open(path + ".partial", "w", encoding="utf-8") as fh:  # only the lock's holder writes it
            json.dump(answer, fh)
        os.replace(path + ".partial", path)
        return answer


# ------------------------------------------------------------------------------------------------ at exit
def end_process_group_at_exit() -> None:
    """Call once the task has returned: at interpreter exit, destroy the default process group if it is still up
    (a forked rank ends without running exit handlers, and needs none)."""
    atexit.register(_destroy_default_process_group)


def _destroy_default_process_group() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    with contextlib.suppress(Exception):  # the exit handler of a rank whose work is done: never a new failure
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ DeepSpeed's noise
def quiet_deepspeed() -> None:
    after_import("deepspeed.comm.torch", functools.partial(_without_built_line, function="build_shm_op"))
    after_import("deepspeed.comm.ccl", functools.partial(_without_built_line, function="build_ccl_op"))
    after_import("deepspeed.utils.logging", _without_scheduler_warning)
    replace_once(warnings, "showwarning", _unless_deepspeed_called)


def _without_built_line(module: Any, function: str) -> None:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def build(*args: Any, **kwargs: Any) -> Any:
            with contextlib.redirect_stdout(LineFilter(sys.stdout, BUILT_LINE)) as out:
                try:
                    return original(*args, **kwargs)
                finally:
                    out.close()

        return build

    replace_once(module, function, wrap)


def _without_scheduler_warning(module: Any) -> None:
    logger = getattr(module, "logger", None)
    if logger is not None and not any(isinstance(f, _SchedulerNotStarted) for f in logger.filters):
        logger.addFilter(_SchedulerNotStarted())


class _SchedulerNotStarted:
    """Drops DeepSpeed's warning that its engine asked the warm-up schedule for a learning rate at set-up."""

    def filter(self, record: Any) -> bool:
        return not str(record.msg).startswith(SCHEDULER_NOT_STARTED)


class LineFilter(io.TextIOBase):
    """Writes whole lines through to ``stream``, except those ``pattern`` matches; ``close`` passes on the rest."""

    def __init__(self, stream: Any, pattern: re.Pattern) -> None:
        self.stream, self.pattern, self.pending = stream, pattern, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if not self.pattern.match(line):
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def close(self) -> None:
        if self.pending and not self.pattern.match(self.pending):
            self.stream.write(self.pending)
        self.pending = ""
        self.stream.flush()


def _unless_deepspeed_called(showwarning: Callable[..., Any]) -> Callable[..., Any]:
    deepspeed_dir = os.sep + "deepspeed" + os.sep

    def show(message: Any, category: type, *args: Any, **kwargs: Any) -> Any:
        if issubclass(category, FutureWarning) and DEPRECATED_COLLECTIVE.search(str(message)):
            frame = sys._getframe(1)
            while frame is not None:
                if deepspeed_dir in frame.f_code.co_filename:
                    return None  # DeepSpeed's call, not the user's: nothing they can change
                frame = frame.f_back
        return showwarning(message, category, *args, **kwargs)

    return show


# ------------------------------------------------------------------------------------------------ after import
def replace_once(owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """``owner.name = wrap(owner.name)``, marked as dsconf's: nothing when it is missing or dsconf's already (a rank set
    up twice, a module imported again)."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_dsconf", False):
        return
    replacement = functools.wraps(original)(wrap(original))
    replacement._dsconf = True  # type: ignore[attr-defined]
    setattr(owner, name, replacement)


def after_import(name: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(module)`` once module ``name`` is imported: now if it is, else right after its import."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport):
            finder.callbacks.setdefault(name, []).append(callback)
            return
    sys.meta_path.insert(0, _AfterImport({name: [callback]}))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module it lets the other finders find it, then runs the callbacks once
    the module's code has run."""

    def __init__(self, callbacks: Dict[str, list]) -> None:
        self.callbacks = callbacks

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.callbacks:
            return None
        callbacks = self.callbacks.pop(name)
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_call(module: Any) -> None:
            exec_module(module)
            for callback in callbacks:
                callback(module)

        loader.exec_module = exec_then_call  # the loader is this spec's own (one per module found)
        return spec
