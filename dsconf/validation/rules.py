"""Cross-field rules: combinations DeepSpeed refuses at parse time or only at ``deepspeed.initialize``, and the
few that dsconf refuses although DeepSpeed runs them (because DeepSpeed silently ignores what the user wrote).

Each rule reads the translated config dict and returns the problems it finds; ``RULES`` runs them all so a
user sees every problem at once. Each rule says who enforces it (``enforced_by``): DeepSpeed's parser
("parse"), DeepSpeed's engine ("initialize", with the text of its refusal), or dsconf alone (None, with
``why``). A dsconf rule that ``warns`` reports what it finds as a warning (the config runs as the user chose;
DeepSpeed ignores part of it): ``check_rules`` issues those as ``RuleWarning``. A value left as HF's "auto" is
unknown until HF fills it: rules skip it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from dsconf.errors import ConfigWarning, Problem
from dsconf.schema.introspect import default_of, fields_of
from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS, AdamParams, optimizer_params_model
from dsconf.schema.root import DEEPSPEED_NODE
from dsconf.schema.zero import OFFLOAD_BLOCKS, OffloadOptimizerConfig, OffloadParamConfig
from dsconf.validation.normalize import is_auto

P = DEEPSPEED_NODE
Check = Callable[[Dict[str, Any]], List[Problem]]


@dataclass(frozen=True)
class Rule:
    check: Check
    enforced_by: Optional[str]  # "parse", "initialize" or None (dsconf's own)
    deepspeed_says: str = ""  # initialize-time rules: DeepSpeed's own refusal text, as in its source
    why: str = ""  # dsconf's own rules: why dsconf refuses what DeepSpeed runs
    # The keys the rule reads, relative to the ``deepspeed`` node (a section: every key in it). Declared next to
    # the rule so that ``dsconf explain`` lists the rules of a key; tests/validation/test_rule_coverage.py holds
    # them against the paths each rule reports.
    keys: Tuple[str, ...] = ()
    warns: bool = False  # dsconf's own rules only: the config runs as the user chose it; say what DeepSpeed ignores

    @property
    def name(self) -> str:
        return self.check.__name__


class RuleWarning(ConfigWarning):
    """What a warning rule found: the config runs, but DeepSpeed ignores part of what it says."""


RULES: List[Rule] = []


def rule(enforced_by: Optional[str], *, keys: Tuple[str, ...], deepspeed_says: str = "", why: str = "",
         warns: bool = False) -> Callable[[Check], Check]:
    assert enforced_by in ("parse", "initialize", None) and (enforced_by or why)
    assert enforced_by != "initialize" or deepspeed_says
    assert not (warns and enforced_by), "only dsconf's own rules can be warnings: DeepSpeed refuses the others"
    assert keys, "declare the keys the rule reads"

    def register(check: Check) -> Check:
        RULES.append(Rule(check, enforced_by, deepspeed_says, why, tuple(keys), warns))
        return check

    return register


def _enabled(ds: Dict[str, Any], section: str) -> bool:
    block = ds.get(section)
    return isinstance(block, dict) and block.get("enabled", False) is True


def _stage(ds: Dict[str, Any]) -> Optional[int]:
    """The ZeRO stage, or None while it is unknown ("auto")."""
    zero = ds.get("zero_optimization") or {}
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    return stage if isinstance(stage, int) and not isinstance(stage, bool) else None


def _number(value: Any, default: float) -> float:
    """A numeric setting, or ``default`` while it is "auto"."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _optimizer_spec(ds: Dict[str, Any]):
    opt = ds.get("optimizer")
    if isinstance(opt, dict) and isinstance(opt.get("type"), str):
        return DEEPSPEED_OPTIMIZERS.get(opt["type"].lower()), opt["type"]
    return None, None


@rule("parse", keys=("fp16.enabled", "bf16.enabled", "amp.enabled"))
def one_precision(ds: Dict[str, Any]) -> List[Problem]:
    on = [s for s in ("fp16", "bf16", "amp") if _enabled(ds, s)]
    if len(on) > 1:
        return [Problem(f"{P}.{on[1]}.enabled", f"{' and '.join(on)} cannot be enabled together",
                        "pick one precision group: precision=fp16|bf16|amp")]
    return []


@rule("parse",
      keys=("fp16.fp16_master_weights_and_grads", "bf16.bf16_master_weights_and_grads", "bf16.bf16_optimizer_states",
            "zero_optimization.stage"))
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


@rule("parse", keys=("fp16.enabled", "fp16.loss_scale", "fp16.loss_scale_window", "fp16.min_loss_scale"))
def dynamic_loss_scale_settings(ds: Dict[str, Any]) -> List[Problem]:
    fp16 = ds.get("fp16") or {}
    problems = []
    if fp16.get("enabled") is True and fp16.get("loss_scale", 0) == 0:
        for key in ("loss_scale_window", "min_loss_scale"):
            if fp16.get(key, 1) <= 0:
                problems.append(Problem(f"{P}.fp16.{key}", "must be > 0 with dynamic loss scaling (loss_scale=0)"))
    return problems


@rule("parse", keys=("zero_optimization.offload_optimizer.ratio", "zero_optimization.stage"))
def partial_offload_needs_stage3(ds: Dict[str, Any]) -> List[Problem]:
    offload = (ds.get("zero_optimization") or {}).get("offload_optimizer") or {}
    if _number(offload.get("ratio"), 1.0) < 1.0 and _stage(ds) not in (3, None):
        return [Problem(f"{P}.zero_optimization.offload_optimizer.ratio",
                        "partial optimizer offload (ratio < 1) needs ZeRO stage 3", "choose zero=stage3")]
    return []


def _offloads(ds: Dict[str, Any], key: str) -> bool:
    device = ((ds.get("zero_optimization") or {}).get(key) or {}).get("device", "none")
    return device in ("cpu", "nvme")


@rule(None, why="DeepSpeed silently runs without optimizer offload at stage 0",
      keys=("zero_optimization.offload_optimizer.device", "zero_optimization.stage"))
def optimizer_offload_needs_zero(ds: Dict[str, Any]) -> List[Problem]:
    if _offloads(ds, "offload_optimizer") and _stage(ds) == 0:
        return [Problem(f"{P}.zero_optimization.offload_optimizer", "optimizer offload needs ZeRO stage >= 1",
                        "choose zero=stage1_offload|stage2_offload|stage3_offload")]
    return []


@rule(None, why="DeepSpeed silently keeps parameters on the GPU below stage 3",
      keys=("zero_optimization.offload_param.device", "zero_optimization.stage"))
def param_offload_needs_stage3(ds: Dict[str, Any]) -> List[Problem]:
    if _offloads(ds, "offload_param") and _stage(ds) not in (3, None):
        return [Problem(f"{P}.zero_optimization.offload_param", "parameter offload needs ZeRO stage 3",
                        "choose zero=stage3_offload")]
    return []


@rule(None, why="DeepSpeed fails only when it creates its swap files, inside deepspeed.initialize on every rank",
      keys=("zero_optimization.offload_optimizer.device", "zero_optimization.offload_optimizer.nvme_path",
            "zero_optimization.offload_param.device", "zero_optimization.offload_param.nvme_path"))
def nvme_offload_needs_path(ds: Dict[str, Any]) -> List[Problem]:
    zero = ds.get("zero_optimization") or {}
    return [Problem(f"{P}.zero_optimization.{key}.nvme_path", "is required with device=nvme")
            for key in OFFLOAD_BLOCKS if (zero.get(key) or {}).get("device") == "nvme"
            and not (zero.get(key) or {}).get("nvme_path")]


@rule(None, why="DeepSpeed silently ignores an offload block's settings while its device is 'none' (a warning: "
      "the user chose no offload, e.g. one side of a sweep over the device)",
      keys=("zero_optimization.offload_optimizer", "zero_optimization.offload_param"), warns=True)
def offload_settings_need_device(ds: Dict[str, Any]) -> List[Problem]:
    zero = ds.get("zero_optimization") or {}
    problems = []
    for key, model in (("offload_optimizer", OffloadOptimizerConfig), ("offload_param", OffloadParamConfig)):
        block = zero.get(key) or {}
        defaults = {name: default_of(field) for name, (_, field) in fields_of(model).items()}
        changed = [k for k, v in block.items() if k != "device" and k in defaults and v != defaults[k]
                   and not is_auto(v)]
        if block.get("device", "none") == "none" and changed:
            problems.append(Problem(f"{P}.zero_optimization.{key}.{changed[0]}",
                                    f"has no effect while {key}.device is 'none'",
                                    f"DeepSpeed ignores it; set {P}.zero_optimization.{key}.device=cpu or nvme to "
                                    "offload"))
    return problems


@rule("parse", keys=("zero_optimization.compute_grad_norm", "zero_optimization.stage"))
def compute_grad_norm_needs_stage_1_or_2(ds: Dict[str, Any]) -> List[Problem]:
    zero = ds.get("zero_optimization") or {}
    if zero.get("compute_grad_norm") is False and _stage(ds) not in (1, 2, None):
        return [Problem(f"{P}.zero_optimization.compute_grad_norm", "false is supported only with ZeRO stage 1 or 2")]
    return []


@rule("parse", keys=("gradient_allreduce_op", "zero_optimization.stage", "zero_optimization.zenflow",
                     "compile.deepcompile"))
def allreduce_sum_not_with_stage3(ds: Dict[str, Any]) -> List[Problem]:
    if str(ds.get("gradient_allreduce_op", "mean")).lower() != "sum":
        return []
    zero = ds.get("zero_optimization") or {}
    with_what = [what for what, on in (("ZeRO stage 3", _stage(ds) == 3),
                                       ("ZenFlow (zero_optimization.zenflow)", zero.get("zenflow") is not None),
                                       ("DeepCompile (compile.deepcompile)",
                                        (ds.get("compile") or {}).get("deepcompile") is True)) if on]
    if with_what:
        return [Problem(f"{P}.gradient_allreduce_op", f"'sum' is not supported with {' and '.join(with_what)}",
                        "use 'mean'")]
    return []


@rule("parse", keys=("expert_parallel.load_balance_coeff",))
def no_load_balance_coeff(ds: Dict[str, Any]) -> List[Problem]:
    coeff = (ds.get("expert_parallel") or {}).get("load_balance_coeff")
    if coeff is not None:
        return [Problem(f"{P}.expert_parallel.load_balance_coeff", f"{coeff!r} is not supported: DeepSpeed's AutoEP "
                        "has no auxiliary-loss-free load balancing", "remove it, or set it to null")]
    return []


@rule(None, why="deepspeed.initialize reads data_parallel_size only together with sequence_parallel_size (to build "
      "its data x sequence parallel device mesh); alone it is silently ignored",
      keys=("data_parallel_size", "sequence_parallel_size"))
def data_parallel_size_needs_sequence_parallel_size(ds: Dict[str, Any]) -> List[Problem]:
    if ds.get("data_parallel_size") is not None and ds.get("sequence_parallel_size") is None:
        return [Problem(f"{P}.data_parallel_size", "has no effect without sequence_parallel_size",
                        f"set {P}.sequence_parallel_size too, or remove it: without it the data-parallel size is "
                        "the world size over the parallel sizes")]
    return []


_SAMPLING = "data_efficiency.data_sampling"


def _sampling(ds: Dict[str, Any], block: str) -> Dict[str, Any]:
    sampling = (ds.get("data_efficiency") or {}).get("data_sampling") or {}
    return (sampling.get(block) or {}) if isinstance(sampling, dict) else {}


@rule("parse", keys=(f"{_SAMPLING}.curriculum_learning.enabled", f"{_SAMPLING}.curriculum_learning.curriculum_metrics"))
def curriculum_learning_needs_metrics(ds: Dict[str, Any]) -> List[Problem]:
    curriculum = _sampling(ds, "curriculum_learning")
    if curriculum.get("enabled") and "curriculum_metrics" not in curriculum:
        return [Problem(f"{P}.{_SAMPLING}.curriculum_learning.curriculum_metrics", "is required when curriculum "
                        "learning is enabled", "give {metric name: {index_to_sample_path, difficulty_type, ...}}")]
    return []


@rule("parse", keys=(f"{_SAMPLING}.dynamic_batching.enabled", f"{_SAMPLING}.dynamic_batching.max_tokens"))
def dynamic_batching_needs_max_tokens(ds: Dict[str, Any]) -> List[Problem]:
    batching = _sampling(ds, "dynamic_batching")
    if batching.get("enabled") and "max_tokens" not in batching:
        return [Problem(f"{P}.{_SAMPLING}.dynamic_batching.max_tokens", "is required when dynamic batching is enabled",
                        f"set {P}.{_SAMPLING}.dynamic_batching.max_tokens=<tokens per batch>")]
    return []


@rule("initialize", deepspeed_says="Amp and ZeRO are not currently compatible",
      keys=("amp.enabled", "zero_optimization.stage"))
def amp_without_zero(ds: Dict[str, Any]) -> List[Problem]:
    if _enabled(ds, "amp") and _stage(ds) > 0:
        return [Problem(f"{P}.amp.enabled", "Apex AMP is not compatible with ZeRO (DeepSpeed fails at initialize)",
                        "use precision=fp16 with ZeRO, or zero=stage0 with amp")]
    return []


@rule("initialize", deepspeed_says="is not compatible with ZeRO", keys=("optimizer.type", "zero_optimization.stage"))
def one_bit_optimizers_without_zero(ds: Dict[str, Any]) -> List[Problem]:
    spec, name = _optimizer_spec(ds)
    if spec is not None and spec.one_bit and _stage(ds) not in (0, None):
        return [Problem(f"{P}.optimizer.type", f"{name} is not compatible with ZeRO (DeepSpeed fails at initialize)",
                        "use zero=stage0, or Adam/AdamW with ZeRO")]
    return []


@rule("initialize", deepspeed_says="You are using an untested ZeRO Optimizer",
      keys=("optimizer.type", "zero_optimization.stage", "zero_allow_untested_optimizer"))
def untested_optimizer_with_zero(ds: Dict[str, Any]) -> List[Problem]:
    spec, name = _optimizer_spec(ds)
    if name is None or _stage(ds) in (0, None) or (spec is not None and spec.one_bit):
        return []
    tested = spec.zero_tested if spec is not None else False
    if not tested and ds.get("zero_allow_untested_optimizer", False) is not True:
        return [Problem(f"{P}.optimizer.type", f"ZeRO has not been tested with {name}; DeepSpeed refuses it at "
                        "initialize", f"set {P}.zero_allow_untested_optimizer=true, or use Adam/AdamW/Adagrad/Lion")]
    return []


@rule("initialize", deepspeed_says="'max_grad_norm' is not supported as an optimizer parameter",
      keys=("optimizer.params.max_grad_norm",))
def no_max_grad_norm_in_optimizer_params(ds: Dict[str, Any]) -> List[Problem]:
    params = (ds.get("optimizer") or {}).get("params") or {}
    if isinstance(params, dict) and "max_grad_norm" in params:
        return [Problem(f"{P}.optimizer.params.max_grad_norm", "DeepSpeed refuses max_grad_norm here (at initialize)",
                        f"use {P}.gradient_clipping instead")]
    return []


@rule("initialize", deepspeed_says="torch.optim.AdamW if adam_w_mode else torch.optim.Adam",
      keys=("optimizer.type", "optimizer.params.torch_adam", "optimizer.params.bias_correction"))
def no_bias_correction_with_torch_adam(ds: Dict[str, Any]) -> List[Problem]:
    """DeepSpeed hands every Adam param but torch_adam and adam_w_mode to torch's Adam(W), which has no
    bias_correction: a TypeError inside deepspeed.initialize on every rank."""
    params = (ds.get("optimizer") or {}).get("params")
    if not (isinstance(params, dict) and optimizer_params_model(ds["optimizer"].get("type")) is AdamParams):
        return []
    if params.get("torch_adam") is True and params.get("bias_correction") is not None:
        return [Problem(f"{P}.optimizer.params.bias_correction", "torch's Adam (torch_adam=true) has no "
                        "bias_correction (it always corrects)",
                        f"remove it, or set {P}.optimizer.params.torch_adam=false")]
    return []


@rule("initialize", deepspeed_says="optimizer requires dynamic loss scaling",
      keys=("optimizer.type", "fp16.loss_scale"))
def lamb_needs_dynamic_loss_scale(ds: Dict[str, Any]) -> List[Problem]:
    spec, name = _optimizer_spec(ds)
    if spec is not None and spec.needs_dynamic_loss_scale and (ds.get("fp16") or {}).get("loss_scale", 0) != 0:
        return [Problem(f"{P}.fp16.loss_scale", f"{name} requires dynamic loss scaling",
                        f"set {P}.fp16.loss_scale=0")]
    return []


@rule(None, why="DeepSpeed fails only when a sparse attention layer builds its layout, after launch",
      keys=("sparse_attention.global_block_indices", "sparse_attention.global_block_end_indices",
            "sparse_attention.horizontal_global_attention", "sparse_attention.attention"))
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


def check_rules(ds: Dict[str, Any], *, structure_ok: bool = True) -> List[Problem]:
    """Every refusing rule's problems; a warning rule's findings are issued as ``RuleWarning``. When the schema check
    already found problems, a rule that trips over a value of the wrong type has nothing to add; on a well-formed
    config a rule that raises is a bug and propagates."""
    problems: List[Problem] = []
    for each in RULES:
        try:
            found = each.check(ds)
        except (TypeError, AttributeError, KeyError, ValueError):
            if structure_ok:
                raise
            continue
        if each.warns:
            for problem in found:
                warnings.warn(str(problem), RuleWarning, stacklevel=2)
        else:
            problems.extend(found)
    return problems
