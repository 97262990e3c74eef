"""DeepSpeed itself as the oracle: parse config dicts with ``DeepSpeedConfig`` at a given world size.

Used in-process for the installed DeepSpeed and as a script (``python deepspeed_oracle.py < cases.json``)
under another DeepSpeed version's interpreter. It imports nothing from dsconf.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List
from unittest import mock

os.environ.setdefault("DS_ACCELERATOR", "cpu")

STAGE3_ALIASES = {
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_model_persistence_threshold": "model_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save": "gather_16bit_weights_on_model_save",
    "stage3_module_granularity_threshold": "module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params": "use_all_reduce_for_fetch_params",
    "stage3_allgather_sequential": "allgather_sequential",
}
SAME_NAME = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "prescale_gradients", "gradient_predivide_factor", "gradient_allreduce_op", "steps_per_print",
             "wall_clock_breakdown", "dump_state", "gradient_clipping", "zero_allow_untested_optimizer",
             "zero_force_ds_cpu_optimizer"]
DTYPES = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16", "bfloat16": "torch.bfloat16",
          "float16": "torch.float16", "half": "torch.float16"}


def _plain(value: Any) -> Any:
    if hasattr(value, "value") and type(value).__module__ != "builtins" and not isinstance(value, (int, float)):
        return value.value  # enums
    if isinstance(value, int) and type(value) is not int and type(value) is not bool:
        return int(value)  # int enums such as ZeroStageEnum
    return value


def mismatches(given: Dict[str, Any], parsed: Any) -> List[str]:
    """Keys of ``given`` whose value differs from what DeepSpeed parsed."""
    out: List[str] = []

    def expect(path: str, want: Any, got: Any) -> None:
        got = _plain(got)
        if isinstance(want, float) or isinstance(got, float):
            same = want == got
        else:
            same = want == got and type(want) is type(got) if isinstance(want, bool) else want == got
        if not same:
            out.append(f"{path}: config {want!r} != DeepSpeed {got!r}")

    for key, value in given.items():
        if key in SAME_NAME:
            expect(key, value, getattr(parsed, key))
        elif key == "optimizer":
            name = parsed.optimizer_name
            expect("optimizer.type", value["type"].lower(), str(name).lower())
            expect("optimizer.params", value.get("params"), parsed.optimizer_params)
            if "legacy_fusion" in value:
                expect("optimizer.legacy_fusion", value["legacy_fusion"], parsed.optimizer_legacy_fusion)
        elif key == "scheduler":
            expect("scheduler.type", value["type"], parsed.scheduler_name)
            expect("scheduler.params", value.get("params"), parsed.scheduler_params)
        elif key == "communication_data_type":
            expect(key, DTYPES[value.lower()], str(parsed.communication_data_type))
        elif key == "sparse_gradients":
            expect(key, value, parsed.sparse_gradients_enabled)
        elif key in ("fp16", "bf16"):
            model = parsed.float16_config if key == "fp16" else parsed.bfloat16_config
            for k, v in value.items():
                expect(f"{key}.{k}", v, getattr(model, k))
        elif key == "amp":
            expect("amp.enabled", value["enabled"], parsed.amp_enabled)
            expect("amp.params", {k: v for k, v in value.items() if k != "enabled"}, parsed.amp_params)
        elif key == "torch_autocast":
            expect("torch_autocast.enabled", value.get("enabled", False), parsed.torch_autocast_enabled)
            if "dtype" in value:
                expect("torch_autocast.dtype", DTYPES.get(value["dtype"], value["dtype"]),
                       str(parsed.torch_autocast_dtype))
        elif key == "zero_optimization":
            for k, v in value.items():
                got = getattr(parsed.zero_config, STAGE3_ALIASES.get(k, k))
                if isinstance(v, dict):
                    for kk, vv in v.items():
                        expect(f"zero_optimization.{k}.{kk}", vv, getattr(got, kk))
                else:
                    expect(f"zero_optimization.{k}", v, got)
        elif key == "activation_checkpointing":
            for k, v in value.items():
                expect(f"activation_checkpointing.{k}", v, getattr(parsed.activation_checkpointing_config, k))
        elif key == "sparse_attention":
            expect("sparse_attention", value, parsed.sparse_attention)
        else:
            out.append(f"{key}: no known DeepSpeed attribute to compare")
    return out


def parse(config: Dict[str, Any], world_size: int) -> Dict[str, Any]:
    """{"ok": bool, "error": str, "triple": [...], "mismatches": [...]} for one config at one world size."""
    import deepspeed.runtime.config as ds_config

    with mock.patch.object(ds_config.dist, "get_world_size", return_value=world_size), \
            mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        try:
            parsed = ds_config.DeepSpeedConfig(copy.deepcopy(config))
        except Exception as err:  # DeepSpeed raises AssertionError, ValueError, pydantic errors...
            return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    return {"ok": True, "error": "",
            "triple": [parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu,
                       parsed.gradient_accumulation_steps],
            "mismatches": mismatches(config, parsed)}


ORACLE = Path(__file__).resolve()


def ds0195_python() -> str:
    """Interpreter of the second environment with DeepSpeed 0.19.5 (set up by scripts/setup.sh)."""
    default = Path(__file__).resolve().parents[1] / ".venv-ds0195" / "bin" / "python"
    return os.environ.get("DSCONF_DS0195_PYTHON") or (str(default) if default.exists() else "")


def parse_with_other_deepspeed(python: str, cases: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Run the oracle under another interpreter; cases are {"config": ..., "world_size": ...}."""
    proc = subprocess.run([python, str(ORACLE)], input=json.dumps(cases), capture_output=True, text=True,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def installed_version() -> str:
    import deepspeed

    return deepspeed.__version__


if __name__ == "__main__":
    cases = json.load(sys.stdin)
    json.dump({"version": installed_version(),
               "results": [parse(case["config"], case["world_size"]) for case in cases]}, sys.stdout)
