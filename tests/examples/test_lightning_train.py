"""Lightning on dsconf's config, through dsconf's launcher.

Lightning's DeepSpeed strategy refuses CPUs ("The DeepSpeed strategy is only supported on CUDA GPUs"), so the real
DeepSpeed runs (ZeRO-2 in bf16 at 1 and 2 ranks: the loss falls, the engine runs ``ds_config.json``) are marked
``gpu``. On CPU: that refusal is still Lightning's (so the skip reason stays true), and Lightning under dsconf's
launcher takes torch elastic's environment and starts no process of its own (its DDP strategy, gloo, 2 ranks).
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from optional_packages import requires
from test_train import EXAMPLES, ok, output, read_json, run_example

pytestmark = requires("lightning", "lightning is not installed")
LIGHTNING_REFUSES_CPU = "The DeepSpeed strategy is only supported on CUDA GPUs"

CHECK_APP = """
import json, os, sys
sys.path.insert(0, {examples!r})
from lightning_train import train  # the example's own loop
import dsconf
from dsconf.launch import context

@dsconf.main(config_path={conf!r}, config_name="lightning_train", version_base=None)
def main(cfg):
    trainer, module = train(cfg)
    engine = trainer.strategy.model
    if context.rank() == 0:
        with open(os.path.join(context.job_dir(), "engine.json"), "w") as fh:
            json.dump({{"type": type(engine).__name__, "config": engine.config, "world_size": trainer.world_size,
                       "environment": type(trainer.strategy.cluster_environment).__name__,
                       "losses": module.losses}}, fh)

if __name__ == "__main__":
    main()
"""

DDP_APP = """
import json, os, sys
import lightning, torch
import dsconf
from dsconf.integrations.lightning import job_devices
from dsconf.launch import context

class Module(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, index):
        return self.layer(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def main(cfg):
    trainer = lightning.Trainer(strategy="ddp", accelerator="cpu", **job_devices(), max_steps=2, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4))
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=2))
    with open(os.path.join(context.job_dir(), f"rank{{context.rank()}}.json"), "w") as fh:
        json.dump({{"environment": type(trainer.strategy.cluster_environment).__name__,
                   "world_size": trainer.world_size, "global_rank": trainer.global_rank,
                   "external": trainer.strategy.cluster_environment.creates_processes_externally,
                   "pid": os.getpid(), "parent": os.getppid()}}, fh)

if __name__ == "__main__":
    main()
"""


def write_app(tmp_path, source: str):
    app = tmp_path / "check_app.py"
    app.write_text(textwrap.dedent(source.format(examples=str(EXAMPLES), conf=str(EXAMPLES / "conf"))))
    return app


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=f"Lightning: '{LIGHTNING_REFUSES_CPU} but `CPUAccelerator` "
                    "is used.'")
@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.slow  # trains
def test_lightning_runs_the_dict_dsconf_exported(ranks, tmp_path):
    if torch.cuda.device_count() < ranks:
        pytest.skip(f"needs {ranks} GPUs")
    run_dir = tmp_path / "run"
    ok(run_example(f"dist.nproc_per_node={ranks}", f"hydra.run.dir={run_dir}", cwd=tmp_path,
                   script=write_app(tmp_path, CHECK_APP), timeout=600))
    ds_config = read_json(run_dir / "ds_config.json")
    engine = json.loads((run_dir / "engine.json").read_text())
    assert engine["type"] == "DeepSpeedEngine" and engine["world_size"] == ranks
    assert engine["environment"] == "TorchElasticEnvironment"
    assert engine["config"] == ds_config
    losses = engine["losses"]
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5]), losses


@pytest.mark.slow  # runs the example
def test_lightning_still_refuses_deepspeed_on_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA host: the real runs above cover it")
    proc = run_example(f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, script=EXAMPLES / "lightning_train.py")
    assert proc.returncode == 1, output(proc)
    assert LIGHTNING_REFUSES_CPU in proc.stderr, output(proc)


@pytest.mark.slow
def test_lightning_takes_torch_elastics_environment_and_starts_no_process(tmp_path):
    run_dir = tmp_path / "run"
    ok(run_example("dist.nproc_per_node=2", "deepspeed.train_micro_batch_size_per_gpu=1", f"hydra.run.dir={run_dir}",
                   cwd=tmp_path, script=write_app(tmp_path, DDP_APP), timeout=300))
    ranks = [read_json(run_dir / f"rank{r}.json") for r in (0, 1)]
    assert [r["global_rank"] for r in ranks] == [0, 1]
    assert all(r["environment"] == "TorchElasticEnvironment" and r["world_size"] == 2 for r in ranks)
    assert all(r["external"] is True for r in ranks), ranks  # so Lightning's launcher starts no process
    assert ranks[0]["parent"] == ranks[1]["parent"]  # both started by the same torch elastic agent
