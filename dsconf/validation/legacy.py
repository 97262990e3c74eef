"""Legacy spellings DeepSpeed still reads, translated to their modern form with one warning each.

A legacy key given together with its replacement is a conflict, as it is for DeepSpeed.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, List

from dsconf.errors import ConfigWarning, Problem, join_path
from dsconf.schema.introspect import default_of, fields_of, unwrap_optional
from dsconf.schema.root import DEEPSPEED_NODE


class LegacyKeyWarning(ConfigWarning):
    """A deprecated DeepSpeed key was translated to its modern form."""


def _warn(message: str) -> None:
    warnings.warn(message, LegacyKeyWarning, stacklevel=4)


def _offload_set(block: Any) -> bool:
    return isinstance(block, dict) and block.get("device", "none") != "none"


# Legacy keys whose value changes shape when translated (below); every other ``legacy=`` field is a plain rename.
TRANSLATED = {"cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "fp32_allreduce", "bfloat16"}


def translate_legacy_forms(ds: Dict[str, Any], prefix: str = DEEPSPEED_NODE) -> None:
    """Old forms of a whole section, rewritten before the section is read: ``"zero_optimization": true``."""
    zero = ds.get("zero_optimization")
    if isinstance(zero, bool):
        ds["zero_optimization"] = {"stage": int(zero)}
        _warn(f"{prefix}.zero_optimization={str(zero).lower()} is DeepSpeed's old form; translated to "
              f"{prefix}.zero_optimization.stage={int(zero)}")


def rename_deprecated(value: Dict[str, Any], cls: type, path: str, problems: List[Problem]) -> None:
    """Deprecated spellings (``legacy=`` naming a sibling) renamed in place, recursively, one warning each."""
    for name, (tp, field) in fields_of(cls).items():
        new = field.metadata.get("legacy")
        if name in value and new and name not in TRANSLATED and value[name] is not None:
            # a composed config always holds the replacement, at its default unless the user set it
            replacement = fields_of(cls).get(new)
            default = default_of(replacement[1]) if replacement else None
            if value.get(new) is not None and value.get(new) != default:
                problems.append(Problem(join_path(path, name), f"deprecated key given together with {new}",
                                        f"keep only {join_path(path, new)}"))
                continue
            value[new] = value.pop(name)
            _warn(f"{join_path(path, name)} is deprecated; translated to {join_path(path, new)}")
        inner, _ = unwrap_optional(tp)
        if dataclasses.is_dataclass(inner) and isinstance(value.get(name), dict):
            rename_deprecated(value[name], inner, join_path(path, name), problems)


def translate_legacy(ds: Dict[str, Any], prefix: str = DEEPSPEED_NODE) -> List[Problem]:
    """Rewrite legacy keys of ``ds`` in place; return conflicts."""
    from dsconf.schema.deepspeed import DeepSpeedConfig

    problems: List[Problem] = []
    rename_deprecated(ds, DeepSpeedConfig, prefix, problems)
    zero = ds.get("zero_optimization")
    if isinstance(zero, dict):
        for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
            value = zero.pop(old, None)
            if value is None:
                continue
            path = f"{prefix}.zero_optimization.{old}"
            if _offload_set(zero.get(new)):
                problems.append(Problem(path, f"deprecated key given together with its replacement {new}",
                                        f"remove {old} and keep {new}"))
            elif value:
                zero[new] = {**(zero.get(new) or {}), "device": "cpu"}
                _warn(f"{path}=true is deprecated; translated to {prefix}.zero_optimization.{new}.device=cpu")
            else:
                _warn(f"{path}=false is deprecated and has no effect; dropped")
        if zero.get("cpu_offload_use_pin_memory") is not None:
            # DeepSpeed reads it but applies it nowhere (its replacement is set per offload block).
            zero.pop("cpu_offload_use_pin_memory")
            _warn(f"{prefix}.zero_optimization.cpu_offload_use_pin_memory is deprecated and ignored by DeepSpeed; "
                  f"dropped (set {prefix}.zero_optimization.offload_optimizer.pin_memory / offload_param.pin_memory)")

    fp32_allreduce = ds.pop("fp32_allreduce", None)
    if fp32_allreduce is not None:
        path = f"{prefix}.fp32_allreduce"
        current = ds.get("communication_data_type")
        if fp32_allreduce and current not in (None, "fp32"):
            problems.append(Problem(path, f"conflicts with communication_data_type={current!r}",
                                    "remove fp32_allreduce; communication_data_type replaces it"))
        elif fp32_allreduce:
            ds["communication_data_type"] = "fp32"
            _warn(f"{path} is ignored by DeepSpeed since 0.5.8; translated to "
                  f"{prefix}.communication_data_type=fp32")
        else:
            _warn(f"{path}=false is ignored by DeepSpeed since 0.5.8; dropped (fp32 all-reduce is not the default)")

    bfloat16 = ds.pop("bfloat16", None)
    if isinstance(bfloat16, dict):
        path = f"{prefix}.bfloat16"
        bf16 = ds.get("bf16") or {}
        if any(bf16.get(k) != v for k, v in bfloat16.items()) and bf16.get("enabled"):
            problems.append(Problem(path, "deprecated section given together with bf16",
                                    "keep only bf16 (precision=bf16)"))
        else:
            ds["bf16"] = {**bf16, **bfloat16}
            _warn(f"{path} is the deprecated name of bf16; translated to {prefix}.bf16")
    return problems
