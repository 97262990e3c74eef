"""OmegaConf resolvers: ``${dsconf.batch:}`` completes the batch triple for the job's data-parallel size.

A batch key is *given* when it holds a value; it is *derived* when it holds this resolver, null or "auto".
"""

from __future__ import annotations

from typing import Any, Optional

from dsconf.batch import BATCH_KEYS, derive_batch

RESOLVER = "dsconf.batch"
AUTO = "auto"


def given_batch_value(raw: Any) -> Optional[Any]:
    """The user's value of a batch key, or None when the key is to be derived."""
    if raw is None:
        return None
    if isinstance(raw, str) and (raw.strip().lower() == AUTO or raw.startswith("${" + RESOLVER)):
        return None
    return raw


def _resolve_batch(*, _node_: Any, _parent_: Any, _root_: Any) -> int:
    from dsconf.world import data_parallel_size

    raws = {key: given_batch_value(_parent_._get_node(key)._value()) for key in BATCH_KEYS}
    dist = _root_.get("dist") if hasattr(_root_, "get") else None
    sequence = _parent_.get("sequence_parallel_size", None)
    triple = derive_batch(*(raws[k] for k in BATCH_KEYS), data_parallel_size(dist, sequence_parallel_size=sequence))
    return getattr(triple, str(_node_._key()))


def register() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve_batch)


def complete_batch(cfg: Any) -> Any:
    """Make batch keys holding null or "auto" derive their value, so reading them gives the derived int."""
    from dsconf.schema.deepspeed import DERIVE_BATCH
    from dsconf.schema.root import DEEPSPEED_NODE

    node = cfg.get(DEEPSPEED_NODE) if hasattr(cfg, "get") else None
    if node is None:
        return cfg
    for key in BATCH_KEYS:
        if key in node and given_batch_value(node._get_node(key)._value()) is None:
            node[key] = DERIVE_BATCH
    return cfg
