"""Real-world DeepSpeed configs (tests/corpus, shapes from public training repositories; SOURCES.md says which):
``dsconf validate`` agrees with DeepSpeed's own verdict on every file, and every accepted file survives
``dsconf import`` -> ``dsconf show`` with the same meaning to DeepSpeed.

DeepSpeed's verdict (tests/deepspeed_oracle.py ``verdict``) is derived, never written by hand: fill "auto" as HF
Trainer/Accelerate fill it, then the file is valid when DeepSpeed's parser accepts it, reads every key in it (a
key it never reads is a silent mistake), and gets no "auto" that nobody fills. dsconf may refuse more than the
parser in two documented ways only: rules DeepSpeed enforces later, in ``deepspeed.initialize`` (the rule quotes
DeepSpeed's engine; tests/validation/test_rule_coverage.py checks the quote), and dsconf's own rules for what
DeepSpeed silently ignores (each says why).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List

import pytest
from deepspeed_oracle import ds0195_python, hf_fill, parse_with_other_deepspeed, parsed_state, verdict

from dsconf.errors import Problem
from dsconf.files import read_config_file
from dsconf.schema.introspect import with_defaults
from dsconf.validate_files import FileReport, check_config, has_auto, implied_world_size

CORPUS_DIR = Path(__file__).parent / "corpus"
FILES = sorted(p for p in CORPUS_DIR.iterdir() if p.suffix in (".json", ".hjson", ".yaml", ".yml"))
CATEGORIES = ("hf_", "llm_", "dse_", "megatron_", "aio_", "misc_", "seed_", "broken_")


def load(path: Path) -> Dict[str, Any]:
    return read_config_file(str(path))


def world_size(config: Dict[str, Any]) -> int:
    return implied_world_size(config)


def dsconf_report(path: Path, target: str = None) -> FileReport:  # type: ignore[assignment]
    config = load(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return check_config(config, world_size=world_size(config), keep_auto=has_auto(config), path=path.name,
                            target=target)


@pytest.fixture(scope="module")
def verdicts() -> Dict[str, Dict[str, Any]]:
    out = {}
    for path in FILES:
        config = load(path)
        out[path.name] = verdict(config, world_size(config))
    return out


def test_the_corpus_is_large_and_varied(verdicts):
    assert len(FILES) >= 40
    for prefix in CATEGORIES:
        assert sum(p.name.startswith(prefix) for p in FILES) >= 3, prefix
    assert {p.suffix for p in FILES} >= {".json", ".hjson", ".yaml"}
    valid = [name for name, v in verdicts.items() if v["ok"]]
    assert len(valid) >= 30 and len(verdicts) - len(valid) >= 15
    assert sum(has_auto(load(p)) for p in FILES) >= 10


def _stricter_reason(problem: Problem, report: FileReport) -> str:
    """Why dsconf may refuse what DeepSpeed's parser accepts ("" when it may not)."""
    from dsconf.validation.rules import RULES

    for rule in RULES:
        if rule.enforced_by != "parse" and any(problem.message in p.message for p in _rule_problems(rule, report)):
            return rule.deepspeed_says or rule.why
    if problem.path == "optimizer.type" and "is not built into DeepSpeed" in problem.message:
        import deepspeed.runtime.config as ds_config
        import torch

        name = problem.message.split()[0]
        assert name.lower() not in ds_config.DEEPSPEED_OPTIMIZERS and not hasattr(torch.optim, name)
        return "DeepSpeed fails at initialize: not a DeepSpeed or torch optimizer"
    return ""


def _rule_problems(rule: Any, report: FileReport) -> List[Problem]:
    from dsconf.schema.deepspeed import DeepSpeedConfig
    from dsconf.validation.legacy import translate_legacy, translate_legacy_forms
    from dsconf.validation.normalize import normalize

    config = copy.deepcopy(load(CORPUS_DIR / report.path))
    translate_legacy_forms(config)
    config = normalize(config, DeepSpeedConfig, "deepspeed", keep_auto=True, problems=[])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        translate_legacy(config)
    return [Problem(p.path.removeprefix("deepspeed."), p.message, p.hint) for p in rule.check(config)]


# Keys DeepSpeed ignores that dsconf translates into what they meant, with a warning (the seeds' spellings).
TRANSLATED_IGNORED = {"fp32_allreduce": "communication_data_type"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_validate_agrees_with_deepspeed(path, verdicts):
    truth = verdicts[path.name]
    report = dsconf_report(path)
    if not truth["ok"]:
        translated = [k for k in TRANSLATED_IGNORED if truth["why"] == f"DeepSpeed ignores {[k]}"]
        if translated:
            assert report.ok and any(translated[0] in w for w in report.warnings), report.warnings
            return
        assert not report.ok, f"DeepSpeed: {truth['why']}; dsconf accepts it"
        return
    unexplained = [str(p) for p in report.problems if not _stricter_reason(p, report)]
    assert not unexplained, f"DeepSpeed accepts {path.name}; dsconf refuses: {unexplained}"


@pytest.mark.skipif(not ds0195_python(), reason="DSCONF_DS0195_PYTHON (a DeepSpeed 0.19.5 environment) not set")
@pytest.mark.slow  # DeepSpeed 0.19.5's interpreter
def test_validate_agrees_with_deepspeed_0195_on_the_seed_shapes():
    """Targeting 0.19.5, the features 0.19.8 removed (amp, sparse attention, ...) are valid again, as for it."""
    paths = [p for p in FILES if p.name.startswith(("seed_", "broken_removed", "dse_"))]
    cases = [{"config": load(p), "world_size": world_size(load(p)), "verdict": True} for p in paths]
    results = parse_with_other_deepspeed(ds0195_python(), cases)["results"]
    checked = 0
    for path, truth in zip(paths, results):
        report = dsconf_report(path, target="0.19.5")
        if truth["ok"]:
            unexplained = [str(p) for p in report.problems if not _stricter_reason(p, report)]
            assert not unexplained, (path.name, unexplained)
        elif not any(k in truth["why"] for k in TRANSLATED_IGNORED):
            assert not report.ok, (path.name, truth["why"])
        checked += 1
    assert checked >= 8 and any(r["ok"] for r in results) and not all(r["ok"] for r in results)


def _comparable(state: Dict[str, Any]) -> Dict[str, Any]:
    """A parsed config without what the two inputs legitimately differ in: DeepSpeed's deprecated ZeRO fields
    (dsconf writes their modern replacements, which DeepSpeed fills from them)."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    deprecated = {name for name, f in DeepSpeedZeroConfig.model_fields.items()
                  if (f.json_schema_extra or {}).get("deprecated")}
    deprecated |= {f.alias for name, f in DeepSpeedZeroConfig.model_fields.items()
                   if (f.json_schema_extra or {}).get("deprecated") and f.alias}
    out = dict(state)
    if isinstance(out.get("zero_config"), dict):
        out["zero_config"] = {k: v for k, v in out["zero_config"].items() if k not in deprecated}
        for block in ("offload_optimizer", "offload_param"):  # DeepSpeed offloads only to a device
            if (out["zero_config"].get(block) or {}).get("device") == "none":
                out["zero_config"][block] = None
    return out


def _meant(config: Dict[str, Any]) -> Dict[str, Any]:
    """The file as DeepSpeed should read it: keys DeepSpeed ignores but dsconf translates, translated."""
    out = copy.deepcopy(config)
    if out.pop("fp32_allreduce", None):
        out.setdefault("communication_data_type", "fp32")
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
@pytest.mark.slow  # 45 files, each imported, shown and parsed
def test_import_then_show_means_the_same_to_deepspeed(path, tmp_path, deepspeed_parse):
    from dsconf.composition import compose
    from dsconf.importer import import_file

    config = load(path)
    ws = world_size(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report, written = import_file(str(path), str(tmp_path / "imported.yaml"), world_size=ws)
        if not report.ok:  # a refused file is not imported
            assert written is None and not (tmp_path / "imported.yaml").exists()
            return
        assert written
        imported = (tmp_path / "imported.yaml").read_text()
        assert imported.splitlines()[1] == "defaults:" and ("keep_auto: true" in imported) == has_auto(config)
        shown = compose([], world_size=ws, config_dir=str(tmp_path), config_name="imported")
    original = deepspeed_parse_state(_meant(config), ws)
    again = deepspeed_parse_state(shown, ws)
    for key, model in (("optimizer_params", _params_model("optimizer", shown)),
                       ("scheduler_params", _params_model("scheduler", shown))):
        # DeepSpeed keeps params as given; their defaults are the constructors' (held against dsconf's params
        # defaults in tests/schema), so compare them with those defaults in place on both sides
        original[key], again[key] = with_defaults(original.get(key), model), with_defaults(again.get(key), model)
    differing = sorted(k for k in set(original) | set(again) if original.get(k) != again.get(k))
    assert not differing, {k: (original.get(k), again.get(k)) for k in differing[:5]}


def _params_model(section: str, config: Dict[str, Any]) -> Any:
    from dsconf.schema.introspect import dynamic_model
    from dsconf.schema.optimizer import OptimizerConfig
    from dsconf.schema.scheduler import SchedulerConfig

    owner = OptimizerConfig if section == "optimizer" else SchedulerConfig
    return dynamic_model(owner, "params", config.get(section) or {})


def deepspeed_parse_state(config: Dict[str, Any], ws: int) -> Dict[str, Any]:
    from unittest import mock

    import deepspeed.runtime.config as ds_config

    filled = hf_fill(config, ws)
    with mock.patch.object(ds_config.dist, "get_world_size", return_value=ws), \
            mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        return _comparable(parsed_state(ds_config.DeepSpeedConfig(copy.deepcopy(filled))))


def test_validate_command_on_the_whole_corpus_in_one_process(verdicts):
    valid = [str(p) for p in FILES if verdicts[p.name]["ok"] and dsconf_report(p).ok]
    broken = [str(p) for p in FILES if p.name.startswith("broken_") and not verdicts[p.name]["ok"]]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    ok = subprocess.run([sys.executable, "-m", "dsconf.cli", "validate", "--keep-auto", *valid], capture_output=True,
                        text=True, env=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.count(": OK (") == len(valid)
    bad = subprocess.run([sys.executable, "-m", "dsconf.cli", "validate", "--keep-auto", *valid, *broken],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 1
    assert "Traceback" not in bad.stderr
    for path in broken:
        assert f"{path}: " in bad.stderr and "problem" in bad.stderr
    monitor = next(p for p in broken if "monitor_config" in p)
    assert "monitor_config: unknown key: DeepSpeed ignores it" in bad.stderr, bad.stderr[-3000:]
    assert f"{monitor}" in bad.stderr


def test_validate_exit_codes_for_unreadable_files(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true,,}\n}\n')
    dup = tmp_path / "dup.json"
    dup.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    missing = tmp_path / "missing.json"
    for path, text in ((bad_json, "line 3"), (dup, "duplicate key 'train_batch_size'"), (missing, "cannot read")):
        proc = subprocess.run([sys.executable, "-m", "dsconf.cli", "validate", str(path)], capture_output=True,
                              text=True)
        assert proc.returncode == 2, proc.stderr
        assert str(path) in proc.stderr and text in proc.stderr and "Traceback" not in proc.stderr


def test_validate_reads_json_with_comments(tmp_path):
    path = tmp_path / "commented.json"
    path.write_text('{\n  // DeepSpeed reads hjson\n  "train_micro_batch_size_per_gpu": 2,\n}\n')
    proc = subprocess.run([sys.executable, "-m", "dsconf.cli", "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(json.dumps(read_config_file(str(path)))) == {"train_micro_batch_size_per_gpu": 2}
