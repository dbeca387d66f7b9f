"""The stage-wise search (``budget.search: stagewise``), its searcher driven directly as Tune
would, over a real Optuna study in SQLite: synchronous rounds, one per stage; each round's best
prefixes (by their cooldown probe at the stage's end) are what the next round's candidates
keep, so they fork from the parent's boundary state; and the spec's rules for it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tuner.engine_search import META_KEY, ScheduleSearcher
from tuner.objectives import StudyObjective, trial_status
from tuner.optuna_storage import PARENT_ATTR, PREFIX_STAGES_ATTR, STAGE_ROUND_ATTR
from tuner.prefixes import prefix_key
from tuner.schedule import Schedule
from tuner.space import ScheduleSpace
from tuner.spec import StudySpec, TaskDefaults
from tuner.trial_config import STOP_AFTER_KEY

optuna.logging.set_verbosity(optuna.logging.WARNING)

DEFAULTS = TaskDefaults(epochs=6, base_batch_size=32, base_lr=0.1)
TRAIN_SIZE = 4096
SPEC = """
task: digits
schedule: {total_epochs: 6}
space:
  stages: {min: 2, max: 3}
  batch_size: {min: 32, max: 256}
budget: {trials: 30, search: stagewise, stage_candidates: 3, stage_keep: 1, seed_runs: 0}
baselines: false
"""


def make_searcher(storage: str, text: str = SPEC) -> tuple[ScheduleSearcher, StudyObjective]:
    spec = StudySpec.from_yaml(text)
    resolved = spec.resolve(DEFAULTS)
    objective = StudyObjective.of(spec, resolved.total_epochs)
    searcher = ScheduleSearcher(
        space=ScheduleSpace.from_spec(resolved),
        objective=objective,
        baselines=[],
        storage_url=storage,
        study_name="s",
        seed=spec.seed,
        startup_trials=2,
        train_size=TRAIN_SIZE,
        budget=spec.budget.trials,
        stagewise=(spec.budget.stage_candidates, spec.budget.stage_keep),
    )
    return searcher, objective


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'optuna.db'}"


def suggest(searcher: ScheduleSearcher, trial_id: str) -> dict[str, Any]:
    config = searcher.suggest(trial_id)
    assert isinstance(config, dict), config
    return config


def at_stop(config: dict[str, Any], score: float) -> dict[str, Any]:
    """The trial's last result: its round's stage trained and probed (``score``)."""
    stop = config[STOP_AFTER_KEY]
    return {
        "training_iteration": stop,
        "val_accuracy": score - 0.01,
        "score": score,
        "compute_epochs": stop + 0.2,
        "config": config,
    }


def test_rounds_train_each_stage_and_fork_the_best_prefixes(storage: str) -> None:
    searcher, objective = make_searcher(storage)
    first = {f"t{i}": suggest(searcher, f"t{i}") for i in range(3)}
    for config in first.values():
        schedule = Schedule.from_dict(config["schedule"])
        end = schedule.stages[0].end_epoch
        # Every candidate of round 0 stops at its first stage's end, probed there.
        assert config[STOP_AFTER_KEY] == end
        assert config["probe_at"] == [end]
    # The round is full: nothing more until its trials have finished and been ranked.
    assert searcher.suggest("t3") is None
    searcher.on_trial_complete("t0", at_stop(first["t0"], 0.90))
    searcher.on_trial_complete("t1", at_stop(first["t1"], 0.95))
    assert searcher.suggest("t3") is None  # t2 still trains
    searcher.on_trial_complete("t2", at_stop(first["t2"], 0.80))

    parent = Schedule.from_dict(first["t1"]["schedule"])
    children = [suggest(searcher, f"t{i}") for i in range(3, 6)]
    assert searcher.stage_round == (0, 1)
    for child_config in children:
        child = Schedule.from_dict(child_config["schedule"])
        # The kept prefix: the parent's stage count and first stage, hence its boundary state.
        assert child.num_stages == parent.num_stages
        assert child.stages[0] == parent.stages[0]
        assert prefix_key(child, 1, child_config) == prefix_key(parent, 1, first["t1"])
        ends = [st.end_epoch for st in child.stages]
        if child.num_stages == 2:  # round 1's stage is its last: it trains to the end
            assert STOP_AFTER_KEY not in child_config
            assert child_config["probe_at"] == ends[:1]
        else:
            assert child_config[STOP_AFTER_KEY] == ends[1]
            assert child_config["probe_at"] == ends[:2]
    study = searcher.study
    asked = {t.user_attrs.get("stagetune_number"): t for t in study.get_trials(deepcopy=False)}
    for meta in (c[META_KEY] for c in children):
        attrs = asked[meta["number"]].user_attrs
        assert attrs[PARENT_ATTR] == first["t1"][META_KEY]["number"]
        assert attrs[PREFIX_STAGES_ATTR] == 1
        assert attrs[STAGE_ROUND_ATTR] == 1
    # Round 0's trials are told PRUNED (the sampler ranks them by their probe), not COMPLETE.
    states = {asked[c[META_KEY]["number"]].state for c in first.values()}
    assert states == {TrialState.PRUNED}
    # Their store status says why they stopped.
    status, reason = trial_status(objective, at_stop(first["t0"], 0.9), error=False)
    assert status == "stopped"
    assert reason.startswith("stage-wise search: trained to the end of the stage")


def test_a_round_with_no_prefix_to_keep_starts_a_new_generation(storage: str) -> None:
    searcher, _ = make_searcher(storage)
    for i in range(3):
        suggest(searcher, f"t{i}")
    for i in range(3):  # every candidate failed: nothing to fork from
        searcher.on_trial_complete(f"t{i}", None, error=True)
    config = suggest(searcher, "t3")
    assert searcher.stage_round == (1, 0)
    schedule = Schedule.from_dict(config["schedule"])
    assert config[STOP_AFTER_KEY] == schedule.stages[0].end_epoch
    drawn = searcher.study.get_trials(deepcopy=False)[-1]
    assert PARENT_ATTR not in drawn.user_attrs


def test_the_rounds_survive_a_save_and_restore(storage: str, tmp_path: Path) -> None:
    searcher, _ = make_searcher(storage)
    first = {f"t{i}": suggest(searcher, f"t{i}") for i in range(3)}
    for i, score in enumerate((0.7, 0.8, 0.9)):
        searcher.on_trial_complete(f"t{i}", at_stop(first[f"t{i}"], score))
    path = tmp_path / "searcher.pkl"
    searcher.save(str(path))
    again, _ = make_searcher(storage)
    again.restore(str(path))
    child = Schedule.from_dict(suggest(again, "t3")["schedule"])
    assert child.stages[0] == Schedule.from_dict(first["t2"]["schedule"]).stages[0]


@pytest.mark.parametrize(
    ("change", "needs"),
    [
        ("objective: {kind: pareto}", "one metric"),
        ("budget: {search: stagewise, cooldown_probes: false}", "cooldown_probes: true"),
        ("budget: {search: stagewise, prefix_store_mb: 0}", "prefix_store_mb above 0"),
        ("space: {stages: {min: 1, max: 1}}", "space.stages.max of 2"),
        ("budget: {search: stagewise, stage_candidates: 2, stage_keep: 3}", "stage_keep (3)"),
    ],
)
def test_the_spec_says_what_the_stagewise_search_needs(change: str, needs: str) -> None:
    if change.startswith("budget"):
        text = f"task: digits\n{change}\n"
    else:
        text = f"task: digits\nbudget: {{search: stagewise}}\n{change}\n"
    with pytest.raises(ValueError, match=re.escape(needs)):
        StudySpec.from_yaml(text)


def test_the_default_search_is_unchanged_by_the_stagewise_settings() -> None:
    spec = StudySpec.from_yaml("task: digits\nbudget: {stage_candidates: 4}\n")
    assert spec.budget.search == "optuna"
