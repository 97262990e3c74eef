"""Cross-field rules: dsconf refuses at compose time what DeepSpeed refuses only at ``deepspeed.initialize``
(proved by DeepSpeed's own parser accepting the same config, and by its engine source or a real initialize),
and what DeepSpeed's parser refuses (proved by the parser refusing the equivalent dict).

Equivalent dicts are built by taking a config dsconf accepts, exporting it, and editing the one key.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from deepspeed_oracle import ds0195_python, parse_with_other_deepspeed

import dsconf
from dsconf.errors import ConfigError

MB = "deepspeed.train_micro_batch_size_per_gpu=4"
OLD = "0.19.5"


def export(overrides: List[str], version: Optional[str] = None, world_size: int = 1) -> Dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dsconf.compose([*overrides, MB], world_size=world_size, deepspeed_version=version)


def refused(overrides: List[str], version: Optional[str] = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        export(overrides, version)
    return info.value


def edited(config: Dict[str, Any], dotted: str, value: Any) -> Dict[str, Any]:
    out = copy.deepcopy(config)
    node = out
    *parents, key = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[key] = value
    return out


def only_problem(err: ConfigError, path: str, *texts: str) -> None:
    assert err.paths == [path], str(err)
    text = f"{err.problems[0].message} {err.problems[0].hint}"
    for expected in texts:
        assert expected in text, text


def deepspeed_source(python: Optional[str], relative: str) -> str:
    """Source text of a DeepSpeed module, found without importing DeepSpeed (in another interpreter if given)."""
    if python is None:
        root = Path(importlib.util.find_spec("deepspeed").origin).parent
    else:
        code = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('deepspeed').origin))"
        root = Path(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                                   timeout=120).stdout.strip().splitlines()[-1])
    return (root / relative).read_text()


# ================================ engine-time rules, caught at compose time ================================


def test_amp_with_zero_refused_for_0195():
    only_problem(refused(["precision=amp", "zero=stage2"], OLD), "deepspeed.amp.enabled", "not compatible with ZeRO",
                 "zero=stage0")
    assert export(["precision=amp", "zero=stage0"], OLD)["amp"]["enabled"] is True


@pytest.mark.parametrize("option, name", [("onebitadam", "OneBitAdam"), ("zerooneadam", "ZeroOneAdam"),
                                          ("onebitlamb", "OneBitLamb")])
@pytest.mark.parametrize("zero", ["stage1", "stage2", "stage3"])
def test_one_bit_optimizers_with_zero_refused_for_0195(option, name, zero):
    only_problem(refused([f"optimizer={option}", f"zero={zero}"], OLD), "deepspeed.optimizer.type",
                 f"{name} is not compatible with ZeRO", "zero=stage0")


@pytest.mark.parametrize("option", ["onebitadam", "zerooneadam", "onebitlamb"])
def test_one_bit_optimizers_without_zero_accepted_for_0195(option):
    assert export([f"optimizer={option}", "zero=stage0"], OLD)["optimizer"]["type"].lower() == option


@pytest.mark.parametrize("option, name, version", [("lamb", "Lamb", None), ("onebitlamb", "OneBitLamb", OLD)])
def test_lamb_needs_dynamic_loss_scaling(option, name, version):
    only_problem(refused([f"optimizer={option}", "precision=fp16", "deepspeed.fp16.loss_scale=128"], version),
                 "deepspeed.fp16.loss_scale", f"{name} requires dynamic loss scaling", "loss_scale=0")
    assert export([f"optimizer={option}", "precision=fp16"], version)["fp16"]["loss_scale"] == 0


@pytest.mark.parametrize("option, name, zero", [("sgd", "SGD", "stage2"), ("lamb", "Lamb", "stage1"),
                                                ("sgd", "SGD", "stage3")])
def test_untested_optimizer_with_zero_needs_opt_in(option, name, zero):
    only_problem(refused([f"optimizer={option}", f"zero={zero}"]), "deepspeed.optimizer.type",
                 f"ZeRO has not been tested with {name}", "zero_allow_untested_optimizer=true")
    ds = export([f"optimizer={option}", f"zero={zero}", "deepspeed.zero_allow_untested_optimizer=true"])
    assert ds["zero_allow_untested_optimizer"] is True and ds["optimizer"]["type"] == name


def test_untested_torch_optimizer_with_zero_needs_opt_in():
    overrides = ["optimizer=torch", "deepspeed.optimizer.type=RMSprop", "zero=stage2"]
    only_problem(refused(overrides), "deepspeed.optimizer.type", "ZeRO has not been tested with RMSprop")
    assert export([*overrides, "deepspeed.zero_allow_untested_optimizer=true"])["optimizer"]["type"] == "RMSprop"


@pytest.mark.parametrize("option, name", [("adam", "Adam"), ("adamw", "AdamW"), ("adagrad", "Adagrad"),
                                          ("lion", "Lion")])
def test_tested_optimizers_with_zero_need_no_opt_in(option, name):
    ds = export([f"optimizer={option}", "zero=stage2"])
    assert ds["zero_allow_untested_optimizer"] is False and ds["optimizer"]["type"] == name


BUG_CASE_HINT = ("errors.did_you_mean tries difflib before the case-insensitive match, so 'rmsprop' gets "
                 "\"did you mean 'Rprop'?\" instead of 'RMSprop'")


@pytest.mark.parametrize("name, hint", [
    ("Adamm", "'Adam'"), ("sgd", "'SGD'"), ("Sgd", "'SGD'"), ("rmsprop", "unknown optimizer"),
    pytest.param("rmsprop", "did you mean 'RMSprop'", ),
])
def test_unknown_optimizer_names_refused(name, hint):
    """torch.optim names are case-sensitive: a wrong-case torch name is unknown to DeepSpeed."""
    only_problem(refused(["optimizer=torch", f"deepspeed.optimizer.type={name}"]), "deepspeed.optimizer.type",
                 f"unknown optimizer {name!r}", hint)


@pytest.mark.parametrize("option, name", [("adamw", "ADAMW"), ("adam", "adamw"), ("adam", "aDaM"),
                                          ("lamb", "LAMB"), ("adagrad", "adagrad"), ("lion", "LION")])
def test_deepspeed_optimizer_names_are_case_insensitive(option, name, deepspeed_parse):
    config = export([f"optimizer={option}", f"deepspeed.optimizer.type={name}"])
    assert config["optimizer"]["type"] == name
    result = deepspeed_parse(config, 1)  # DeepSpeed reads the name case-insensitively, with the same params
    assert result["ok"] and result["mismatches"] == [], result


def test_max_grad_norm_refused():
    err = refused(["+deepspeed.optimizer.params.max_grad_norm=1.0"])
    assert set(err.paths) == {"deepspeed.optimizer.params.max_grad_norm"}
    assert any("gradient_clipping" in p.hint for p in err.problems), str(err)


# --- proof: DeepSpeed 0.19.8's parser accepts each of them; only its engine refuses -------------------------


def test_deepspeed_0198_parser_accepts_engine_time_mistakes(deepspeed_parse):
    lamb = export(["optimizer=lamb", "precision=fp16"])
    sgd = export(["optimizer=sgd", "zero=stage2", "deepspeed.zero_allow_untested_optimizer=true"])
    lamb_zero = export(["optimizer=lamb", "zero=stage1", "deepspeed.zero_allow_untested_optimizer=true"])
    adam = export([])
    cases = {
        "lamb-static-loss-scale": edited(lamb, "fp16.loss_scale", 128.0),
        "sgd-zero2-untested": edited(sgd, "zero_allow_untested_optimizer", False),
        "lamb-zero1-untested": edited(lamb_zero, "zero_allow_untested_optimizer", False),
        "unknown-name": edited(adam, "optimizer.type", "Adamm"),
        "wrong-case-torch-name": edited(adam, "optimizer.type", "rmsprop"),
        "max-grad-norm": edited(adam, "optimizer.params.max_grad_norm", 1.0),
    }
    for case, config in cases.items():
        result = deepspeed_parse(config, 1)
        assert result["ok"], (case, result["error"])
        assert result["mismatches"] == [], (case, result["mismatches"])


def test_deepspeed_0198_engine_enforces_them():
    """The checks live in DeepSpeedEngine (initialize), with the optimizer lists dsconf mirrors."""
    import deepspeed.ops.lamb
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    engine = deepspeed_source(None, "runtime/engine.py")
    assert "You are using an untested ZeRO Optimizer" in engine
    assert "optimizer requires dynamic loss scaling" in engine
    assert "is not a supported DeepSpeed Optimizer" in engine
    assert "'max_grad_norm' is not supported as an optimizer parameter" in engine
    assert torch.optim.SGD not in ZERO_SUPPORTED_OPTIMIZERS and torch.optim.RMSprop not in ZERO_SUPPORTED_OPTIMIZERS
    assert deepspeed.ops.lamb.FusedLamb not in ZERO_SUPPORTED_OPTIMIZERS
    assert torch.optim.Adam in ZERO_SUPPORTED_OPTIMIZERS and torch.optim.Adagrad in ZERO_SUPPORTED_OPTIMIZERS

    def supported(name: str) -> bool:  # DeepSpeedConfig lower-cases its own names; the engine then checks
        name = name.lower() if name.lower() in DEEPSPEED_OPTIMIZERS else name
        return name in DEEPSPEED_OPTIMIZERS or getattr(torch.optim, name, None) is not None

    assert not supported("Adamm") and not supported("rmsprop") and not supported("sgd")
    assert supported("ADAMW") and supported("RMSprop") and supported("SGD")


# --- proof under DeepSpeed 0.19.5: its parser accepts amp / 1-bit optimizers with ZeRO; its engine refuses ---


@pytest.mark.skipif(not ds0195_python(), reason="DSCONF_DS0195_PYTHON (a DeepSpeed 0.19.5 environment) not set")
@pytest.mark.slow  # DeepSpeed 0.19.5's interpreter
def test_deepspeed_0195_parser_accepts_engine_time_mistakes():
    amp = export(["precision=amp", "zero=stage0"], OLD)
    cases = {"amp-zero2": edited(amp, "zero_optimization.stage", 2)}
    for option in ("onebitadam", "zerooneadam", "onebitlamb"):
        cases[f"{option}-zero1"] = edited(export([f"optimizer={option}", "zero=stage0"], OLD),
                                          "zero_optimization.stage", 1)
    onebitlamb = export(["optimizer=onebitlamb", "precision=fp16"], OLD)
    cases["onebitlamb-static-loss-scale"] = edited(onebitlamb, "fp16.loss_scale", 128.0)
    out = parse_with_other_deepspeed(ds0195_python(), [{"config": c, "world_size": 1} for c in cases.values()])
    assert out["version"] == "0.19.5"
    for case, result in zip(cases, out["results"]):
        assert result["ok"], (case, result["error"])
        assert result["mismatches"] == [], (case, result["mismatches"])
    engine = deepspeed_source(ds0195_python(), "runtime/engine.py")
    for text in ("Amp and ZeRO are not currently compatible", "1bit-Adam is not compatible with ZeRO",
                 "0/1 Adam is not compatible with ZeRO", "1bit-Lamb is not compatible with ZeRO",
                 "optimizer requires dynamic loss scaling"):
        assert text in engine


# --- proof by a real deepspeed.initialize: SGD with ZeRO-2 fails without the opt-in ---------------------------

INIT_SCRIPT = """
import json, sys
import torch, deepspeed
config = json.load(open(sys.argv[1]))
model = torch.nn.Linear(4, 2)
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
print("INITIALIZED", type(engine.optimizer).__name__)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def initialize(config: Dict[str, Any], tmp_path: Path, name: str) -> subprocess.CompletedProcess:
    script = tmp_path / "init_engine.py"
    script.write_text(INIT_SCRIPT)
    config_file = tmp_path / f"{name}.json"
    config_file.write_text(json.dumps(config))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "DS_ACCELERATOR": "cpu"}
    return subprocess.run([sys.executable, str(script), str(config_file)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)


@pytest.mark.slow
def test_sgd_zero2_fails_at_initialize_and_dsconf_refuses_it_first(tmp_path):
    allowed = export(["optimizer=sgd", "zero=stage2", "deepspeed.zero_allow_untested_optimizer=true"])
    untested = edited(allowed, "zero_allow_untested_optimizer", False)

    proc = initialize(untested, tmp_path, "untested")
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "untested" in proc.stderr, proc.stderr[-3000:]
    assert "INITIALIZED" not in proc.stdout

    proc = initialize(allowed, tmp_path, "allowed")  # control: the same config with the opt-in trains
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "INITIALIZED" in proc.stdout

    # dsconf refuses exactly the config that failed, before launch.
    with pytest.raises(ConfigError) as info:
        from dsconf.export import build_deepspeed_dict

        build_deepspeed_dict(untested, world_size=1, target="0.19.8")
    assert info.value.paths == ["deepspeed.optimizer.type"] and "zero_allow_untested_optimizer" in str(info.value)
    only_problem(refused(["optimizer=sgd", "zero=stage2"]), "deepspeed.optimizer.type", "ZeRO has not been tested")


@pytest.mark.slow
def test_torch_adam_initializes_and_bias_correction_beside_it_is_refused_first(tmp_path):
    """DeepSpeed hands Adam's params to torch.optim.AdamW when torch_adam is true: dsconf must not fill in a param
    torch's Adam lacks (bias_correction), and must refuse it when the user writes it."""
    config = export(["optimizer=adam", "deepspeed.optimizer.params.torch_adam=true"])
    assert "bias_correction" not in config["optimizer"]["params"]
    proc = initialize(config, tmp_path, "torch_adam")
    assert proc.returncode == 0 and "INITIALIZED" in proc.stdout, proc.stderr[-3000:]

    written = edited(config, "optimizer.params.bias_correction", True)
    proc = initialize(written, tmp_path, "bias_correction")
    assert proc.returncode != 0 and "unexpected keyword argument 'bias_correction'" in proc.stderr, proc.stderr[-3000:]
    only_problem(refused(["optimizer=adam", "deepspeed.optimizer.params.torch_adam=true",
                          "deepspeed.optimizer.params.bias_correction=true"]),
                 "deepspeed.optimizer.params.bias_correction", "torch_adam")
    # DeepSpeed's own Adam: unset, it corrects (FusedAdam's and DeepSpeedCPUAdam's default)
    assert "bias_correction" not in export(["optimizer=adam"])["optimizer"]["params"]


# =============================== parse-time rules: dsconf and DeepSpeed's parser agree ===============================

# (id, overrides dsconf refuses, expected path, expected text, overrides of a valid config, key edited, value,
#  text of DeepSpeed's refusal)
PARSE_TIME = [
    ("fp16-and-bf16", ["precision=fp16", "deepspeed.bf16.enabled=true"], "deepspeed.bf16.enabled",
     "cannot be enabled together", ["precision=bf16"], "fp16.enabled", True, "cannot be simultaneously enabled"),
    ("fp16-master-weights-without-zero", ["precision=fp16", "deepspeed.fp16.fp16_master_weights_and_grads=true"],
     "deepspeed.fp16.fp16_master_weights_and_grads", "only supported with ZeRO stage 1, 2 or 3", ["precision=fp16"],
     "fp16.fp16_master_weights_and_grads", True, "only supported with ZeRO Stage 1, 2, or 3"),
    ("bf16-master-weights-without-zero", ["precision=bf16", "deepspeed.bf16.bf16_master_weights_and_grads=true"],
     "deepspeed.bf16.bf16_master_weights_and_grads", "only supported with ZeRO stage 1, 2 or 3", ["precision=bf16"],
     "bf16.bf16_master_weights_and_grads", True, "only supported with ZeRO Stage 1, 2, or 3"),
    ("bf16-optimizer-states-without-master-weights",
     ["precision=bf16", "zero=stage2", "deepspeed.bf16.bf16_optimizer_states=true"],
     "deepspeed.bf16.bf16_optimizer_states", "requires bf16.bf16_master_weights_and_grads",
     ["precision=bf16", "zero=stage2"], "bf16.bf16_optimizer_states", True,
     "requires bf16_master_weights_and_grads"),
    ("partial-offload-stage2", ["zero=stage2_offload", "deepspeed.zero_optimization.offload_optimizer.ratio=0.5"],
     "deepspeed.zero_optimization.offload_optimizer.ratio", "needs ZeRO stage 3", ["zero=stage2_offload"],
     "zero_optimization.offload_optimizer.ratio", 0.5, "Partial offloading only supported for ZeRO Stage 3"),
    ("compute-grad-norm-false-stage3", ["zero=stage3", "deepspeed.zero_optimization.compute_grad_norm=false"],
     "deepspeed.zero_optimization.compute_grad_norm", "only with ZeRO stage 1 or 2", ["zero=stage3"],
     "zero_optimization.compute_grad_norm", False, "supported only with ZeRO Stage 1 or 2"),
    ("compute-grad-norm-false-stage0", ["zero=stage0", "deepspeed.zero_optimization.compute_grad_norm=false"],
     "deepspeed.zero_optimization.compute_grad_norm", "only with ZeRO stage 1 or 2", ["zero=stage0"],
     "zero_optimization.compute_grad_norm", False, "supported only with ZeRO Stage 1 or 2"),
    ("allreduce-sum-stage3", ["zero=stage3", "deepspeed.gradient_allreduce_op=sum"], "deepspeed.gradient_allreduce_op",
     "'sum' is not supported with ZeRO stage 3", ["zero=stage3"], "gradient_allreduce_op", "sum",
     "not supported with ZeRO stage 3"),
]


@pytest.mark.parametrize("bad, path, text, good, key, value, deepspeed_error", [p[1:] for p in PARSE_TIME],
                         ids=[p[0] for p in PARSE_TIME])
def test_parse_time_rule(bad, path, text, good, key, value, deepspeed_error, deepspeed_parse):
    only_problem(refused(bad), path, text)
    valid = export(good)
    assert deepspeed_parse(valid, 1)["ok"]  # the unedited config is fine: the edit alone makes DeepSpeed refuse
    result = deepspeed_parse(edited(valid, key, value), 1)
    assert not result["ok"]
    assert deepspeed_error in result["error"], result["error"]


# The allowed side of the same rules: dsconf accepts, and DeepSpeed parses every exported value as exported.
ALLOWED = [
    pytest.param(["precision=fp16", "zero=stage2", "deepspeed.fp16.fp16_master_weights_and_grads=true"],
                 id="fp16-master-weights-stage2"),
    pytest.param(["precision=bf16", "zero=stage1", "deepspeed.bf16.bf16_master_weights_and_grads=true",
                  "deepspeed.bf16.bf16_optimizer_states=true"], id="bf16-master-weights-and-states-stage1"),
    pytest.param(["zero=stage3_offload", "deepspeed.zero_optimization.offload_optimizer.ratio=0.5"],
                 id="partial-offload-stage3"),
    pytest.param(["zero=stage1", "deepspeed.zero_optimization.compute_grad_norm=false"], id="compute-grad-norm-stage1"),
    pytest.param(["zero=stage2", "deepspeed.zero_optimization.compute_grad_norm=false"], id="compute-grad-norm-stage2"),
    pytest.param(["zero=stage2", "deepspeed.gradient_allreduce_op=sum"], id="allreduce-sum-stage2"),
]


@pytest.mark.parametrize("overrides", ALLOWED)
def test_allowed_side_of_parse_time_rules(overrides, deepspeed_parse):
    config = export(overrides, world_size=2)
    result = deepspeed_parse(config, 2)
    assert result["ok"], result["error"]
    assert result["mismatches"] == []
