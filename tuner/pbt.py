"""Population Based Training over schedules (``budget.search: pbt``).

PBT (Jaderberg et al. 2017) is the peer system whose output is itself a schedule: a population
trains at once, and at every perturbation interval the worst quarter clones the weights and
hyperparameters of the best quarter and perturbs them. Here the hyperparameters are the
current stage's batch size and LR multiplier, and a perturbation *is* a stage boundary, so the
winner's lineage is an ordinary :class:`~tuner.schedule.Schedule`: its stages are the
segments between perturbations, typed like every schedule of the space (powers of two, batch
never decreasing unless the space allows it, LR multipliers on the space's grid, at most
``space.stages.max`` stages).

:class:`SchedulePBT` is Ray Tune's :class:`PopulationBasedTraining` (synchronous mode: the
population perturbs at the same epochs) with four changes:

* the explore step (:meth:`SchedulePBT._get_new_config`) takes the cloned trial's schedule up
  to the perturbation epoch and appends one new stage to the end of the run: the batch doubled
  or kept, the LR multiplier times 0.8 or 1.25 (on the space's grid); the exploiting trial
  keeps its own number, and its config records the lineage (``pbt_lineage``);
* trials are ranked by ``score``, the cooldown probe the trainable runs at every
  perturbation epoch (``probe_at``), not by mid-run accuracy at a high LR;
* baselines train beside the population but are never cloned, never perturbed;
* a trial that ends early (it diverged) while all others wait at the next perturbation epoch
  does not leave them waiting for good (:meth:`SchedulePBT.choose_trial_to_run`).

Each trial's ``schedule`` at the end is its lineage, what the study stores, reports and
exports. Checkpoints are the trainable's own (``save_checkpoint``: model, optimizer, RNG
streams, data order), kept in Tune's storage.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable
from typing import Any, Final

from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining, TrialScheduler

from tuner.engine_search import META_KEY, TrialMeta
from tuner.schedule import Schedule, Stage
from tuner.space import ScheduleSpace, lr_multiplier_grid

__all__ = ["LINEAGE_KEY", "SchedulePBT", "initial_schedules", "pbt_interval", "perturb"]

#: Config key of a trial's lineage: ``[[epoch, trial number cloned], ...]``.
LINEAGE_KEY: Final = "pbt_lineage"

#: LR multiplier perturbations (Ray Tune's default factors).
LR_FACTORS: Final = (0.8, 1.25)


def pbt_interval(space: ScheduleSpace, interval: int | None) -> int:
    """The perturbation interval in epochs: the spec's, else the run cut into as many segments
    as the space allows stages (at least one epoch)."""
    if interval is not None:
        return interval
    return max(1, space.total_epochs // max(1, space.stages_max))


def initial_schedules(
    space: ScheduleSpace,
    n: int,
    seed: int,
    feasible: Callable[[Schedule], bool] | None = None,
) -> list[Schedule]:
    """The population's starting points: one stage each, batches from the smaller half of the
    space's batch sizes whose one-stage schedule is ``feasible`` (the objective's constraint,
    e.g. ``max_steps``; PBT only grows batches), LR multipliers log-uniform on the grid."""
    rng = random.Random(f"pbt-{seed}")

    def one_stage(exp: int, mult: float) -> Schedule:
        stage = Stage(
            0,
            space.total_epochs,
            1 << exp,
            lr_multiplier=mult,
            warmup_epochs=min(space.warmup_min, float(space.total_epochs)),
            decay=space.decays[0],
        )
        return space.schedule([stage], label_smoothing=space.label_smoothing[0])

    exps = list(range(space.batch_exp_min, space.batch_exp_max + 1))
    if feasible is not None:
        exps = [e for e in exps if feasible(one_stage(e, 1.0))] or exps[-1:]
    exps = exps[: max(1, (len(exps) + 1) // 2)]
    out = []
    for _ in range(n):
        exp = rng.choice(exps)
        mult = space.lr_mult_min
        if space.lr_mult_min < space.lr_mult_max:
            u = rng.random()
            mult = lr_multiplier_grid(
                space.lr_mult_min * (space.lr_mult_max / space.lr_mult_min) ** u,
                space.lr_mult_min,
                space.lr_mult_max,
            )
        out.append(one_stage(exp, mult))
    return out


def perturb(space: ScheduleSpace, schedule: Schedule, epoch: int, rng: random.Random) -> Schedule:
    """``schedule`` up to ``epoch``, then one new stage to the end of the run with the batch
    doubled or kept and the LR multiplier perturbed (the same schedule when the space allows
    no more stages or nothing changed)."""
    if not 0 < epoch < schedule.total_epochs:
        return schedule
    head: list[Stage] = []
    for st in schedule.stages:
        if st.start_epoch >= epoch:
            break
        head.append(dataclasses.replace(st, end_epoch=min(st.end_epoch, epoch)))
    last = head[-1]
    if len(head) >= space.stages_max:
        return schedule
    batch = last.batch_size
    if rng.random() < 0.5 and batch * 2 <= space.largest_batch:
        batch *= 2
    mult = last.lr_multiplier
    if space.lr_mult_min < space.lr_mult_max:
        mult = lr_multiplier_grid(
            last.lr_multiplier * rng.choice(LR_FACTORS), space.lr_mult_min, space.lr_mult_max
        )
    if batch == last.batch_size and mult == last.lr_multiplier:
        return schedule
    tail = Stage(
        epoch,
        schedule.total_epochs,
        batch,
        lr_multiplier=mult,
        warmup_epochs=min(space.warmup_min, float(schedule.total_epochs - epoch)),
        decay=last.decay,
    )
    return dataclasses.replace(schedule, stages=(*head, tail))


def _unchanged(config: dict[str, Any]) -> dict[str, Any]:
    return config  # the explore step is _get_new_config's; Ray wants one of the two hooks


class _Population:
    """The Tune controller as PBT's synchronous mode sees it: without the baselines, which
    train beside the population at their own pace (they would otherwise hold back or jump
    the next perturbation epoch)."""

    def __init__(self, controller: Any) -> None:
        self._controller = controller

    def get_trials(self) -> list[Any]:
        return [t for t in self._controller.get_trials() if not SchedulePBT._is_baseline(t)]

    def get_live_trials(self) -> list[Any]:
        return [t for t in self._controller.get_live_trials() if not SchedulePBT._is_baseline(t)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._controller, name)


class SchedulePBT(PopulationBasedTraining):
    """Ray Tune's PBT over the current stage's batch and LR multiplier (module docstring)."""

    def __init__(self, space: ScheduleSpace, *, interval: int, seed: int) -> None:
        super().__init__(
            time_attr="training_iteration",
            metric="score",
            mode="max",
            perturbation_interval=interval,
            custom_explore_fn=_unchanged,
            quantile_fraction=0.25,
            synch=True,
            require_attrs=False,
        )
        self._space = space
        self._seed = seed

    @staticmethod
    def _is_baseline(trial: Any) -> bool:
        meta = TrialMeta.from_config(trial.config)
        return meta is not None and meta.baseline is not None

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if self._is_baseline(trial) or result.get("done") or result.get("score") is None:
            # Not a decision point: baselines are outside the population, the run's end is
            # not perturbed, and only probed epochs have a score.
            return TrialScheduler.CONTINUE
        population: Any = _Population(tune_controller)
        decision: str = super().on_trial_result(population, trial, result)
        return decision

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        """Ray's choice, and when it has none because every live population trial is paused
        at the next perturbation epoch, the perturbation first. Ray's synchronous mode
        perturbs when the last trial *reports* that epoch; a trial that instead ends before it
        (it diverged) while all others wait reports nothing more, and the population would
        stay paused for good."""
        chosen = super().choose_trial_to_run(tune_controller)
        if chosen is not None:
            return chosen
        population: Any = _Population(tune_controller)
        live = population.get_live_trials()
        if not live or any(
            t.status != Trial.PAUSED
            or self._trial_state[t].last_train_time < self._next_perturbation_sync
            or self._trial_state[t].last_result is None
            for t in live
        ):
            return None
        last = max(live, key=lambda t: self._trial_state[t].last_train_time)
        result = self._trial_state[last].last_result
        assert result is not None  # checked above
        super().on_trial_result(population, last, dict(result))
        return super().choose_trial_to_run(tune_controller)

    def _get_new_config(
        self, trial: Any, trial_to_clone: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        donor = trial_to_clone.config
        epoch = int(self._trial_state[trial_to_clone].last_train_time)
        rng = random.Random(f"{self._seed}-{self._num_perturbations}-{trial.trial_id}")
        schedule = perturb(self._space, Schedule.from_dict(donor["schedule"]), epoch, rng)
        new = copy.deepcopy(dict(donor))
        new["schedule"] = schedule.to_dict()
        new[META_KEY] = copy.deepcopy(trial.config[META_KEY])  # the trial keeps its number
        donor_meta = TrialMeta.from_config(donor)
        lineage = list(donor.get(LINEAGE_KEY) or [])
        lineage.append([epoch, donor_meta.number if donor_meta else None])
        new[LINEAGE_KEY] = lineage
        return new, {"schedule": f"cloned at epoch {epoch}, then {schedule.summary()}"}
