"""The search space: ZeRO stage x offload x micro batch per GPU (x the user's own dimensions), the global batch fixed.

A ``Candidate`` is one configuration; ``overrides`` turns it into the Hydra overrides of its trial. The global batch
(``train_batch_size``) is the one the user's config gives for the job's world size, and every candidate keeps it:
``gradient_accumulation_steps`` is derived (``global batch / (micro batch x world size)``), so a tuned run trains
exactly what the untuned one would. The micro batches are the powers of two (or the user's list) that divide the
global batch evenly across the ranks.

Combinations DeepSpeed does not run are not candidates: stage 0 offloads nothing, parameters are offloaded by stage 3
alone, and NVMe offload (ZeRO-Infinity) is stage 3's.

More dimensions come from the command line in Hydra's sweep syntax (``key=choice(a,b)``, ``key=a,b``, ``key=range(..)``)
or ``hydra.sweeper.params``: each is a categorical dimension of the search; plain overrides apply to every trial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dsconf.batch import BATCH_KEYS
from dsconf.errors import ConfigError, Problem
from dsconf.schema.root import DEEPSPEED_NODE
from dsconf.tune.settings import NVME_OFFLOADS, OFFLOADS, PREFIX, TuneSettings

ZERO = f"{DEEPSPEED_NODE}.zero_optimization"
# keys each trial sets; the command line may not set them (it would fight the search)
SEARCHED_KEYS = {
    f"{ZERO}.stage": "space.stage",
    f"{ZERO}.offload_optimizer.device": "space.offload",
    f"{ZERO}.offload_param.device": "space.offload",
}
BATCH_OVERRIDE_KEYS = tuple(f"{DEEPSPEED_NODE}.{key}" for key in BATCH_KEYS)
OFFLOAD_LEVEL = {"none": 0, "optimizer": 1, "all": 2, "optimizer_nvme": 3, "all_nvme": 4}


@dataclass(frozen=True)
class Candidate:
    stage: int
    offload: str
    micro_batch: int
    extras: Tuple[Tuple[str, str], ...] = ()  # (key, override) of the user's dimensions

    @property
    def key(self) -> str:
        """Its identity in the study's storage and in trials.json."""
        parts = [f"stage={self.stage}", f"offload={self.offload}", f"micro_batch={self.micro_batch}"]
        return " ".join(parts + [override for _, override in self.extras])

    def params(self) -> Dict[str, Any]:
        """Its Optuna parameters."""
        return {"stage": self.stage, "offload": self.offload, "micro_batch": self.micro_batch,
                **{key: override for key, override in self.extras}}


@dataclass(frozen=True)
class Space:
    """The arguments split, and what the search runs over."""

    fixed: Tuple[str, ...]  # overrides every trial gets (the command line's and hydra.sweeper.params' plain ones)
    dimensions: Tuple[Tuple[str, Tuple[str, ...]], ...]  # the user's: key -> its overrides ("key=value")

    def first(self) -> List[str]:
        """The overrides of the base job: the fixed ones and each dimension's first value."""
        return [*self.fixed, *(values[0] for _, values in self.dimensions)]


def split_arguments(arguments: Sequence[str], config_loader: Any) -> Space:
    """The command line's overrides (and ``hydra.sweeper.params``) as fixed overrides and searched dimensions."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(list(arguments))
    fixed: List[str] = []
    dimensions: Dict[str, Tuple[str, ...]] = {}
    problems: List[Problem] = []
    for override in parsed:
        key = override.get_key_element()
        bare = key.lstrip("+~")
        if bare in SEARCHED_KEYS:
            problems.append(Problem(bare, "is set by the tuner for each trial",
                                    f"search or fix it with hydra.sweeper.{SEARCHED_KEYS[bare]}=[...]"))
            continue
        if override.is_sweep_override():
            if bare in BATCH_OVERRIDE_KEYS:
                problems.append(Problem(bare, "the tuner keeps the global batch fixed and searches the micro batch",
                                        "give one value; search micro batches with hydra.sweeper.space.micro_batch"))
            elif not override.is_discrete_sweep():
                problems.append(Problem(bare, f"the tuner searches discrete values, not {override.input_line!r}",
                                        "use choice(a,b,...), a comma list or range(...)"))
            else:
                dimensions[key] = tuple(f"{key}={value}" for value in override.sweep_string_iterator())
        else:
            fixed.append(override.input_line)
    if problems:
        raise ConfigError(problems)
    return Space(tuple(fixed), tuple(dimensions.items()))


def micro_batches(settings: TuneSettings, global_batch: int, world_size: int) -> List[int]:
    """The micro batches per GPU that keep ``global_batch`` with a whole gradient accumulation."""
    per_rank, remainder = divmod(global_batch, world_size)
    if remainder or per_rank < 1:  # dsconf's validation refuses such a config before this is reached
        raise ConfigError(Problem(f"{DEEPSPEED_NODE}.train_batch_size",
                                  f"{global_batch} does not divide across {world_size} ranks"))
    fits = [m for m in range(1, per_rank + 1) if per_rank % m == 0]
    if settings.micro_batches is None:
        return [m for m in fits if m & (m - 1) == 0]
    wrong = [m for m in settings.micro_batches if m not in fits]
    if wrong:
        raise ConfigError(Problem(
            f"{PREFIX}.space.micro_batch",
            f"{', '.join(map(str, wrong))} would change the global batch {global_batch} (= micro batch x gradient "
            f"accumulation x {world_size} ranks): a micro batch must divide {per_rank}",
            f"valid: {', '.join(map(str, fits))}"))
    return list(settings.micro_batches)


def runs(stage: int, offload: str) -> bool:
    """Whether DeepSpeed runs this stage with this offload."""
    if offload == "none":
        return True
    if stage == 0:
        return False  # ZeRO-Offload needs a partitioned optimizer
    if offload in NVME_OFFLOADS or offload == "all":
        return stage == 3  # parameters are stage 3's; NVMe offload is ZeRO-Infinity's
    return True


def candidates(settings: TuneSettings, space: Space, global_batch: int, world_size: int) -> List[Candidate]:
    """Every candidate, in the order the prior ranks them before it knows any memory (see ``promise``)."""
    batches = micro_batches(settings, global_batch, world_size)
    combos: List[Tuple[Tuple[str, str], ...]] = [()]
    for key, values in space.dimensions:
        combos = [(*combo, (key, value)) for combo in combos for value in values]
    out = [Candidate(stage, offload, micro, extras)
           for extras in combos for offload in settings.offloads for stage in settings.stages
           for micro in batches if runs(stage, offload)]
    if not out:
        raise ConfigError(Problem(f"{PREFIX}.space.offload",
                                  f"no stage in {list(settings.stages)} runs with offload {list(settings.offloads)}",
                                  "offload needs stage >= 1; params and NVMe offload need stage 3"))
    return sorted(out, key=promise)


def promise(candidate: Candidate) -> Tuple[int, int, int]:
    """Fastest first, as a rule of thumb before anything is measured: the less offloaded, the larger the micro batch
    (fewer, fuller steps), the lower the ZeRO stage (less communication)."""
    return OFFLOAD_LEVEL[candidate.offload], -candidate.micro_batch, candidate.stage


def leanest(all_candidates: Sequence[Candidate]) -> Candidate:
    """The candidate that should need the least accelerator memory: the most offloaded (to CPU rather than NVMe, which
    is slower for the same accelerator memory), the highest stage, the smallest micro batch; the user's dimensions at
    their first values. The memory probe runs it."""
    first_extras = all_candidates[0].extras

    def lean(c: Candidate) -> Tuple[int, int, int, int]:
        moved = {"none": 0, "optimizer": 1, "optimizer_nvme": 1, "all": 2, "all_nvme": 2}[c.offload]
        return -moved, int(c.offload in NVME_OFFLOADS), -c.stage, c.micro_batch

    return min((c for c in all_candidates if c.extras == first_extras), key=lean)


def overrides(candidate: Candidate, space: Space, global_batch: int, world_size: int,
              nvme_path: Optional[str], training_args: Optional[str] = None) -> List[str]:
    """The Hydra overrides of the candidate's trial: the user's, then the candidate's stage, offload and batch.

    With HF's Trainer (``training_args``: the config's ``hf.training_args`` path) the batch is the Trainer's to set:
    its data loader uses ``per_device_train_batch_size``, and dsconf fills DeepSpeed's "auto" batch keys from it.
    """
    optimizer_device, param_device = OFFLOADS[candidate.offload]
    accumulation = global_batch // (candidate.micro_batch * world_size)
    if training_args:
        batch = [f"{training_args}.per_device_train_batch_size={candidate.micro_batch}",
                 f"{training_args}.gradient_accumulation_steps={accumulation}"]
    else:
        batch = [f"{DEEPSPEED_NODE}.train_batch_size={global_batch}",
                 f"{DEEPSPEED_NODE}.train_micro_batch_size_per_gpu={candidate.micro_batch}",
                 f"{DEEPSPEED_NODE}.gradient_accumulation_steps={accumulation}"]
    out = [*space.fixed, *(override for _, override in candidate.extras), *batch,
           f"{ZERO}.stage={candidate.stage}",
           f"{ZERO}.offload_optimizer.device={optimizer_device}",
           f"{ZERO}.offload_param.device={param_device}"]
    for block, device in (("offload_optimizer", optimizer_device), ("offload_param", param_device)):
        if device == "nvme":
            out.append(f"{ZERO}.{block}.nvme_path={nvme_path}")
    return out
