"""The engine's searcher, driven directly (as Tune would) over a real Optuna study stored in
SQLite: baselines first, constraint rejection, how trials are told, and resume."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tuner import engine_search, optuna_storage
from tuner.baselines import build_baselines
from tuner.engine_search import META_KEY, PriorTrial, ScheduleSearcher
from tuner.errors import StagetuneError
from tuner.objectives import StudyObjective
from tuner.schedule import Schedule
from tuner.space import ScheduleSpace
from tuner.spec import StudySpec, TaskDefaults

optuna.logging.set_verbosity(optuna.logging.WARNING)

DEFAULTS = TaskDefaults(epochs=6, base_batch_size=32, base_lr=0.1)
TRAIN_SIZE = 4096


def make_searcher(
    text: str, storage: str | None, name: str = "s", *, recipes: bool = False
) -> ScheduleSearcher:
    spec = StudySpec.from_yaml(text)
    resolved = spec.resolve(DEFAULTS)
    space = ScheduleSpace.from_spec(resolved)
    return ScheduleSearcher(
        space=space,
        objective=StudyObjective.of(spec, resolved.total_epochs),
        baselines=build_baselines(space) if spec.baselines else [],
        storage_url=storage,
        study_name=name,
        seed=spec.seed,
        startup_trials=3,
        train_size=TRAIN_SIZE,
        recipes=recipes,
    )


def suggest(searcher: ScheduleSearcher, trial_id: str) -> dict[str, Any]:
    """A suggestion that must be a trial config (not FINISHED / not ready)."""
    config = searcher.suggest(trial_id)
    assert isinstance(config, dict), config
    return config


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'optuna.db'}"


SPEC = "task: digits\nspace: {batch_size: {min: 32, max: 512}, stages: {min: 1, max: 3}}"


def result(epochs: int, acc: float, **extra: object) -> dict[str, object]:
    return {"training_iteration": epochs, "val_accuracy": acc, "steps": 10 * epochs, **extra}


def test_baselines_come_first_then_optuna_trials(storage: str) -> None:
    searcher = make_searcher(SPEC, storage)
    configs = [suggest(searcher, f"t{i}") for i in range(5)]
    metas = [c[META_KEY] for c in configs]
    assert [m["number"] for m in metas] == [0, 1, 2, 3, 4]
    assert [m["baseline"] for m in metas] == [
        "small_batch",
        "large_batch",
        "increase_batch",
        None,
        None,
    ]
    assert [m["optuna_trial"] for m in metas] == [None, None, None, 0, 1]
    assert metas[3]["params"]["n_stages"] >= 1
    for config in configs:
        Schedule.from_dict(config["schedule"])  # a valid schedule document
    study = optuna.load_study(study_name="s", storage=storage)
    attrs = study.trials[0].user_attrs
    assert attrs["stagetune_number"] == 3
    assert attrs["stagetune_schedule"] == configs[3]["schedule"]


def test_schedules_violating_the_constraint_are_not_trained(storage: str) -> None:
    searcher = make_searcher(
        SPEC + "\nobjective: {max_mean_batch_size: 64}\nbaselines: false", storage
    )
    for i in range(8):
        config = suggest(searcher, f"t{i}")
        assert config is not None
        schedule = Schedule.from_dict(config["schedule"])
        assert schedule.mean_batch_size(TRAIN_SIZE) <= 64
        searcher.on_trial_complete(
            f"t{i}", result(6, 0.5 + schedule.mean_batch_size(TRAIN_SIZE) / 1000)
        )
    study = optuna.load_study(study_name="s", storage=storage)
    infeasible = [t for t in study.trials if t.user_attrs.get("stagetune_infeasible")]
    assert infeasible, "some draws violate the constraint and are recorded as infeasible"
    assert all(t.constraints and max(t.constraints.values()) > 0 for t in infeasible)
    trained = [t for t in study.trials if "stagetune_number" in t.user_attrs]
    assert len(trained) == 8
    assert all(max(t.constraints.values()) <= 0 for t in trained)


def test_a_constraint_too_tight_for_the_space_fails_with_advice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_search, "MAX_DRAWS", 3)
    searcher = make_searcher(
        "task: digits\nspace: {batch_size: {min: 32, max: 4096}, stages: {min: 3, max: 3}}\n"
        "objective: {max_mean_batch_size: 32.5}\nbaselines: false",
        None,
    )
    # All three stages at batch 32 is the only feasible schedule: 3 draws (seeded) miss it.
    with pytest.raises(StagetuneError, match="too tight"):
        suggest(searcher, "t0")


def test_trials_are_told_complete_pruned_or_failed(storage: str) -> None:
    searcher = make_searcher(SPEC + "\nbaselines: false", storage)
    for i in range(3):
        suggest(searcher, f"t{i}")
    for epoch in (1, 2):
        searcher.on_trial_result("t1", result(epoch, 0.3 * epoch))
    searcher.on_trial_complete("t0", result(6, 0.9))  # all 6 epochs
    searcher.on_trial_complete("t1", result(2, 0.6))  # ASHA stopped it after 2
    searcher.on_trial_complete("t2", None, error=True)
    searcher.on_trial_complete("t2", None, error=True)  # a repeated notice is ignored
    study = optuna.load_study(study_name="s", storage=storage)
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL]
    assert study.trials[0].value == 0.9
    # Epoch k's accuracy at step k (the store's epoch numbering), the last epoch included
    # (Tune hands it to on_trial_complete only); the objective has its name.
    assert study.trials[1].intermediate_values == {0: 0.3, 1: 0.6}
    assert study.trials[0].intermediate_values == {5: 0.9}
    assert study.metric_names == ["val_accuracy"]


def test_resume_replays_trials_suggested_after_the_last_checkpoint(
    storage: str, tmp_path: Path
) -> None:
    first = make_searcher(SPEC, storage)
    for i in range(4):
        suggest(first, f"t{i}")  # 3 baselines + tuned trial 3
    checkpoint = tmp_path / "searcher.pkl"
    first.save(str(checkpoint))
    lost = [suggest(first, f"t{i}") for i in (4, 5)]  # suggested, then the process dies

    # Tune pickles the searcher when the experiment starts and restores its checkpoint.
    second = pickle.loads(pickle.dumps(make_searcher(SPEC, storage)))
    second.restore(str(checkpoint))
    replayed = [suggest(second, f"n{i}") for i in range(3)]
    assert [c[META_KEY]["number"] for c in replayed if c] == [4, 5, 6]
    assert [c["schedule"] for c in replayed[:2] if c] == [c["schedule"] for c in lost if c]
    assert replayed[2] is not None
    assert replayed[2][META_KEY]["optuna_trial"] == 3  # a fresh Optuna trial
    second.on_trial_complete("n0", result(6, 0.8))
    study = optuna.load_study(study_name="s", storage=storage)
    assert study.trials[1].state == TrialState.COMPLETE  # the replayed trial 4 is told
    assert len(study.trials) == 4


def test_a_draw_cut_short_by_a_kill_leaves_one_optuna_trial_per_number(
    storage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies between the two user-attribute writes of a new trial: the resumed
    study draws that number again, and no second Optuna trial claims the same number."""
    first = make_searcher(SPEC, storage)
    for i in range(3):
        suggest(first, f"t{i}")  # the baselines
    checkpoint = tmp_path / "searcher.pkl"
    first.save(str(checkpoint))
    written: list[str] = []
    set_user_attr = optuna.Trial.set_user_attr

    def killed_after_one_write(self: optuna.Trial, key: str, value: Any) -> None:
        if written:
            raise KeyboardInterrupt  # stands for the SIGKILL
        written.append(key)
        set_user_attr(self, key, value)

    monkeypatch.setattr(optuna.Trial, "set_user_attr", killed_after_one_write)
    with pytest.raises(KeyboardInterrupt):
        first.suggest("t3")
    monkeypatch.undo()

    second = pickle.loads(pickle.dumps(make_searcher(SPEC, storage)))
    second.restore(str(checkpoint))
    assert suggest(second, "n0")[META_KEY]["number"] == 3
    study = optuna.load_study(study_name="s", storage=storage)
    numbers = [
        t.user_attrs["stagetune_number"] for t in study.trials if "stagetune_number" in t.user_attrs
    ]
    assert numbers == [3]


def test_a_kill_between_enqueueing_a_candidate_and_asking_loses_no_candidate(
    storage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies after a recipe candidate is enqueued and before Optuna's ask takes
    it. The resumed run closes that waiting trial and draws every candidate once, in order,
    and no trial is left waiting (before, the stale trial went to the next draw, each later
    candidate's trial to the draw after its own, and a study whose budget ended first left
    the last one waiting)."""
    fresh = make_searcher(SPEC, f"sqlite:///{tmp_path / 'fresh.db'}", recipes=True)
    for i in range(3):
        suggest(fresh, f"f{i}")
    drawn = [suggest(fresh, f"f{i}")[META_KEY] for i in range(3, 6)]
    order = [m["candidate"] for m in drawn]
    assert order[:2] == ["fitted_constant", "fitted_increase"]  # the recipes come first

    first = make_searcher(SPEC, storage, recipes=True)
    for i in range(3):
        suggest(first, f"t{i}")  # the baselines
    checkpoint = tmp_path / "searcher.pkl"
    first.save(str(checkpoint))

    def killed(self: optuna.Study, *args: Any, **kwargs: Any) -> optuna.Trial:
        raise KeyboardInterrupt  # stands for the SIGKILL

    monkeypatch.setattr(optuna.Study, "ask", killed)
    with pytest.raises(KeyboardInterrupt):
        first.suggest("t3")
    monkeypatch.undo()
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.WAITING]  # what the kill left

    second = pickle.loads(pickle.dumps(make_searcher(SPEC, storage, recipes=True)))
    second.restore(str(checkpoint))
    resumed = [suggest(second, f"n{i}")[META_KEY] for i in range(3)]
    assert [m["number"] for m in resumed] == [3, 4, 5]
    assert [m["candidate"] for m in resumed] == order
    assert [m["params"] for m in resumed[:2]] == [m["params"] for m in drawn[:2]]
    study = optuna.load_study(study_name="s", storage=storage)
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING, TrialState.RUNNING]


def test_a_fresh_start_completes_a_study_from_its_database_trials(storage: str) -> None:
    """Another host takes the study over without the Tune experiment: finished trials are
    skipped, interrupted ones run again as they were, numbering is dense, the budget holds."""
    first = make_searcher(SPEC, storage)
    issued = [suggest(first, f"t{i}") for i in range(5)]  # 3 baselines + tuned 3 and 4
    first.on_trial_complete("t3", result(6, 0.7))
    configs = {c[META_KEY]["number"]: c for c in issued}
    # The database: 0, 1, 3 finished; 2 (a baseline) and 4 were running when it died.
    prior = [
        PriorTrial(
            number=n,
            baseline=configs[n][META_KEY]["baseline"],
            schedule=configs[n]["schedule"],
            params={
                **configs[n][META_KEY]["params"],
                **(
                    {"optuna_trial": configs[n][META_KEY]["optuna_trial"]}
                    if configs[n][META_KEY]["optuna_trial"] is not None
                    else {}
                ),
            },
            finished=n in (0, 1, 3),
        )
        for n in range(5)
    ]
    spec = StudySpec.from_yaml(SPEC)
    resolved = spec.resolve(DEFAULTS)
    space = ScheduleSpace.from_spec(resolved)
    second = ScheduleSearcher(
        space=space,
        objective=StudyObjective.of(spec, resolved.total_epochs),
        baselines=build_baselines(space),
        storage_url=storage,
        study_name="s",
        startup_trials=3,
        train_size=TRAIN_SIZE,
        budget=8,
        prior=prior,
    )
    again = [suggest(second, f"n{i}") for i in range(5)]
    metas = [c[META_KEY] for c in again]
    assert [m["number"] for m in metas] == [2, 4, 5, 6, 7]
    assert again[0]["schedule"] == configs[2]["schedule"]
    assert metas[0]["baseline"] == "increase_batch"
    assert again[1]["schedule"] == configs[4]["schedule"]
    assert metas[1]["optuna_trial"] == configs[4][META_KEY]["optuna_trial"]
    assert second.suggest("n5") == "FINISHED"  # 3 finished + 5 issued = the budget of 8
    # New draws continue from a seed of their own: no schedule of the first run comes back.
    earlier = {str(c["schedule"]) for c in issued}
    assert all(str(c["schedule"]) not in earlier for c in again[2:])
    second.on_trial_complete("n1", result(6, 0.8))
    study = optuna.load_study(study_name="s", storage=storage)
    assert study.trials[1].state == TrialState.COMPLETE  # trial 4's Optuna trial is told


def test_searchers_opening_a_fresh_database_at_once_all_get_optuna_storage(db_url: str) -> None:
    # Two dispatchers starting their first studies together both create Optuna's tables;
    # the loser used to fail its study ("duplicate key value violates unique constraint",
    # every time with four threads on PostgreSQL).
    start = threading.Barrier(4)
    errors: list[BaseException] = []
    storages: list[optuna.storages.RDBStorage] = []

    def open_storage() -> None:
        start.wait()
        try:
            storages.append(optuna_storage.open_storage(db_url, {}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_storage) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for storage in storages:
        assert storage.get_all_studies() == []
        storage.engine.dispose()
