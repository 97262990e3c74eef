"""Every precision x zero x optimizer x scheduler combination, exported for world sizes 1, 2 and 8 and fed to
DeepSpeed's own parser: DeepSpeed accepts every config dsconf accepts, computes the same batch triple, and parses
every exported key to the exported value. The same for DeepSpeed 0.19.5 when its environment exists. Each group
option is composed by Hydra; a combination is built from its options' compositions, and every pair of options of
every two groups is composed together by Hydra to show that this is the config a run composes (``Parts``).

That proves names, not defaults (dsconf writes its defaults out and DeepSpeed reads them back). So each export
is also compared with DeepSpeed's parse of a *minimal* config holding only what the user chose (the group
options' own keys, nothing else): everything DeepSpeed makes of the two must be equal, so every default dsconf
writes is DeepSpeed's own.
"""

from __future__ import annotations

import copy
import itertools
import json
import multiprocessing
import warnings
from typing import Any, Dict, List, Tuple

import pytest
from deepspeed_oracle import ds0195_python, parse_with_other_deepspeed

import dsconf
from dsconf.groups import OPTIMIZER_OPTIONS, PRECISION, SCHEDULER_OPTIONS, ZERO, group_options

pytestmark = pytest.mark.slow  # the grid: 2,400 combinations, each exported 6 times and parsed by DeepSpeed

WORLD_SIZES = (1, 2, 8)
TARGETS = ("0.19.8", "0.19.5")
# Why dsconf may refuse a combination: each is a rule DeepSpeed enforces (at parse or at initialize).
EXPECTED_REFUSALS = (
    "was removed in DeepSpeed 0.19.8",  # amp on a 0.19.8 target
    "is not built into DeepSpeed 0.19.8",  # 1-bit optimizers on a 0.19.8 target
    "is not compatible with ZeRO",  # amp or 1-bit optimizers with ZeRO
    "ZeRO has not been tested with",  # untested optimizer with ZeRO
)


REQUIRED_PARAMS = {  # what a scheduler option needs set before DeepSpeed accepts it
    "warmup_decay": {"total_num_steps": 100},
    "warmup_cosine": {"total_num_steps": 100},
    "one_cycle": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3},
}
# What DeepSpeed keeps of optimizer/scheduler params is the dict it was given (their defaults live in the
# constructors: tests/schema checks dsconf's against them), so these two are compared apart.
PARAMS_STATE = ("optimizer_params", "scheduler_params")


def minimal_config(combo: Tuple[str, str, str, str]) -> Dict[str, Any]:
    """The combination in DeepSpeed's own terms: only the keys the chosen options set."""
    precision, zero, optimizer, scheduler = combo
    out: Dict[str, Any] = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                           **copy.deepcopy(PRECISION[precision]), "zero_optimization": copy.deepcopy(ZERO[zero])}
    if optimizer != "none":
        out["optimizer"] = {"type": OPTIMIZER_OPTIONS[optimizer], "params": {}}
    if scheduler != "none":
        out["scheduler"] = {"type": SCHEDULER_OPTIONS[scheduler], "params": dict(REQUIRED_PARAMS.get(scheduler, {}))}
    return out


def _state_differences(exported: Dict[str, Any], minimal: Dict[str, Any]) -> List[str]:
    keys = (set(exported) | set(minimal)) - set(PARAMS_STATE)
    return [f"{k}: export {exported.get(k)!r} != minimal {minimal.get(k)!r}" for k in sorted(keys)
            if exported.get(k) != minimal.get(k)]


def combinations() -> List[Tuple[str, str, str, str]]:
    return list(itertools.product(*_options()))


BATCH = ["deepspeed.train_micro_batch_size_per_gpu=4", "deepspeed.gradient_accumulation_steps=2"]
GROUPS = ("precision", "zero", "optimizer", "scheduler")


def overrides(choices: Dict[str, str]) -> List[str]:
    """The command line of a run choosing ``choices`` (group -> option), with the batch and what a scheduler needs."""
    required = REQUIRED_PARAMS.get(choices.get("scheduler", ""), {})
    return [*(f"{group}={option}" for group, option in choices.items()), *BATCH,
            *(f"deepspeed.scheduler.params.{key}={value}" for key, value in required.items())]


class Parts:
    """Each group option composed by Hydra on its own, and which ``deepspeed`` keys each group sets.

    Hydra's composition is a fixed 40 ms however small the config, and the grid is 2,400 combinations: so each
    option is composed once, and a combination is the default composition with each group's keys taken from its
    option's own composition. A group's keys are the ``deepspeed`` keys any of its options changes; that is Hydra's
    merge exactly when no two groups share a key and no option changes anything outside ``deepspeed``: both are
    asserted here, and ``test_the_grid_is_what_hydra_composes`` composes every pair of options of every two groups
    through Hydra and finds the same config and the same exports.
    """

    def __init__(self) -> None:
        from omegaconf import OmegaConf

        from dsconf.composition import compose_config

        self.base = compose_config(BATCH)
        base = OmegaConf.to_container(self.base)
        self.composed = {(g, o): compose_config(overrides({g: o})) for g, options in zip(GROUPS, _options())
                         for o in options}
        self.keys: Dict[str, List[str]] = {group: [] for group in GROUPS}
        for (group, _), cfg in self.composed.items():
            ours = OmegaConf.to_container(cfg)
            assert {k: v for k, v in ours.items() if k != "deepspeed"} == \
                {k: v for k, v in base.items() if k != "deepspeed"}
            changed = {k for k in ours["deepspeed"] if ours["deepspeed"][k] != base["deepspeed"][k]}
            self.keys[group] = sorted(changed | set(self.keys[group]))
        owned = [k for group in GROUPS for k in self.keys[group]]
        assert owned and len(owned) == len(set(owned)), f"groups set the same deepspeed keys: {self.keys}"

    def combination(self, combo: Tuple[str, str, str, str]) -> Any:
        cfg = copy.deepcopy(self.base)
        for group, option in zip(GROUPS, combo):
            part = self.composed[(group, option)].deepspeed
            for key in self.keys[group]:
                cfg.deepspeed[key] = part[key]
        return cfg


def _options() -> List[List[str]]:
    """Each of GROUPS' options, in GROUPS' order."""
    groups = group_options()
    groups["optimizer"] = [o for o in groups["optimizer"] if o != "torch"]  # 'torch' needs a type: tested elsewhere
    return [groups[group] for group in GROUPS]


# The pool's workers are forked from the fixture's process and find the parts here: handing them to each task
# instead would pickle 30 composed configs with every chunk.
_PARTS: List[Parts] = []


def export_rows(combo: Tuple[str, str, str, str], cfg: Any) -> List[Dict[str, Any]]:
    from dsconf.export import to_deepspeed

    rows = []
    for target in TARGETS:
        for ws in WORLD_SIZES:
            row = {"combo": combo, "target": target, "world_size": ws}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    row["config"] = to_deepspeed(cfg, world_size=ws, deepspeed_version=target)
            except dsconf.ConfigError as err:
                row["error"] = str(err)
            rows.append(row)
    return rows


def export_combination(combo: Tuple[str, str, str, str]) -> List[Dict[str, Any]]:
    return export_rows(combo, _PARTS[0].combination(combo))


@pytest.fixture(scope="module")
def parts() -> Parts:
    return Parts()


@pytest.fixture(scope="module")
def exported(parts) -> List[Dict[str, Any]]:
    _PARTS[:] = [parts]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        chunks = pool.map(export_combination, combinations(), chunksize=40)
    return [row for chunk in chunks for row in chunk]


def pairwise(options: List[List[str]]) -> List[Tuple[str, ...]]:
    """Combinations in which every option of each group meets every option of each other group at least once,
    chosen greedily (each the one that meets the most pairs not yet met)."""
    def pairs(combo: Tuple[str, ...]) -> set:
        return {(i, combo[i], j, combo[j]) for i, j in itertools.combinations(range(len(combo)), 2)}

    candidates = {combo: pairs(combo) for combo in itertools.product(*options)}
    uncovered = set().union(*candidates.values())
    chosen = []
    while uncovered:
        best = max(candidates, key=lambda combo: len(candidates[combo] & uncovered))
        chosen.append(best)
        uncovered -= candidates.pop(best)
    return chosen


def test_the_grid_is_what_hydra_composes(parts, exported) -> None:
    """Every pair of options of every two groups composed through Hydra (as a run composes it): the same config
    as the grid's, key for key, and the same exports and refusals."""
    from omegaconf import OmegaConf

    from dsconf.composition import compose_config

    assert parts.keys["precision"] == ["amp", "bf16", "fp16", "torch_autocast"]
    assert parts.keys["zero"] == ["zero_optimization"] and parts.keys["optimizer"] == ["optimizer"]
    rows = {(tuple(r["combo"]), r["target"], r["world_size"]): r for r in exported}
    sample = pairwise(_options())
    assert len(sample) < len(combinations()) / 10
    for combo in sample:
        composed = compose_config(overrides(dict(zip(GROUPS, combo))))
        assert OmegaConf.to_yaml(composed) == OmegaConf.to_yaml(parts.combination(combo)), combo
        for row in export_rows(combo, composed):
            assert row == rows[(combo, row["target"], row["world_size"])]


def test_every_combination_was_exported(exported):
    assert len(exported) == len(combinations()) * len(TARGETS) * len(WORLD_SIZES)
    accepted = [r for r in exported if "config" in r and r["target"] == "0.19.8"]
    # fp32/bf16/fp16/torch_autocast x 8 zero options x Adam-family optimizers must all be accepted.
    assert len(accepted) > 1000
    for row in accepted:
        assert json.loads(json.dumps(row["config"])) == row["config"]  # plain JSON, no OmegaConf types


def test_every_refusal_is_a_deepspeed_rule(exported):
    refused = [r for r in exported if "error" in r]
    assert refused, "the grid contains combinations DeepSpeed does not support"
    for row in refused:
        assert any(reason in row["error"] for reason in EXPECTED_REFUSALS), (row["combo"], row["error"])


def _check_against(results: List[Dict[str, Any]], rows: List[Dict[str, Any]]) -> None:
    failures = []
    for row, result in zip(rows, results):
        cfg = row["config"]
        expected = [cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]]
        if not result["ok"]:
            failures.append((row["combo"], row["world_size"], result["error"]))
        elif result["triple"] != expected or result["mismatches"]:
            failures.append((row["combo"], row["world_size"], result["triple"], expected, result["mismatches"]))
    assert not failures, failures[:10]


@pytest.fixture(scope="module")
def parsed_0198(exported, deepspeed_parse) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(accepted 0.19.8 rows, the installed DeepSpeed's parse of each export): parsed once, checked by two tests."""
    rows = [r for r in exported if "config" in r and r["target"] == "0.19.8"]
    return rows, [deepspeed_parse(r["config"], r["world_size"]) for r in rows]


@pytest.fixture(scope="module")
def parsed_0195(exported) -> Dict[str, Any]:
    """DeepSpeed 0.19.5's parse of every accepted 0.19.5 export, and of the minimal config of one row in three (one
    world size in three): one request to its interpreter, checked by two tests."""
    rows = [r for r in exported if "config" in r and r["target"] == "0.19.5"]
    sampled = rows[::3]
    cases = [{"config": r["config"], "world_size": r["world_size"]} for r in rows] + _minimal_pairs(sampled)
    out = parse_with_other_deepspeed(ds0195_python(), cases)
    return {"version": out["version"], "rows": rows, "results": out["results"][:len(rows)], "sampled": sampled,
            "minimal": out["results"][len(rows):]}


def test_installed_deepspeed_accepts_what_dsconf_accepts(parsed_0198):
    import deepspeed

    assert deepspeed.__version__.startswith("0.19.8")
    rows, results = parsed_0198
    _check_against(results, rows)


def test_triple_follows_world_size(exported):
    for row in exported:
        if "config" in row:
            cfg = row["config"]
            assert cfg["train_micro_batch_size_per_gpu"] == 4 and cfg["gradient_accumulation_steps"] == 2
            assert cfg["train_batch_size"] == 8 * row["world_size"]


@pytest.mark.skipif(not ds0195_python(), reason="DSCONF_DS0195_PYTHON (a DeepSpeed 0.19.5 environment) not set")
def test_deepspeed_0195_accepts_what_dsconf_accepts_for_it(parsed_0195):
    rows = parsed_0195["rows"]
    assert any("amp" in r["config"] for r in rows) and any(
        r["config"].get("optimizer", {}).get("type") == "OneBitAdam" for r in rows)
    assert parsed_0195["version"] == "0.19.5"
    _check_against(parsed_0195["results"], rows)


def _minimal_pairs(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{"config": minimal_config(tuple(r["combo"])), "world_size": r["world_size"]} for r in rows]


def _check_defaults(exported_results: List[Dict[str, Any]], minimal_results: List[Dict[str, Any]],
                    rows: List[Dict[str, Any]]) -> None:
    failures = []
    for row, ours, theirs in zip(rows, exported_results, minimal_results):
        assert ours["ok"] and theirs["ok"], (row["combo"], ours.get("error"), theirs.get("error"))
        diff = _state_differences(ours["state"], theirs["state"])
        if diff:
            failures.append((row["combo"], row["world_size"], diff[:5]))
    assert not failures, failures[:10]


def test_exports_mean_what_a_minimal_config_means_to_deepspeed(parsed_0198, deepspeed_parse):
    """dsconf's defaults are DeepSpeed's: the export and the bare choice parse to the same state."""
    rows, ours = parsed_0198
    theirs = [deepspeed_parse(p["config"], p["world_size"]) for p in _minimal_pairs(rows)]
    _check_defaults(ours, theirs, rows)


@pytest.mark.skipif(not ds0195_python(), reason="DSCONF_DS0195_PYTHON (a DeepSpeed 0.19.5 environment) not set")
def test_exports_mean_what_a_minimal_config_means_to_deepspeed_0195(parsed_0195):
    sampled = parsed_0195["sampled"]  # one world size in three
    _check_defaults(parsed_0195["results"][::3], parsed_0195["minimal"], sampled)
