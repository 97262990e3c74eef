"""Helpers for the launch tests: real torch elastic workers, gloo on CPU, scripts run as subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("DS_ACCELERATOR", "cpu")
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# scripts started by the tests (and Hydra's integration suite) find dsconf and hydra_plugins/ from the tree
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])

# A training script used by most tests: every rank joins a gloo group, checks it with an all-reduce, and
# writes what it saw to <out>/rank{R}.json; ``behaviour`` (cfg.test.*) makes a rank fail or hang.
TRAIN_SCRIPT = '''
import json, os, sys, time
import dsconf
from dsconf.launch import context


@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def train(cfg):
    import torch
    import torch.distributed as dist
    from hydra.core.hydra_config import HydraConfig

    test = cfg.get("test") or {}
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    print(f"rank {rank} of {world}", flush=True)
    try:
        ds = context.deepspeed_config()
    except RuntimeError:
        ds = None
    facts = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                            "TORCHELASTIC_RUN_ID", "DSCONF_DEEPSPEED_CONFIG",
                                            "CUDA_VISIBLE_DEVICES")}
    facts.update(pid=os.getpid(), ppid=os.getppid(), sid=os.getsid(0), pgid=os.getpgrp(), rank=rank, world=world,
                 allreduce=int(total.item()),
                 ds=ds, cwd=os.getcwd(), output_dir=HydraConfig.get().runtime.output_dir,
                 job_num=HydraConfig.get().job.get("num"), which=test.get("which"))
    out = test.get("out") or HydraConfig.get().runtime.output_dir
    os.makedirs(out, exist_ok=True)
    # written whole, then renamed: tests poll for these files while ranks are still running
    path = os.path.join(out, f"rank{rank}-{test.get('which', 'x')}.json")
    with open(path + ".part", "w") as fh:
        json.dump(facts, fh)
    os.replace(path + ".part", path)
    if test.get("fail_rank") == rank and test.get("fail_which", test.get("which")) == test.get("which"):
        raise ValueError(f"boom from rank {rank}")
    if test.get("sleep") and test.get("sleep_which", test.get("which")) == test.get("which"):
        time.sleep(float(test.sleep))
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "which": test.get("which")}


if __name__ == "__main__":
    train()
'''


def write_script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def run_script(script: Path, *args: str, cwd: Optional[Path] = None, timeout: float = 120,
               env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], cwd=str(cwd or script.parent), text=True,
                          capture_output=True, timeout=timeout, env={**os.environ, **(env or {})})


def rank_facts(folder: Path) -> List[Dict[str, Any]]:
    """What each rank wrote, sorted by (which, rank)."""
    facts = [json.loads(p.read_text()) for p in folder.glob("rank*.json")]
    return sorted(facts, key=lambda f: (str(f.get("which")), int(f.get("rank", f.get("RANK")))))


def wait_for(predicate: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def alive(pids: List[int]) -> List[int]:
    """The pids still running (zombies count as gone)."""
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def descendants(pid: int) -> List[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The example (examples/train.py) with a probe: every rank writes its torch variables to $DSCONF_PROBE_OUT, then
# runs the example's own task (its model, its DeepSpeed training, its metrics.json) on the example's config.
EXAMPLES = REPO / "examples"
EXAMPLE_PROBE = f'''
import json, os, sys
sys.path.insert(0, {str(EXAMPLES)!r})
import train as example  # registers the example's schema; its task is example.main.__dsconf_task__
import dsconf


@dsconf.main(config_path={str(EXAMPLES / "conf")!r}, config_name="train", version_base=None)
def main(cfg):
    facts = {{k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                            "MASTER_PORT", "TORCHELASTIC_RUN_ID")}}
    out = os.environ["DSCONF_PROBE_OUT"]
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "rank" + facts["RANK"] + ".json")
    with open(path + ".part", "w") as fh:  # whole, then renamed: tests poll for it
        json.dump(facts, fh)
    os.replace(path + ".part", path)
    return example.main.__dsconf_task__(cfg)


if __name__ == "__main__":
    main()
'''
# Variables of the environments dsconf adapts to: a test's processes start without the ones of the test's own run
LAUNCHER_VAR_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "SLURM_", "SUBMITIT_", "PET_", "SKYPILOT_",
                         "TORCHELASTIC_")
TORCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
              "CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE", "HYDRA_FULL_ERROR")


def clean_env(**extra: str) -> Dict[str, str]:
    """This process's environment without any launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in TORCH_VARS and not k.startswith(LAUNCHER_VAR_PREFIXES)}
    env.update(extra)
    return env


def run_nodes(commands: List[List[str]], envs: List[Dict[str, str]], logs: List[Path], cwd: Path,
              timeout: float = 400) -> List[Any]:
    """Start one process per "node" (its own command and environment, output to its log); their exit codes, or
    "hung" for one still running at ``timeout`` (then killed)."""
    procs = []
    for command, env, log in zip(commands, envs, logs):
        with open(log, "w") as fh:
            procs.append(subprocess.Popen(command, cwd=str(cwd), env=env, stdout=fh, stderr=subprocess.STDOUT,
                                          text=True))
    deadline = time.monotonic() + timeout
    codes: List[Any] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append("hung")
        finally:
            proc.kill()
    return codes


def logs_text(paths: List[Path], tail: int = 3000) -> str:
    return "\n".join(f"--- {p}\n{p.read_text()[-tail:]}" for p in paths if p.exists())
