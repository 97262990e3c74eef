"""The batch triple: train_batch_size = micro batch per GPU x gradient accumulation x data-parallel size.

``derive_batch`` is the one place dsconf knows DeepSpeed's batch rules (deepspeed/runtime/config.py,
``_set_batch_related_parameters`` then ``_batch_assertion``): it completes the triple exactly as
DeepSpeed would, and raises ``ConfigError`` exactly where DeepSpeed would fail, but before launch and
naming the keys, the arithmetic and the nearest values that would work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from dsconf.errors import ConfigError, Problem, join_path
from dsconf.schema.root import DEEPSPEED_NODE

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
TB, MB, GAS = BATCH_KEYS


@dataclass(frozen=True)
class BatchTriple:
    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int

    def as_dict(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in BATCH_KEYS}


def derive_batch(
    train_batch_size: Optional[int],
    train_micro_batch_size_per_gpu: Optional[int],
    gradient_accumulation_steps: Optional[int],
    world_size: int,
    *,
    prefix: str = DEEPSPEED_NODE,
) -> BatchTriple:
    """Complete the batch triple as DeepSpeed does for ``world_size`` data-parallel ranks.

    ``None`` means "not given" (map HF-style "auto" to None first); 0 counts as given. Derivation, like
    DeepSpeed's, uses floor division, so a request that does not divide evenly is rejected afterwards.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    ws = world_size
    tb, mb, gas = train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps
    given = {TB: tb, MB: mb, GAS: gas}
    path = {key: join_path(prefix, key) for key in BATCH_KEYS}

    # Given values are never changed by DeepSpeed, so each must be a positive int on its own.
    problems = [_check_given(key, value, given, path) for key, value in given.items() if value is not None]
    problems = [p for p in problems if p is not None]
    if tb is None and mb is None:
        problems.append(Problem(
            path[TB], f"neither it nor {path[MB]} is set; DeepSpeed needs at least one of them",
            f"set {path[MB]}=<per-GPU batch> to derive the rest, or {path[TB]}=<global batch>"))
    if problems:
        raise ConfigError(problems)
    assert tb is not None or mb is not None  # for type checkers; checked just above

    # DeepSpeed's _set_batch_related_parameters, step for step (nested floor division included);
    # with all three given nothing is derived.
    notes = {MB: "", GAS: ""}
    if tb is not None and mb is not None and gas is None:
        gas, notes[GAS] = tb // mb // ws, f" (derived as {tb} // {mb} // {ws})"
    elif tb is not None and gas is not None and mb is None:
        mb, notes[MB] = tb // ws // gas, f" (derived as {tb} // {ws} // {gas})"
    elif tb is None and mb is not None and gas is not None:
        tb = mb * gas * ws
    elif tb is not None and mb is None and gas is None:
        mb, gas = tb // ws, 1
        notes[MB], notes[GAS] = f" (derived as {tb} // {ws})", " (default)"
    elif tb is None and mb is not None and gas is None:
        tb, gas = mb * ws, 1
    assert tb is not None and mb is not None and gas is not None

    # DeepSpeed's _batch_assertion: given values are already known > 0, so only derived ones can fail.
    if mb > 0 and gas > 0 and tb == mb * gas * ws:
        return BatchTriple(tb, mb, gas)
    # Only a given train_batch_size can fail here: derived from micro and gas, it always fits.
    message = (f"must equal micro batch x gradient accumulation x data-parallel size, but {tb} != {path[MB]} "
               f"{mb}{notes[MB]} x {path[GAS]} {gas}{notes[GAS]} x data-parallel size {ws} = {mb * gas * ws}")
    raise ConfigError(Problem(path[TB], message, _fix_hint(tb, given, ws, path)))


def _check_given(key: str, value: object, given: dict, path: dict[str, str]) -> Optional[Problem]:
    """A given value DeepSpeed would reject on its own (it keeps given values as they are)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return None
    # Unsetting this key still works if the other batch size is given.
    derivable = any(given[k] is not None for k in (TB, MB) if k != key)
    hint = "use a positive integer" + (", or leave it unset to derive it" if derivable else "")
    if not isinstance(value, int) or isinstance(value, bool):
        return Problem(path[key], f"must be an integer, got {value!r}", hint)
    return Problem(path[key], f"must be > 0, got {value}", hint)


def _fix_hint(tb: int, given: dict, ws: int, path: dict[str, str]) -> str:
    """The nearest values that would work, changing one given key at a time."""
    mb, gas = given[MB], given[GAS]
    if mb is not None and gas is not None:  # all three given: each key has one value that fits the others
        options = [f"{path[TB]}={mb * gas * ws}"]
        options += [f"{path[MB]}={tb // (gas * ws)}"] if tb % (gas * ws) == 0 else []
        options += [f"{path[GAS]}={tb // (mb * ws)}"] if tb % (mb * ws) == 0 else []
        return "with data-parallel size {}, try {}; or leave one of the three unset to derive it".format(
            ws, ", or ".join(options))
    # One of micro/gas given (or neither): train_batch_size must be a multiple of it times ws.
    other = MB if mb is not None else GAS if gas is not None else None
    unit = ws * (given[other] if other else 1)
    options = [f"{path[TB]}={_either(_nearest_multiples(tb, unit))}"]
    if other:
        fits = _nearest_fits(tb, ws, given[other])
        if fits:
            options.append(f"{path[other]}={_either(fits)}")
        else:
            options.append(f"no {path[other]} fits: {tb} is not divisible by data-parallel size {ws}")
    return f"with data-parallel size {ws}, try " + ", or ".join(options)


def _nearest_multiples(value: int, unit: int) -> list[int]:
    """The positive multiples of ``unit`` just below and just above ``value`` (not a multiple itself)."""
    below = value // unit * unit
    return [m for m in (below, below + unit) if m > 0]


def _nearest_fits(tb: int, ws: int, requested: int) -> list[int]:
    """The sizes s closest below and above ``requested`` with tb divisible by s x ws."""
    if tb % ws:
        return []
    quotient = tb // ws
    divisors = {d for i in range(1, math.isqrt(quotient) + 1) if quotient % i == 0 for d in (i, quotient // i)}
    below = [d for d in divisors if d < requested]
    above = [d for d in divisors if d > requested]
    return ([max(below)] if below else []) + ([min(above)] if above else [])


def _either(values: list[int]) -> str:
    return " or ".join(str(v) for v in values)
