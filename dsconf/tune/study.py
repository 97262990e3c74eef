"""A tuning study, from the command line's overrides to ``best.yaml``.

1. The arguments are split into fixed overrides and the user's dimensions (``space.split_arguments``); the base job
   (fixed overrides, each dimension's first value) gives the world size and the global batch, which every
   candidate keeps (``space.candidates``).
2. Every candidate is composed and validated before anything runs, as the launcher would: all the bad ones are
   named at once (a config mistake never reaches a trial).
3. The study opens in Optuna's storage (default: ``tune.db`` in the sweep dir) with ``load_if_exists``: a study run
   again with the same command continues. Trials that finished are taken as they are (never re-run); one that was
   running when the study was killed is marked failed and runs again.
4. The memory probe (``prior``): the leanest candidate at the two smallest micro batches, as ordinary trials.
   Candidates predicted over the limit are pruned, with their prediction.
5. The search: a space of at most ``n_trials`` candidates runs in full (a grid), most promising first; a larger
   one runs the most promising third of the budget left after the probe, then Optuna's TPE sampler proposes the
   rest. A candidate that ran out
   of memory prunes those that need at least as much (the same or a lower stage, as much or less offload, a micro
   batch as large or larger).
6. ``top_k``: the best few run again for ``top_k_steps``; the fastest of those is the winner (``best.yaml``).

A trial that fails for any reason but memory stops the study at once (``TuneStopped``: the trial's one-line error
and its log dir). Results are written after every trial (``results``), the report at the end (``report``).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dsconf.errors import EXIT_CONFIG_ERROR, EXIT_JOB_FAILED, ConfigError, Problem
from dsconf.tune import results, space
from dsconf.tune.prior import Prior, Probe
from dsconf.tune.results import Record
from dsconf.tune.settings import PREFIX, TuneSettings, format_size
from dsconf.tune.space import Candidate
from dsconf.tune.trial import FAILED, INFEASIBLE, OK, PRUNED, Outcome, read_ranks, run_trial

log = logging.getLogger(__name__)

STORAGE_FILE = "tune.db"
MAX_SKIPS = 25  # TPE proposals in a row that are not worth a run (measured, pruned): take the next candidate instead
GPU_SIDE = {"none": 0, "optimizer": 1, "optimizer_nvme": 1, "all": 2, "all_nvme": 2}  # what stays on the accelerator


class TuneStopped(Exception):
    """The study stopped: a trial failed (not for memory), or nothing fits. ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_JOB_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class JobShape:
    world_size: int
    nproc_per_node: int
    nodes: int
    global_batch: int
    training_args: Optional[str] = None  # HF's Trainer sets the batch: the config's hf.training_args path


class Tuner:
    def __init__(self, settings: TuneSettings, *, config: Any, hydra_context: Any, launcher: Any) -> None:
        self.settings = settings
        self.config = config
        self.loader = hydra_context.config_loader
        self.launcher = launcher
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.records: Dict[str, Record] = {}
        self.open: Dict[str, Candidate] = {}  # neither measured nor pruned yet, in promise order
        self.prior: Optional[Prior] = None
        self.next_job = 0
        self.facts: List[str] = []

    # ------------------------------------------------------------------------------------------- set-up
    def sweep(self, arguments: Sequence[str]) -> Record:
        from omegaconf import OmegaConf

        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
        params = [f"{key}={value}" for key, value in self.settings.params]
        self.space = space.split_arguments(params + list(arguments), self.loader)
        self.shape = self._shape(self._compose(self.space.first()))
        self.candidates = space.candidates(self.settings, self.space, self.shape.global_batch, self.shape.world_size)
        self.batches = space.micro_batches(self.settings, self.shape.global_batch, self.shape.world_size)
        self._check_candidates()
        for c in self.candidates:
            self.records[c.key] = self._record(c)
            self.open[c.key] = c
        self.study = self._open_study()
        self._recover()
        log.info(f"dsconf tune: {len(self.candidates)} candidates, global batch {self.shape.global_batch} on "
                 f"{self.shape.world_size} rank(s); study '{self.settings.study_name}' in {self.storage}")
        self._probe()
        self._search()
        self._confirm()
        winner = self._name_winner()
        self._write(final=True)
        return winner

    def _compose(self, overrides: List[str]) -> Any:
        return self.loader.load_sweep_config(self.config, list(overrides))

    def _shape(self, job_cfg: Any) -> JobShape:
        from omegaconf import OmegaConf

        from dsconf.launch.hydra_support import as_sweep_job, select, task_cfg
        from dsconf.launch.job_export import export_deepspeed
        from dsconf.launch.plan import dist_settings, plan_job

        task = task_cfg(job_cfg)
        if select(task, "deepspeed") is None:
            raise ConfigError(Problem("deepspeed", "the tuner tunes a dsconf config, and this app's has no "
                                      "'deepspeed' node", "list dsconf in the primary config's defaults"))
        plan = plan_job(dist_settings(task, OmegaConf.select(job_cfg, "hydra.launcher.dist")))
        if len(plan.world_sizes) > 1:
            raise ConfigError(Problem("dist.nnodes", f"an elastic node range ({plan.min_nodes}:{plan.max_nodes}): "
                                      "the tuner measures one world size", "give a fixed number of nodes"))
        with as_sweep_job(job_cfg):
            deepspeed, _ = export_deepspeed(task, plan.world_size, None)
        assert deepspeed is not None
        hf = select(task, "hf")
        training_args = str(select(hf, "training_args")) if select(hf, "training_args") else None
        return JobShape(plan.world_size, plan.nproc_per_node, plan.max_nodes, int(deepspeed["train_batch_size"]),
                        training_args)

    def _overrides(self, c: Candidate) -> List[str]:
        return space.overrides(c, self.space, self.shape.global_batch, self.shape.world_size, self.settings.nvme_path,
                               self.shape.training_args)

    def _check_candidates(self) -> None:
        """Compose and validate every candidate as the launcher would; one ConfigError naming each bad one."""
        from dsconf import hydra_private
        from dsconf.composition import exception_chain, hydra_error_with_overrides
        from dsconf.launch.sweep_check import ComposedJobs, validate_job

        composed = ComposedJobs()
        bad: List[Tuple[Candidate, List[Problem]]] = []
        for c in self.candidates:
            overrides = self._overrides(c)
            try:
                job_cfg = self._compose(overrides)
                validate_job(job_cfg)
                composed.configs[tuple(overrides)] = job_cfg
            except ConfigError as err:
                bad.append((c, err.problems))
            except Exception as err:
                if not hydra_private.raised_while_composing(exception_chain(err)):
                    raise
                bad.append((c, hydra_error_with_overrides(err, overrides, self.config).problems[:1]))
        if bad:  # the first bad candidate's problems: a mistake usually repeats in every candidate with that value
            c, problems = bad[0]
            others = f" (and {len(bad) - 1} more candidate(s))" if len(bad) > 1 else ""
            raise ConfigError([Problem(p.path, f"candidate {c.key}{others}: {p.message}", p.hint) for p in problems])
        if hasattr(self.launcher, "use_composed_jobs"):  # dsconf's launcher: each trial's config composed once
            self.launcher.use_composed_jobs(composed)

    def _record(self, c: Candidate) -> Record:
        return Record(candidate=c.key, overrides=self._overrides(c), stage=c.stage, offload=c.offload,
                      micro_batch=c.micro_batch,
                      gradient_accumulation_steps=self.shape.global_batch // (c.micro_batch * self.shape.world_size),
                      train_batch_size=self.shape.global_batch, world_size=self.shape.world_size,
                      extras={key: override for key, override in c.extras}, reason="not tried yet")

    # ------------------------------------------------------------------------------------------ storage
    def _open_study(self) -> Any:
        optuna = _optuna()
        self.storage = self.settings.storage or f"sqlite:///{(self.sweep_dir / STORAGE_FILE).resolve()}"
        _check_storage_support(self.storage)
        # TPE models the trials once the probe's two and the promise-ordered third of the budget have run
        startup = 2 + max(2, (self.settings.n_trials - 2) // 3)
        sampler = optuna.samplers.TPESampler(seed=self.settings.seed, n_startup_trials=startup)
        try:
            study = optuna.create_study(study_name=self.settings.study_name, storage=self.storage, sampler=sampler,
                                        direction="maximize", load_if_exists=True)
        except Exception as err:
            raise ConfigError(Problem(f"{PREFIX}.storage", f"Optuna cannot open {self.storage!r}: "
                                      f"{type(err).__name__}: {err}", "an RDB URL such as sqlite:///tune.db")) from None
        fingerprint = {"global_batch": self.shape.global_batch, "world_size": self.shape.world_size,
                       "steps": self.settings.steps, "warmup_steps": self.settings.warmup_steps,
                       "fixed": list(self.space.fixed), "choices": self._choices()}
        stored = study.user_attrs.get("fingerprint")
        if stored is None:
            study.set_user_attr("fingerprint", fingerprint)
        elif stored != fingerprint:
            changed = ", ".join(k for k in fingerprint if stored.get(k) != fingerprint[k])
            raise ConfigError(Problem(f"{PREFIX}.study_name", f"the study {self.settings.study_name!r} in "
                                      f"{self.storage} was run with another {changed}: its trials would not compare",
                                      "run the same command to resume it, or use a new sweep dir or study_name"))
        return study

    def _choices(self) -> Dict[str, List[Any]]:
        """Each Optuna parameter's choices (fixed for the study's life: Optuna refuses a changed space)."""
        out: Dict[str, List[Any]] = {"stage": list(self.settings.stages), "offload": list(self.settings.offloads),
                                     "micro_batch": list(self.batches)}
        out.update({key: list(values) for key, values in self.space.dimensions})
        return out

    def _recover(self) -> None:
        """Take the finished trials of an earlier run of this study; a trial left running is marked failed."""
        optuna = _optuna()
        state = optuna.trial.TrialState
        numbers = [int(p.name) for p in self.sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        self.next_job = max(numbers, default=-1) + 1
        taken = 0
        for t in self.study.get_trials(deepcopy=False):
            self.next_job = max(self.next_job, int(t.user_attrs.get("job", -1)) + 1)
            if t.state == state.RUNNING:
                self.study.tell(t.number, state=state.FAIL)
                continue
            data = t.user_attrs.get("record")
            if t.state in (state.COMPLETE, state.PRUNED) and data and data.get("candidate") in self.records:
                record = Record.from_dict(data)
                self.records[record.candidate] = record
                self.open.pop(record.candidate, None)
                taken += 1
        for key, value in self.study.user_attrs.items():
            if key.startswith("confirm:") and key[8:] in self.records:
                self.records[key[8:]].confirmed = value
        if taken:
            log.info(f"dsconf tune: resuming: {taken} finished trial(s) taken from the study, not run again")

    # ---------------------------------------------------------------------------------------- the trials
    @property
    def measured(self) -> int:
        return sum(r.job is not None and r.status in (OK, INFEASIBLE) for r in self.records.values())

    def _ask(self, c: Optional[Candidate]) -> Tuple[Any, Optional[Candidate]]:
        """An Optuna trial (for ``c`` when given, else the sampler's proposal) and the candidate it stands for."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # enqueue_trial is "experimental" in Optuna 2
            if c is not None:
                self.study.enqueue_trial(c.params())
            trial = self.study.ask()
        params = {name: trial.suggest_categorical(name, choices) for name, choices in self._choices().items()}
        extras = tuple((key, params[key]) for key, _ in self.space.dimensions)
        proposed = Candidate(int(params["stage"]), str(params["offload"]), int(params["micro_batch"]), extras)
        return trial, proposed

    def _run(self, trial: Any, c: Candidate, *, probe: bool = False) -> Record:
        optuna = _optuna()
        state = optuna.trial.TrialState
        job, self.next_job = self.next_job, self.next_job + 1
        trial.set_user_attr("candidate", c.key)
        trial.set_user_attr("job", job)
        log.info(f"dsconf tune: trial {self.measured + 1} (job {job}){' [memory probe]' if probe else ''}: {c.key}")
        try:
            outcome = run_trial(self.launcher, self._overrides(c), job, steps=self.settings.steps,
                                warmup_steps=self.settings.warmup_steps, sweep_dir=self.sweep_dir)
        except BaseException:
            self.study.tell(trial, state=state.FAIL)  # interrupted: a resumed study runs it again
            raise
        record = self.records[c.key]
        _fill(record, outcome)
        record.probe = probe
        self.open.pop(c.key, None)
        if outcome.status == OK:
            trial.set_user_attr("record", record.as_dict())
            self.study.tell(trial, record.samples_per_s)
            log.info(f"dsconf tune:   {record.samples_per_s:.1f} samples/s, step {record.step_time_s:.4g} s (slowest: "
                     f"rank {record.slowest_rank}), peak {format_size(record.peak_memory_bytes)}")
        elif outcome.status == INFEASIBLE:
            trial.set_user_attr("record", record.as_dict())
            self.study.tell(trial, state=state.PRUNED)
            log.info(f"dsconf tune:   out of memory: {record.reason}")
            self._prune_dominated(c, job)
        else:
            self.study.tell(trial, state=state.FAIL)
            self._write()
            raise TuneStopped(f"tune: trial job {job} ({c.key}) failed: {outcome.error}; logs: {outcome.log_dir}",
                              EXIT_CONFIG_ERROR if outcome.config_error else EXIT_JOB_FAILED)
        self._write()
        return record

    def _prune_dominated(self, failed: Candidate, job: int) -> None:
        for c in list(self.open.values()):
            if (c.extras == failed.extras and c.micro_batch >= failed.micro_batch and c.stage <= failed.stage
                    and GPU_SIDE[c.offload] <= GPU_SIDE[failed.offload]):
                self._prune(c, f"needs at least the memory of {failed.key}, which ran out of memory (job {job})")

    def _prune(self, c: Candidate, reason: str) -> None:
        record = self.records[c.key]
        record.status, record.reason = PRUNED, reason
        self.open.pop(c.key, None)

    # ------------------------------------------------------------------------------------------- probe
    def _probe(self) -> None:
        stored = self.study.user_attrs.get("probe")
        if stored:
            self._use_prior(Probe.from_dict(stored))
            return
        lean = space.leanest(self.candidates)
        sizes = sorted({c.micro_batch for c in self.candidates
                        if (c.stage, c.offload, c.extras) == (lean.stage, lean.offload, lean.extras)})[:2]
        points: List[Tuple[int, int]] = []
        ranks: List[Dict[str, Any]] = []
        for size in sizes:
            c = Candidate(lean.stage, lean.offload, size, lean.extras)
            record = self.records[c.key]
            if c.key in self.open:
                trial, _ = self._ask(c)
                record = self._run(trial, c, probe=True)
            if record.status != OK or record.peak_memory_bytes is None:
                break
            points.append((size, int(record.peak_memory_bytes)))
            ranks = ranks or read_ranks(Path(record.job_dir))
        if not points or not ranks:
            log.warning("dsconf tune: the memory probe measured nothing: no candidate is pruned by the prior")
            return
        facts = ranks[0]
        probe = Probe(stage=lean.stage, offload=lean.offload, points=points, params=int(facts.get("params") or 1),
                      largest_layer_params=int(facts.get("largest_layer_params") or 1),
                      total_memory_bytes=int(facts.get("total_memory_bytes") or 0),
                      cpu_only=(facts.get("environment") or {}).get("accelerator") == "cpu",
                      nproc_per_node=self.shape.nproc_per_node, nodes=self.shape.nodes)
        self.study.set_user_attr("probe", probe.as_dict())
        self._use_prior(probe)

    def _use_prior(self, probe: Probe) -> None:
        self.prior = Prior(probe, self.settings.memory_limit)
        log.info(f"dsconf tune: prior: {self.prior.describe()}")
        for c in self.candidates:
            record = self.records[c.key]
            record.predicted_memory_bytes = self.prior.predict(c)
            record.memory_limit_bytes = self.prior.limit
            reason = self.prior.over(c)
            if reason and c.key in self.open:
                self._prune(c, reason)
        pruned = sum(self.records[c.key].reason.startswith("predicted") for c in self.candidates)
        if pruned:
            log.info(f"dsconf tune: {pruned} candidate(s) predicted not to fit: pruned (see trials.json)")
        self._write()

    # ------------------------------------------------------------------------------------------ search
    def _search(self) -> None:
        budget = self.settings.n_trials
        startable = [c for c in self.candidates if c.key in self.open]
        grid = self.measured + len(startable) <= budget
        probes = sum(r.probe for r in self.records.values())
        startup = budget if grid else max(2, (budget - probes) // 3)  # in promise order, after the probe's trials
        self.facts.append(f"search: {'every candidate (a grid)' if grid else f'TPE after {startup} trials'}, most "
                          f"promising first; at most {budget} trials (hydra.sweeper.n_trials)")
        skips = 0
        while self.open and self.measured < budget:
            in_order = self.measured - probes < startup or skips >= MAX_SKIPS
            chosen = next(iter(self.open.values())) if in_order else None
            trial, c = self._ask(chosen)
            if c.key not in self.open:
                self._tell_known(trial, c)
                skips += 1
                continue
            skips = 0
            self._run(trial, c)
        for c in list(self.open.values()):
            self._prune(c, f"not tried: hydra.sweeper.n_trials={budget} trials went to more promising candidates")

    def _tell_known(self, trial: Any, c: Candidate) -> None:
        """A proposal already decided: told what is known, at no cost (a measured value, else pruned)."""
        state = _optuna().trial.TrialState
        record = self.records.get(c.key)
        trial.set_user_attr("candidate", c.key)
        trial.set_user_attr("duplicate", True)
        if record is not None and record.status == OK and record.samples_per_s is not None:
            self.study.tell(trial, record.samples_per_s)
        else:
            self.study.tell(trial, state=state.PRUNED)

    # ------------------------------------------------------------------------------------------ top_k
    def _confirm(self) -> None:
        if not self.settings.top_k:
            return
        best = sorted((r for r in self.records.values() if r.status == OK and r.samples_per_s),
                      key=lambda r: -(r.samples_per_s or 0.0))[: self.settings.top_k]
        for record in best:
            if record.confirmed:
                continue
            job, self.next_job = self.next_job, self.next_job + 1
            log.info(f"dsconf tune: re-running {record.candidate} for up to {self.settings.top_k_steps} steps "
                     f"(job {job})")
            # as long as the script trains: it may stop before top_k_steps, not before a trial's steps
            outcome = run_trial(self.launcher, record.overrides, job, steps=self.settings.top_k_steps,
                                warmup_steps=self.settings.warmup_steps, sweep_dir=self.sweep_dir,
                                min_steps=self.settings.steps)
            if outcome.status == FAILED:
                self._write()
                raise TuneStopped(f"tune: the re-run of {record.candidate} (job {job}) failed: {outcome.error}; "
                                  f"logs: {outcome.log_dir}")
            timed = min((int(r.get("timed_steps") or 0) for r in outcome.ranks), default=0)
            confirmed: Dict[str, Any] = {"job": job, "steps": timed, "status": outcome.status,
                                         "step_time_s": outcome.step_time_s, "samples_per_s": outcome.samples_per_s,
                                         "tokens_per_s": outcome.tokens_per_s,
                                         "peak_memory_bytes": outcome.peak_memory_bytes, "error": outcome.error}
            if outcome.status == INFEASIBLE:
                record.status, record.reason = INFEASIBLE, f"ran out of memory in the longer re-run: {outcome.error}"
            record.confirmed = confirmed
            self.study.set_user_attr(f"confirm:{record.candidate}", confirmed)
            self._write()

    def _name_winner(self) -> Record:
        measured = [r for r in self.records.values() if r.status == OK and r.throughput]
        confirmed = [r for r in measured if r.confirmed and r.confirmed.get("status") == OK]
        pool = confirmed or measured
        if not pool:
            self._write()
            smallest = min((r for r in self.records.values() if r.predicted_memory_bytes is not None),
                           key=lambda r: r.predicted_memory_bytes or 0, default=None)
            hint = (f"; the smallest prediction is {format_size(smallest.predicted_memory_bytes)} "
                    f"({smallest.candidate})" if smallest else "")
            raise TuneStopped(f"tune: no candidate fits{hint}: see {self.sweep_dir / results.TRIALS_FILE}")
        winner = max(pool, key=lambda r: r.throughput or 0.0)
        winner.winner = True
        log.info(f"dsconf tune: best: {winner.candidate}: {winner.throughput:.1f} samples/s, peak "
                 f"{format_size(winner.peak_memory_bytes)}")
        return winner

    # ------------------------------------------------------------------------------------------ results
    def _write(self, final: bool = False) -> None:
        records = list(self.records.values())
        facts = [f"world size {self.shape.world_size}, global batch {self.shape.global_batch} (kept in every "
                 f"trial: gradient accumulation derived)",
                 f"timed {self.settings.steps} optimizer steps per trial after {self.settings.warmup_steps} warm-up "
                 f"step(s); the slowest rank's step time",
                 *([f"prior: {self.prior.describe()}"] if self.prior else []), *self.facts,
                 f"storage: {self.storage}, study {self.settings.study_name!r}"]
        env = next((r.environment for r in records if r.environment), None)
        if env:
            facts.append("environment: " + ", ".join(f"{k} {v}" for k, v in env.items() if v))
        results.write_trials(records, self.sweep_dir)
        results.write_summary(records, self.sweep_dir, facts)
        if not final:
            return
        winner = next(r for r in records if r.winner)
        from dsconf.groups import group_options

        results.write_best(self._compose(winner.overrides), winner, self.sweep_dir, list(group_options()))
        try:
            from dsconf.tune.report import write_tune_report

            path = write_tune_report(self.sweep_dir)
            log.info(f"dsconf tune: wrote {path}")
        except ImportError as err:  # matplotlib (dsconf[report]) missing: the results stand without the plots
            log.warning(f"dsconf tune: no report.html: {err}")
        log.info(f"dsconf tune: wrote {self.sweep_dir / results.BEST_FILE}, {results.TRIALS_FILE}, "
                 f"{results.SUMMARY_FILE}")


def _fill(record: Record, outcome: Outcome) -> None:
    record.status = outcome.status
    record.reason = outcome.error if outcome.status != OK else ""
    record.job, record.job_dir, record.log_dir, record.wall_s = outcome.job, outcome.job_dir, outcome.log_dir, \
        outcome.wall_s
    record.step_time_s, record.rank_step_time_s = outcome.step_time_s, outcome.rank_step_time_s
    record.slowest_rank, record.samples_per_s, record.tokens_per_s = (outcome.slowest_rank, outcome.samples_per_s,
                                                                     outcome.tokens_per_s)
    record.peak_memory_bytes, record.rank_peak_memory_bytes = outcome.peak_memory_bytes, outcome.rank_peak_memory_bytes
    record.memory_measure = outcome.memory_measure
    record.environment = dict(outcome.facts("environment") or {})


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError(Problem("hydra/sweeper", "dsconf_tune searches with Optuna, which is not installed",
                                  "pip install 'dsconf[tune]'")) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _check_storage_support(storage: str) -> None:
    """Optuna 2's RDB storage predates SQLAlchemy 2 and fails with it on an assertion: say so, and what works."""
    optuna = _optuna()
    if int(optuna.__version__.split(".")[0]) >= 3 or "://" not in storage:
        return
    try:
        import sqlalchemy
    except ImportError:
        return
    if int(sqlalchemy.__version__.split(".")[0]) >= 2:
        raise ConfigError(Problem(f"{PREFIX}.storage", f"Optuna {optuna.__version__}'s RDB storage needs SQLAlchemy "
                                  f"< 2 (installed: {sqlalchemy.__version__})",
                                  "pip install 'sqlalchemy<2' 'alembic<1.14', or a current Optuna (>= 3)"))

