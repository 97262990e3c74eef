"""What dsconf hands Accelerate: Accelerate's precision and accumulation read from the job's dict."""

from __future__ import annotations

import pytest
from optional_packages import requires

from dsconf.composition import compose
from dsconf.integrations.accelerate import deepspeed_plugin, mixed_precision

pytestmark = requires("accelerate", "the hf extra is not installed")


@pytest.mark.parametrize("precision, expected", [("fp32", "no"), ("bf16", "bf16"), ("fp16", "fp16")])
def test_mixed_precision_follows_the_dict(precision, expected):
    ds = compose([f"precision={precision}", "deepspeed.train_micro_batch_size_per_gpu=2"], world_size=1)
    assert mixed_precision(ds) == expected


def test_the_plugin_holds_the_dict_with_nothing_left_to_fill():
    ds = compose(["zero=stage3", "deepspeed.train_micro_batch_size_per_gpu=2"], world_size=2)
    plugin = deepspeed_plugin(dict(ds))
    assert plugin.zero_stage == 3 and plugin.deepspeed_config["train_batch_size"] == 4
    assert plugin.deepspeed_config.pop("steps_per_print") == float("inf")  # Accelerate's, whatever the dict says
    assert plugin.deepspeed_config == {k: v for k, v in ds.items() if k != "steps_per_print"}
