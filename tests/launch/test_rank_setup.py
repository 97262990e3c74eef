"""What every rank sets up first (``dsconf.launch.rank_setup``), against torch's real extension builder.

The builds here are of a tiny torch extension (one C function: a second to compile) in a ``TORCH_EXTENSIONS_DIR`` of
the test's own, through the same ``torch.utils.cpp_extension.load`` DeepSpeed's ops go through; DeepSpeed's own op
is only loaded from the cache the set-up built (never rebuilt here). Each case runs in a fresh interpreter, as a rank.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from dsconf.launch import rank_setup

TINY = 'extern "C" int dsconf_tiny() { return 42; }\n'
LOAD = """
import os, sys, time
if os.environ.get("WITH_DSCONF") == "1":
    from dsconf.launch.rank_setup import prepare_rank
    prepare_rank()
from torch.utils.cpp_extension import load
start = time.time()
load(name="dsconf_tiny", sources=[os.path.abspath("tiny.cpp")], is_python_module=False)
print(f"loaded in {time.time() - start:.1f} s", flush=True)
"""
NOTICE = "building the torch extension 'dsconf_tiny'"
SYSTEM_NINJA = shutil.which("ninja", path="/usr/local/bin:/usr/bin:/bin")


def _version(ninja: Optional[str]) -> str:
    if ninja is None:
        return ""
    return subprocess.run([ninja, "--version"], capture_output=True, text=True).stdout.strip()


@pytest.fixture
def ext(tmp_path: Path) -> Path:
    (tmp_path / "tiny.cpp").write_text(TINY)
    (tmp_path / "load.py").write_text(LOAD)
    return tmp_path


def load(ext: Path, *, dsconf: bool = True, path: Optional[str] = None, timeout: float = 120) -> \
        subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext / "cache"), "WITH_DSCONF": "1" if dsconf else "0"}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "load.py"], cwd=ext, env=env, capture_output=True, text=True,
                          timeout=timeout)


def built_at(ext: Path) -> float:
    return (ext / "cache" / "dsconf_tiny" / "tiny.o").stat().st_mtime_ns


def test_a_build_is_announced_before_it_starts_and_a_cached_one_is_not(ext: Path) -> None:
    first = load(ext)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith("dsconf: rank 0: ") and NOTICE in lines[0] and str(ext / "cache") in lines[0], lines
    assert lines[-1].startswith("loaded in")  # the notice came first
    second = load(ext)
    assert second.returncode == 0 and NOTICE not in second.stdout, second.stdout


@pytest.mark.slow
@pytest.mark.skipif(_version(SYSTEM_NINJA) in ("", _version(shutil.which("ninja"))),
                    reason="needs a system ninja of another version than the environment's")
def test_the_environments_ninja_is_used_so_the_cache_is_not_rebuilt(ext: Path) -> None:
    system_first = f"/usr/local/bin:/usr/bin:/bin{os.pathsep}{os.path.dirname(sys.executable)}"
    assert load(ext).returncode == 0  # built with the environment's ninja
    built = built_at(ext)
    time.sleep(0.01)
    ours = load(ext, path=system_first)  # the system's ninja first, as when a venv's python runs unactivated
    assert ours.returncode == 0 and NOTICE not in ours.stdout and built_at(ext) == built, ours.stdout
    plain = load(ext, dsconf=False, path=system_first)  # torch alone runs the system's ninja: it rebuilds
    assert plain.returncode == 0 and built_at(ext) != built, plain.stdout
    again = load(ext, path=system_first)  # and the build log is now the other ninja's: dsconf says it rebuilds
    assert again.returncode == 0 and NOTICE in again.stdout, again.stdout


@pytest.mark.slow
def test_a_stale_build_lock_is_named_with_what_to_do_within_seconds(ext: Path) -> None:
    assert load(ext).returncode == 0
    lock = ext / "cache" / "dsconf_tiny" / "lock"
    lock.write_text("")  # what an interrupted build leaves behind
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext / "cache"), "WITH_DSCONF": "1"}
    proc = subprocess.Popen([sys.executable, "load.py"], cwd=ext, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    try:
        line = proc.stdout.readline()  # torch alone would wait here forever, without a word
        waited = time.monotonic() - started
        assert "waited" in line and f"rm {lock}" in line and "interrupted build" in line, line
        assert waited < 10, waited  # a few seconds of imports, then WAIT_NOTICE_S
        lock.unlink()  # what the line says to do
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read().startswith("loaded in")
    finally:
        proc.kill()


@pytest.mark.slow
def test_without_dsconf_torch_waits_on_that_lock_in_silence(ext: Path) -> None:
    """The behaviour dsconf's line is for (a regression check on torch: if torch ever speaks up, drop ours)."""
    assert load(ext).returncode == 0
    (ext / "cache" / "dsconf_tiny" / "lock").write_text("")
    with pytest.raises(subprocess.TimeoutExpired) as info:
        load(ext, dsconf=False, timeout=8)
    assert not (info.value.stdout or b"").strip()


def test_torchs_private_functions_are_what_rank_setup_wraps() -> None:
    from torch.utils import cpp_extension, file_baton

    assert list(inspect.signature(cpp_extension._run_ninja_build).parameters)[:3] == [
        "build_directory", "verbose", "error_prefix"], rank_setup.TORCH_PRIVATE
    baton = file_baton.FileBaton("/nonexistent/lock")
    assert baton.lock_file_path == "/nonexistent/lock" and callable(baton.wait)
    assert cpp_extension.FileBaton is file_baton.FileBaton  # cpp_extension's baton is the class wrapped


def test_deepspeeds_op_load_goes_through_the_wrapper_and_says_nothing(tmp_path: Path) -> None:
    """DeepSpeed's CPU communication op, from the cache the set-up built: ninja is asked, nothing is rebuilt or
    announced, and DeepSpeed's "built successfully" line is left out."""
    code = """
import dsconf.launch.rank_setup as rs
asked = []
original = rs.will_build
rs.will_build = lambda d: asked.append(d) or original(d)
rs.prepare_rank()
import sys
import deepspeed.comm.torch
comm_torch = sys.modules["deepspeed.comm.torch"]  # deepspeed.comm's own name `torch` is the torch package
print("module", comm_torch.build_shm_op() is not None)
print("asked", [d.rsplit("/", 1)[-1] for d in asked])
"""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.pop("TORCH_EXTENSIONS_DIR", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    if "module False" in lines:
        pytest.skip("DeepSpeed has no shared-memory communication op on this accelerator")
    assert "asked ['deepspeed_shm_comm']" in lines, proc.stdout
    assert "built successfully" not in proc.stdout and "building the torch extension" not in proc.stdout, proc.stdout


def test_deprecation_warnings_of_deepspeeds_calls_are_dropped_and_the_users_kept() -> None:
    shown: List[str] = []
    show = rank_setup._unless_deepspeed_called(lambda message, *args, **kwargs: shown.append(str(message)))
    message = "`torch.distributed.all_gather_into_tensor` is deprecated. Please use ..."
    deepspeed_frame = compile("show(FutureWarning(m), FutureWarning, 'c10d_logger.py', 83)",
                              os.path.join(os.sep, "site-packages", "deepspeed", "comm", "torch.py"), "exec")
    exec(deepspeed_frame, {"show": show, "m": message})
    assert shown == []
    show(FutureWarning(message), FutureWarning, "c10d_logger.py", 83)  # the user's own call
    show(UserWarning("something else"), UserWarning, "x.py", 1)
    assert shown == [message, "something else"]


def test_the_environments_ninja_goes_first_on_path() -> None:
    folder = rank_setup.environment_ninja_dir()
    if folder is None:
        pytest.skip("this environment has no ninja of its own")
    environ: Dict[str, str] = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    assert rank_setup.use_environment_ninja(environ) == folder and environ["PATH"].split(os.pathsep)[0] == folder
    assert rank_setup.use_environment_ninja(environ) is None  # already first: PATH is left as it is


SLEEPY_APP = """
import time
import dsconf

@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def main(cfg):
    time.sleep(float(cfg.get("sleep", 0)))
    print("rank output", flush=True)

main()
"""


@pytest.mark.slow
def test_a_job_whose_ranks_are_silent_at_start_is_not_silent(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(SLEEPY_APP)
    proc = subprocess.Popen([sys.executable, "app.py", "+sleep=12", "deepspeed.train_micro_batch_size_per_gpu=1",
                             f"hydra.run.dir={tmp_path / 'run'}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "DS_ACCELERATOR": "cpu"})
    start, stamps = time.monotonic(), []
    lines: List[str] = []
    for line in proc.stdout:
        stamps.append(time.monotonic() - start)
        lines.append(line.rstrip())
    assert proc.wait(timeout=120) == 0, lines
    notices = [i for i, line in enumerate(lines) if line.startswith("dsconf: note: the ranks have printed nothing for")]
    assert notices and stamps[notices[0]] <= 10, (lines, stamps)
    assert lines[-1].endswith("rank output")
    gaps = [b - a for a, b in zip([0.0, *stamps], stamps)]
    assert max(gaps) <= 10, (lines, stamps)


STREAMING_APP = """
import time
import dsconf

@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def main(cfg):
    print("first line", flush=True)
    time.sleep(6)
    print("last line", flush=True)

main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_rank_lines_reach_a_pipe_as_they_are_printed(tmp_path: Path, sweep: bool) -> None:
    """stdout a pipe or a file (SLURM's output file, ``| tee``), no PYTHONUNBUFFERED: a rank's line shows when the rank
    prints it, not when the job ends."""
    (tmp_path / "app.py").write_text(STREAMING_APP)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    args = ["-m", "+n=1", f"hydra.sweep.dir={tmp_path / 'sweep'}"] if sweep else [f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen([sys.executable, "app.py", *args, "deepspeed.train_micro_batch_size_per_gpu=1"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**env, "DS_ACCELERATOR": "cpu"})
    stamps = {}
    for line in proc.stdout:
        for text in ("first line", "last line"):
            if line.rstrip().endswith(text):
                stamps[text] = time.monotonic()
    assert proc.wait(timeout=120) == 0
    assert stamps["last line"] - stamps["first line"] >= 4, stamps  # the rank sleeps 6 s between the two


SHARING_APP = """
import json, os, subprocess, sys
import dsconf

@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def main(cfg):
    started = []
    popen_init = subprocess.Popen.__init__

    def counting(self, args, *a, **k):
        started.append(" ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args))
        return popen_init(self, args, *a, **k)

    subprocess.Popen.__init__ = counting
    from deepspeed.ops.op_builder.cpu import FusedAdamBuilder
    builder = FusedAdamBuilder()
    facts = {"cpu_arch": builder.cpu_arch(), "simd_width": builder.simd_width(), "started": started,
             "file": os.environ.get("DSCONF_CPU_INFO_FILE")}
    subprocess.Popen.__init__ = popen_init
    with open(f"facts-{os.getpid()}.json", "w") as fh:
        json.dump(facts, fh)

main()
"""
FRESH_ANSWER = """
import json
from deepspeed.ops.op_builder.cpu import FusedAdamBuilder
print(json.dumps({"cpu_arch": FusedAdamBuilder().cpu_arch(), "simd_width": FusedAdamBuilder().simd_width()}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_ranks_ask_py_cpuinfo_once_for_what_deepspeeds_op_builders_ask(tmp_path: Path, sweep: bool) -> None:
    """py-cpuinfo answers each question by starting a Python interpreter, and DeepSpeed asks twice per op load on every
    rank: in a job, or in a sweep of three jobs in two batches (a tuning study launches each trial as a batch of its
    own), one rank asks once, and every rank gets the answer a fresh process gets."""
    (tmp_path / "app.py").write_text(SHARING_APP)
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    args = ["dist.nproc_per_node=2", "deepspeed.train_micro_batch_size_per_gpu=1"]
    out = (["-m", "+n=1,2,3", "hydra.sweeper.max_batch_size=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"] if sweep
           else [f"hydra.run.dir={tmp_path / 'run'}"])
    proc = subprocess.run([sys.executable, "app.py", *out, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fresh = subprocess.run([sys.executable, "-c", FRESH_ANSWER], capture_output=True, text=True, env=env, check=True)
    expected = json.loads(fresh.stdout.splitlines()[-1])
    facts = [json.loads(path.read_text()) for path in tmp_path.glob("facts-*.json")]
    assert len(facts) == (6 if sweep else 2)
    if sweep:
        assert proc.stdout.count("Launching ") == 2, proc.stdout  # two batches (Hydra's launch calls)
    asked = [c for f in facts for c in f["started"] if "cpuinfo" in c]
    assert len(asked) == 1, asked
    for fact in facts:
        assert (fact["cpu_arch"], fact["simd_width"]) == (expected["cpu_arch"], expected["simd_width"])
    shared = {fact["file"] for fact in facts}
    assert len(shared) == 1 and not Path(shared.pop()).parent.exists()  # the launcher's directory, gone with it


AT_EXIT_APP = """
import atexit, json, os
import dsconf


def report():  # registered before dsconf's exit handler, so it runs after it (the last registered runs first)
    import torch.distributed as dist
    with open(os.path.join(os.environ["AT_EXIT_OUT"], "rank" + os.environ["RANK"] + ".json"), "w") as fh:
        json.dump({"initialized": dist.is_initialized()}, fh)


atexit.register(report)


@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def main(cfg):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    if cfg.get("fail"):
        raise ValueError("the task failed")


if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how,fail", [("torchrun", False), ("torchrun", True), ("spawn", False)],
                         ids=["in-place", "in-place-failed", "spawned"])
def test_a_rank_destroys_the_process_group_its_task_left_at_exit_only_after_a_return(tmp_path: Path, how: str,
                                                                                    fail: bool) -> None:
    """gloo's threads left to interpreter finalization now and then abort a rank whose run succeeded (SIGABRT):
    a rank run in place (torchrun, mpiexec, srun) or spawned destroys the group its task left, at exit; a rank whose
    task raised leaves it (a peer may still be in a collective)."""
    (tmp_path / "app.py").write_text(AT_EXIT_APP)
    out = tmp_path / "out"
    out.mkdir()
    args = ["deepspeed.train_micro_batch_size_per_gpu=1", f"hydra.run.dir={tmp_path / 'run'}"]
    if fail:
        args.append("+fail=true")
    command = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "app.py", *args]
               if how == "torchrun" else [sys.executable, "app.py", "dist.nproc_per_node=2", "dist.start_method=spawn",
                                          *args])
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "AT_EXIT_OUT": str(out)})
    assert (proc.returncode != 0) == fail, proc.stderr[-3000:]
    reports = {path.name: json.loads(path.read_text()) for path in out.glob("rank*.json")}
    assert reports == {f"rank{r}.json": {"initialized": fail} for r in range(2)}, proc.stderr[-3000:]
