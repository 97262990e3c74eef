"""dsconf's optimizer params presets hold DeepSpeed's defaults: the defaults of the classes DeepSpeed builds for
each optimizer name (its fused GPU class and its CPU class for offload). DeepSpeed's parser keeps params as
given, so this is where a wrong preset default would show.
"""

from __future__ import annotations

import inspect

import pytest
from deepspeed_oracle import BUILT_OPTIMIZERS as BUILT

from dsconf.schema.introspect import default_of, fields_of
from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS

# dsconf keys DeepSpeed's engine consumes before calling the class (popped from params there).
ENGINE_KEYS = {"torch_adam", "adam_w_mode"}


def _signature(path: str) -> dict:
    import importlib

    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
            if k not in ("self", "params", "model_params")}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_params_defaults_are_those_of_the_classes_deepspeed_builds(name):
    ours = {k: default_of(f) for k, (_, f) in fields_of(DEEPSPEED_OPTIMIZERS[name.lower()].params).items()}
    for path in BUILT[name]:
        theirs = _signature(path)
        for key, value in ours.items():
            if key in ENGINE_KEYS or key not in theirs or value is None:  # None: not filled in, the class's own
                continue
            want = list(theirs[key]) if isinstance(theirs[key], tuple) else theirs[key]
            assert value == want, f"{name}.{key}: dsconf {value!r} != {path} {want!r}"
        # every key dsconf offers is one the class (or the engine) takes
        assert set(ours) - ENGINE_KEYS <= set(theirs) | {k for p in BUILT[name] for k in _signature(p)}, path
