"""``dsconf estimate``: memory for model states (params, gradients, Adam states) per GPU and per node's CPU,
under each ZeRO option, from DeepSpeed's own estimators.

The numbers come from ``estimate_zero2_model_states_mem_needs`` (``deepspeed.runtime.zero.stage_1_and_2``) and
``estimate_zero3_model_states_mem_needs`` (``deepspeed.runtime.zero.stage3``), called with DeepSpeed's default
``additional_buffer_factor``; nothing here re-derives their formulas, so the table follows the installed
DeepSpeed. The rows are the ones DeepSpeed's ``*_all_cold`` helpers print (those helpers only print):

- stage 2 with ``offload_optimizer`` cpu and none;
- stage 3 with (``offload_optimizer``, ``offload_param``) = (cpu, cpu), (cpu, none), (none, none), each with and
  without ``zero.Init`` (``zero_init``). Offloading params without the optimizer has no row: DeepSpeed's stage-3
  estimator ignores ``cpu_offload_params`` when ``cpu_offload`` is off and its table skips that combination.

DeepSpeed estimates CPU offload only; a config offloading to NVMe is matched to the CPU-offload rows (the GPU
side is the same) with a note that the per-CPU figure is CPU offload's.

Stages 0 and 1 have no rows. DeepSpeed has no estimator for them, and its ZeRO-2 one would understate them:
stage 1 keeps full gradients on every GPU and stage 0 also full optimizer states, while the ZeRO-2 formula
partitions both. Working them out here would be dsconf's own formula, not DeepSpeed's.

``zero_init`` is not a config key: ``deepspeed.zero.Init`` is chosen in code (HF Transformers and Accelerate use
it with ZeRO-3 by default), so a composed stage-3 config selects both of its ``zero_init`` rows.

Only model states are covered: activations, temporary buffers and the CUDA context come on top.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from dsconf.batch import BATCH_KEYS
from dsconf.schema.root import DEEPSPEED_NODE

GIB = 2**30

# DeepSpeed has no default for the largest layer (its ZeRO-3 estimator requires it; its docs measure it on a
# live model). A tenth of the model is dsconf's stand-in: in decoder LLMs the largest layer is the embedding
# (vocab x hidden), from about 1.5% of a 70B model to about 20% of a 1B one with a 128k vocabulary, so a tenth
# errs high for large models, where the memory matters. The header says when it was assumed.
DEFAULT_LARGEST_LAYER_FRACTION = 10

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT = re.compile(r"(\d+(?:_\d+)*(?:\.\d+(?:_\d+)*)?(?:e[+-]?\d+)?)([kmbgt]?)", re.IGNORECASE)
COUNT_FORMS = ("a whole count from 1 to 1e15, such as 7b, 350m, 1.5k, 1.3e9, 1_000_000 or 125000000 "
               "(suffixes k, m, b or g, t)")
# DeepSpeed's estimators divide in floats; far beyond any model, int/int division overflows there.
MAX_COUNT = 10**15

# (stage, offload_optimizer, offload_param) -> the dsconf `zero=` option that configures exactly that
ZERO_OPTIONS: Dict[Tuple[int, bool, bool], str] = {
    (2, False, False): "stage2",
    (2, True, False): "stage2_offload",
    (3, False, False): "stage3",
    (3, True, False): "stage3_offload_optimizer",
    (3, True, True): "stage3_offload",
}


class EstimateError(ValueError):
    """A bad ``dsconf estimate`` argument, or DeepSpeed missing; ``dsconf: <message>``, exit 2."""


@dataclass(frozen=True)
class Row:
    """One ZeRO option and the model-state memory DeepSpeed estimates for it.

    ``zero_init`` is None for stage 2 (``zero.Init`` partitions at construction, a stage-3 feature);
    ``per_cpu_bytes`` is per node. ``fits`` / ``selected`` stay None until asked for.
    """

    stage: int
    offload_optimizer: bool
    offload_param: bool
    zero_init: Optional[bool]
    per_gpu_bytes: int
    per_cpu_bytes: int
    zero_option: Optional[str]
    fits: Optional[bool] = None
    selected: Optional[bool] = None

    def as_json(self) -> Dict[str, Any]:
        """The row for ``--json``: ``fits`` and ``selected`` only when they were computed."""
        return {k: v for k, v in asdict(self).items() if k not in ("fits", "selected") or v is not None}


def parse_count(text: str, flag: str = "--params") -> int:
    """A parameter count from ``7b``, ``350m``, ``1.3e9``, ``1_000_000`` or a plain int.

    Decimal arithmetic, so ``1.3e9`` is exactly 1300000000 (not a float's neighbour); a count that is not whole
    (``1.5``, ``1.2345k``) is refused rather than rounded, since it is almost certainly a typo.
    """
    match = _COUNT.fullmatch(text.strip())
    if match is None:
        raise EstimateError(f"{flag}: cannot read {text!r} as a parameter count; use {COUNT_FORMS}")
    number, suffix = match.groups()
    try:
        value = Decimal(number.replace("_", "")) * _SUFFIXES[suffix.lower()]
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
        raise EstimateError(f"{flag}: cannot read {text!r} as a parameter count; use {COUNT_FORMS}") from None
    if value != value.to_integral_value():
        raise EstimateError(f"{flag}: {text!r} is {value.normalize():f} parameters, not a whole count; "
                            f"use {COUNT_FORMS}")
    if not 1 <= value <= MAX_COUNT:
        raise EstimateError(f"{flag}: {text!r} is out of range; use {COUNT_FORMS}")
    return int(value)


def default_largest_layer(params: int) -> int:
    """dsconf's stand-in for the largest layer when none is given (see DEFAULT_LARGEST_LAYER_FRACTION)."""
    return max(1, params // DEFAULT_LARGEST_LAYER_FRACTION)


def _estimators() -> Tuple[Callable[..., Tuple[int, int]], Callable[..., Tuple[int, int, int]]]:
    """DeepSpeed's two estimators, imported here so ``import dsconf`` never pulls in DeepSpeed or torch. DeepSpeed's
    note on the accelerator it picks at import is left out: the estimators use none."""
    import logging

    def quiet(record: logging.LogRecord) -> bool:
        return record.module != "real_accelerator"

    logger = logging.getLogger("DeepSpeed")  # the logger DeepSpeed's own logging sets up on import
    logger.addFilter(quiet)
    try:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    except ImportError as err:
        missing = isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] == "deepspeed"
        why = "DeepSpeed is not installed" if missing else f"DeepSpeed failed to import ({err})"
        raise EstimateError(f"estimate uses DeepSpeed's memory estimators, but {why}: install the dsconf[deepspeed] "
                            f"extra (pip install 'dsconf[deepspeed]')") from None
    finally:
        logger.removeFilter(quiet)
    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs


def check_counts(**counts: int) -> None:
    """Each count (keyword = flag name with dashes) is a whole number >= 1, or ``EstimateError`` naming the flag."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise EstimateError(f"--{name.replace('_', '-')}: must be a whole number >= 1, got {value!r}")


def estimate(params: int, largest_layer_params: Optional[int] = None, *, gpus_per_node: int = 1,
             nodes: int = 1) -> List[Row]:
    """DeepSpeed's estimates for every row of its ``*_all_cold`` tables, in their order.

    ``largest_layer_params`` only matters for stage 3 (the GPU gathers one whole layer at a time); None means
    ``default_largest_layer(params)``.
    """
    check_counts(params=params, gpus_per_node=gpus_per_node, nodes=nodes)
    largest = default_largest_layer(params) if largest_layer_params is None else largest_layer_params
    if isinstance(largest, bool) or not isinstance(largest, int) or not 1 <= largest <= params:
        raise EstimateError(f"--largest-layer-params: must be between 1 and --params ({params}), got {largest!r}")
    zero2, zero3 = _estimators()
    hardware = {"num_gpus_per_node": gpus_per_node, "num_nodes": nodes}
    rows = []
    for offload_optimizer in (True, False):
        cpu, gpu = zero2(total_params=params, cpu_offload=offload_optimizer, **hardware)
        rows.append(Row(2, offload_optimizer, False, None, int(gpu), int(cpu),
                        ZERO_OPTIONS[(2, offload_optimizer, False)]))
    for offload_optimizer, offload_param in ((True, True), (True, False), (False, False)):
        for zero_init in (True, False):
            cpu, gpu, _ = zero3(total_params=params, largest_layer_params=largest, cpu_offload=offload_optimizer,
                                cpu_offload_params=offload_param, zero_init=zero_init, **hardware)
            rows.append(Row(3, offload_optimizer, offload_param, zero_init, int(gpu), int(cpu),
                            ZERO_OPTIONS[(3, offload_optimizer, offload_param)]))
    return rows


def mark_fits(rows: Sequence[Row], gpu_memory_gib: float) -> List[Row]:
    """``fits``: the row's per-GPU model states are at most ``gpu_memory_gib`` GiB (2**30 bytes)."""
    if not gpu_memory_gib > 0:
        raise EstimateError(f"--gpu-memory: must be a positive number of GiB, got {gpu_memory_gib!r}")
    limit = gpu_memory_gib * GIB
    return [replace(row, fits=row.per_gpu_bytes <= limit) for row in rows]


def fitting_options(rows: Iterable[Row]) -> List[str]:
    """The ``zero=`` options with a row that fits, in table order."""
    return list(dict.fromkeys(r.zero_option for r in rows if r.fits and r.zero_option))


def batch_default(overrides: Sequence[str]) -> List[str]:
    """The batch does not change model-state memory, but dsconf refuses a config without one: when the overrides
    set no batch key, a micro batch of 1 lets the rest of the config compose."""
    keys = {item.lstrip("+~").partition("=")[0] for item in overrides}
    if keys & {f"{DEEPSPEED_NODE}.{key}" for key in BATCH_KEYS}:
        return list(overrides)
    return [*overrides, f"{DEEPSPEED_NODE}.train_micro_batch_size_per_gpu=1"]


def config_choice(ds: Dict[str, Any]) -> Tuple[int, str, str]:
    """(stage, offload_optimizer device, offload_param device) of an exported DeepSpeed dict."""
    zero = ds.get("zero_optimization") or {}

    def device(block: str) -> str:
        return str((zero.get(block) or {}).get("device") or "none")

    return int(zero.get("stage") or 0), device("offload_optimizer"), device("offload_param")


def mark_selected(rows: Sequence[Row], ds: Dict[str, Any]) -> Tuple[List[Row], List[str]]:
    """``selected``: the rows for the composed config's stage and offloads, and notes on what the table misses.

    A stage-3 config selects both ``zero_init`` rows (the config does not decide it). NVMe offload is matched
    to the CPU-offload rows: the GPU side is the same, the per-CPU figure is what CPU offload would need.
    """
    stage, optimizer_device, param_device = config_choice(ds)
    offload_optimizer, offload_param = optimizer_device != "none", stage == 3 and param_device != "none"
    notes = []
    if stage < 2:
        notes.append(f"the config is ZeRO stage {stage}: DeepSpeed's estimators cover stages 2 and 3 only, and "
                     f"stage {stage} needs more GPU memory than stage 2's rows (no row marked)")
    elif offload_param and not offload_optimizer:
        notes.append("the config offloads params but not the optimizer: DeepSpeed's estimator has no row for "
                     "that (no row marked)")
    elif "nvme" in (optimizer_device, param_device if stage == 3 else "none"):
        notes.append("the config offloads to NVMe: DeepSpeed estimates CPU offload; the per-GPU figure holds, "
                     "the per-CPU one is what CPU offload would need")
    marked = [replace(r, selected=stage >= 2 and (r.stage, r.offload_optimizer, r.offload_param)
                      == (stage, offload_optimizer, offload_param)) for r in rows]
    return marked, notes


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB"


def _count(n: int) -> str:
    for scale, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}".replace(".00", "")
    return str(n)


def render_table(rows: Sequence[Row], *, params: int, largest_layer_params: Optional[int], gpus_per_node: int,
                 nodes: int, gpu_memory_gib: Optional[float] = None) -> List[str]:
    """The human table: a header saying what was assumed, one line per row, and the fitting options."""
    largest = default_largest_layer(params) if largest_layer_params is None else largest_layer_params
    assumed = "" if largest_layer_params is not None else " (default: --params / 10; set --largest-layer-params)"
    lines = [
        "DeepSpeed's estimate of model-state memory (params, gradients, Adam states; not activations):",
        f"{_count(params)} params, largest layer {_count(largest)}{assumed}; "
        f"{nodes} node{'s' if nodes > 1 else ''} x {gpus_per_node} GPU{'s' if gpus_per_node > 1 else ''}",
    ]
    header = ["stage", "offload_optimizer", "offload_param", "zero_init", "per GPU", "per CPU (node)", "zero="]
    if gpu_memory_gib is not None:
        header.append(f"fits {gpu_memory_gib:g} GiB")
    table = [header]
    for r in rows:
        cells = [str(r.stage), "cpu" if r.offload_optimizer else "none",
                 ("cpu" if r.offload_param else "none") if r.stage == 3 else "-",
                 "-" if r.zero_init is None else str(r.zero_init).lower(), _gib(r.per_gpu_bytes),
                 _gib(r.per_cpu_bytes), r.zero_option or "-"]
        if gpu_memory_gib is not None:
            cells.append("yes" if r.fits else "no")
        table.append(cells)
    right = {4, 5}
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    selecting = any(r.selected is not None for r in rows)
    for index, cells in enumerate(table):
        mark = ""
        if selecting:
            mark = "  " if index == 0 or not rows[index - 1].selected else "> "
        text = "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        lines.append((mark + text).rstrip())
    if selecting:
        lines.append("> = the composed config" if any(r.selected for r in rows)
                     else "no row matches the composed config (see the note above)")
    if gpu_memory_gib is not None:
        options = fitting_options(rows)
        lines.append(f"fits in {gpu_memory_gib:g} GiB per GPU: " + (", ".join(f"zero={o}" for o in options)
                                                                      if options else "none of these options"))
    return lines
