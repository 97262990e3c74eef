"""dsconf.batch against DeepSpeed's own batch parser (DeepSpeedConfig), case by case."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional
from unittest import mock

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed.runtime.config as ds_config  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402

from dsconf.batch import BATCH_KEYS, BatchTriple, derive_batch  # noqa: E402
from dsconf.errors import ConfigError  # noqa: E402

TB, MB, GAS = BATCH_KEYS
P_TB, P_MB, P_GAS = (f"deepspeed.{key}" for key in BATCH_KEYS)
Triple = tuple[int, int, int]

# None = key absent. -1, 0 and small values, plus DeepSpeed's TestBatchConfig values (16, 17, 18, 32, 33).
VALUES = (None, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 18, 32, 33)
WORLD_SIZES = range(1, 9)


@contextmanager
def ranks(world_size: int) -> Iterator[None]:
    """Make DeepSpeedConfig see ``world_size`` ranks without a process group."""
    with mock.patch.object(ds_config.dist, "get_world_size", return_value=world_size), \
            mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        yield


def deepspeed_triple(tb: Optional[int], mb: Optional[int], gas: Optional[int]) -> Optional[Triple]:
    """DeepSpeed's triple for the given keys (call inside ``ranks``), or None where it rejects."""
    config = {key: value for key, value in zip(BATCH_KEYS, (tb, mb, gas)) if value is not None}
    try:
        parsed = DeepSpeedConfig(config)  # a fresh dict each time: DeepSpeed keeps and mutates it
    except Exception:
        return None
    return parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps


def dsconf_triple(tb: Optional[int], mb: Optional[int], gas: Optional[int], ws: int) -> Optional[Triple]:
    try:
        triple = derive_batch(tb, mb, gas, ws)
    except ConfigError:
        return None
    assert isinstance(triple, BatchTriple)
    return triple.train_batch_size, triple.train_micro_batch_size_per_gpu, triple.gradient_accumulation_steps


def error(tb: Optional[int], mb: Optional[int], gas: Optional[int], ws: int, **kwargs: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        derive_batch(tb, mb, gas, ws, **kwargs)
    return info.value


# --- generated: every combination, compared with DeepSpeed ------------------------------------------------


@pytest.mark.parametrize("ws", WORLD_SIZES, ids=lambda ws: f"ws{ws}")
def test_matches_deepspeed_everywhere(ws: int) -> None:
    """len(VALUES) ** 3 cases per world size: accept iff DeepSpeed accepts, with the same triple."""
    mismatches = []
    accepted = 0
    with ranks(ws):
        for tb, mb, gas in itertools.product(VALUES, repeat=3):
            expected, got = deepspeed_triple(tb, mb, gas), dsconf_triple(tb, mb, gas, ws)
            accepted += expected is not None
            if got != expected:
                mismatches.append(f"tb={tb} mb={mb} gas={gas}: deepspeed {expected}, dsconf {got}")
    assert not mismatches, f"{len(mismatches)} mismatches at ws={ws}, e.g. " + "; ".join(mismatches[:5])
    # Both outcomes really occur, so agreement is not agreement on "always reject".
    assert 0 < accepted < len(VALUES) ** 3


# --- DeepSpeed's TestBatchConfig rows, each with every subset of the keys given ---------------------------

# (num_ranks, tb, mb, gas, ok) from deepspeed tests/unit/runtime/test_ds_config_dict.py::TestBatchConfig
ROWS = [(2, 32, 16, 1, True), (2, 32, 8, 2, True), (2, 33, 17, 2, False), (2, 32, 18, 1, False)]
SUBSETS = ["tb+mb+gas", "tb+mb", "tb+gas", "mb+gas", "tb", "mb", "gas", "none"]
# The triple DeepSpeed reaches for each row and subset of keys given (worked out by hand), None = rejected.
EXPECTED: dict[tuple[int, str], Optional[Triple]] = {
    (0, "tb+mb+gas"): (32, 16, 1), (0, "tb+mb"): (32, 16, 1), (0, "tb+gas"): (32, 16, 1),
    (0, "mb+gas"): (32, 16, 1), (0, "tb"): (32, 16, 1), (0, "mb"): (32, 16, 1),
    (1, "tb+mb+gas"): (32, 8, 2), (1, "tb+mb"): (32, 8, 2), (1, "tb+gas"): (32, 8, 2),
    (1, "mb+gas"): (32, 8, 2), (1, "tb"): (32, 16, 1), (1, "mb"): (16, 8, 1),
    (2, "tb+mb+gas"): None, (2, "tb+mb"): None, (2, "tb+gas"): None,  # 33 // 2 // 2 = 8, 8 x 2 x 2 = 32
    (2, "mb+gas"): (68, 17, 2), (2, "tb"): None, (2, "mb"): (34, 17, 1),
    (3, "tb+mb+gas"): None, (3, "tb+mb"): None, (3, "tb+gas"): (32, 16, 1),
    (3, "mb+gas"): (36, 18, 1), (3, "tb"): (32, 16, 1), (3, "mb"): (36, 18, 1),
}
ROW_CASES = [
    pytest.param(row, subset, id=f"ranks{n}-tb{tb}-mb{mb}-gas{gas}-{'ok' if ok else 'bad'}-given:{subset}")
    for row, (n, tb, mb, gas, ok) in enumerate(ROWS) for subset in SUBSETS
]


@pytest.mark.parametrize("row,subset", ROW_CASES)
def test_deepspeed_batch_config_rows(row: int, subset: str) -> None:
    n, tb, mb, gas, ok = ROWS[row]
    keys = subset.split("+")
    args = (tb if "tb" in keys else None, mb if "mb" in keys else None, gas if "gas" in keys else None)
    expected = EXPECTED.get((row, subset))  # absent: rejected (gas only, nothing given)
    if subset == "tb+mb+gas":
        assert (expected is not None) == ok
    with ranks(n):
        assert deepspeed_triple(*args) == expected
    assert dsconf_triple(*args, n) == expected


# --- what the error says ----------------------------------------------------------------------------------


def test_micro_batch_not_dividing_names_keys_arithmetic_and_nearest_values() -> None:
    err = error(32, 5, None, 2)
    assert err.paths == [P_TB]
    problem = err.problems[0]
    assert f"32 != {P_MB} 5 x {P_GAS} 3 (derived as 32 // 5 // 2) x data-parallel size 2 = 30" in problem.message
    assert f"{P_TB}=30 or 40" in problem.hint
    assert f"{P_MB}=4 or 8" in problem.hint
    assert P_TB in str(err) and "30 or 40" in str(err)


def test_gas_not_dividing_suggests_batch_sizes_and_gas_values() -> None:
    problem = error(32, None, 3, 2).problems[0]  # micro derived as 32 // 2 // 3 = 5, 5 x 3 x 2 = 30
    assert f"32 != {P_MB} 5 (derived as 32 // 2 // 3) x {P_GAS} 3 x data-parallel size 2 = 30" in problem.message
    assert f"{P_TB}=30 or 36" in problem.hint
    assert f"{P_GAS}=2 or 4" in problem.hint


def test_all_three_given_suggests_the_value_that_fits_each_key() -> None:
    problem = error(32, 5, 2, 2).problems[0]
    assert problem.path == P_TB
    assert f"32 != {P_MB} 5 x {P_GAS} 2 x data-parallel size 2 = 20" in problem.message
    assert f"{P_TB}=20" in problem.hint
    assert f"{P_MB}=8" in problem.hint  # 8 x 2 x 2 = 32
    assert P_GAS + "=" not in problem.hint  # no gas g with 5 x g x 2 = 32
    assert "unset" in problem.hint


def test_train_batch_only_not_divisible_by_world_size() -> None:
    problem = error(30, None, None, 4).problems[0]
    assert f"30 != {P_MB} 7 (derived as 30 // 4) x {P_GAS} 1 (default) x data-parallel size 4 = 28" in problem.message
    assert f"{P_TB}=28 or 32" in problem.hint


def test_micro_batch_larger_than_share_of_batch_says_gas_would_be_zero() -> None:
    problem = error(8, 5, None, 2).problems[0]
    assert f"{P_GAS} 0 (derived as 8 // 5 // 2)" in problem.message
    assert f"{P_TB}=10," in problem.hint  # no positive multiple of 10 below 8
    assert f"{P_MB}=4" in problem.hint


def test_no_micro_batch_fits_when_batch_does_not_divide_by_world_size() -> None:
    problem = error(33, 17, None, 2).problems[0]
    assert f"{P_TB}=34" in problem.hint
    assert "33 is not divisible by data-parallel size 2" in problem.hint


def test_neither_batch_size_given_names_both_keys() -> None:
    for gas in (None, 4):
        err = error(None, None, gas, 8)
        assert err.paths == [P_TB]
        assert P_MB in err.problems[0].message and "at least one" in err.problems[0].message
        assert f"{P_MB}=<per-GPU batch>" in err.problems[0].hint


def test_non_positive_values_reported_each_with_its_path() -> None:
    err = error(0, -1, 0, 2)
    assert err.paths == [P_TB, P_MB, P_GAS]
    assert "got 0" in err.problems[0].message and "got -1" in err.problems[1].message
    assert error(None, None, 0, 1).paths == [P_GAS, P_TB]  # zero gas, and no batch size at all


def test_zero_can_be_left_unset_only_if_derivable() -> None:
    assert "leave it unset" in error(0, 4, None, 2).problems[0].hint  # micro given: tb derivable
    assert "leave it unset" not in error(None, 0, 2, 2).problems[0].hint  # mb unset would leave nothing


def test_non_integer_values_are_reported_not_crashed_on() -> None:
    err = error(32, 4, "auto", 2)  # type: ignore[arg-type]
    assert err.paths == [P_GAS] and "'auto'" in err.problems[0].message
    assert error(32.0, 4, None, 2).paths == [P_TB]  # type: ignore[arg-type]
    assert error(True, 4, None, 2).paths == [P_TB]  # type: ignore[arg-type]


def test_prefix_sets_the_paths() -> None:
    err = error(32, 5, None, 2, prefix="trainer.ds")
    assert err.paths == ["trainer.ds.train_batch_size"]
    assert "trainer.ds.train_micro_batch_size_per_gpu=4 or 8" in err.problems[0].hint
    assert error(None, None, None, 1, prefix="").paths == ["train_batch_size"]


@pytest.mark.parametrize("ws", [0, -1, 2.0, True, None])
def test_bad_world_size_is_a_caller_error(ws: object) -> None:
    with pytest.raises(ValueError, match="world_size"):
        derive_batch(32, None, None, ws)  # type: ignore[arg-type]


def test_triple_as_dict_uses_deepspeed_keys() -> None:
    triple = derive_batch(None, 4, 2, 3)
    assert triple == BatchTriple(24, 4, 2)
    assert triple.as_dict() == {TB: 24, MB: 4, GAS: 2}
    assert list(triple.as_dict()) == list(BATCH_KEYS)


# --- every hint is right: suggested values are accepted by DeepSpeed, and no closer value is ------------------

SUGGESTION = re.compile(r"deepspeed\.(\w+)=(\d+(?: or \d+)*)")
HINT_VALUES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 18, 32, 33)


@pytest.mark.parametrize("ws", [1, 2, 3, 4, 6, 8], ids=lambda ws: f"ws{ws}")
def test_suggestions_are_valid_and_nearest(ws: int) -> None:
    checked = 0
    with ranks(ws):
        for tb, mb, gas in itertools.product(HINT_VALUES, (None, *HINT_VALUES), (None, *HINT_VALUES)):
            if dsconf_triple(tb, mb, gas, ws) is not None:
                continue
            given = {TB: tb, MB: mb, GAS: gas}
            hint = error(tb, mb, gas, ws).problems[0].hint
            suggested = {key: [int(v) for v in values.split(" or ")] for key, values in SUGGESTION.findall(hint)}
            assert TB in suggested, hint
            for key, values in suggested.items():
                assert given[key] is not None, f"suggests {key}, which was not given: {hint}"
                for value in values:
                    changed = {**given, key: value}
                    assert deepspeed_triple(changed[TB], changed[MB], changed[GAS]) is not None, (given, key, value)
                # Nearest: nothing valid strictly between the requested value and each suggestion.
                # (The all-three case suggests the one value that fits; nothing else can.)
                if mb is not None and gas is not None:
                    continue
                requested = given[key]
                low = max([v for v in values if v < requested], default=0)
                high = min([v for v in values if v > requested], default=tb + 1)
                between = [v for v in range(low + 1, high) if v != requested]
                valid = [v for v in between if dsconf_triple(*{**given, key: v}.values(), ws) is not None]
                assert not valid, f"{key}: {valid} are closer than {values} for {given}, ws={ws}"
            checked += 1
    assert checked > 100


def test_batch_module_imports_neither_torch_nor_deepspeed() -> None:
    code = "import sys, dsconf.batch; print(sorted({'torch', 'deepspeed'} & set(sys.modules)))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
