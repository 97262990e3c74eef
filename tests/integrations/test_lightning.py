"""What dsconf hands Lightning: the job's dict, minus the keys Lightning refuses in it and takes as Trainer
arguments instead (it raises "Do not set gradient_accumulation_steps in the DeepSpeed config"), and the job's
devices and nodes."""

from __future__ import annotations

import pytest
from optional_packages import requires

from dsconf.composition import compose
from dsconf.integrations.lightning import trainer_kwargs

pytestmark = requires("lightning", "lightning is not installed")


@pytest.mark.parametrize("precision, expected", [("fp32", "32-true"), ("bf16", "bf16-mixed"), ("fp16", "16-mixed")])
def test_trainer_kwargs_move_what_lightning_owns(precision, expected, monkeypatch):
    from lightning.pytorch.strategies import DeepSpeedStrategy

    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    ds = compose([f"precision={precision}", "deepspeed.train_micro_batch_size_per_gpu=2",
                  "deepspeed.gradient_accumulation_steps=3"], world_size=8)
    kwargs = trainer_kwargs(dict(ds))
    assert kwargs["accumulate_grad_batches"] == 3 and kwargs["precision"] == expected
    assert kwargs["devices"] == 4 and kwargs["num_nodes"] == 2
    strategy = kwargs["strategy"]
    assert isinstance(strategy, DeepSpeedStrategy)
    assert "gradient_accumulation_steps" not in strategy.config
    assert {**strategy.config, "gradient_accumulation_steps": 3} == ds  # Lightning puts it back from the Trainer
