"""The launcher on a GPU host, simulated on CPU (``gpu_sim/fake_cuda.py``: what it proves and what it does not).

Every process of these runs gets the simulated ``torch.cuda``; each rank calls ``torch.cuda.set_device(LOCAL_RANK)``
as DeepSpeed does, then forms a gloo group. The tests read the simulation's log: where CUDA was initialised
(never in the launcher: forked ranks would fail), and which physical GPU each rank bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from accelerator_here import accelerator
from launch_helpers import rank_facts

SIM = Path(__file__).parent / "gpu_sim"
sys.path.insert(0, str(SIM))

import fake_cuda  # noqa: E402

BATCH = ["deepspeed.train_micro_batch_size_per_gpu=2"]

# One rank: bind the device DeepSpeed would bind, then join the gloo group and report.
SIM_SCRIPT = '''
import json, os
import dsconf


@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def train(cfg):
    import torch
    import torch.distributed as dist
    from dsconf.launch import context

    if torch.cuda.device_count():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # what deepspeed.initialize does
    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(total)
    facts = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                            "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "SLURM_LOCALID", "SLURM_NODEID")}
    facts.update(rank=dist.get_rank(), allreduce=int(total.item()), ds=context.deepspeed_config(), pid=os.getpid())
    with open(os.path.join(cfg.test.out, f"rank{dist.get_rank()}.json"), "w") as fh:
        json.dump(facts, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    train()
'''


def sim_env(gpus: int, log: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")}
    env.update(DSCONF_SIM_GPUS=str(gpus), DSCONF_SIM_LOG=str(log),
               PYTHONPATH=os.pathsep.join([str(SIM), env.get("PYTHONPATH", "")]), **extra)
    return env


def run_sim(tmp_path: Path, *args: str, gpus: int = 2, env: dict | None = None, unset: tuple = (),
            timeout: float = 180):
    script = tmp_path / "sim_train.py"
    script.write_text(SIM_SCRIPT)
    out = tmp_path / "facts"
    out.mkdir(exist_ok=True)
    log = tmp_path / "sim.jsonl"
    proc = subprocess.run([sys.executable, str(script), *BATCH, f"+test.out={out}", f"hydra.run.dir={tmp_path / 'run'}",
                           *args], cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in {**sim_env(gpus, log), **(env or {})}.items() if k not in unset})
    return proc, fake_cuda.events(str(log)), out


def launcher_inits(events: list) -> list:
    """CUDA initialisations outside the ranks (the launcher or its agent: RANK unset there)."""
    return [e for e in events if e["kind"] == "cuda_init" and e["RANK"] is None]


@pytest.mark.parametrize("args", [["dist.nproc_per_node=2"], ["dist.nproc_per_node=auto"],
                                  ["dist.nproc_per_node=2", "precision=fp16"]],
                         ids=["default", "nproc-auto", "fp16-asks-deepspeeds-accelerator"])
@pytest.mark.slow  # starts ranks
def test_fork_on_a_gpu_host_binds_every_rank_without_poisoning(tmp_path: Path, args: list) -> None:
    """Finding 4: with start_method=fork the launcher must not initialise CUDA (counting GPUs for nproc auto, and
    asking DeepSpeed's auto-detected accelerator whether fp16 works, included); every rank binds its own GPU."""
    proc, events, out = run_sim(tmp_path, "dist.start_method=fork", *args, unset=["DS_ACCELERATOR"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert launcher_inits(events) == [], launcher_inits(events)
    assert not [e for e in events if e["kind"] == "fork_poisoned"]
    bound = sorted((int(e["RANK"]), e["physical"]) for e in events if e["kind"] == "set_device")
    assert bound == [(0, 0), (1, 1)]
    assert [f["allreduce"] for f in rank_facts(out)] == [3, 3]


def test_the_simulation_catches_a_launcher_that_initialises_cuda(tmp_path: Path) -> None:
    """The harness itself: a launcher process that initialised CUDA before forking makes every rank fail."""
    code = ("import torch, os, multiprocessing as mp\n"
            "torch.cuda.is_available()\n"
            "def rank():\n    torch.cuda.set_device(0)\n"
            "p = mp.get_context('fork').Process(target=rank); p.start(); p.join(); raise SystemExit(p.exitcode)\n")
    log = tmp_path / "sim.jsonl"
    env = sim_env(2, log)
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and fake_cuda.FORK_MESSAGE in proc.stderr
    kinds = [e["kind"] for e in fake_cuda.events(str(log))]
    assert kinds == ["cuda_init", "fork_poisoned"]


@pytest.mark.slow  # starts ranks
def test_fp16_follows_deepspeeds_accelerator_not_cuda_visibility(tmp_path: Path) -> None:
    """Finding 7: with DS_ACCELERATOR=cpu on a GPU host, ranks would run on DeepSpeed's CPU accelerator: fp16 is
    refused before launch (it used to pass, then fail on every rank)."""
    fp16_on_cpu = accelerator("cpu").fp16  # DeepSpeed's CPU accelerator's answer, as the launcher gets it
    proc, events, out = run_sim(tmp_path, "precision=fp16", "dist.nproc_per_node=2", env={"DS_ACCELERATOR": "cpu"})
    if fp16_on_cpu:  # this CPU's DeepSpeed accelerator does fp16: nothing to refuse
        assert proc.returncode == 0, proc.stderr[-3000:]
        return
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "deepspeed.fp16.enabled" in proc.stderr and "cpu accelerator (DS_ACCELERATOR=cpu)" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(out.glob("rank*.json"))


@pytest.mark.slow  # sweeps
def test_parallel_sweep_packs_jobs_on_disjoint_devices(tmp_path: Path) -> None:
    """Two 2-rank jobs at once on a 4-GPU host: each job's ranks bind GPUs of its own subset."""
    script = tmp_path / "sim_train.py"
    script.write_text(SIM_SCRIPT)
    log = tmp_path / "sim.jsonl"
    proc = subprocess.run([sys.executable, str(script), "-m", "hydra/launcher=dsconf",
                           "hydra.launcher.max_parallel_jobs=2", "dist.nproc_per_node=2", *BATCH,
                           f"+test.out={tmp_path}", "+test.job=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=300, env=sim_env(4, log))
    assert proc.returncode == 0, proc.stderr[-3000:]
    binds = [e for e in fake_cuda.events(str(log)) if e["kind"] == "set_device"]
    assert len(binds) == 4 and sorted(e["physical"] for e in binds) == [0, 1, 2, 3]
    subsets = {e["CUDA_VISIBLE_DEVICES"] for e in binds}
    assert len(subsets) == 2 and all(len(s.split(",")) == 2 for s in subsets)
    assert launcher_inits(fake_cuda.events(str(log))) == []
