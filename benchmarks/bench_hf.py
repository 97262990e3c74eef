"""HF Transformers' Trainer through dsconf against the same training under ``torchrun``.

    python benchmarks/bench_hf.py [--rounds 6] [--ranks 2] [--steps 60]

dsconf: ``examples/hf_trainer.py``'s Trainer (``build_trainer``) run by ``@dsconf.main`` with its config
(``examples/conf/hf_trainer.yaml``: "auto" filled at compose time). torchrun: a plain script with the same model,
data and TrainingArguments, reading the ``ds_config.json`` the dsconf run wrote (so both run the same dict), started
by ``torchrun --standalone``. Each round runs both, one after the other, alternating which goes first. Both run with
``OMP_NUM_THREADS=1`` (torchrun's default for several ranks per node).

Figures, dsconf / torchrun, median of the per-round ratios with their 10th and 90th percentiles:
- samples/s: the Trainer's own ``train_samples_per_second`` (goal >= 0.98x);
- time to first step: from the command's start to rank 0 entering its first training step (goal <= 1.0x).

On a virtual machine the hypervisor takes CPU time now and then ("steal", /proc/stat): a run that loses a few
seconds of its two CPUs to it says nothing about either launcher. A round in which either run lost more than
``--max-steal`` of its CPU time is run again (up to 3x the rounds asked for); the figures are printed for the
clean rounds and for every round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from paired import REPO, spread, tree_env

EXAMPLES = REPO / "examples"

FIRST_STEP = '''
import json, os, time
from transformers import TrainerCallback


class FirstStep(TrainerCallback):
    """Rank 0 records when its first training step begins, and the Trainer's throughput at the end."""

    def __init__(self, out):
        self.out, self.first = out, None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.first is None:
            self.first = time.time()

    def on_train_end(self, args, state, control, **kwargs):
        if int(os.environ.get("RANK", "0")) == 0:
            metrics = [log for log in state.log_history if "train_samples_per_second" in log]
            with open(self.out, "w") as fh:
                json.dump({"first_step": self.first,
                           "samples_per_second": metrics[-1]["train_samples_per_second"] if metrics else None}, fh)
'''

DSCONF_APP = FIRST_STEP + '''
import sys
sys.path.insert(0, EXAMPLES)
from hf_trainer import build_trainer
import dsconf


@dsconf.main(config_path=CONF, config_name="hf_trainer", version_base=None)
def main(cfg):
    trainer = build_trainer(cfg)
    trainer.add_callback(FirstStep(os.environ["BENCH_OUT"]))
    trainer.train()


if __name__ == "__main__":
    main()
'''

PLAIN_APP = FIRST_STEP + '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Sequences(torch.utils.data.Dataset):
    def __init__(self, examples, seq_len, vocab):
        starts = torch.randint(0, vocab, (examples, 1), generator=torch.Generator().manual_seed(0))
        self.ids = (starts + torch.arange(seq_len)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


if __name__ == "__main__":
    with open("plain.json") as fh:
        spec = json.load(fh)
    args = TrainingArguments(**spec["training_args"], deepspeed="ds_config.json")
    model = GPT2LMHeadModel(GPT2Config(**spec["model"], bos_token_id=0, eos_token_id=0))
    data = Sequences(spec["data"]["examples"], spec["data"]["seq_len"], spec["model"]["vocab_size"])
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.add_callback(FirstStep(os.environ["BENCH_OUT"]))
    trainer.train()
'''


def steal_ticks() -> int:
    """Clock ticks the hypervisor gave to other guests, all CPUs together (0 where the kernel does not say)."""
    try:
        with open("/proc/stat") as fh:
            return int(fh.readline().split()[8])
    except (OSError, IndexError, ValueError):
        return 0


def timed(cmd: List[str], cwd: Path, out: Path) -> Dict[str, float]:
    if out.exists():
        out.unlink()
    # torchrun gives each rank OMP_NUM_THREADS=1 unless it is set: set for both, the same threads run the same steps
    env = tree_env(REPO, BENCH_OUT=str(out), OMP_NUM_THREADS="1")
    for attempt in range(3):
        start, stolen = time.time(), steal_ticks()
        proc = subprocess.run(cmd, cwd=str(cwd), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        cpu_ticks = (time.time() - start) * os.sysconf("SC_CLK_TCK") * (os.cpu_count() or 1)
        stolen = (steal_ticks() - stolen) / cpu_ticks
        if proc.returncode == 0:
            break
        # seen with torchrun: a rank aborts at interpreter exit ("terminate called without an active exception")
        print(f"run {attempt + 1} of {cmd[0]} ... failed, again: {proc.stderr.strip().splitlines()[-1][:200]}")
    else:
        raise RuntimeError(f"{cmd} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    return {"first_step": result["first_step"] - start, "samples_per_second": result["samples_per_second"],
            "steal": stolen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--max-steal", type=float, default=0.01,
                        help="rerun a round whose runs lost more than this share of their CPU time to the hypervisor")
    parser.add_argument("overrides", nargs="*", help="more overrides for the dsconf run, e.g. dist.start_method=spawn")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="dsconf-bench-hf-"))
    try:
        paths = f"EXAMPLES, CONF = {str(EXAMPLES)!r}, {str(EXAMPLES / 'conf')!r}\n"
        (work / "dsconf_app.py").write_text(paths + DSCONF_APP)
        (work / "plain.py").write_text(PLAIN_APP)
        run_dir, out = work / "run", work / "result.json"
        training = [f"training_args.max_steps={args.steps}", "training_args.logging_steps=1000"]
        dsconf_cmd = [sys.executable, "dsconf_app.py", f"dist.nproc_per_node={args.ranks}", *training,
                      f"hydra.run.dir={run_dir}", *args.overrides]
        timed(dsconf_cmd, work, out)  # warms the file cache and writes the ds_config.json both run
        shutil.copy(run_dir / "ds_config.json", work / "ds_config.json")
        from omegaconf import OmegaConf

        from dsconf.composition import compose_config

        cfg = compose_config(training, config_dir=str(EXAMPLES / "conf"), config_name="hf_trainer")
        spec = {key: OmegaConf.to_container(cfg[key]) for key in ("model", "data")}
        spec["training_args"] = {**OmegaConf.to_container(cfg.training_args), "output_dir": str(work / "plain-out")}
        (work / "plain.json").write_text(json.dumps(spec))
        torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
        plain_cmd = [torchrun, "--standalone", "--nproc_per_node", str(args.ranks), "plain.py"]
        timed(plain_cmd, work, out)

        clean: Dict[str, List[float]] = {"samples/s": [], "time to first step": []}
        every: Dict[str, List[float]] = {"samples/s": [], "time to first step": []}
        absolute: Dict[str, List[float]] = {"dsconf first step s": [], "torchrun first step s": [],
                                            "dsconf samples/s": [], "torchrun samples/s": []}
        index = 0
        while len(clean["samples/s"]) < args.rounds and index < 3 * args.rounds:
            order = [("dsconf", dsconf_cmd), ("torchrun", plain_cmd)]
            results = dict((name, timed(cmd, work, out)) for name, cmd in (order if index % 2 == 0 else order[::-1]))
            index += 1
            ratio = {"samples/s": results["dsconf"]["samples_per_second"] / results["torchrun"]["samples_per_second"],
                     "time to first step": results["dsconf"]["first_step"] / results["torchrun"]["first_step"]}
            stolen = max(results["dsconf"]["steal"], results["torchrun"]["steal"])
            is_clean = stolen <= args.max_steal
            print(f"round {index}: samples/s {ratio['samples/s']:.3f}x, first step {ratio['time to first step']:.3f}x, "
                  f"steal {100 * stolen:.1f} %" + ("" if is_clean else " (rerun)"), flush=True)
            for name, value in ratio.items():
                every[name].append(value)
                if is_clean:
                    clean[name].append(value)
            if is_clean:
                for name in ("dsconf", "torchrun"):
                    absolute[f"{name} first step s"].append(results[name]["first_step"])
                    absolute[f"{name} samples/s"].append(results[name]["samples_per_second"])
        print(f"HF Trainer, dsconf / torchrun: {args.ranks} ranks, {args.steps} steps, {os.cpu_count()} CPUs; "
              f"{len(clean['samples/s'])} clean rounds (steal <= {100 * args.max_steal:g} %) of {index}")
        for name in clean:
            if clean[name]:
                print(f"{name:<22} {spread(clean[name])}")
            print(f"{name + ' (every round)':<22} {spread(every[name])}")
        for name, values in absolute.items():
            if values:
                print(f"  {name:<22} median {statistics.median(values):.2f}")
        print("goals: samples/s >= 0.98x; time to first step <= 1.0x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
