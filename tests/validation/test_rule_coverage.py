"""Every rule in ``dsconf/validation/rules.py`` is tested, and every refusal is backed by DeepSpeed or declared
as dsconf's own stricter rule:

- ``parse`` rules: DeepSpeed's parser refuses the same config;
- ``initialize`` rules: DeepSpeed's parser accepts it and its engine source holds the refusal dsconf quotes
  (a real ``deepspeed.initialize`` runs where the CPU allows: tests/validation/test_rules.py);
- dsconf's own rules: DeepSpeed's parser accepts the config (it runs without a word) and the rule says why
  dsconf refuses it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
from deepspeed_oracle import BUILT_OPTIMIZERS as BUILT
from deepspeed_oracle import ds0195_python, parse_with_other_deepspeed

from dsconf.errors import ConfigError
from dsconf.export import build_deepspeed_dict
from dsconf.validation import rules
from dsconf.validation.rules import RULES, check_rules

NEW, OLD = "0.19.8", "0.19.5"
BASE = {"train_batch_size": 8}

# rule -> (target version, a config that trips it, in DeepSpeed's own vocabulary)
CASES: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "one_precision": (NEW, {"fp16": {"enabled": True}, "bf16": {"enabled": True}}),
    "master_weights_need_zero": (NEW, {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}),
    "dynamic_loss_scale_settings": (NEW, {"fp16": {"enabled": True, "loss_scale_window": 0}}),
    "partial_offload_needs_stage3": (NEW, {"zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}),
    "optimizer_offload_needs_zero": (NEW, {"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}),
    "param_offload_needs_stage3": (NEW, {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}),
    "nvme_offload_needs_path": (NEW, {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}),
    "offload_settings_need_device": (NEW, {"zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "none", "buffer_count": 8}}}),
    "compute_grad_norm_needs_stage_1_or_2": (NEW, {"zero_optimization": {"stage": 3, "compute_grad_norm": False}}),
    "allreduce_sum_not_with_stage3": (NEW, {"gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}}),
    "no_load_balance_coeff": (NEW, {"expert_parallel": {"enabled": False, "load_balance_coeff": 0}}),
    "data_parallel_size_needs_sequence_parallel_size": (NEW, {"data_parallel_size": 1}),
    "curriculum_learning_needs_metrics": (NEW, {"data_efficiency": {"data_sampling": {
        "curriculum_learning": {"enabled": True}}}}),
    "dynamic_batching_needs_max_tokens": (NEW, {"data_efficiency": {"data_sampling": {
        "dynamic_batching": {"enabled": True}}}}),
    "amp_without_zero": (OLD, {"amp": {"enabled": True}, "zero_optimization": {"stage": 1}}),
    "one_bit_optimizers_without_zero": (OLD, {"optimizer": {"type": "OneBitAdam", "params": {}},
                                              "zero_optimization": {"stage": 1}}),
    "untested_optimizer_with_zero": (NEW, {"optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                                           "zero_optimization": {"stage": 2}}),
    "no_max_grad_norm_in_optimizer_params": (NEW, {"optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}}),
    "no_bias_correction_with_torch_adam": (NEW, {"optimizer": {"type": "AdamW", "params": {
        "torch_adam": True, "bias_correction": False}}}),
    "lamb_needs_dynamic_loss_scale": (NEW, {"optimizer": {"type": "Lamb", "params": {}},
                                            "fp16": {"enabled": True, "loss_scale": 128}}),
    "sparse_attention_layout": (OLD, {"sparse_attention": {"mode": "fixed", "attention": "unidirectional",
                                                           "horizontal_global_attention": True}}),
}


def _config(name: str) -> Tuple[str, Dict[str, Any]]:
    target, case = CASES[name]
    return target, {**BASE, **case}


def test_every_rule_has_a_case():
    assert {r.name for r in RULES} == set(CASES)


@pytest.mark.parametrize("name", sorted(n for n in CASES if not next(r for r in RULES if r.name == n).warns))
def test_dsconf_refuses_the_case_through_that_rule(name):
    target, config = _config(name)
    rule = next(r for r in RULES if r.name == name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError) as info:
            build_deepspeed_dict(config, world_size=1, target=target)
    wanted = {p.path for p in rule.check({k: v for k, v in config.items()})}
    assert wanted and wanted <= set(info.value.paths), (wanted, str(info.value))


@pytest.mark.parametrize("name", sorted(n for n in CASES if next(r for r in RULES if r.name == n).warns))
def test_a_warning_rule_warns_and_the_config_runs(name):
    target, config = _config(name)
    rule = next(r for r in RULES if r.name == name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_deepspeed_dict(config, world_size=1, target=target)
    said = [str(w.message) for w in caught if issubclass(w.category, rules.RuleWarning)]
    assert said == [str(p) for p in rule.check(config)] and said, said


def _parse_all(cases: Dict[str, Tuple[str, Dict[str, Any]]], deepspeed_parse) -> Dict[str, Dict[str, Any]]:
    out = {name: deepspeed_parse(config, 1) for name, (target, config) in cases.items() if target == NEW}
    old = {name: config for name, (target, config) in cases.items() if target == OLD}
    if old and ds0195_python():
        results = parse_with_other_deepspeed(ds0195_python(), [{"config": c, "world_size": 1} for c in old.values()])
        out.update(dict(zip(old, results["results"])))
    return out


@pytest.fixture(scope="module")
def parsed(deepspeed_parse) -> Dict[str, Dict[str, Any]]:
    return _parse_all({name: _config(name) for name in CASES}, deepspeed_parse)


def _engine_source(target: str) -> str:
    if target == NEW:
        import deepspeed

        root = Path(deepspeed.__file__).parent
    else:
        python = ds0195_python()
        if not python:
            pytest.skip("DSCONF_DS0195_PYTHON (a DeepSpeed 0.19.5 environment) not set")
        root = next(Path(python).parents[1].glob("lib/python*/site-packages/deepspeed"))
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in (root / "runtime").glob("*.py"))


@pytest.mark.parametrize("rule", [r for r in RULES if r.enforced_by == "parse"], ids=lambda r: r.name)
@pytest.mark.slow  # parsed: DeepSpeed 0.19.5's interpreter too
def test_parse_rules_are_deepspeeds_parser(rule, parsed):
    if rule.name not in parsed:
        pytest.skip("DSCONF_DS0195_PYTHON (a DeepSpeed 0.19.5 environment) not set")
    assert not parsed[rule.name]["ok"], f"DeepSpeed's parser accepts the case of {rule.name}"


@pytest.mark.parametrize("rule", [r for r in RULES if r.enforced_by == "initialize"], ids=lambda r: r.name)
@pytest.mark.slow  # parsed
def test_initialize_rules_are_in_deepspeeds_engine(rule, parsed):
    target, _ = _config(rule.name)
    assert rule.deepspeed_says in _engine_source(target), f"DeepSpeed {target} has no {rule.deepspeed_says!r}"
    if rule.name in parsed:
        assert parsed[rule.name]["ok"], parsed[rule.name]["error"]  # only initialize catches it


@pytest.mark.parametrize("rule", [r for r in RULES if r.enforced_by is None], ids=lambda r: r.name)
@pytest.mark.slow  # parsed
def test_dsconfs_own_rules_say_why_and_deepspeed_runs_the_config(rule, parsed):
    assert len(rule.why) > 20
    if rule.name not in parsed:
        pytest.skip("DSCONF_DS0195_PYTHON (a DeepSpeed 0.19.5 environment) not set")
    assert parsed[rule.name]["ok"], parsed[rule.name]["error"]


def test_a_rule_that_raises_on_a_well_formed_config_fails_loudly(monkeypatch):
    def broken(ds):
        raise KeyError("bug")

    monkeypatch.setattr(rules, "RULES", [*RULES, rules.Rule(broken, None, why="a deliberately broken rule here")])
    with pytest.raises(KeyError):
        check_rules({"zero_optimization": {"stage": 2}})
    assert check_rules({"zero_optimization": {"stage": 2}}, structure_ok=False) == []


def test_which_optimizers_zero_has_tested_is_deepspeeds_list():
    """dsconf's zero_tested flags agree with DeepSpeed's ZERO_SUPPORTED_OPTIMIZERS for the classes its engine builds
    for each name (tests/schema/test_optimizer_params.py's BUILT)."""
    import importlib

    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS

    for name, paths in BUILT.items():
        classes = [getattr(importlib.import_module(p.rpartition(".")[0]), p.rpartition(".")[2]) for p in paths]
        supported = all(cls in ZERO_SUPPORTED_OPTIMIZERS for cls in classes)
        assert DEEPSPEED_OPTIMIZERS[name.lower()].zero_tested == supported, name


@pytest.mark.parametrize("name", sorted(CASES))
def test_declared_keys_are_schema_keys_and_cover_what_the_rule_reports(name):
    """``dsconf explain`` lists a rule under the keys it declares: each declared key is in the schema (under some
    sparsity mode) or is itself a path the rule reports (``optimizer.params.max_grad_norm``, which the schema
    leaves out on purpose), and every path the rule reports for its case is a declared key, or inside or above
    one."""
    from dsconf.composition import chosen_types
    from dsconf.explain import UnknownKey, resolve
    from dsconf.schema.sparse_attention import SPARSITY_MODES

    _, config = _config(name)
    rule = next(r for r in RULES if r.name == name)
    declared = [f"deepspeed.{key}" for key in rule.keys]
    reported = {p.path for p in rule.check(config)}
    optimizer = (config.get("optimizer") or {}).get("type")
    for key in declared:
        resolved = []
        for mode in SPARSITY_MODES:
            try:
                resolved.append(resolve(key, {**chosen_types([]), "optimizer": optimizer, "sparse_attention": mode}))
            except UnknownKey:
                pass
        assert resolved or key in reported, f"{name} declares {key}, which is not in the schema"
    for path in reported:
        assert any(path == k or path.startswith(k + ".") or k.startswith(path + ".") for k in declared), (
            f"{name} reports {path} but declares only {declared}")
