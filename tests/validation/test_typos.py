"""A misspelt key in any section DeepSpeed reads is refused, naming the key it was meant to be.

The sections and their keys are walked from the schema itself, so a section added to the schema is covered
without a new test row.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from dsconf.errors import ConfigError
from dsconf.export import build_deepspeed_dict
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.introspect import fields_of, unwrap_optional
from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS
from dsconf.schema.scheduler import SCHEDULERS
from dsconf.schema.sparse_attention import SPARSITY_MODES
from dsconf.versions import LATEST_KNOWN

OLD = "0.19.5"


def sections() -> Iterator[Tuple[str, type, Dict[str, Any]]]:
    """(dotted path, model, a config placing an empty dict at that path) for every section of the schema."""
    def walk(cls: type, path: List[str], seen: Tuple[type, ...]) -> Iterator[Tuple[List[str], type]]:
        yield path, cls
        for name, (tp, _) in fields_of(cls).items():
            inner, _ = unwrap_optional(tp)
            if dataclasses.is_dataclass(inner) and inner not in seen:
                yield from walk(inner, [*path, name], (*seen, inner))

    for path, cls in walk(DeepSpeedConfig, [], ()):
        if path:
            yield ".".join(path), cls, _nested(path, {})
    for spec in DEEPSPEED_OPTIMIZERS.values():
        if spec.params is not None:
            yield f"optimizer.params[{spec.type}]", spec.params, {"optimizer": {"type": spec.type, "params": {}}}
    for name, model in SCHEDULERS.items():
        yield f"scheduler.params[{name}]", model, {"scheduler": {"type": name, "params": {}}}
    for mode, model in SPARSITY_MODES.items():
        yield f"sparse_attention[{mode}]", model, {"sparse_attention": {"mode": mode}}


def _nested(path: List[str], leaf: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = leaf
    for part in reversed(path):
        out = {part: out}
    return out


def _leaf(config: Dict[str, Any]) -> Dict[str, Any]:
    node = config
    while node and all(isinstance(v, dict) for v in node.values()) and len(node) == 1:
        node = next(iter(node.values()))
    if "params" in node:
        return node["params"]
    return node


def _removed_on(config: Dict[str, Any], cls: Any) -> bool:
    """Whether a key on the way to the section is one DeepSpeed 0.19.8 removed (then target 0.19.5)."""
    fields = fields_of(cls) if dataclasses.is_dataclass(cls) else {}
    for key, value in config.items():
        if key in fields:
            tp, field = fields[key]
            if field.metadata.get("until"):
                return True
            if isinstance(value, dict) and _removed_on(value, unwrap_optional(tp)[0]):
                return True
    return False


def typo_of(name: str, others: List[str]) -> str:
    """A one-letter slip of ``name`` that is no other key."""
    for i in range(len(name) - 2, 0, -1):
        candidate = name[:i] + name[i + 1:]  # a dropped letter
        if candidate not in others and candidate != name:
            return candidate
    return name + "x"


CASES = [(path, cls, config, name) for path, cls, config in sections() for name in fields_of(cls) if len(name) >= 4]


def test_every_section_is_covered():
    paths = {path.split("[")[0] for path, *_ in CASES}
    for section in ("zero_optimization.offload_optimizer", "fp16", "tensorboard", "flops_profiler", "aio",
                    "checkpoint", "comms_logger", "optimizer.params", "scheduler.params", "activation_checkpointing"):
        assert section in paths, section
    assert len(CASES) > 300


@pytest.mark.parametrize("path, cls, config, name", CASES, ids=[f"{c[0]}.{c[3]}" for c in CASES])
def test_misspelt_key_is_refused_with_the_intended_key(path, cls, config, name):
    import copy

    config = copy.deepcopy(config)
    typo = typo_of(name, list(fields_of(cls)))
    _leaf(config)[typo] = 1
    config.setdefault("train_batch_size", 8)
    removed = _removed_on(config, DeepSpeedConfig)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError) as info:
            build_deepspeed_dict(config, world_size=1, target=OLD if removed else LATEST_KNOWN)
    dotted = path.split("[")[0]
    typo_problems = [p for p in info.value.problems if p.path == f"deepspeed.{dotted}.{typo}"]
    assert typo_problems, str(info.value)
    assert "unknown key" in typo_problems[0].message
    assert f"'{name}'" in typo_problems[0].hint, typo_problems[0]
