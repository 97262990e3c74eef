"""Every section of the schema against DeepSpeed itself: the keys it reads, their names, defaults and types, and
the keys each version knows (0.19.8 installed; 0.19.5 in a second environment, through a subprocess).

DeepSpeed is the oracle in three ways: its pydantic models (fields, aliases, defaults, constraints), the
``FOO``/``FOO_DEFAULT`` pairs of its constants modules for sections it reads as plain dicts, and the keys its
parser actually reads, recorded by a dict that logs every key looked up in it.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import os
import pathlib
import subprocess
import sys
import typing
from typing import Any, Dict, List, Optional, Set, Tuple

import pytest
from deepspeed_oracle import ds0195_python, parse_with_other_deepspeed
from test_schema import schema_models

from dsconf.schema import (
    AioConfig,
    AutotuningConfig,
    CheckpointConfig,
    CheckpointWriterConfig,
    CommsLoggerConfig,
    DataEfficiencyConfig,
    DataTypesConfig,
    DeepSpeedConfig,
    EigenvalueConfig,
    ElasticityConfig,
    ExpertParallelConfig,
    FlopsProfilerConfig,
    LegacyCurriculumConfig,
    ModelInfoConfig,
    NebulaConfig,
    PipelineConfig,
    ProgressiveLayerDropConfig,
    TimersConfig,
    TrainingKeys,
    ZeroOptimizationConfig,
)
from dsconf.schema.checkpointing import (
    DATA_PARALLEL_UNITS,
    DTYPES,
    TAG_VALIDATION_MODES,
    WRITER_TYPES,
    ParallelWriteConfig,
)
from dsconf.schema.data_efficiency import (
    CurriculumLearningConfig,
    DataRoutingConfig,
    DataSamplingConfig,
    DynamicBatchingConfig,
    LayerTokenLRScheduleConfig,
    RandomLTDConfig,
)
from dsconf.schema.deepspeed import LOG_LEVELS
from dsconf.schema.introspect import default_of, fields_of, unwrap_optional
from dsconf.schema.removed import REMOVED_IN, CompressionTrainingConfig, QuantizeTrainingConfig
from dsconf.schema.sparse_attention import FixedSparsityConfig
from dsconf.versions import at_least

INSTALLED = "0.19.8"

# ---------------------------------------------------------------------------------------------------------------
# What a DeepSpeed version reads. The same code runs in-process (0.19.8) and under 0.19.5's interpreter.
# ---------------------------------------------------------------------------------------------------------------
FACTS_SCRIPT = r'''
import copy, importlib, json, os, sys
from unittest import mock

os.environ.setdefault("DS_ACCELERATOR", "cpu")


from deepspeed_oracle import RecordingDict  # the tests folder is on sys.path (conftest, or PYTHONPATH)


def parse(config):
    import deepspeed.runtime.config as ds_config
    with mock.patch.object(ds_config.dist, "get_world_size", return_value=1), \
            mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        return ds_config.DeepSpeedConfig(config)


def keys_read(template, extra=None):
    """{dotted path: sorted keys read} when DeepSpeedConfig parses ``template`` (plus ``extra`` as is)."""
    root = RecordingDict(template, passes_on_copies=False)
    dict.update(root, extra or {})
    parse(root)
    return root.keys_read_by_section()


def constant_pairs(module_name):
    """{CONST: [key, default]} for every CONST with a CONST_DEFAULT whose value is a string."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    names = vars(module)
    out = {}
    for name, default in names.items():
        base = name[:-len("_DEFAULT")]
        if name.endswith("_DEFAULT") and isinstance(names.get(base), str):
            try:
                json.dumps(default)
            except TypeError:
                default = repr(default)
            out[base] = [names[base], default]
    return out


def string_constants(module_name):
    module = importlib.import_module(module_name)
    return sorted({v for k, v in vars(module).items() if k.isupper() and isinstance(v, str)})


def model_fields(path):
    """{field: alias} of a pydantic model, or None where the version has no such class."""
    module, _, name = path.rpartition(".")
    try:
        model = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return {field: info.alias for field, info in model.model_fields.items()}


def facts(request):
    """Everything the test asks for, as JSON-able data."""
    import deepspeed
    import deepspeed.runtime.config as ds_config

    out = {"version": deepspeed.__version__,
           "top": keys_read({"train_batch_size": 1})[""],
           "removed_top": sorted(getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})),
           "removed_zero": sorted(getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {})),
           "models": {path: model_fields(path) for path in request["models"]},
           "pairs": {name: constant_pairs(name) for name in request["constants"]},
           "strings": {name: string_constants(name) for name in request["strings"]},
           "sections": {}, "refusals": [], "compression_techniques": None}
    try:
        from deepspeed.compression.config import get_compression_config
        out["compression_techniques"] = sorted(get_compression_config({}))
    except ImportError:
        pass  # removed in 0.19.8
    for config in request["parses"]:
        try:
            parse(config)
            out["refusals"].append(None)
        except Exception as err:
            out["refusals"].append(f"{type(err).__name__}: {err}")
    for name, (template, extra) in request["probes"].items():
        try:
            read = keys_read({"train_batch_size": 1, name: template}, extra)
        except Exception as err:  # a section this version refuses
            out["sections"][name] = f"{type(err).__name__}: {err}"
            continue
        out["sections"][name] = {path[len(name) + 1:]: keys for path, keys in read.items() if path.startswith(name)}
    return out


if __name__ == "__main__":
    json.dump(facts(json.load(sys.stdin)), sys.stdout)
'''

# Section -> (a section dict that makes DeepSpeedConfig read its keys, other top-level keys it needs)
PROBES: Dict[str, Tuple[dict, dict]] = {
    "aio": ({}, {}),
    "checkpoint": ({"parallel_write": {}, "writer": {}}, {}),
    "data_types": ({}, {}),
    "flops_profiler": ({}, {}),
    "autotuning": ({"model_info": {}}, {}),
    "timers": ({}, {}),
    "expert_parallel": ({"enabled": False}, {}),
    "data_efficiency": ({"data_sampling": {"curriculum_learning": {}, "dynamic_batching": {}},
                         "data_routing": {"random_ltd": {}}}, {}),
    # Removed in 0.19.8 (0.19.8 refuses them; 0.19.5 reads them)
    "nebula": ({}, {}),
    # 0.19.5 reads quantize_training only when MoQ is on, which it looks up (a level too high) in
    # compression_training.shared_parameters.enabled
    "quantize_training": ({}, {"compression_training": {"shared_parameters": {"enabled": True}}}),
}
# Sections whose every key DeepSpeedConfig reads while parsing (the others are read later, by the engine).
FULLY_PARSED = {"aio", "checkpoint", "data_types", "flops_profiler", "autotuning", "timers", "expert_parallel",
                "nebula", "quantize_training"}

CONSTANTS = ["deepspeed.runtime.constants", "deepspeed.profiling.constants", "deepspeed.runtime.swap_tensor.constants",
             "deepspeed.autotuning.constants", "deepspeed.comm.constants", "deepspeed.runtime.data_pipeline.constants",
             "deepspeed.runtime.model_checkpointing.constants", "deepspeed.nebula.constants",
             "deepspeed.elasticity.constants"]
STRINGS = ["deepspeed.runtime.data_pipeline.constants"]


def pydantic_sections() -> List[type]:
    return [m for m in schema_models() if getattr(m, "deepspeed_model", None)]


def _request() -> dict:
    return {"models": sorted({m.deepspeed_model for m in pydantic_sections()}), "constants": CONSTANTS,
            "strings": STRINGS, "probes": PROBES, "parses": [config for _, config in _zero_cases()]}


@pytest.fixture(scope="module")
def facts_0198() -> dict:
    namespace: Dict[str, Any] = {"__name__": "ds_facts"}
    exec(FACTS_SCRIPT, namespace)
    out = json.loads(json.dumps(namespace["facts"](json.loads(json.dumps(_request())))))
    assert out["version"] == INSTALLED, "these tests pin the installed DeepSpeed's facts"
    return out


@pytest.fixture(scope="module")
def facts_0195() -> dict:
    python = ds0195_python()
    if not python:
        pytest.skip("no DeepSpeed 0.19.5 environment (.venv-ds0195, or DSCONF_DS0195_PYTHON); CI always has it")
    tests_dir = str(pathlib.Path(__file__).resolve().parents[1])
    proc = subprocess.run([python, "-c", FACTS_SCRIPT], input=json.dumps(_request()), capture_output=True, text=True,
                          env={**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": tests_dir}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["version"] == "0.19.5"
    return out


# ---------------------------------------------------------------------------------------------------------------
# Helpers over the schema
# ---------------------------------------------------------------------------------------------------------------
def meta(model: type, name: str) -> typing.Mapping[str, Any]:
    return fields_of(model)[name][1].metadata


def known_in_installed(model: type, name: str) -> bool:
    until = meta(model, name).get("until")
    return not (until and at_least(INSTALLED, until))


def spellings(model: type, name: str) -> Set[str]:
    return {name, *meta(model, name).get("aliases", ())}


def model_of(tp: Any) -> Optional[type]:
    inner, _ = unwrap_optional(tp)
    return inner if dataclasses.is_dataclass(inner) else None


def model_at(root: type, path: str) -> type:
    cls = root
    for part in [p for p in path.split(".") if p]:
        sub = model_of(fields_of(cls)[part][0])
        assert sub is not None, f"{cls.__name__}.{part} is not a section"
        cls = sub
    return cls


def plain_defaults(model: type) -> dict:
    """The model's defaults as DeepSpeed would get them (nulls left out, sections recursively)."""
    out = {}
    for name, (_, field) in fields_of(model).items():
        value = default_of(field)
        if dataclasses.is_dataclass(value):
            value = plain_defaults(type(value))
        if value is not None:
            out[name] = value
    return out


def base_type(tp: Any) -> Any:
    """A coarse Python type of an annotation (None where it is a union of several)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return base_type(args[0]) if len(args) == 1 else None
    if origin is typing.Literal:
        return type(typing.get_args(tp)[0])
    if origin in (list, List) or tp is list:
        return list
    if origin in (dict, Dict) or tp is dict:
        return dict
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return int if issubclass(tp, int) else str
    if tp is pathlib.PurePath or tp is pathlib.Path:
        return str
    return tp


def value_choices(tp: Any) -> Optional[Set[Any]]:
    inner, _ = unwrap_optional(tp)
    if typing.get_origin(inner) is typing.Literal:
        return set(typing.get_args(inner))
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return {member.value for member in inner}
    return None


def json_settable(info: Any) -> bool:
    """Whether a pydantic field can be given in a JSON config (not a torch.dtype, process group, class tuple...)."""
    import torch

    inner, _ = unwrap_optional(info.annotation)
    return not info.exclude and inner not in (object, torch.dtype, tuple)


def ds_model(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def ds_default(info: Any) -> Any:
    from pydantic_core import PydanticUndefined

    value = info.default_factory() if info.default is PydanticUndefined and info.default_factory else info.default
    return getattr(value, "value", value)


# ---------------------------------------------------------------------------------------------------------------
# The top level
# ---------------------------------------------------------------------------------------------------------------
def test_recorder_survives_the_copy_deepspeed_parses(facts_0198):
    import copy

    from deepspeed_oracle import RecordingDict

    rec = RecordingDict({"a": 1, "s": {"x": 1}}, passes_on_copies=False)
    clone = copy.copy(rec)
    assert type(clone) is type(rec) and clone.get("b") is None and "b" in rec.read
    assert rec.keys_read_by_section() == {"": ["b"], "s": []}
    # managed_gradient_accumulation is read only from DeepSpeed's copy of the config
    assert "managed_gradient_accumulation" in facts_0198["top"]


# deepspeed.initialize reads keys of the dict before (and beside) DeepSpeedConfig: a real initialize on a tiny model,
# one rank on CPU, with a config that records every key looked up; the keys its branches read need their siblings
# (data_parallel_size is read only when sequence_parallel_size is present).
INITIALIZE_SCRIPT = r'''
import json, os, socket, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(port))
import torch, deepspeed
from deepspeed_oracle import RecordingDict

config = RecordingDict(json.loads(sys.argv[1]), passes_on_copies=False)
model = torch.nn.Linear(4, 4)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
engine.backward(engine(torch.randn(2, 4)).sum())
engine.step()
print("READ=" + json.dumps(config.keys_read_by_section()))
'''
INITIALIZE_CONFIG = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 1,
                     "data_parallel_size": 1, "tensor_parallel": {"autotp_size": 0},
                     "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}


@pytest.fixture(scope="module")
def initialize_reads() -> Dict[str, List[str]]:
    tests_dir = str(pathlib.Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", INITIALIZE_SCRIPT, json.dumps(INITIALIZE_CONFIG)], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("READ=")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("READ="):])


@pytest.mark.slow  # a real deepspeed.initialize
def test_keys_deepspeed_initialize_reads_are_in_the_schema(initialize_reads, facts_0198):
    outside_the_parser = set(initialize_reads[""]) - set(facts_0198["top"])
    assert "data_parallel_size" in outside_the_parser  # the recording sees what the parser never reads
    assert outside_the_parser - set(fields_of(DeepSpeedConfig)) == set()
    assert "autotp_size" in initialize_reads["tensor_parallel"]
    from dsconf.schema.parallelism import TensorParallelConfig

    assert set(initialize_reads["tensor_parallel"]) <= set(fields_of(TensorParallelConfig))


# Top-level keys deepspeed.initialize reads outside DeepSpeedConfig (held by the test above).
READ_BY_INITIALIZE = {"data_parallel_size"}


def test_top_level_keys_are_the_ones_deepspeed_reads(facts_0198):
    read = set(facts_0198["top"]) | {"elasticity"} | READ_BY_INITIALIZE  # elasticity: a separate path, older versions
    ours = set(fields_of(DeepSpeedConfig))
    assert read - ours == set(), "keys DeepSpeed reads that the schema does not model"
    dsconf_only = ours - read
    assert dsconf_only == {n for n in dsconf_only if meta(DeepSpeedConfig, n).get("legacy")}, \
        "top-level fields DeepSpeed never reads must be dsconf's legacy translations"
    assert dsconf_only == {"fp32_allreduce"}


@pytest.mark.slow  # facts_0195: DeepSpeed 0.19.5's interpreter
def test_top_level_since_matches_the_keys_0195_reads(facts_0198, facts_0195):
    # 0.19.8 looks up the removed keys only to refuse them; 0.19.5 never reads a top-level eigenvalue, and reads
    # quantize_training only when MoQ is on
    new = set(facts_0198["top"]) - set(facts_0195["top"]) - set(facts_0198["removed_top"])
    assert {n for n in fields_of(DeepSpeedConfig) if meta(DeepSpeedConfig, n).get("since") == "0.19.8"} == new
    assert set(facts_0195["top"]) - set(facts_0198["top"]) == set()


def test_new_top_level_sections_are_lazy():
    """Sections outside the core keys are null until written, and a dotted override can still reach them."""
    from omegaconf import OmegaConf

    core = {f.name for f in dataclasses.fields(TrainingKeys)}
    for name, (tp, field) in fields_of(DeepSpeedConfig).items():
        if name in core or model_of(tp) is None:
            continue
        assert default_of(field) is None, name
        assert typing.get_type_hints(DeepSpeedConfig)[name] is Any, f"{name}: annotate Any (see _field.section)"
    cfg = OmegaConf.structured(DeepSpeedConfig)
    OmegaConf.update(cfg, "tensorboard.enabled", True)
    OmegaConf.update(cfg, "zero_optimization.zenflow.topk_ratio", 0.2)
    assert cfg.tensorboard == {"enabled": True} and cfg.zero_optimization.zenflow == {"topk_ratio": 0.2}
    assert cfg.wandb is None


def test_top_level_defaults_match_deepspeed_constants(facts_0198):
    checked = 0
    for key, default in facts_0198["pairs"]["deepspeed.runtime.constants"].values():
        if key not in fields_of(TrainingKeys) or key in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                         "gradient_accumulation_steps"):
            continue
        assert default_of(fields_of(DeepSpeedConfig)[key][1]) == default, key
        checked += 1
    assert checked >= 15


def test_choices_are_deepspeeds():
    from deepspeed.runtime import constants as c
    from deepspeed.runtime.config import DtypeEnum
    from deepspeed.runtime.model_checkpointing import constants as mc
    from deepspeed.utils.logging import log_levels

    assert LOG_LEVELS == list(log_levels)
    assert TAG_VALIDATION_MODES == [m.lower() for m in c.CHECKPOINT_TAG_VALIDATION_MODES]
    assert TAG_VALIDATION_MODES == [m.lower() for m in mc.CHECKPOINT_TAG_VALIDATION_MODES]
    assert WRITER_TYPES == [t.lower() for t in mc.CHECKPOINT_WRITER_TYPES]
    assert DATA_PARALLEL_UNITS == [u.lower() for u in mc.CHECKPOINT_DATA_PARALLEL_UNITS]
    floats = {name for member in DtypeEnum if member is not DtypeEnum.int8 for name in member._all_values[1:]}
    assert set(DTYPES) == floats


# ---------------------------------------------------------------------------------------------------------------
# Sections DeepSpeed parses with pydantic models
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ours", pydantic_sections(), ids=lambda m: m.__name__)
def test_pydantic_section_is_deepspeeds_model(ours):
    """Same keys (aliases included), defaults, coarse types, enum/literal choices and range constraints."""
    theirs = ds_model(ours.deepspeed_model)
    fields = {n for n in fields_of(ours) if known_in_installed(ours, n)}
    matched = set()
    for name, info in theirs.model_fields.items():
        if not json_settable(info):
            continue
        wanted = {name} | ({info.alias} if info.alias else set())
        mine = [n for n in fields if spellings(ours, n) == wanted]
        assert len(mine) == 1, f"{ours.__name__}: DeepSpeed's {sorted(wanted)} is not modelled with all its spellings"
        (mine,) = mine
        matched.add(mine)
        tp, field = fields_of(ours)[mine]
        got, want = default_of(field), ds_default(info)
        if dataclasses.is_dataclass(got) or model_of(tp) is not None:
            pass  # a nested section: its own model is checked on its own
        elif field.metadata.get("legacy"):
            assert got is None, f"{mine}: a legacy key defaults to null (not written)"
        else:
            assert got == want and isinstance(got, bool) == isinstance(want, bool), \
                f"{ours.__name__}.{mine}: dsconf default {got!r} != DeepSpeed {want!r}"
        if model_of(tp) is None and base_type(info.annotation) is not None and base_type(tp) is not None:
            assert base_type(tp) is base_type(info.annotation), f"{ours.__name__}.{mine}: {tp} vs {info.annotation}"
        choices = value_choices(info.annotation)
        if choices is not None:
            assert set(field.metadata.get("choices") or ()) == choices, f"{ours.__name__}.{mine}: choices"
        for constraint in info.metadata:
            for bound in ("ge", "gt", "le", "lt"):
                if hasattr(constraint, bound):
                    # dsconf has no "lt": an exclusive upper bound is declared as le and said in the help
                    assert field.metadata.get("le" if bound == "lt" else bound) == getattr(constraint, bound), \
                        f"{ours.__name__}.{mine}: DeepSpeed's {bound}={getattr(constraint, bound)}"
    assert fields - matched == set(), f"{ours.__name__}: fields DeepSpeed {INSTALLED}'s model does not have"


@pytest.mark.parametrize("ours", pydantic_sections(), ids=lambda m: m.__name__)
@pytest.mark.slow  # facts_0195
def test_pydantic_section_versions(ours, facts_0198, facts_0195):
    """``since`` marks exactly the fields 0.19.5's model lacks, ``until`` exactly those 0.19.8's dropped."""
    new, old = facts_0198["models"][ours.deepspeed_model], facts_0195["models"][ours.deepspeed_model]
    assert new is not None and old is not None

    def known(fields: Dict[str, Optional[str]], name: str) -> bool:
        return bool(spellings(ours, name) & ({*fields} | {a for a in fields.values() if a}))

    for name in fields_of(ours):
        since, until = meta(ours, name).get("since"), meta(ours, name).get("until")
        assert known(new, name) == (until is None), f"{ours.__name__}.{name}: until={until}"
        assert known(old, name) == (since is None), f"{ours.__name__}.{name}: since={since}"


# ---------------------------------------------------------------------------------------------------------------
# Sections DeepSpeed reads as plain dicts
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("section", sorted(PROBES), ids=str)
@pytest.mark.slow  # facts_0195
def test_dict_section_keys_are_the_ones_deepspeed_reads(section, facts_0198, facts_0195):
    facts = facts_0195 if meta(DeepSpeedConfig, section).get("until") else facts_0198
    read = facts["sections"][section]
    assert isinstance(read, dict), read
    for path, keys in read.items():
        model = model_at(model_at(DeepSpeedConfig, section), path)
        ours = set(fields_of(model))
        assert set(keys) <= ours, f"{section}.{path}: DeepSpeed reads keys the schema lacks"
        if section in FULLY_PARSED:
            assert ours == set(keys), f"{section}.{path}: keys DeepSpeed does not read"


@pytest.mark.parametrize("section", sorted(s for s in PROBES if not meta(DeepSpeedConfig, s).get("until")), ids=str)
@pytest.mark.slow  # facts_0195
def test_dict_section_since_matches_0195(section, facts_0198, facts_0195):
    new, old = facts_0198["sections"][section], facts_0195["sections"][section]
    for path, keys in new.items():
        model = model_at(model_at(DeepSpeedConfig, section), path)
        added = set(keys) - set(old.get(path, ()))
        assert {n for n in keys if meta(model, n).get("since") == "0.19.8"} == added, f"{section}.{path}"


# (constants module, constant-name prefix -> model, whether the prefix's pairs are all of the model's keys)
PREFIXES = [
    ("deepspeed.profiling.constants", "FLOPS_PROFILER_", FlopsProfilerConfig, True),
    ("deepspeed.runtime.swap_tensor.constants", "AIO_", AioConfig, True),
    ("deepspeed.autotuning.constants", "AUTOTUNING_", AutotuningConfig, True),
    ("deepspeed.autotuning.constants", "MODEL_INFO_", ModelInfoConfig, True),
    ("deepspeed.comm.constants", "COMMS_LOGGER_", CommsLoggerConfig, True),
    ("deepspeed.runtime.data_pipeline.constants", "DATA_EFFICIENCY_", DataEfficiencyConfig, False),
    ("deepspeed.runtime.data_pipeline.constants", "DATA_SAMPLING_", DataSamplingConfig, False),
    ("deepspeed.runtime.data_pipeline.constants", "CURRICULUM_LEARNING_", CurriculumLearningConfig, False),
    ("deepspeed.runtime.data_pipeline.constants", "DYNAMIC_BATCHING_", DynamicBatchingConfig, False),
    ("deepspeed.runtime.data_pipeline.constants", "DATA_ROUTING_", DataRoutingConfig, False),
    ("deepspeed.runtime.data_pipeline.constants", "RANDOM_LTD_LAYER_TOKEN_LR_", LayerTokenLRScheduleConfig, False),
    ("deepspeed.runtime.data_pipeline.constants", "RANDOM_LTD_", RandomLTDConfig, False),
]
# DeepSpeed 0.19.5 modules of the sections 0.19.8 removed
PREFIXES_0195 = [
    ("deepspeed.runtime.constants", "EIGENVALUE_", EigenvalueConfig, True),
    ("deepspeed.runtime.constants", "PLD_", ProgressiveLayerDropConfig, True),
    ("deepspeed.nebula.constants", "NEBULA_", NebulaConfig, True),
    ("deepspeed.elasticity.constants", "", ElasticityConfig, True),
]


def _check_prefix(facts: dict, module: str, prefix: str, model: type, complete: bool) -> None:
    pairs = facts["pairs"][module]
    longer = [p for _, p, _, _ in PREFIXES + PREFIXES_0195 if p != prefix and p.startswith(prefix)]
    pairs = {const: kd for const, kd in pairs.items()
             if const.startswith(prefix) and not any(const.startswith(p) for p in longer)}
    assert pairs, f"no {prefix}* constants in {module}"
    for const, (key, default) in pairs.items():
        assert key in fields_of(model), f"{const}={key!r} is not a key of {model.__name__}"
        got = default_of(fields_of(model)[key][1])
        assert got == default, f"{model.__name__}.{key}: dsconf {got!r} != DeepSpeed's {const}_DEFAULT {default!r}"
    if complete:
        sections = {n for n, (tp, _) in fields_of(model).items() if model_of(tp) is not None}
        assert set(fields_of(model)) - sections == {key for key, _ in pairs.values()}, model.__name__


@pytest.mark.parametrize("module, prefix, model, complete", PREFIXES, ids=[p[1] for p in PREFIXES])
def test_dict_section_defaults_are_deepspeed_constants(module, prefix, model, complete, facts_0198):
    _check_prefix(facts_0198, module, prefix, model, complete)


@pytest.mark.parametrize("module, prefix, model, complete", PREFIXES_0195, ids=[p[2].__name__ for p in PREFIXES_0195])
@pytest.mark.slow  # facts_0195
def test_removed_section_defaults_are_0195_constants(module, prefix, model, complete, facts_0195):
    _check_prefix(facts_0195, module, prefix, model, complete)


def test_data_efficiency_keys_are_deepspeed_constants(facts_0198):
    """Keys without a default in DeepSpeed are still its constants; and an empty section parses to our defaults."""
    from deepspeed.runtime.data_pipeline.config import get_data_efficiency_config

    strings = set(facts_0198["strings"]["deepspeed.runtime.data_pipeline.constants"])
    models = {m for m in schema_models() if m.__module__ == DataEfficiencyConfig.__module__}
    for model in models:
        assert set(fields_of(model)) <= strings, f"{model.__name__}: keys that are no DeepSpeed constant"

    def same(theirs: dict, model: type, path: str) -> None:
        for key, value in theirs.items():
            tp, field = fields_of(model)[key]
            if isinstance(value, dict):
                same(value, model_of(tp), f"{path}.{key}")
            else:
                assert default_of(field) == value, f"{path}.{key}"

    same(get_data_efficiency_config({"data_efficiency": {}}), DataEfficiencyConfig, "data_efficiency")


def test_checkpoint_defaults_are_deepspeeds(facts_0198):
    routes = [CheckpointConfig, CheckpointWriterConfig]
    for const, (key, default) in facts_0198["pairs"]["deepspeed.runtime.model_checkpointing.constants"].items():
        owners = [m for m in routes if key in fields_of(m)]
        assert len(owners) == 1, f"{const}={key!r}"
        assert default_of(fields_of(owners[0])[key][1]) == default, const
    engine_reads = [(CheckpointConfig, "load_universal"), (CheckpointConfig, "use_node_local_storage"),
                    (CheckpointConfig, "tag_validation"), (ParallelWriteConfig, "pipeline_stage")]
    runtime_pairs = {key: default for key, default in facts_0198["pairs"]["deepspeed.runtime.constants"].values()}
    for model, key in engine_reads:
        assert default_of(fields_of(model)[key][1]) == runtime_pairs[key], key
    for key in fields_of(DataTypesConfig):
        assert default_of(fields_of(DataTypesConfig)[key][1]) == runtime_pairs[key], key


def test_pipeline_defaults_are_deepspeeds():
    from deepspeed.runtime.config import get_pipeline_config

    ours = plain_defaults(PipelineConfig)
    assert ours == get_pipeline_config({})
    # use_reentrant is read by the pipeline engine (runtime/pipe/engine.py), null meaning true
    assert set(fields_of(PipelineConfig)) - set(ours) == {"use_reentrant"}


def test_expert_parallel_defaults_are_deepspeeds():
    from deepspeed.module_inject.auto_ep_config import AutoEPConfig

    theirs = {f.name: getattr(AutoEPConfig(), f.name) for f in dataclasses.fields(AutoEPConfig)
              if not f.name.startswith("_")}
    assert set(theirs) == set(fields_of(ExpertParallelConfig))
    for name, want in theirs.items():
        got = default_of(fields_of(ExpertParallelConfig)[name][1])
        # expert_w3: absent = the preset's (DeepSpeed's _UNSET); dsconf's null is "not written"
        assert got == want or name == "expert_w3" and got is None, name


def test_timers_are_deepspeeds():
    from deepspeed.utils.config import TIMERS, TIMERS_THROUGHPUT

    assert TIMERS == "timers" and set(fields_of(TimersConfig)) == {TIMERS_THROUGHPUT}


@pytest.mark.slow  # facts_0195
def test_removed_0195_sections_read_as_in_0195(facts_0195):
    from deepspeed.runtime.data_pipeline.constants import (
        CURRICULUM_LEARNING_MAX_DIFFICULTY,
        CURRICULUM_LEARNING_MIN_DIFFICULTY,
        CURRICULUM_LEARNING_SCHEDULE_CONFIG,
        CURRICULUM_LEARNING_SCHEDULE_TYPE,
    )

    # 0.19.5's legacy curriculum: the CurriculumScheduler keys, plus curriculum_type read by the engine
    assert set(fields_of(LegacyCurriculumConfig)) == {
        "enabled", "curriculum_type", CURRICULUM_LEARNING_MIN_DIFFICULTY, CURRICULUM_LEARNING_MAX_DIFFICULTY,
        CURRICULUM_LEARNING_SCHEDULE_TYPE, CURRICULUM_LEARNING_SCHEDULE_CONFIG}
    pairs = facts_0195["pairs"]["deepspeed.runtime.constants"]
    for const in ("GRAPH_HARVESTING", "SPARSE_GRADIENTS"):
        key, default = pairs[const]
        assert default is False and default_of(fields_of(DeepSpeedConfig)[key][1]) is None  # null = not written
    assert fields_of(QuantizeTrainingConfig).keys() == {"eigenvalue"}


@pytest.mark.slow  # facts_0195
def test_compression_training_techniques_are_0195s(facts_0195):
    assert set(facts_0195["compression_techniques"]) == set(fields_of(CompressionTrainingConfig))


# ---------------------------------------------------------------------------------------------------------------
# What DeepSpeed 0.19.8 removed
# ---------------------------------------------------------------------------------------------------------------
REMOVED_TOP = sorted(n for n in fields_of(DeepSpeedConfig) if meta(DeepSpeedConfig, n).get("until"))
REMOVED_ZERO = sorted(n for n in fields_of(ZeroOptimizationConfig) if meta(ZeroOptimizationConfig, n).get("until"))


def removed_sample(model: type, name: str) -> Any:
    """A value of a removed key that 0.19.5 accepts: the section's defaults, or true."""
    tp = fields_of(model)[name][0]
    if name == "sparse_attention":
        return plain_defaults(FixedSparsityConfig)
    if model_of(tp) is not None:
        return plain_defaults(model_of(tp))
    return {"mics_shard_size": -1, "mics_hierarchical_params_gather": False}.get(name, True)


def test_removed_keys_are_deepspeeds(facts_0198):
    assert REMOVED_TOP == facts_0198["removed_top"]
    assert REMOVED_ZERO == facts_0198["removed_zero"]
    for model, names in ((DeepSpeedConfig, REMOVED_TOP), (ZeroOptimizationConfig, REMOVED_ZERO)):
        for name in names:
            m = meta(model, name)
            assert m["until"] == REMOVED_IN == "0.19.8", name
            assert m.get("instead") and "\n" not in m["instead"], f"{name}: needs DeepSpeed's advice"
    curriculum = meta(DeepSpeedConfig, "curriculum_learning")["instead"]
    assert "data_efficiency.data_sampling.curriculum_learning" in curriculum
    amp = meta(DeepSpeedConfig, "amp")["instead"]
    assert all(word in amp for word in ("fp16", "bf16", "torch_autocast"))


def _top_cases() -> List[Tuple[str, dict]]:
    return [(name, {"train_batch_size": 1, name: removed_sample(DeepSpeedConfig, name)}) for name in REMOVED_TOP]


def _zero_cases() -> List[Tuple[str, dict]]:
    return [(f"zero_optimization.{name}",
             {"train_batch_size": 1, "zero_optimization": {name: removed_sample(ZeroOptimizationConfig, name)}})
            for name in REMOVED_ZERO]


def _cases() -> List[Tuple[str, dict]]:
    return _top_cases() + _zero_cases()


@pytest.mark.parametrize("name, config", _cases(), ids=[c[0] for c in _cases()])
def test_0198_refuses_removed_keys(name, config, deepspeed_parse):
    result = deepspeed_parse(config, 1)
    assert not result["ok"] and "removed" in result["error"], result


@pytest.mark.slow  # DeepSpeed 0.19.5's interpreter
def test_0195_accepts_removed_keys():
    python = ds0195_python()
    if not python:
        pytest.skip("no DeepSpeed 0.19.5 environment (.venv-ds0195, or DSCONF_DS0195_PYTHON); CI always has it")
    cases = _top_cases()
    out = parse_with_other_deepspeed(python, [{"config": config, "world_size": 1} for _, config in cases])
    assert out["version"] == "0.19.5"
    refused = {name: r["error"] for (name, _), r in zip(cases, out["results"]) if not r["ok"]}
    assert refused == {}


@pytest.mark.slow  # facts_0195
def test_0195_accepts_removed_zero_keys(facts_0195):
    # Parsed by FACTS_SCRIPT: the oracle's value comparison cannot read a dict-valued ZeRO key (zeropp_loco_param)
    refused = {name: r for (name, _), r in zip(_zero_cases(), facts_0195["refusals"]) if r is not None}
    assert refused == {}
