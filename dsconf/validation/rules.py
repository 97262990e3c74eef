"""Cross-field rules: combinations DeepSpeed refuses at parse time or only at ``deepspeed.initialize``.

Each rule reads the translated config dict and returns the problems it finds; ``RULES`` runs them all so a
user sees every problem at once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List

from dsconf.errors import Problem
from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS
from dsconf.schema.zero import OffloadOptimizerConfig, OffloadParamConfig

P = "deepspeed"


def _enabled(ds: Dict[str, Any], section: str) -> bool:
    block = ds.get(section)
    return isinstance(block, dict) and bool(block.get("enabled", False))


def _stage(ds: Dict[str, Any]) -> int:
    zero = ds.get("zero_optimization") or {}
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    return stage if isinstance(stage, int) else 0


def _optimizer_spec(ds: Dict[str, Any]):
    opt = ds.get("optimizer")
    if isinstance(opt, dict) and isinstance(opt.get("type"), str):
        return DEEPSPEED_OPTIMIZERS.get(opt["type"].lower()), opt["type"]
    return None, None


def one_precision(ds: Dict[str, Any]) -> List[Problem]:
    on = [s for s in ("fp16", "bf16", "amp") if _enabled(ds, s)]
    if len(on) > 1:
        return [Problem(f"{P}.{on[1]}.enabled", f"{' and '.join(on)} cannot be enabled together",
                        "pick one precision group: precision=fp16|bf16|amp")]
    return []


def master_weights_need_zero(ds: Dict[str, Any]) -> List[Problem]:
    problems = []
    for section, key in (("fp16", "fp16_master_weights_and_grads"), ("bf16", "bf16_master_weights_and_grads"),
                         ("bf16", "bf16_optimizer_states")):
        if (ds.get(section) or {}).get(key) and _stage(ds) == 0:
            problems.append(Problem(f"{P}.{section}.{key}", "is only supported with ZeRO stage 1, 2 or 3",
                                    "choose zero=stage1|stage2|stage3"))
    bf16 = ds.get("bf16") or {}
    if bf16.get("bf16_optimizer_states") and not bf16.get("bf16_master_weights_and_grads"):
        problems.append(Problem(f"{P}.bf16.bf16_optimizer_states", "requires bf16.bf16_master_weights_and_grads",
                                f"set {P}.bf16.bf16_master_weights_and_grads=true"))
    return problems


def dynamic_loss_scale_settings(ds: Dict[str, Any]) -> List[Problem]:
    fp16 = ds.get("fp16") or {}
    problems = []
    if fp16.get("enabled") and fp16.get("loss_scale", 0) == 0:
        for key in ("loss_scale_window", "min_loss_scale"):
            if fp16.get(key, 1) <= 0:
                problems.append(Problem(f"{P}.fp16.{key}", "must be > 0 with dynamic loss scaling (loss_scale=0)"))
    return problems


def zero_stage_options(ds: Dict[str, Any]) -> List[Problem]:
    zero = ds.get("zero_optimization") or {}
    stage = _stage(ds)
    problems = []
    offload = zero.get("offload_optimizer") or {}
    if offload.get("ratio", 1.0) < 1.0 and stage != 3:
        problems.append(Problem(f"{P}.zero_optimization.offload_optimizer.ratio",
                                "partial optimizer offload (ratio < 1) needs ZeRO stage 3", "choose zero=stage3"))
    if offload.get("device", "none") != "none" and stage == 0:
        problems.append(Problem(f"{P}.zero_optimization.offload_optimizer", "optimizer offload needs ZeRO stage >= 1",
                                "choose zero=stage1_offload|stage2_offload|stage3_offload"))
    if (zero.get("offload_param") or {}).get("device", "none") != "none" and stage != 3:
        problems.append(Problem(f"{P}.zero_optimization.offload_param", "parameter offload needs ZeRO stage 3",
                                "choose zero=stage3_offload"))
    for key, model in (("offload_optimizer", OffloadOptimizerConfig), ("offload_param", OffloadParamConfig)):
        block = zero.get(key) or {}
        if block.get("device") == "nvme" and not block.get("nvme_path"):
            problems.append(Problem(f"{P}.zero_optimization.{key}.nvme_path", "is required with device=nvme"))
        defaults = dataclasses.asdict(model())
        changed = [k for k, v in block.items() if k != "device" and k in defaults and v != defaults[k]]
        if block.get("device", "none") == "none" and changed:
            problems.append(Problem(f"{P}.zero_optimization.{key}.{changed[0]}",
                                    f"has no effect while {key}.device is 'none'",
                                    f"set {P}.zero_optimization.{key}.device=cpu or nvme"))
    if zero.get("compute_grad_norm") is False and stage not in (1, 2):
        problems.append(Problem(f"{P}.zero_optimization.compute_grad_norm",
                                "false is supported only with ZeRO stage 1 or 2"))
    if str(ds.get("gradient_allreduce_op", "mean")).lower() == "sum" and stage == 3:
        problems.append(Problem(f"{P}.gradient_allreduce_op", "'sum' is not supported with ZeRO stage 3",
                                "use 'mean' or a lower stage"))
    return problems


def amp_without_zero(ds: Dict[str, Any]) -> List[Problem]:
    if _enabled(ds, "amp") and _stage(ds) > 0:
        return [Problem(f"{P}.amp.enabled", "Apex AMP is not compatible with ZeRO (DeepSpeed fails at initialize)",
                        "use precision=fp16 with ZeRO, or zero=stage0 with amp")]
    return []


def optimizer_with_zero(ds: Dict[str, Any]) -> List[Problem]:
    spec, name = _optimizer_spec(ds)
    stage = _stage(ds)
    if name is None or stage == 0:
        return []
    if spec is not None and spec.one_bit:
        return [Problem(f"{P}.optimizer.type", f"{name} is not compatible with ZeRO (DeepSpeed fails at initialize)",
                        "use zero=stage0, or Adam/AdamW with ZeRO")]
    tested = spec.zero_tested if spec is not None else False
    if not tested and not ds.get("zero_allow_untested_optimizer", False):
        return [Problem(f"{P}.optimizer.type", f"ZeRO has not been tested with {name}; DeepSpeed refuses it at "
                        "initialize", f"set {P}.zero_allow_untested_optimizer=true, or use Adam/AdamW/Adagrad/Lion")]
    return []


def lamb_needs_dynamic_loss_scale(ds: Dict[str, Any]) -> List[Problem]:
    spec, name = _optimizer_spec(ds)
    if spec is not None and spec.needs_dynamic_loss_scale and (ds.get("fp16") or {}).get("loss_scale", 0) != 0:
        return [Problem(f"{P}.fp16.loss_scale", f"{name} requires dynamic loss scaling",
                        f"set {P}.fp16.loss_scale=0")]
    return []


def sparse_attention_layout(ds: Dict[str, Any]) -> List[Problem]:
    sparse = ds.get("sparse_attention")
    if not isinstance(sparse, dict):
        return []
    problems = []
    ends = sparse.get("global_block_end_indices")
    starts = sparse.get("global_block_indices")
    if ends is not None and starts is not None and len(ends) != len(starts):
        problems.append(Problem(f"{P}.sparse_attention.global_block_end_indices",
                                f"has {len(ends)} entries but global_block_indices has {len(starts)}",
                                "give one end index per start index"))
    if sparse.get("horizontal_global_attention") and sparse.get("attention", "bidirectional") != "bidirectional":
        problems.append(Problem(f"{P}.sparse_attention.horizontal_global_attention",
                                "is valid only with attention='bidirectional'"))
    return problems


RULES: List[Callable[[Dict[str, Any]], List[Problem]]] = [
    one_precision,
    master_weights_need_zero,
    dynamic_loss_scale_settings,
    zero_stage_options,
    amp_without_zero,
    optimizer_with_zero,
    lamb_needs_dynamic_loss_scale,
    sparse_attention_layout,
]


def check_rules(ds: Dict[str, Any]) -> List[Problem]:
    """Every rule's problems. A rule that meets a value of the wrong type (already reported by the schema
    check) has nothing to add."""
    problems: List[Problem] = []
    for rule in RULES:
        try:
            problems.extend(rule(ds))
        except (TypeError, AttributeError, KeyError, ValueError):
            continue
    return problems
