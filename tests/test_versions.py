"""The target DeepSpeed version decides what a config may contain.

Sections DeepSpeed 0.19.8 removed (amp, sparse_attention in every mode, sparse_gradients, the 1-bit optimizers) are
valid for 0.19.5 (DeepSpeed 0.19.5 parses dsconf's export to the same values) and refused for 0.19.8 with what to
use instead (DeepSpeed 0.19.8 refuses the 0.19.5 export too). Keys new in 0.19.8 are refused for 0.19.5 and left
out of a 0.19.5 export at their defaults. The target defaults to the installed DeepSpeed.
"""

from __future__ import annotations

import copy
import warnings
from importlib import metadata
from typing import Any, Dict, List, Optional

import pytest
from deepspeed_oracle import ds0195_python, parse_with_other_deepspeed

import dsconf
from dsconf import versions
from dsconf.errors import ConfigError

MB = "deepspeed.train_micro_batch_size_per_gpu=4"
OLD, NEW = "0.19.5", "0.19.8"
WORLD_SIZE = 2
MODES = ["dense", "fixed", "variable", "bigbird", "bslongformer"]


def export(overrides: List[str], version: Optional[str]) -> Dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dsconf.compose([*overrides, MB], world_size=WORLD_SIZE, deepspeed_version=version)


def refusal(overrides: List[str], version: Optional[str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        export(overrides, version)
    return info.value


# (id, overrides, path of the refusal for 0.19.8, what to use instead, exported key)
REMOVED = [
    ("amp", ["precision=amp"], "deepspeed.amp", "precision=fp16, precision=bf16 or precision=torch_autocast", "amp"),
    ("amp-disabled", ["precision=amp", "deepspeed.amp.enabled=false"], "deepspeed.amp", "precision=bf16", "amp"),
    *[(f"sparse-attention-{mode}", [f"sparse_attention={mode}"], "deepspeed.sparse_attention", "sparse_attention=none",
       "sparse_attention") for mode in MODES],
    ("sparse-gradients", ["+deepspeed.sparse_gradients=true"], "deepspeed.sparse_gradients", "remove it",
     "sparse_gradients"),
    ("sparse-gradients-false", ["deepspeed.sparse_gradients=false"], "deepspeed.sparse_gradients", "remove it",
     "sparse_gradients"),
]
REMOVED_IDS = [r[0] for r in REMOVED]


@pytest.mark.parametrize("overrides, path, instead, key", [r[1:] for r in REMOVED], ids=REMOVED_IDS)
def test_removed_section_refused_for_0198_with_what_to_use_instead(overrides, path, instead, key, deepspeed_parse):
    err = refusal(overrides, NEW)
    assert err.paths == [path], str(err)
    problem = err.problems[0]
    assert "was removed in DeepSpeed 0.19.8" in problem.message and "target is 0.19.8" in problem.message
    assert instead in problem.hint

    # The rule is DeepSpeed's: 0.19.8's own parser refuses what dsconf exports for 0.19.5.
    old_export = export(overrides, OLD)
    assert key in old_export
    result = deepspeed_parse(old_export, WORLD_SIZE)
    assert not result["ok"]
    assert "removed" in result["error"], result["error"]


@pytest.mark.parametrize("overrides, path, instead, key", [r[1:] for r in REMOVED], ids=REMOVED_IDS)
def test_removed_section_accepted_for_0195(overrides, path, instead, key):
    config = export(overrides, OLD)
    assert key in config
    assert "gradient_allreduce_op" not in config


def test_removed_section_values_for_0195():
    assert export(["precision=amp"], OLD)["amp"] == {"enabled": True, "opt_level": "O1"}
    assert export(["precision=amp", "deepspeed.amp.opt_level=O2"], OLD)["amp"]["opt_level"] == "O2"
    assert export(["+deepspeed.sparse_gradients=true"], OLD)["sparse_gradients"] is True
    for mode in MODES:
        assert export([f"sparse_attention={mode}"], OLD)["sparse_attention"]["mode"] == mode
    fixed = export(["sparse_attention=fixed", "deepspeed.sparse_attention.num_local_blocks=8"], OLD)
    assert fixed["sparse_attention"]["num_local_blocks"] == 8


@pytest.mark.parametrize("option, name", [("onebitadam", "OneBitAdam"), ("zerooneadam", "ZeroOneAdam"),
                                          ("onebitlamb", "OneBitLamb")])
def test_one_bit_optimizers_only_for_0195(option, name):
    assert export([f"optimizer={option}"], OLD)["optimizer"]["type"] == name
    err = refusal([f"optimizer={option}"], NEW)
    assert err.paths == ["deepspeed.optimizer.type"]
    assert f"{name} is not built into DeepSpeed 0.19.8" in err.problems[0].message
    assert "Adam, AdamW or Lamb" in err.problems[0].hint

    # DeepSpeed 0.19.8 knows no such optimizer: neither its own nor a torch.optim class (refused at initialize).
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    assert name.lower() not in DEEPSPEED_OPTIMIZERS and getattr(torch.optim, name, None) is None


# --- DeepSpeed 0.19.5 parses every 0.19.5 export to the exported values ------------------------------------------

SPARSE_COMPLETE = {  # modes with an optional list DeepSpeed reports as None when absent: give it a value too
    "variable": ["deepspeed.sparse_attention.global_block_end_indices=[1]"],
    "bslongformer": ["deepspeed.sparse_attention.global_block_end_indices=[1]"],
}


def old_cases() -> Dict[str, Dict[str, Any]]:
    cases = {"amp": export(["precision=amp"], OLD),
             "amp-o2": export(["precision=amp", "deepspeed.amp.opt_level=O2"], OLD),
             "sparse-gradients": export(["+deepspeed.sparse_gradients=true"], OLD),
             "defaults": export([], OLD),
             "zero2-defaults": export(["zero=stage2"], OLD)}
    for mode in MODES:
        cases[f"sparse-{mode}"] = export([f"sparse_attention={mode}", *SPARSE_COMPLETE.get(mode, [])], OLD)
    for mode in SPARSE_COMPLETE:  # the default (omitted) list is DeepSpeed's None
        default = export([f"sparse_attention={mode}"], OLD)
        assert "global_block_end_indices" not in default["sparse_attention"]
        default["sparse_attention"]["global_block_end_indices"] = None
        cases[f"sparse-{mode}-default"] = default
    for option in ("onebitadam", "zerooneadam", "onebitlamb"):
        cases[option] = export([f"optimizer={option}"], OLD)
    return cases


def new_only_cases() -> Dict[str, Dict[str, Any]]:
    """0.19.8 exports that use zero_optimization keys 0.19.5 does not know (its pydantic model refuses them)."""
    return {"compute-grad-norm": export(["zero=stage2", "deepspeed.zero_optimization.compute_grad_norm=false"], NEW),
            "parameter-alignment": export(["zero=stage2", "deepspeed.zero_optimization.parameter_alignment=true"], NEW)}


@pytest.mark.skipif(not ds0195_python(), reason="DSCONF_DS0195_PYTHON (a DeepSpeed 0.19.5 environment) not set")
@pytest.mark.slow  # DeepSpeed 0.19.5's interpreter
def test_deepspeed_0195_parses_0195_exports_and_refuses_new_keys():
    old, new = old_cases(), new_only_cases()
    out = parse_with_other_deepspeed(ds0195_python(), [{"config": c, "world_size": WORLD_SIZE}
                                                       for c in [*old.values(), *new.values()]])
    assert out["version"] == OLD
    results = dict(zip([*old, *new], out["results"]))
    for case in old:
        assert results[case]["ok"], (case, results[case]["error"])
        assert results[case]["mismatches"] == [], (case, results[case]["mismatches"])
        assert results[case]["triple"] == [8, 4, 1]
    for case in new:
        assert not results[case]["ok"], case
        assert "Extra inputs are not permitted" in results[case]["error"] or "extra" in results[case]["error"].lower()


# --- keys new in 0.19.8 -----------------------------------------------------------------------------------------

NEW_KEYS = [
    pytest.param(["zero=stage2", "deepspeed.zero_optimization.compute_grad_norm=false"],
                 "deepspeed.zero_optimization.compute_grad_norm", id="compute_grad_norm"),
    pytest.param(["deepspeed.gradient_allreduce_op=sum"], "deepspeed.gradient_allreduce_op",
                 id="gradient_allreduce_op"),
    pytest.param(["zero=stage2", "deepspeed.zero_optimization.parameter_alignment=true"],
                 "deepspeed.zero_optimization.parameter_alignment", id="parameter_alignment"),
]


@pytest.mark.parametrize("overrides, path", NEW_KEYS)
def test_new_key_refused_for_0195(overrides, path, deepspeed_parse):
    err = refusal(overrides, OLD)
    assert err.paths == [path]
    assert "needs DeepSpeed >= 0.19.8" in err.problems[0].message and "target is 0.19.5" in err.problems[0].message
    assert "deepspeed_version=0.19.8" in err.problems[0].hint
    config = export(overrides, NEW)  # valid for 0.19.8, and DeepSpeed 0.19.8 reads it as exported
    result = deepspeed_parse(config, WORLD_SIZE)
    assert result["ok"] and result["mismatches"] == [], result


def test_new_keys_at_defaults_omitted_from_0195_export():
    old = export(["zero=stage2"], OLD)
    assert "gradient_allreduce_op" not in old
    assert "compute_grad_norm" not in old["zero_optimization"]
    assert "parameter_alignment" not in old["zero_optimization"]
    explicit = export(["zero=stage2", "deepspeed.zero_optimization.compute_grad_norm=true",
                       "deepspeed.gradient_allreduce_op=mean",
                       "deepspeed.zero_optimization.parameter_alignment=false"], OLD)
    assert explicit == old  # the defaults spelled out are still valid for 0.19.5, and still left out

    new = export(["zero=stage2"], NEW)
    assert new["gradient_allreduce_op"] == "mean"
    assert new["zero_optimization"]["compute_grad_norm"] is True
    assert new["zero_optimization"]["parameter_alignment"] is False
    trimmed = copy.deepcopy(new)
    del trimmed["gradient_allreduce_op"], trimmed["disable_python_gc"]
    del trimmed["zero_optimization"]["compute_grad_norm"], trimmed["zero_optimization"]["parameter_alignment"]
    assert trimmed == old  # nothing else differs between the two targets for this config
    # ... and those are exactly the keys the schema marks as new in 0.19.8 that this config holds
    from dsconf.schema.deepspeed import DeepSpeedConfig
    from dsconf.schema.introspect import fields_of
    from dsconf.schema.zero import ZeroOptimizationConfig

    new_keys = {k for k, (_, f) in fields_of(DeepSpeedConfig).items() if f.metadata.get("since") == NEW} & set(new)
    new_keys |= {f"zero_optimization.{k}" for k, (_, f) in fields_of(ZeroOptimizationConfig).items()
                 if f.metadata.get("since") == NEW} & {f"zero_optimization.{k}" for k in new["zero_optimization"]}
    assert new_keys == {"gradient_allreduce_op", "disable_python_gc", "zero_optimization.compute_grad_norm",
                        "zero_optimization.parameter_alignment"}


# --- which version is targeted ------------------------------------------------------------------------------------


def test_target_defaults_to_the_installed_deepspeed():
    installed = metadata.version("deepspeed")
    assert installed.startswith("0.19.8")
    assert versions.target_version() == installed
    err = refusal(["precision=amp"], None)
    assert f"target is {installed}" in err.problems[0].message


def test_target_follows_whichever_deepspeed_is_installed(monkeypatch):
    monkeypatch.setattr(versions, "installed_deepspeed", lambda: "0.19.5")
    assert versions.target_version() == "0.19.5"
    assert export(["precision=amp"], None)["amp"]["enabled"] is True
    assert "gradient_allreduce_op" not in export([], None)
    monkeypatch.setattr(versions, "installed_deepspeed", lambda: None)
    assert versions.target_version() == versions.LATEST_KNOWN
    assert refusal(["precision=amp"], None).paths == ["deepspeed.amp"]


def test_target_set_by_override():
    config = export(["precision=amp", "deepspeed_version=0.19.5"], None)
    assert config["amp"]["enabled"] is True
    assert "deepspeed_version" not in config
    err = refusal(["deepspeed.gradient_allreduce_op=sum", "deepspeed_version=0.19.5"], None)
    assert "target is 0.19.5" in err.problems[0].message


def test_target_set_by_argument_wins_over_override():
    assert export(["precision=amp"], OLD)["amp"]["enabled"] is True
    err = refusal(["precision=amp", "deepspeed_version=0.19.5"], NEW)
    assert err.paths == ["deepspeed.amp"] and "target is 0.19.8" in err.problems[0].message
