"""``dsconf schema``: the JSON Schema editors use, held against ``dsconf validate`` with the ``jsonschema`` library.

- Every corpus file ``dsconf validate`` accepts is valid against the schema (for the installed DeepSpeed and 0.19.5).
- Mistakes generated from every field of the schema (an unknown key in each section, a wrong type, a null, a value
  outside the choices or the range, a key the target version does not know) are refused by both, at the same path;
  values generated the same way that validation accepts (defaults, choices, coerced spellings, "auto") are accepted
  by both. Cross-field rules are beyond a schema and are not compared.
- The schema for 0.19.5 accepts ``amp`` and ``sparse_attention``; the one for 0.19.8 refuses them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import typing
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import pytest
from jsonschema import Draft202012Validator
from test_cli import dsconf_script

from dsconf.batch import BATCH_KEYS
from dsconf.files import read_config_file
from dsconf.json_schema import json_schema
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.introspect import default_of, dynamic_model, fields_of, model_key, unwrap_optional
from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS, TORCH_OPTIMIZER_PARAMS
from dsconf.schema.scheduler import REQUIRED
from dsconf.schema.sparse_attention import SPARSITY_MODES
from dsconf.schema.zero import ZeroOptimizationConfig
from dsconf.validate_files import FileReport, check_config, has_auto, implied_world_size
from dsconf.versions import LATEST_KNOWN, known_in

CORPUS = Path(__file__).parent / "corpus"
CORPUS_FILES = sorted(p for p in CORPUS.iterdir() if p.suffix in (".json", ".hjson", ".yaml", ".yml"))
TARGETS = ("0.19.5", LATEST_KNOWN)
BASE = {"train_micro_batch_size_per_gpu": 1}  # the smallest file validation accepts
UNKNOWN = "zz_not_a_key"

# What validation reports about one key's name or value alone (validation.structure, and batch.py for the batch
# keys): what a schema states. Everything else it reports, the cross-field rules and the batch arithmetic, is beyond
# a schema.
STRUCTURAL = re.compile(r"^(unknown key|expected |must not be null$|must not be empty$|was removed in DeepSpeed|"
                        r"needs DeepSpeed >=|unknown sparsity mode|must be an integer, got|must be > 0, got|"
                        r"'auto' is not a value here|DeepSpeed refuses max_grad_norm)|"
                        r"( is not allowed| is out of range| is not a finite number)$| is not built into DeepSpeed")
# Structural problems only validation can find, and why.
BEYOND_THE_SCHEMA = {
    "unknown optimizer": "any torch.optim class is an optimizer: listing them would import torch (over a second)",
    "takes no argument": "a torch.optim class's arguments are its constructor's signature",
    "is required but has no value": "'???' is OmegaConf's mark for a missing value, not a value a file holds",
}


@pytest.fixture(scope="module")
def validators() -> Dict[str, Draft202012Validator]:
    return {target: Draft202012Validator(json_schema(target)) for target in TARGETS}


def schema_error_paths(validator: Draft202012Validator, config: Any) -> Set[str]:
    """The dotted paths the schema reports errors at. An unknown key (additionalProperties) is reported at its own
    path, as editors mark it, rather than at the object that holds it."""
    paths = set()
    for error in validator.iter_errors(config):
        where = [str(p) for p in error.absolute_path]
        if error.validator == "additionalProperties" and error.validator_value is False:
            paths.update(".".join([*where, str(k)]) for k in error.instance if k not in error.schema["properties"])
        else:
            paths.add(".".join(where))
    return paths


def validate(config: Dict[str, Any], target: str) -> FileReport:
    """``dsconf validate`` of a file holding ``config``, with --keep-auto when it has "auto" values (the schema is
    for files that go to HF Trainer/Accelerate too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return check_config(copy.deepcopy(config), keep_auto=has_auto(config), target=target)


def structural_paths(report: FileReport) -> Set[str]:
    return {p.path for p in report.problems if STRUCTURAL.search(p.message)
            and not any(k in p.message for k in BEYOND_THE_SCHEMA)}


# --- the schema itself and the command ---

@pytest.mark.parametrize("target", TARGETS)
def test_the_schema_is_a_valid_draft_2020_12_schema(target):
    schema = json_schema(target)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert target in schema["title"]


def test_the_default_target_is_the_installed_deepspeed():
    from dsconf.versions import installed_deepspeed

    assert json_schema() == json_schema(installed_deepspeed() or LATEST_KNOWN)


def test_descriptions_defaults_aliases_and_deprecations_come_from_the_fields():
    schema = json_schema(LATEST_KNOWN)
    zero = schema["$defs"]["ZeroOptimizationConfig"]["properties"]
    assert zero["stage"]["description"].startswith(fields_of(ZeroOptimizationConfig)["stage"][1].metadata["help"])
    assert zero["stage"]["default"] == 0
    checkpoints = schema["$defs"]["ActivationCheckpointingConfig"]["properties"]["number_checkpoints"]
    assert {k: checkpoints[k] for k in ("type", "minimum", "default")} == {"type": ["integer", "null"], "minimum": 1,
                                                                             "default": None}
    assert "Another spelling of stage3_prefetch_bucket_size" in zero["prefetch_bucket_size"]["description"]
    assert zero["cpu_offload"]["deprecated"] is True
    assert "offload_optimizer" in zero["cpu_offload"]["deprecationMessage"]
    assert schema["properties"]["amp"]["deprecated"] is True and "Apex AMP was removed" in \
        schema["properties"]["amp"]["deprecationMessage"]
    # "auto" where HF fills it says from what; where DeepSpeed drops it, which default DeepSpeed uses
    assert {"const": "auto", "description": "filled by HF from Accelerate: zero_stage"} in zero["stage"]["anyOf"]
    buffer_size = schema["$defs"]["OffloadParamConfig"]["properties"]["buffer_size"]
    assert "DeepSpeed uses its default 100000000" in buffer_size["description"]


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([dsconf_script(), *args], capture_output=True, text=True, cwd=cwd, env=dict(os.environ),
                          timeout=60)


def test_schema_command_writes_the_file_and_exits_0(tmp_path):
    proc = run(tmp_path, "schema", "--deepspeed-version", "0.19.5", "-o", "ds_config.schema.json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "ds_config.schema.json").read_text()) == json_schema("0.19.5")
    assert "ds_config.schema.json" in proc.stdout and not proc.stderr
    printed = run(tmp_path, "schema")  # no -o: the schema on stdout, for the installed DeepSpeed
    assert printed.returncode == 0 and json.loads(printed.stdout) == json_schema()


@pytest.mark.parametrize("version, says", [("banana", "'banana' is not a version"),
                                           ("0.18.0", "dsconf knows DeepSpeed 0.19.5 to")])
def test_an_unknown_version_is_a_one_line_error(tmp_path, version, says):
    proc = run(tmp_path, "schema", "--deepspeed-version", version, "-o", "out.json")
    assert proc.returncode == 2 and not (tmp_path / "out.json").exists()
    assert proc.stderr.startswith("dsconf: ") and says in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_a_newer_version_than_dsconf_knows_is_a_warning(tmp_path):
    proc = run(tmp_path, "schema", "--deepspeed-version", "9.0.0")
    assert proc.returncode == 0 and json.loads(proc.stdout)["title"] == "DeepSpeed config (DeepSpeed 9.0.0)"
    assert proc.stderr.startswith("dsconf: warning: ") and len(proc.stderr.splitlines()) == 1


# --- the target version ---

REMOVED_SECTIONS = {"amp": {"enabled": True, "opt_level": "O1"},
                    "sparse_attention": {"mode": "fixed", "block": 16, "num_local_blocks": 4}}


@pytest.mark.parametrize("key", sorted(REMOVED_SECTIONS))
def test_0195_accepts_amp_and_sparse_attention_and_0198_refuses_them(validators, key):
    config = {**BASE, key: REMOVED_SECTIONS[key]}
    assert validate(config, "0.19.5").ok and not schema_error_paths(validators["0.19.5"], config)
    assert not validate(config, "0.19.8").ok and schema_error_paths(validators["0.19.8"], config) == {key}
    disabled = {**BASE, key: {"enabled": False} if key == "amp" else {"mode": "dense"}}
    assert schema_error_paths(validators["0.19.8"], disabled) == {key}  # 0.19.8 refuses them even disabled
    assert not schema_error_paths(validators["0.19.8"], {**BASE, key: None})


def test_keys_newer_than_the_target_are_refused(validators):
    config = {**BASE, "gradient_allreduce_op": "sum"}  # since 0.19.8
    assert schema_error_paths(validators["0.19.5"], config) == {"gradient_allreduce_op"}
    assert not schema_error_paths(validators["0.19.8"], config)
    assert not schema_error_paths(validators["0.19.5"], {**BASE, "gradient_allreduce_op": "mean"})  # its default


def test_every_key_has_its_description_and_default(validators):
    """Each key of each section (in its $defs entry, the top level in the root) with the field's help and default
    (for the newest DeepSpeed that has the key's section)."""
    checked = 0
    for kind, site in ALL_SITES:
        if kind != "key" or (site.owner is DeepSpeedConfig and site.name in BATCH_KEYS):
            continue
        target = LATEST_KNOWN if site.reachable_in(LATEST_KNOWN) else "0.19.5"
        schema = validators[target].schema
        model = schema if site.owner is DeepSpeedConfig else schema["$defs"][site.owner.__name__]
        prop = model["properties"][site.name]
        assert prop["description"].startswith(site.field.metadata["help"]), site.dotted
        default = default_of(site.field)
        if default in (dataclasses.MISSING, REQUIRED) or dataclasses.is_dataclass(default) or not site.known_in(target):
            assert "default" not in prop, site.dotted
        else:
            assert prop["default"] == default and type(prop["default"]) is type(default), site.dotted
        checked += 1
    assert checked >= 500


def test_the_schema_states_every_kind_of_fact_the_fields_declare():
    """A field declared with metadata the schema does not read would hold a fact editors miss."""
    from dsconf.json_schema import EXPRESSED

    declared = {key for _, site in ALL_SITES for key in site.field.metadata}
    assert declared <= EXPRESSED, f"the JSON Schema does not express {sorted(declared - EXPRESSED)}"
    assert {"help", "ge", "choices", "since", "until", "aliases", "auto", "legacy", "model_key"} <= declared


def test_two_spellings_of_one_key_are_refused_by_both(validators):
    config = {**BASE, "zero_optimization": {"prefetch_bucket_size": 10, "stage3_prefetch_bucket_size": 10}}
    assert any("another spelling" in p.message for p in validate(config, LATEST_KNOWN).problems)
    assert schema_error_paths(validators[LATEST_KNOWN], config) == {"zero_optimization"}


@pytest.mark.parametrize("type_name", ["adamw", "ADAMW", "AdamW"])
def test_params_follow_a_deepspeed_optimizer_named_in_any_case(validators, type_name):
    config = {**BASE, "optimizer": {"type": type_name, "params": {"lr": "fast", "lrr": 1}}}
    expected = {"optimizer.params.lr", "optimizer.params.lrr"}
    assert structural_paths(validate(config, LATEST_KNOWN)) == expected
    assert schema_error_paths(validators[LATEST_KNOWN], config) == expected


def test_the_old_boolean_form_of_zero_optimization_is_accepted_by_both(validators):
    for value in (True, False):
        config = {**BASE, "zero_optimization": value}
        assert validate(config, LATEST_KNOWN).ok and not schema_error_paths(validators[LATEST_KNOWN], config)


# --- the corpus of real files ---

def corpus_reports(target: str) -> Iterator[Tuple[Path, Dict[str, Any], FileReport]]:
    for path in CORPUS_FILES:
        config = read_config_file(str(path))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = check_config(config, world_size=implied_world_size(config), keep_auto=has_auto(config),
                                  target=target)
        yield path, config, report


@pytest.mark.parametrize("target", TARGETS)
def test_every_corpus_file_validate_accepts_is_valid_against_the_schema(validators, target):
    accepted = 0
    for path, config, report in corpus_reports(target):
        if report.ok:
            accepted += 1
            errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:150]}"
                      for e in validators[target].iter_errors(config)]
            assert not errors, f"dsconf validate accepts {path.name}; the schema refuses it: {errors}"
    assert accepted >= 40


@pytest.mark.parametrize("target", TARGETS)
def test_structural_problems_in_the_corpus_are_schema_errors_at_the_same_path(validators, target):
    compared = 0
    for path, config, report in corpus_reports(target):
        expected = structural_paths(report)
        missing = expected - schema_error_paths(validators[target], config)
        assert not missing, f"{path.name}: dsconf validate reports {sorted(expected)}; the schema misses {missing}"
        compared += len(expected)
    assert compared >= 20


# --- mistakes and values generated from every field of the schema ---

@dataclasses.dataclass(frozen=True)
class Site:
    """A key of the schema where a file can hold it: its path, its declaration, and what must be set around it for
    its model to apply (an optimizer's or scheduler's type, a sparsity mode)."""

    path: Tuple[str, ...]
    owner: type
    name: str
    tp: Any
    field: dataclasses.Field
    around: Tuple[Tuple[Tuple[str, ...], Any], ...]  # (path, value) pairs written first
    gates: Tuple[Tuple[Optional[str], Optional[str]], ...]  # (since, until) of the key's ancestors

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def reported(self) -> str:
        """Where validation reports a problem in the key's value: under the field's own name, whichever of its
        spellings the file uses (the schema reports it where the file has it)."""
        return ".".join(self.path[:-1] + (self.name,)) if self.name else self.dotted

    def known_in(self, target: str) -> bool:
        return known_in(target, self.field.metadata.get("since"), self.field.metadata.get("until"))

    def reachable_in(self, target: str) -> bool:
        return all(known_in(target, since, until) for since, until in self.gates)

    def config(self, value: Any, path: Optional[Tuple[str, ...]] = None) -> Dict[str, Any]:
        config = copy.deepcopy(BASE)
        for where, item in [*self.around, (path or self.path, value)]:
            node = config
            for part in where[:-1]:
                node = node.setdefault(part, {})
            node[where[-1]] = item
        return config


def params_models(owner: type, field: dataclasses.Field) -> List[Tuple[str, type]]:
    """The values of a dynamic field's ``model_key`` that have a model, and the model each picks."""
    choices = fields_of(owner)[model_key(field)][1].metadata.get("choices")
    names = choices or [*(s.type for s in DEEPSPEED_OPTIMIZERS.values()), *TORCH_OPTIMIZER_PARAMS]
    return [(n, field.metadata["models"](n)) for n in names if field.metadata["models"](n) is not None]


def sites(cls: type = DeepSpeedConfig, prefix: Tuple[str, ...] = (), around: Tuple = (),
          gates: Tuple = ()) -> Iterator[Tuple[str, Any]]:
    """("model", Site of the section) and ("key", Site) for every section and key reachable from the top."""
    yield "model", Site(prefix, cls, "", cls, dataclasses.field(), around, gates)
    for name, (tp, field) in fields_of(cls).items():
        site = Site(prefix + (name,), cls, name, tp, field, around, gates)
        yield "key", site
        for alias in field.metadata.get("aliases", ()):
            yield "alias", dataclasses.replace(site, path=prefix + (alias,))
        inner, _ = unwrap_optional(tp)
        below = gates + ((field.metadata.get("since"), field.metadata.get("until")),)
        if dataclasses.is_dataclass(inner):
            yield from sites(inner, site.path, around, below)
        elif inner is Any and model_key(field):
            for type_name, model in params_models(cls, field):
                yield from sites(model, site.path, around + ((prefix + (model_key(field),), type_name),), below)
        elif inner is Any:
            model = dynamic_model(cls, name, {})
            if model in SPARSITY_MODES.values():
                for mode, mode_model in SPARSITY_MODES.items():
                    yield from sites(mode_model, site.path, around + ((site.path + ("mode",), mode),), below)
            elif model is not None:
                yield from sites(model, site.path, around, below)


ALL_SITES = list(sites())


def wrong_values(site: Site) -> Iterator[Tuple[str, Any]]:
    """(kind, value) mistakes for a key, from its declaration: a wrong type, null, outside its choices or range."""
    inner, optional = unwrap_optional(site.tp)
    meta = site.field.metadata
    if site.owner is DeepSpeedConfig and site.name in BATCH_KEYS:
        yield from (("type", "many"), ("range", 0))
        return
    origin = typing.get_origin(inner)
    if inner is Any:
        model = None if model_key(site.field) else dynamic_model(site.owner, site.name, {})
        if model is not None and model not in SPARSITY_MODES.values():
            yield "type", 5
    elif dataclasses.is_dataclass(inner):
        yield "type", 5
    elif origin in (list, List):
        yield "type", "text"
    elif inner in (bool, int, float):
        yield "type", "many"
    elif inner is str:
        yield "type", 5
    elif typing.get_origin(inner) in (dict, Dict, typing.Union):
        yield "type", 5 if typing.get_origin(inner) is not typing.Union else {}
    if not optional and inner is not Any:
        yield "null", None
    choices = meta.get("choices")
    if choices:
        yield "choice", (max(choices) + 1 if isinstance(choices[0], (int, float)) else "zz-not-a-choice")
    for bound, step in (("ge", -1), ("gt", 0), ("le", 1)):
        if meta.get(bound) is not None:
            yield "range", meta[bound] + step


def other_value(site: Site) -> Any:
    """A value of the key's type that is not its default."""
    inner, _ = unwrap_optional(site.tp)
    default = default_of(site.field)
    if inner is bool:
        return not default
    samples = {int: 12345, float: 0.5, str: "zz"}
    if inner in samples:
        choices = site.field.metadata.get("choices")
        return next((c for c in choices if c != default), None) if choices else samples[inner]
    return ["zz"] if typing.get_origin(inner) in (list, List) else {}


def mistakes(target: str) -> Iterator[Tuple[str, Site, str, Dict[str, Any], Any]]:
    """(kind, site, path where validation must report it, config, the value) for every generated mistake."""
    for kind, site in ALL_SITES:
        if not site.reachable_in(target):
            continue
        if kind == "model":
            path = site.path + (UNKNOWN,)
            yield "unknown key", site, ".".join(path), site.config(1, path), 1
        elif not site.known_in(target):
            yield "version", site, site.dotted, site.config(other_value(site)), other_value(site)
        else:
            for what, value in wrong_values(site):
                yield what, site, site.reported, site.config(value), value


def test_a_dict_typed_key_is_type_checked():
    assert "datastates_ckpt" in structural_paths(validate({**BASE, "datastates_ckpt": 5}, LATEST_KNOWN))


def test_a_union_typed_key_is_type_checked():
    config = {**BASE, "zero_optimization": {"zenflow": {"select_interval": [1]}}}
    assert "zero_optimization.zenflow.select_interval" in structural_paths(validate(config, LATEST_KNOWN))


def test_free_form_params_must_be_a_section():
    config = {**BASE, "optimizer": {"type": "RMSprop", "params": 5}}
    assert "optimizer.params" in structural_paths(validate(config, LATEST_KNOWN))


def _fits(value: Any, tp: Any) -> bool:
    """Whether ``value`` is of type ``tp`` as written (a member of a Union)."""
    if typing.get_origin(tp) in (list, List):
        return isinstance(value, list) and all(_fits(v, typing.get_args(tp)[0]) for v in value)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, tp) and not (isinstance(value, bool) and tp is not bool)


def test_an_optimizer_that_is_no_section_is_a_problem_not_a_traceback():
    assert "optimizer" in structural_paths(validate({**BASE, "optimizer": 5}, LATEST_KNOWN))


def test_an_unknown_sparsity_mode_is_a_problem(validators):
    config = {**BASE, "sparse_attention": {"mode": "fixd"}}
    assert schema_error_paths(validators["0.19.5"], config) == {"sparse_attention.mode"}
    assert "sparse_attention.mode" in structural_paths(validate(config, "0.19.5"))


@pytest.mark.parametrize("target", TARGETS)
def test_each_generated_mistake_is_a_schema_error_at_the_path_validate_reports(validators, target):
    """The refusing side: validation reports each mistake at its key (else the generator or validation is wrong),
    and every structural problem validation reports is a schema error at the same path, and vice versa."""
    kinds: Dict[str, int] = {}
    failures = []
    for kind, site, path, config, _ in mistakes(target):
        dsconf = structural_paths(validate(config, target))
        schema = {site.reported if p == site.dotted else p for p in schema_error_paths(validators[target], config)}
        if path not in dsconf:
            failures.append(f"{kind}: {json.dumps(config)[:160]}: dsconf validate reports {sorted(dsconf)}")
        elif dsconf != schema:
            failures.append(f"{kind} at {path}: dsconf validate reports {sorted(dsconf)}, the schema {sorted(schema)}")
        kinds[kind] = kinds.get(kind, 0) + 1
    assert not failures, f"{len(failures)} disagreements:\n" + "\n".join(failures)
    assert kinds["unknown key"] >= 50 and kinds["type"] >= 400 and kinds["choice"] >= 30 and kinds["range"] >= 90
    assert kinds["null"] >= 300 and kinds["version"] >= 12


def accepted_values(site: Site) -> Iterator[Any]:
    """Values to try in a key: its default, its choices, its bounds, the spellings DeepSpeed coerces, "auto"."""
    meta = site.field.metadata
    default = default_of(site.field)
    if default not in (dataclasses.MISSING, REQUIRED) and not dataclasses.is_dataclass(default):
        yield default
    yield from meta.get("choices") or ()
    yield from (c.upper() for c in meta.get("choices") or () if isinstance(c, str))
    yield from (meta[b] + step for b, step in (("ge", 0), ("gt", 1), ("le", 0)) if meta.get(b) is not None)
    yield from (None, "auto", True, False, 0, 1, 7, 0.5, 1e5, "", "1", "0.5", "true", "YES", "off", "1e3", "nan", [],
                {})


def _at(path: str, reported: Set[str]) -> bool:
    return any(p == path or p.startswith(path + ".") for p in reported)


def beyond_json_schema(site: Site, value: Any) -> str:
    """What a JSON Schema cannot tell apart as validation does."""
    if site.owner is DeepSpeedConfig and site.name in BATCH_KEYS and isinstance(value, float):
        return "JSON has one kind of number: a batch key takes 8 and refuses 8.0"
    meta = site.field.metadata
    if isinstance(value, str) and getattr(site.owner, "deepspeed_model", None) and \
            any(meta.get(b) is not None for b in ("ge", "gt", "le")):
        return "a number written as text, which pydantic's lax mode reads, is matched by a pattern: its range is left"
    return ""


@pytest.mark.slow  # about 12,000 values, each validated twice
@pytest.mark.parametrize("target", TARGETS)
def test_generated_values_are_accepted_alike(validators, target):
    """The accepting side: for values of every key, the schema refuses exactly where validation does."""
    disagreements = []
    tried = 0
    for kind, site in ALL_SITES:
        if kind == "model" or not site.reachable_in(target):
            continue
        for value in accepted_values(site):
            if beyond_json_schema(site, value):
                continue
            config = site.config(value)
            dsconf = _at(site.reported, structural_paths(validate(config, target)))
            schema = _at(site.dotted, schema_error_paths(validators[target], config))
            if dsconf != schema:
                disagreements.append(f"{site.dotted}={value!r}: dsconf validate {'refuses' if dsconf else 'accepts'}"
                                     f", the schema {'refuses' if schema else 'accepts'}")
            tried += 1
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(disagreements)
    assert tried >= 8000
