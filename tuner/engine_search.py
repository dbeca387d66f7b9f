"""The Ray Tune searcher of the engine: baselines first, then Optuna ask/tell on a persistent
study.

Why not ``ray.tune.search.optuna.OptunaSearch``? Ray 2.60's ``OptunaSearch`` accepts a
``storage`` and a ``study_name``, but it pickles live ``optuna.Trial`` objects into Tune's
experiment checkpoint, cannot run fixed configurations that are not points of the
define-by-run space (our baselines), tells trials that ASHA stopped as *complete* with an
early-epoch value, and has no way to reject a schedule that violates a constraint before it
is trained. :class:`ScheduleSearcher` drives Optuna's ask/tell interface itself:

* the Optuna study lives in RDB storage (the service database), created or loaded by name,
  so it survives restarts and optuna-dashboard can read it; the searcher's checkpoint holds
  only plain data (Tune trial id -> trial number / Optuna trial number);
* the first suggestions are the baselines (trial numbers 0, 1, 2); they are not Optuna
  trials;
* the objective's ``max_steps`` is built into the draws (each stage draws only batch sizes
  with which the run can still meet it, :class:`tuner.space.StepCap`); a sampled schedule
  that still violates a constraint (a mean-batch bound) is told to Optuna as an
  infeasible trial (``Trial.set_constraint``) and another is drawn, so Tune only trains
  feasible schedules (:data:`MAX_DRAWS` draws at most, then the study fails with a message
  saying the constraint is too tight for the space);
* the study metric per epoch is reported as Optuna intermediate values (single objective), and a
  trial that ended early (ASHA, cancel) is told ``PRUNED`` (TPE ranks pruned trials by how
  far they got and their last value); a failed trial is told ``FAIL``;
* **prefix reuse** (``prefix_reuse`` > 0, single objective): after the startup trials, that
  share of tuned trials keeps the first stages of one of the best trials so far (ranked by
  the furthest rung it reached, then its ``score`` there) and lets the sampler choose the rest:
  the parent's ``n_stages`` and its parameters of those stages are enqueued as fixed
  parameters (``Study.enqueue_trial``), so the sampler conditions the remaining stages on
  everything it has seen. The trainable forks such a trial from the parent's stage-boundary
  state instead of training the prefix again (:mod:`tuner.prefixes`); the Optuna trial
  carries ``stagetune_parent`` and ``stagetune_prefix_stages`` user attributes;
* **stage-wise search** (``stagewise=(candidates, keep)``, single objective): tuned trials
  come in synchronous rounds, one per stage. Round 0 draws ``candidates`` whole schedules;
  each trains to the end of its first stage, where a cooldown probe scores it, and the
  scheduler stops it there (config ``stop_after``). Once every trial of a round has finished,
  the ``keep`` best by that probe are the parents of the next round: its candidates keep a
  parent's stages up to the boundary (enqueued as fixed Optuna parameters, as prefix reuse
  does, so they fork from the parent's boundary state) and the sampler draws the next stage
  and the rest; a candidate whose round stage is its last trains to the end. A round with
  no candidate that stopped at a boundary starts the next generation at round 0. Trials
  stopped at a boundary are told ``PRUNED`` (with their probe as intermediate value), so
  the sampler conditions on every round;
* every tuned trial's stagetune number and schedule are Optuna user attributes. After an
  interrupted run is restored, Optuna trials that are still ``RUNNING`` but unknown to Tune's
  restored state (suggested after its last checkpoint) are suggested again first, with the
  same number and schedule, so trial numbers stay dense and the budget is exact.
"""

from __future__ import annotations

import logging
import math
import pickle
import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher

from tuner.baselines import Baseline
from tuner.errors import StagetuneError
from tuner.noise_candidate import NOISE_SCALE, noise_scale_schedule
from tuner.objectives import StudyObjective, TrialOutcome, failure_of
from tuner.optuna_storage import (
    CANDIDATE_ATTR,
    INFEASIBLE_ATTR,
    NUMBER_ATTR,
    OBJECTIVE_ATTR,
    PARENT_ATTR,
    PREFIX_STAGES_ATTR,
    SCHEDULE_ATTR,
    STAGE_ROUND_ATTR,
    open_storage,
)
from tuner.recipes import (
    LR_VARIANTS,
    RECIPES,
    RUNNER_UP_VARIANTS,
    lr_bracket,
    recipe_schedules,
)
from tuner.schedule import Schedule
from tuner.space import ScheduleSpace, StepCap, constraint_violations
from tuner.trial_config import STOP_AFTER_KEY

if TYPE_CHECKING:
    from optuna.samplers import BaseSampler

__all__ = [
    "LIVE_RUNS",
    "MAX_DRAWS",
    "META_KEY",
    "NOISE_BATCHES",
    "VARIANT_SHARE",
    "FixedTrials",
    "LiveRun",
    "PriorTrial",
    "ScheduleSearcher",
    "TrialMeta",
    "make_sampler",
]

log = logging.getLogger(__name__)

#: The trial-config key holding the engine's bookkeeping (the trainable ignores it).
META_KEY: Final = "stagetune"
#: Consecutive infeasible draws after which the study fails (the constraint is too tight).
MAX_DRAWS: Final = 200
#: The LR variants of the best recipe take at most one of this many tuned trials.
VARIANT_SHARE: Final = 6
#: The batches of the small-batch baseline's noise-scale measurement at each epoch's end on
#: one worker without accumulation (``TrialConfig.noise_batches``; about 10 % more
#: forward/backward passes on ``mnist1d`` at batch 32).
NOISE_BATCHES: Final = 16


@dataclass(frozen=True)
class TrialMeta:
    """What the engine knows about one Tune trial (kept in its config under ``stagetune``)."""

    number: int
    baseline: str | None
    params: dict[str, Any]
    optuna_trial: int | None = None  # Optuna's trial number
    optuna_trial_id: int | None = None  # Optuna's storage id
    candidate: str | None = None  # a tuned trial the engine built (e.g. "noise_scale")

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "baseline": self.baseline,
            "params": self.params,
            "optuna_trial": self.optuna_trial,
            "optuna_trial_id": self.optuna_trial_id,
            "candidate": self.candidate,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TrialMeta | None:
        raw = config.get(META_KEY)
        if not isinstance(raw, Mapping):
            return None
        return cls(
            number=int(raw["number"]),
            baseline=raw.get("baseline"),
            params=dict(raw.get("params") or {}),
            optuna_trial=raw.get("optuna_trial"),
            optuna_trial_id=raw.get("optuna_trial_id"),
            candidate=raw.get("candidate"),
        )


@dataclass(frozen=True)
class PriorTrial:
    """A trial the study's database already holds when the engine starts (a resumed or taken
    over study). ``finished`` trials are never run again and count towards the budget; an
    unfinished one (interrupted) is run again from its first epoch with the same number,
    schedule and params."""

    number: int
    baseline: str | None
    schedule: dict[str, Any]
    params: dict[str, Any]
    finished: bool
    outcome: TrialOutcome | None = None


@dataclass
class LiveRun:
    """What the process running an experiment provides to it: Tune pickles the searcher,
    stopper and callbacks into the experiment directory and a restore brings those old
    objects back, so they look up the current process's parts here by experiment path."""

    callbacks: list[Any] = field(default_factory=list)
    should_stop: Callable[[], bool] | None = None
    prior: tuple[PriorTrial, ...] = ()
    #: Optuna RDB storages the searcher opened: the engine disposes of their connection
    #: pools when the experiment ends (else they stay open until garbage collection).
    storages: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """Dispose of the storages' connection pools."""
        for storage in self.storages:
            engine = getattr(storage, "engine", None)
            if engine is not None:
                engine.dispose()
        self.storages.clear()


#: Experiment path -> the live parts of the run in this process (see :class:`LiveRun`).
LIVE_RUNS: dict[str, LiveRun] = {}


def make_sampler(
    name: str,
    *,
    seed: int,
    startup_trials: int,
    multi_objective: bool,
) -> BaseSampler:
    """The seeded Optuna sampler of a study (TPE handles constraints and several objectives)."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        population = max(4, min(50, startup_trials * 2))
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=population)
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=startup_trials, multivariate=not multi_objective
    )


def _prefix_params(params: Mapping[str, Any], stages: int) -> dict[str, Any]:
    """The Optuna parameters that fix a schedule's first ``stages`` stages: its stage count,
    its label smoothing and every per-stage parameter (``<name>_<i>``) of those stages."""
    return {
        name: value
        for name, value in params.items()
        if name in ("n_stages", "label_smoothing")
        or (name.rsplit("_", 1)[-1].isdigit() and int(name.rsplit("_", 1)[-1]) < stages)
    }


class ScheduleSearcher(Searcher):
    """Baselines, then schedules drawn by Optuna from :class:`ScheduleSpace`."""

    def __init__(
        self,
        *,
        space: ScheduleSpace,
        objective: StudyObjective,
        baselines: Sequence[Baseline],
        storage_url: str | None,
        study_name: str,
        sampler: str = "tpe",
        seed: int = 0,
        startup_trials: int = 5,
        train_size: int | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        budget: int | None = None,
        live_key: str | None = None,
        prior: Sequence[PriorTrial] = (),
        prefix_reuse: float = 0.0,
        noise_candidate: bool = False,
        epoch_budget: int | None = None,
        stagewise: tuple[int, int] | None = None,
        recipes: bool = False,
    ) -> None:
        super().__init__(metric=None, mode=None)
        # The recipe candidates (tuner.recipes): the first tuned draws, until each is drawn
        # (None: not looked up yet; the Optuna study says which a resumed run drew already).
        self._recipes = recipes and not objective.is_multi
        self._recipe_queue: list[tuple[str, dict[str, Any]]] | None = None
        # The LR bracket around the best recipe (tuner.recipes.lr_variants), planned once
        # every recipe trial has finished (None: not planned yet).
        self._variant_queue: list[tuple[str, dict[str, Any]]] | None = None
        # The stage-wise search: (candidates per round, prefixes kept), and its rounds.
        if stagewise is not None and not 1 <= stagewise[1] <= stagewise[0]:
            raise ValueError(f"stagewise needs 1 <= keep <= candidates, not {stagewise}")
        self._stagewise = None if objective.is_multi else stagewise
        self._round = 0  # the stage the current round searches
        self._generation = 0  # rounds restart at 0 when no prefix goes on
        self._round_ids: list[str] = []  # Tune trial ids of the current round
        self._round_parents: list[dict[str, Any]] = []  # {number, params} of the kept prefixes
        self._rounds: dict[int, int] = {}  # trial number -> its round
        self._stop: dict[str, int | None] = {}  # trial id -> stop_after (None: to the end)
        # budget.trial_epochs: no trial starts once the trials have trained this much.
        self._epoch_budget = epoch_budget
        self._compute: dict[str, float] = {}  # trial id -> compute_epochs reported so far
        # The noise-scale candidate (tuner.noise_candidate): the small-batch baseline's noise
        # scale per epoch, then the candidate's Optuna params until it is drawn.
        self._noise_candidate = noise_candidate and not objective.is_multi
        self._noise: dict[int, float] = {}
        self._candidate: dict[str, Any] | None = None
        if not 0.0 <= prefix_reuse < 1.0:
            raise ValueError(f"prefix_reuse must be in [0, 1), not {prefix_reuse}")
        self._prefix_reuse = 0.0 if objective.is_multi else prefix_reuse
        # trial id -> (furthest epoch reported, latest non-null score, the epoch of that score)
        self._progress: dict[str, tuple[int, float | None, int]] = {}
        self._budget = budget
        self._live_key = live_key
        self._prior = tuple(prior)  # used when no live run is registered (tests)
        self._space = space
        self._objective = objective
        self._baselines = [(b.name, b.schedule.to_dict()) for b in baselines]
        self._storage_url = storage_url
        self._study_name = study_name
        self._sampler_name = sampler
        self._seed = seed
        self._startup_trials = startup_trials
        self._train_size = train_size
        # The objective's max_steps, built into the draws (tuner.space: the sampler's random
        # start-up is not spent on schedules the constraint would reject).
        self._cap = StepCap.of(objective.spec, train_size)
        self._engine_kwargs = dict(engine_kwargs or {})
        self._next_number = 0
        self._trials: dict[str, TrialMeta] = {}
        self._finished: set[str] = set()
        self._reported: dict[str, int] = {}  # trial id -> last epoch reported to Optuna
        self._plan: list[int] | None = None  # holes to fill first (after a (re)start)
        self._plan_tail = 0  # the next number after the holes
        self._refill: dict[int, tuple[TrialMeta, dict[str, Any]]] = {}
        self._study: optuna.Study | None = None
        self._memory_storage: optuna.storages.BaseStorage | None = None

    # ------------------------------------------------------------------ Optuna study

    @property
    def study(self) -> optuna.Study:
        """The Optuna study (created on first use, loaded if it exists)."""
        if self._study is None:
            storage: str | optuna.storages.BaseStorage
            if self._storage_url is None:
                if self._memory_storage is None:
                    self._memory_storage = optuna.storages.InMemoryStorage()
                storage = self._memory_storage
            else:
                storage = open_storage(self._storage_url, self._engine_kwargs)
                live = LIVE_RUNS.get(self._live_key or "")
                if live is not None:
                    live.storages.append(storage)
            sampler = make_sampler(
                self._sampler_name,
                seed=self._seed,
                startup_trials=self._startup_trials,
                multi_objective=self._objective.is_multi,
            )
            self._study = optuna.create_study(
                storage=storage,
                study_name=self._study_name,
                sampler=sampler,
                directions=list(self._objective.directions),
                load_if_exists=True,
            )
            existing = len(self._study.get_trials(deepcopy=False))
            if existing:
                # A resumed study: a fresh sampler with the study's seed would draw the same
                # sequence again (duplicate schedules); continue from a seed of its own.
                self._study.sampler = make_sampler(
                    self._sampler_name,
                    seed=self._seed + existing,
                    startup_trials=self._startup_trials,
                    multi_objective=self._objective.is_multi,
                )
            if OBJECTIVE_ATTR not in self._study.user_attrs:
                self._study.set_user_attr(OBJECTIVE_ATTR, list(self._objective.names))
            if self._study.metric_names is None:
                # optuna-dashboard shows these names, not "Objective 0". (Experimental in
                # Optuna since 3.2, without change since; its warning is noise here.)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    self._study.set_metric_names(list(self._objective.names))
        return self._study

    # ------------------------------------------------------------------ Tune interface

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        return True  # the searcher brings its own space and objective

    def suggest(  # type: ignore[override]  # Ray types it Optional[Dict]; FINISHED is a str
        self, trial_id: str
    ) -> dict[str, Any] | str | None:
        if trial_id in self._trials:
            meta = self._trials[trial_id]
            raise StagetuneError(f"trial {trial_id} (number {meta.number}) was suggested twice")
        if self._plan is None:
            self._plan = self._make_plan()
        number = self._plan[0] if self._plan else self._plan_tail
        if self._budget is not None and number >= self._budget:
            return str(Searcher.FINISHED)
        if (
            self._stagewise is not None
            and number >= len(self._baselines)
            and number not in self._refill
            and not (self._epoch_budget is not None and self.epochs_spent() >= self._epoch_budget)
            and not self._round_open()
        ):
            return None  # the round's trials are still training: wait for its ranking
        if self._plan:
            self._plan.pop(0)
        else:
            self._plan_tail += 1
        if number in self._refill:
            # A trial started before the restart but not finished: the same trial again
            # (it started within the trial-epoch budget).
            self._next_number = max(self._next_number, number + 1)
            meta, schedule_dict = self._refill.pop(number)
            return self._issue(trial_id, meta, schedule_dict)
        if self._epoch_budget is not None and self.epochs_spent() >= self._epoch_budget:
            return str(Searcher.FINISHED)
        self._next_number = max(self._next_number, number + 1)
        if number < len(self._baselines):
            name, schedule_dict = self._baselines[number]
            return self._issue(trial_id, TrialMeta(number, name, {}), schedule_dict)
        schedule, trial = self._draw(number)
        params = dict(trial.params)
        # The storage id lets later reports address the trial without a live Trial object.
        candidate = trial.user_attrs.get(CANDIDATE_ATTR)
        meta = TrialMeta(
            number,
            None,
            params,
            trial.number,
            trial._trial_id,
            candidate if isinstance(candidate, str) else None,
        )
        schedule_dict = schedule.to_dict()
        # The schedule first: a process killed between the two writes leaves a trial without
        # a number, which a resume closes and draws again. The other way round it would leave
        # the number without the schedule to replay, and the number would be drawn a second
        # time (two Optuna trials for one stagetune trial).
        trial.set_user_attr(SCHEDULE_ATTR, schedule_dict)
        trial.set_user_attr(NUMBER_ATTR, number)
        return self._issue(trial_id, meta, schedule_dict)

    def _make_plan(self) -> list[int]:
        """The holes to fill first, lowest first: every number below the highest one seen that
        neither Tune's (restored) state nor the database's finished trials hold; then numbers
        go on from there up to the budget. Interrupted trials (in the database, or Optuna
        trials issued before the restart) keep their number and schedule."""
        live = LIVE_RUNS.get(self._live_key or "")
        prior = live.prior if live is not None else self._prior
        known = {m.number for m in self._trials.values()}
        known |= {p.number for p in prior if p.finished}
        self._refill = {}
        for number, meta, schedule_dict in self._orphans(known):
            self._refill[number] = (meta, schedule_dict)
        for p in prior:
            if not p.finished and p.number not in known:
                params = {
                    k: v for k, v in p.params.items() if k not in ("optuna_trial", "candidate")
                }
                ot = p.params.get("optuna_trial")
                candidate = p.params.get("candidate")
                previous = self._refill.get(p.number)
                ot_id = previous[0].optuna_trial_id if previous else None
                meta = TrialMeta(
                    p.number,
                    p.baseline,
                    params,
                    ot if isinstance(ot, int) else None,
                    ot_id,
                    candidate if isinstance(candidate, str) else None,
                )
                self._refill[p.number] = (meta, p.schedule)
        high = max([self._next_number, *(n + 1 for n in self._refill), *(n + 1 for n in known)])
        self._plan_tail = high
        return [n for n in range(high) if n not in known]

    def _issue(self, trial_id: str, meta: TrialMeta, schedule: dict[str, Any]) -> dict[str, Any]:
        self._trials[trial_id] = meta
        config: dict[str, Any] = {"schedule": schedule, META_KEY: meta.to_dict()}
        if meta.baseline is not None:
            config["probe_at"] = []  # baselines run to the end whatever ASHA sees: no probes
            if meta.baseline == "small_batch" and self._noise_candidate:
                # What the noise-scale candidate follows, measured at each epoch's end where
                # one worker has no smaller batch inside a step (TrialConfig.noise_batches).
                config["noise_batches"] = NOISE_BATCHES
        elif self._stagewise is not None:
            config.update(self._stage_config(trial_id, meta, schedule))
        return config

    def _draw(self, number: int) -> tuple[Schedule, optuna.Trial]:
        study = self.study
        for attempt in range(MAX_DRAWS):
            parent = self._round_parent() if self._stagewise is not None else None
            if parent is not None:
                self._enqueue_stage_prefix(parent)
            elif attempt == 0 and self._candidate is not None:
                self.study.enqueue_trial(self._candidate, user_attrs={CANDIDATE_ATTR: NOISE_SCALE})
                self._candidate = None
            elif attempt == 0 and self._pending_recipes():
                name, params = self._pending_recipes().pop(0)
                self.study.enqueue_trial(params, user_attrs={CANDIDATE_ATTR: name})
            elif attempt == 0 and self._pending_variants():
                name, params = self._pending_variants().pop(0)
                self.study.enqueue_trial(params, user_attrs={CANDIDATE_ATTR: name})
            elif attempt < 3 and self._stagewise is None:
                self._enqueue_prefix(number, attempt)
            trial = study.ask()
            if self._stagewise is not None:
                trial.set_user_attr(STAGE_ROUND_ATTR, self._round)
                self._rounds[number] = self._round
            schedule = self._space.sample(trial, self._cap)
            violations = constraint_violations(schedule, self._objective.spec, self._train_size)
            for name, amount in violations.items():
                trial.set_constraint(name, amount)
            if all(v <= 0 for v in violations.values()):
                return schedule, trial
            trial.set_user_attr(INFEASIBLE_ATTR, True)
            study.tell(trial, list(self._objective.infeasible_values()))
        raise StagetuneError(
            f"the objective's constraint rejected {MAX_DRAWS} schedules in a row: it is too "
            "tight for the search space; narrow space.batch_size (or the stage counts) "
            "towards schedules that meet it, or relax the constraint"
        )

    # ------------------------------------------------------------------ prefix reuse

    def _parents(self) -> list[tuple[TrialMeta, int]]:
        """The best tuned trials so far with the epochs they reached, best first: ranked by
        the epoch of their latest score (the furthest rung, or the end), then by that score."""
        ranked = []
        for trial_id, (reached, score, at) in self._progress.items():
            meta = self._trials.get(trial_id)
            if meta is None or meta.baseline is not None or score is None:
                continue
            if self._space.stages_max < 2 or int(meta.params.get("n_stages", 2)) < 2:
                continue  # a one-stage schedule has no prefix to share
            ranked.append((at, score, meta, reached))
        ranked.sort(key=lambda r: (r[0], r[1], -r[2].number), reverse=True)
        return [(meta, reached) for _, _, meta, reached in ranked[:3]]

    def _enqueue_prefix(self, number: int, attempt: int) -> None:
        """With probability ``prefix_reuse`` (past the startup trials), enqueue a trial that
        keeps the first stages of a good trial so far (see the module docstring)."""
        if self._prefix_reuse <= 0.0:
            return
        tuned = sum(1 for m in self._trials.values() if m.baseline is None)
        if tuned < self._startup_trials:
            return
        rng = random.Random(f"{self._seed}-{number}-{attempt}")
        if rng.random() >= self._prefix_reuse:
            return
        parents = self._parents()
        if not parents:
            return
        parent, reached = parents[rng.randrange(len(parents))]
        schedule = self._space.sample(optuna.trial.FixedTrial(parent.params), self._cap)
        ends = [k for k, st in enumerate(schedule.stages[:-1], start=1) if st.end_epoch <= reached]
        if not ends:
            return
        stages = rng.choice(ends)
        self.study.enqueue_trial(
            _prefix_params(parent.params, stages),
            user_attrs={PARENT_ATTR: parent.number, PREFIX_STAGES_ATTR: stages},
        )

    # ------------------------------------------------------------------ stage-wise rounds

    def _round_open(self) -> bool:
        """Whether the current round takes another candidate; when it is full and every one
        of its trials has finished, the next round is planned first (so it is open)."""
        assert self._stagewise is not None
        candidates, _ = self._stagewise
        if len(self._round_ids) < candidates:
            return True
        if any(tid not in self._finished for tid in self._round_ids):
            return False
        self._next_round()
        return True

    def _next_round(self) -> None:
        """Rank the finished round's trials that stopped at their stage's end by the probe
        there; the best ``keep`` are the next round's parents (none: a new generation)."""
        assert self._stagewise is not None
        _, keep = self._stagewise
        ranked = []
        for tid in self._round_ids:
            stop = self._stop.get(tid)
            reached, score, at = self._progress.get(tid, (0, None, 0))
            meta = self._trials.get(tid)
            if stop is None or meta is None or score is None or at < stop or reached < stop:
                continue  # ran to the end (a whole schedule), failed or diverged early
            ranked.append((score, -meta.number, meta))
        ranked.sort(key=lambda r: (r[0], r[1]), reverse=True)
        parents = [meta for _, _, meta in ranked[:keep]]
        self._round_ids = []
        if parents:
            self._round += 1
            self._round_parents = [{"number": m.number, "params": m.params} for m in parents]
        else:
            self._round = 0
            self._generation += 1
            self._round_parents = []
        log.info(
            "stage-wise search: round %d (generation %d)%s",
            self._round,
            self._generation,
            f", forking trials {[p['number'] for p in self._round_parents]}"
            if self._round_parents
            else "",
        )

    def _round_parent(self) -> dict[str, Any] | None:
        """The kept prefix the next candidate of this round forks from (round-robin)."""
        if self._round == 0 or not self._round_parents:
            return None
        return self._round_parents[len(self._round_ids) % len(self._round_parents)]

    def _enqueue_stage_prefix(self, parent: Mapping[str, Any]) -> None:
        """Fix the parent's stage count and its stages before this round's stage."""
        self.study.enqueue_trial(
            _prefix_params(parent["params"], self._round),
            user_attrs={PARENT_ATTR: int(parent["number"]), PREFIX_STAGES_ATTR: self._round},
        )

    def _stage_config(
        self, trial_id: str, meta: TrialMeta, schedule_dict: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A stage-wise trial's probes (every boundary up to its round's stage, so its
        prefix key matches its parent's) and where it stops (that stage's end, unless the
        stage is its last); the trial joins its round."""
        r = self._rounds.get(meta.number)
        if r is None and meta.optuna_trial is not None:  # issued before a restart
            stored = self.study.trials[meta.optuna_trial].user_attrs.get(STAGE_ROUND_ATTR)
            r = stored if isinstance(stored, int) else None
        schedule = Schedule.from_dict(dict(schedule_dict))
        ends = [st.end_epoch for st in schedule.stages]
        if r is None or r >= len(ends) - 1:
            stop = None
            probes = ends[:-1]
        else:
            stop = ends[r]
            probes = ends[: r + 1]
        self._stop[trial_id] = stop
        if r == self._round and trial_id not in self._round_ids:
            self._round_ids.append(trial_id)
        config: dict[str, Any] = {"probe_at": probes}
        if stop is not None:
            config[STOP_AFTER_KEY] = stop
        return config

    @property
    def stage_round(self) -> tuple[int, int] | None:
        """(generation, round) of the stage-wise search (``None``: another search)."""
        return None if self._stagewise is None else (self._generation, self._round)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self._record_noise(trial_id, result)
        self._track(trial_id, result)
        self._report(trial_id, result)

    def _report(self, trial_id: str, result: Mapping[str, Any]) -> None:
        """The epoch's value of the study metric as the Optuna trial's intermediate value at
        step = the epoch's index (0-based, as the store numbers epochs), each epoch once."""
        meta = self._trials.get(trial_id)
        if meta is None or meta.optuna_trial_id is None or self._objective.is_multi:
            return
        value = result.get(self._objective.scheduler_metric or "val_accuracy")
        done = result.get("training_iteration")
        if not isinstance(value, int | float) or not isinstance(done, int):
            return
        if done <= self._reported.get(trial_id, 0):
            return
        self._reported[trial_id] = done
        step = done - 1
        ot = optuna.trial.Trial(self.study, meta.optuna_trial_id)
        with warnings.catch_warnings():
            # A trial replayed after a restore reports its epochs again; Optuna keeps the first.
            warnings.filterwarnings("ignore", message=r".*is already reported.*")
            try:
                ot.report(float(value), step)
            except (ValueError, RuntimeError) as exc:  # finished elsewhere, NaN...
                log.debug("not reporting to Optuna trial %s: %s", meta.optuna_trial, exc)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        meta = self._trials.get(trial_id)
        if meta is None or trial_id in self._finished:
            return
        self._finished.add(trial_id)
        # A trial that ended with a failure report failed as one that raised did.
        error = error or failure_of(result) is not None
        if result and not error:
            # Tune hands a trial's last result to this hook only.
            self._track(trial_id, result)
            self._report(trial_id, result)
        if meta.baseline == "small_batch" and self._noise_candidate and not error:
            # Tune hands the last result to on_trial_complete only.
            self._record_noise(trial_id, result or {})
            self._plan_noise_candidate()
        if meta.optuna_trial is None:
            return  # a baseline
        state, values = self._outcome(result, error)
        try:
            self.study.tell(meta.optuna_trial, values, state=state, skip_if_finished=True)
        except (ValueError, RuntimeError) as exc:
            log.warning("could not tell Optuna trial %s: %s", meta.optuna_trial, exc)

    def _outcome(
        self, result: Mapping[str, Any] | None, error: bool
    ) -> tuple[TrialState, list[float] | None]:
        if error or not result:
            return TrialState.FAIL, None
        values = self._objective.values(result)
        if values is None:
            return TrialState.FAIL, None
        finished = self._objective.is_finished_run(result) or bool(result.get("diverged"))
        if not finished:
            if self._objective.is_multi:
                return TrialState.FAIL, None  # Optuna has no pruning for several objectives
            return TrialState.PRUNED, None
        return TrialState.COMPLETE, list(values)

    def epochs_spent(self) -> float:
        """Trial-epochs the search has trained: what this run's trials reported
        (``compute_epochs``: their epochs and cooldown probes, forked prefixes not), plus the
        finished trials a resumed study held already."""
        live = LIVE_RUNS.get(self._live_key or "")
        prior = live.prior if live is not None else self._prior
        before = sum(
            float(p.outcome.extra.get("compute_epochs") or p.outcome.epochs_done or 0)
            for p in prior
            if p.finished and p.outcome is not None
        )
        return before + sum(self._compute.values())

    def _track(self, trial_id: str, result: Mapping[str, Any]) -> None:
        """A trial's furthest epoch and latest score (the parents of prefix reuse), and the
        compute it has spent."""
        step = result.get("training_iteration")
        compute = result.get("compute_epochs", step)  # a trainable without it: its epochs
        if isinstance(compute, int | float) and not isinstance(compute, bool):
            self._compute[trial_id] = max(self._compute.get(trial_id, 0.0), float(compute))
        if isinstance(step, int):
            reached, score, at = self._progress.get(trial_id, (0, None, 0))
            value = result.get("score")
            if isinstance(value, int | float) and not isinstance(value, bool):
                score, at = float(value), step
            self._progress[trial_id] = (max(reached, step), score, at)

    def _record_noise(self, trial_id: str, result: Mapping[str, Any]) -> None:
        meta = self._trials.get(trial_id)
        if not self._noise_candidate or meta is None or meta.baseline != "small_batch":
            return
        step, noise = result.get("training_iteration"), result.get("noise_scale")
        if isinstance(step, int) and isinstance(noise, int | float) and math.isfinite(noise):
            self._noise[step - 1] = float(noise)

    def _plan_noise_candidate(self) -> None:
        """Once the small-batch baseline has finished: its noise-scale curve as a schedule of
        the space, drawn by the next tuned trial (unless one was drawn before a restart)."""
        self._noise_candidate = False  # one candidate per study
        if any(m.candidate == NOISE_SCALE for m in self._trials.values()):
            return
        if NOISE_SCALE in self._drawn_candidates():
            return
        epochs = self._space.total_epochs
        schedule = noise_scale_schedule(self._space, [self._noise.get(e) for e in range(epochs)])
        if schedule is None:
            log.info("no noise-scale candidate: the small-batch baseline measured no noise scale")
            return
        params = self._space.params_for(schedule, self._cap)
        if params is None:
            log.info("no noise-scale candidate: %s is not in the space", schedule.summary())
            return
        log.info("noise-scale candidate: %s", schedule.summary())
        self._candidate = params

    def _drawn_candidates(self) -> set[str]:
        """The candidates (recipes, variants, the noise-scale schedule) this study's Optuna
        trials drew: those issued with a number, or told infeasible. An enqueued candidate
        that a killed run never issued does not count (its trial is closed as failed at the
        resume, :meth:`_orphans`), so the resumed run draws it again."""
        drawn: set[str] = set()
        for t in self.study.get_trials(deepcopy=False):
            candidate = t.user_attrs.get(CANDIDATE_ATTR)
            if isinstance(candidate, str) and (
                NUMBER_ATTR in t.user_attrs or t.user_attrs.get(INFEASIBLE_ATTR)
            ):
                drawn.add(candidate)
        return drawn

    def _pending_recipes(self) -> list[tuple[str, dict[str, Any]]]:
        """The recipe candidates still to draw, as Optuna parameters (those a resumed study
        drew before its restart are left out; a recipe the space cannot draw too)."""
        if self._recipe_queue is None:
            self._recipe_queue = []
            if self._recipes:
                drawn = self._drawn_candidates()
                for name, schedule in recipe_schedules(
                    self._space, self._objective.spec, self._train_size
                ):
                    if name in drawn:
                        continue
                    params = self._space.params_for(schedule, self._cap)
                    if params is None:
                        log.info(
                            "no %s candidate: %s is not in the space", name, schedule.summary()
                        )
                        continue
                    log.info("%s candidate: %s", name, schedule.summary())
                    self._recipe_queue.append((name, params))
        return self._recipe_queue

    def _pending_variants(self) -> list[tuple[str, dict[str, Any]]]:
        """The LR variants of the best :data:`~tuner.recipes.BRACKETED_RECIPES` recipes still
        to draw (:func:`tuner.recipes.lr_bracket`), as Optuna parameters: none until every
        recipe trial of this run has finished (ranked as prefix reuse ranks parents: the
        furthest epoch reached, then the score there), at most one per
        :data:`VARIANT_SHARE` tuned trials of the budget (a small budget is not spent on the
        recipes' neighbourhood; the best one's variants come first), none in the stage-wise
        search; those a resumed study drew before its restart are left out."""
        if self._variant_queue is not None:
            return self._variant_queue
        if not self._recipes or self._stagewise is not None or self._pending_recipes():
            return []
        recipes = [(tid, meta) for tid, meta in self._trials.items() if meta.candidate in RECIPES]
        if not recipes or any(tid not in self._finished for tid, _ in recipes):
            return []
        self._variant_queue = []
        ranked = []
        for tid, meta in recipes:
            _, score, at = self._progress.get(tid, (0, None, 0))
            if score is not None and math.isfinite(score):
                ranked.append((at, score, -meta.number, meta))
        if not ranked:
            return self._variant_queue
        ranked.sort(key=lambda r: r[:3], reverse=True)
        best = [r[3] for r in ranked]
        drawn = self._drawn_candidates()
        schedules = [
            self._space.sample(optuna.trial.FixedTrial(meta.params), self._cap) for meta in best
        ]
        tuned = None if self._budget is None else self._budget - len(self._baselines)
        allowed = len(LR_VARIANTS) if tuned is None else tuned // VARIANT_SHARE
        for name, variant in lr_bracket(self._space, schedules)[:allowed]:
            if name in drawn:
                continue
            params = self._space.params_for(variant, self._cap)
            if params is None:
                continue
            of = best[1] if name in RUNNER_UP_VARIANTS else best[0]
            log.info("%s candidate (of %s): %s", name, of.candidate, variant.summary())
            self._variant_queue.append((name, params))
        return self._variant_queue

    @property
    def noise_scale(self) -> dict[int, float]:
        """The small-batch baseline's noise scale per epoch, as seen so far."""
        return dict(self._noise)

    # ------------------------------------------------------------------ resume

    def _orphans(self, known: set[int]) -> list[tuple[int, TrialMeta, dict[str, Any]]]:
        """Optuna trials still RUNNING that Tune's (restored) state does not know: issued
        before the restart (replayed with the same number and schedule), or asked and never
        issued (told failed). Trials still WAITING were enqueued by a run killed before its
        ``ask`` took them (a run enqueues only right before it asks): they are closed as
        failed too, or the next ``ask`` would hand that stale candidate to another draw, each
        later candidate would shift by one and the last would be left waiting."""
        if self._storage_url is None:
            return []
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            # Study.tell takes RUNNING trials only; Optuna's fail_stale_trials closes trials
            # through the storage the same way.
            self.study._storage.set_trial_state_values(frozen._trial_id, TrialState.FAIL)
        issued = {m.optuna_trial for m in self._trials.values() if m.optuna_trial is not None}
        out = []
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if frozen.number in issued:
                continue
            number = frozen.user_attrs.get(NUMBER_ATTR)
            schedule = frozen.user_attrs.get(SCHEDULE_ATTR)
            if isinstance(number, int) and isinstance(schedule, dict) and number not in known:
                candidate = frozen.user_attrs.get(CANDIDATE_ATTR)
                meta = TrialMeta(
                    number,
                    None,
                    dict(frozen.params),
                    frozen.number,
                    frozen._trial_id,
                    candidate if isinstance(candidate, str) else None,
                )
                out.append((number, meta, schedule))
            else:  # never issued, or finished in the database already: close it
                self.study.tell(frozen.number, state=TrialState.FAIL, skip_if_finished=True)
        return sorted(out, key=lambda item: item[0])

    def get_state(self) -> dict[str, Any]:
        return {
            "next_number": self._next_number,
            "trials": {k: v.to_dict() for k, v in self._trials.items()},
            "finished": sorted(self._finished),
            "reported": dict(self._reported),
            "progress": {k: list(v) for k, v in self._progress.items()},
            "noise": {
                "wanted": self._noise_candidate,
                "curve": dict(self._noise),
                "params": self._candidate,
            },
            "stagewise": {
                "round": self._round,
                "generation": self._generation,
                "round_ids": list(self._round_ids),
                "parents": list(self._round_parents),
                "rounds": dict(self._rounds),
                "stop": dict(self._stop),
            },
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._next_number = int(state["next_number"])
        self._trials = {
            k: TrialMeta.from_config({META_KEY: v}) or TrialMeta(0, None, {})
            for k, v in state["trials"].items()
        }
        self._finished = set(state["finished"])
        self._reported = dict(state["reported"])
        self._progress = {
            k: (int(v[0]), None if v[1] is None else float(v[1]), int(v[2]))
            for k, v in state.get("progress", {}).items()
        }
        noise = state.get("noise") or {}
        self._noise_candidate = bool(noise.get("wanted", self._noise_candidate))
        self._noise = {int(k): float(v) for k, v in (noise.get("curve") or {}).items()}
        self._candidate = noise.get("params")
        rounds = state.get("stagewise") or {}
        self._round = int(rounds.get("round", 0))
        self._generation = int(rounds.get("generation", 0))
        self._round_ids = list(rounds.get("round_ids", []))
        self._round_parents = list(rounds.get("parents", []))
        self._rounds = {int(k): int(v) for k, v in (rounds.get("rounds") or {}).items()}
        self._stop = dict(rounds.get("stop") or {})
        self._plan = None  # plan the remaining numbers again before the next suggestion
        self._study = None
        # The candidates still to draw are read back from the Optuna study (what was drawn).
        self._recipe_queue = None
        self._variant_queue = None

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as fh:
            pickle.dump(self.get_state(), fh)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as fh:
            self.set_state(pickle.load(fh))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_study"] = None  # live DB connections; reloaded by name
        # A restored copy reads the candidates still to draw back from the Optuna study: a
        # queue pickled before its head was drawn would draw it twice.
        state["_recipe_queue"] = None
        state["_variant_queue"] = None
        if self._storage_url is not None:
            state["_memory_storage"] = None
        return state

    # ------------------------------------------------------------------ introspection

    def meta(self, trial_id: str) -> TrialMeta | None:
        return self._trials.get(trial_id)

    @property
    def numbers_issued(self) -> int:
        return self._next_number


class FixedTrials(Searcher):
    """Issues a fixed list of trial configs in order, then says it is finished (the seed
    runs: each config is one finalist on one fresh seed). Tune restores it with the
    experiment; trials it had issued and that had not finished are run again by Tune."""

    def __init__(self, configs: Sequence[Mapping[str, Any]]) -> None:
        super().__init__()
        self._configs = [dict(c) for c in configs]
        self._issued = 0

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        return True

    def suggest(  # type: ignore[override]  # Ray types it Optional[Dict]; FINISHED is a str
        self, trial_id: str
    ) -> dict[str, Any] | str | None:
        if self._issued >= len(self._configs):
            return str(Searcher.FINISHED)
        self._issued += 1
        return dict(self._configs[self._issued - 1])

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        pass

    def get_state(self) -> dict[str, Any]:
        return {"configs": self._configs, "issued": self._issued}

    def set_state(self, state: dict[str, Any]) -> None:
        self._configs = list(state["configs"])
        self._issued = int(state["issued"])

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as fh:
            pickle.dump(self.get_state(), fh)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as fh:
            self.set_state(pickle.load(fh))
