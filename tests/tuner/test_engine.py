"""The engine through real Ray Tune and a real Optuna study (SQLite), with a simulated
trainable (fast and deterministic; the real one is exercised by tests/workers/test_runner*)."""

from __future__ import annotations

import gc
import json
import logging
import math
import pickle
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tests.seed_pick import checked_pick
from tuner.engine import (
    PBT_CHECKPOINTS_KEPT,
    RunStopper,
    TuningEngine,
    checkpoint_bytes,
    concurrency_for,
    rung_epochs,
    unreadable_state,
)
from tuner.engine_search import PriorTrial
from tuner.noise_candidate import noise_scale_schedule
from tuner.objectives import StudyObjective, search_text
from tuner.schedule import Schedule
from tuner.seeds import fresh_seeds
from tuner.spec import StudySpec, TaskDefaults

pytestmark = pytest.mark.ray

DEFAULTS = TaskDefaults(epochs=6, base_batch_size=32, base_lr=0.1)
TRAIN_SIZE = 4096


def make_fake_trainable() -> type:
    """A class trainable that simulates training (defined in a function so that Ray pickles
    it by value into its workers)."""
    from ray import tune
    from ray.tune.execution.placement_groups import PlacementGroupFactory

    class FakeScheduleTrainable(tune.Trainable):
        @classmethod
        def default_resource_request(cls, config: dict[str, Any]) -> PlacementGroupFactory:
            return PlacementGroupFactory([{"CPU": 1.0}])

        def setup(self, config: dict[str, Any]) -> None:
            self._start(config)

        def reset_config(self, new_config: dict[str, Any]) -> bool:
            self._start(new_config)
            return True

        def _start(self, config: dict[str, Any]) -> None:
            self.schedule = Schedule.from_dict(config["schedule"])
            self.cfg = config
            self.number = config["stagetune"]["number"]
            self.probe_at = tuple(config.get("probe_at", ()))
            probe_log = config.get("fake_probe_log")
            if probe_log:  # one line per trial: its number and the epochs it probes after
                with open(probe_log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps([self.number, list(self.probe_at)]) + "\n")
            self.steps = self.samples = self.epoch = 0
            self.wall = 0.0
            self.acc = 0.1

        def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
            return {
                "epoch": self.epoch,
                "acc": self.acc,
                "steps": self.steps,
                "samples": self.samples,
                "wall": self.wall,
            }

        def load_checkpoint(self, checkpoint: dict[str, Any] | None) -> None:
            assert checkpoint is not None
            self.epoch = checkpoint["epoch"]
            self.acc = checkpoint["acc"]
            self.steps = checkpoint["steps"]
            self.samples = checkpoint["samples"]
            self.wall = checkpoint["wall"]

        def step(self) -> dict[str, Any]:
            if self.number == self.cfg.get("fake_fail_number"):
                raise RuntimeError("simulated worker crash")
            if self.number == self.cfg.get("fake_marker_number"):
                Path(self.cfg["fake_marker"]).touch()
            e = self.epoch
            i = self.schedule.stage_index_at(e)
            st = self.schedule.stages[i]
            spe = self.schedule.steps_per_epoch(i, TRAIN_SIZE)
            self.steps += spe
            self.samples += spe * st.batch_size
            self.wall += spe * 0.001
            # Large batches early and LRs away from the scaling rule's learn slower.
            early = math.log2(st.batch_size / 32) * (1 - e / self.schedule.total_epochs)
            gain = 0.3 / (1 + 0.5 * abs(math.log(st.lr_multiplier)) + 0.3 * early)
            if self.number in (
                *self.cfg.get("fake_bad_numbers", ()),
                *self.cfg.get("fake_late_bloomers", ()),
            ):
                gain = 0.0  # a schedule that does not learn (or not visibly, mid-run)
            self.acc += (1 - self.acc) * gain
            self.epoch += 1
            lucky = self.cfg.get("fake_lucky")  # [number, seed]: one lucky run of a schedule
            if lucky and [self.number, self.cfg["seed"]] == list(lucky):
                self.acc = 0.999
            # {number: {seed: accuracy}}: a schedule's final accuracy on given seeds.
            final = self.cfg.get("fake_final", {}).get(str(self.number), {})
            if self.epoch >= self.schedule.total_epochs and str(self.cfg["seed"]) in final:
                self.acc = final[str(self.cfg["seed"])]
            slow = self.cfg.get("fake_slow", {}).get(str(self.number))
            time.sleep(float(slow or self.cfg.get("fake_delay_s", 0.02)))
            log = self.cfg.get("fake_log")
            if log:  # one line per trained epoch
                with open(log, "a", encoding="utf-8") as fh:
                    fh.write(f"{self.number}\n")
            done = self.epoch >= self.schedule.total_epochs
            # {number: epoch}: the trial diverges after that many epochs (and ends there).
            diverged = self.cfg.get("fake_diverge", {}).get(str(self.number)) == self.epoch
            done = done or diverged
            stray = self.cfg.get("fake_stray_checkpoint_log")
            if stray and done:  # a checkpoint Tune deleted back on disk, out of its bookkeeping
                assert self._storage is not None
                first = Path(self._storage.trial_fs_path, "checkpoint_000000")
                if not first.exists():
                    first.mkdir()
                    (first / "state.pkl").write_bytes(b"left over")
                    with open(stray, "a", encoding="utf-8") as fh:
                        fh.write(f"{first}\n")
            # The trainable's contract: ``score`` after a cooldown probe (a probe lifts the
            # accuracy; a "late bloomer" looks bad mid-run but probes well) and at the end.
            score: dict[str, float | None] = {"score": None}
            if self.epoch in self.probe_at and not done:
                late = self.number in self.cfg.get("fake_late_bloomers", ())
                score["score"] = 0.99 if late else self.acc + (1 - self.acc) * 0.2
            elif done:
                score["score"] = self.acc
            return {
                **score,
                "epoch": e,
                "val_accuracy": self.acc,
                "val_loss": 1 - self.acc,
                "steps": self.steps,
                "samples": self.samples,
                "wall_time_s": self.wall,
                "batch_size": st.batch_size,
                "noise_scale": 24.0 * 2**e,  # a noise scale that doubles every epoch
                "diverged": diverged,
                "done": done,
            }

    return FakeScheduleTrainable


class StopWhenFileExists:
    """A picklable ``should_stop``: true once a file exists (the cancel of these tests)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> bool:
        return self.path.exists()


def engine(tmp_path: Path, text: str, name: str = "study-1", **kwargs: Any) -> TuningEngine:
    spec = StudySpec.from_yaml(text)
    trial_config = kwargs.pop("trial_config", {})
    return TuningEngine(
        spec.resolve(DEFAULTS),
        make_fake_trainable(),
        storage_path=tmp_path / "ray",
        experiment_name=name,
        optuna_storage=f"sqlite:///{tmp_path / 'optuna.db'}",
        optuna_study_name=name,
        train_size=TRAIN_SIZE,
        trial_config={"fake_log": str(tmp_path / "epochs.log"), **trial_config},
        **kwargs,
    )


def epochs_trained(tmp_path: Path) -> list[int]:
    """The trial number of every epoch trained so far, in order."""
    return [int(line) for line in (tmp_path / "epochs.log").read_text().split()]


SPEC = """
task: digits
schedule: {total_epochs: 4}
space: {stages: {min: 1, max: 3}, batch_size: {min: 32, max: 512}}
budget: {trials: 8, grace_period_epochs: 1, reduction_factor: 2, max_failures: 0,
         seed_runs: 0}
"""


def test_concurrency_is_what_the_scarcest_resource_allows() -> None:
    assert concurrency_for({"CPU": 2.0}, {"CPU": 8.0, "GPU": 1.0}, 10) == 4
    assert concurrency_for({"CPU": 1.0, "GPU": 0.5}, {"CPU": 8.0, "GPU": 1.0}, 10) == 2
    assert concurrency_for({"CPU": 1.0}, {"CPU": 16.0}, 3) == 3
    assert concurrency_for({"CPU": 4.0}, {"CPU": 2.0}, 3) == 1


def test_trials_stop_after_the_run_or_at_the_target() -> None:
    def stopper(objective: str) -> RunStopper:
        spec = StudySpec.from_yaml(f"task: digits\nobjective: {objective}")
        return RunStopper(StudyObjective.of(spec, 6), should_stop=None)

    accuracy = stopper("{kind: accuracy}")
    assert not accuracy("t", {"training_iteration": 5, "val_accuracy": 0.99})
    assert accuracy("t", {"training_iteration": 6, "val_accuracy": 0.5})
    assert accuracy("t", {"training_iteration": 2, "diverged": True})
    assert not accuracy.stop_all()
    tta = stopper("{kind: time_to_accuracy, target_accuracy: 0.9}")
    assert not tta("t", {"training_iteration": 2, "val_accuracy": 0.89})
    assert tta("t", {"training_iteration": 2, "val_accuracy": 0.9})


def test_a_study_runs_baselines_first_then_tuned_trials_under_asha(
    ray_session: None, tmp_path: Path
) -> None:
    eng = engine(tmp_path, SPEC, trial_config={"fake_fail_number": 5, "fake_bad_numbers": [6, 7]})
    result = eng.run()

    # The budget, baselines included; numbers are dense.
    assert [o.number for o in result.outcomes] == list(range(8))
    # Baselines are the first trials to train, and always run to the end.
    assert set(epochs_trained(tmp_path)[:2]) <= {0, 1}
    baselines = result.outcomes[:3]
    assert [o.baseline for o in baselines] == ["small_batch", "large_batch", "increase_batch"]
    assert all(o.status == "completed" and o.epochs_done == 4 for o in baselines)
    tuned = result.outcomes[3:]
    assert all(o.baseline is None for o in tuned)
    # ASHA stopped the tuned trials that did not learn at its first rung (epoch 1); the
    # crashing one failed and the study went on.
    for o in result.outcomes[6:]:
        assert o.status == "stopped"
        assert o.epochs_done == 1
    failed = [o for o in tuned if o.status == "failed"]
    assert [o.number for o in failed] == [5]
    assert "simulated worker crash" in (failed[0].stop_reason or "")

    # The Optuna study is in the database: tuned trials only, told how they ended.
    study = optuna.load_study(study_name="study-1", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    states = {t.user_attrs["stagetune_number"]: t.state for t in study.trials}
    assert sorted(states) == list(range(3, 8))
    assert states[5] == TrialState.FAIL
    for o in tuned:
        expected = {"completed": TrialState.COMPLETE, "stopped": TrialState.PRUNED}
        if o.status in expected:
            assert states[o.number] == expected[o.status]

    # The result: the best eligible trial, compared with each baseline.
    summary = result.summary
    best = result.best
    assert best is not None
    assert best.status == "completed"
    tuned_done = [o.val_accuracy or 0.0 for o in tuned if o.status == "completed"]
    if summary["best_is_baseline"]:
        assert best.baseline is not None
        assert all(acc <= (best.val_accuracy or 0.0) for acc in tuned_done)
    else:
        assert best.baseline is None
        assert best.val_accuracy == max(tuned_done)
    assert [b["baseline"] for b in summary["baselines"]] == [
        "small_batch",
        "large_batch",
        "increase_batch",
    ]
    assert all("vs_best" in b for b in summary["baselines"])
    assert result.best_schedule is not None
    assert result.best_schedule.total_epochs == 4


def test_probe_epochs_are_the_rungs_of_ray_tunes_asha() -> None:
    from ray.tune.schedulers import AsyncHyperBandScheduler

    for grace, rf, max_t in [
        (1, 2, 4),
        (2, 3, 12),
        (1, 3, 30),
        (4, 2, 10),
        (3, 4, 3),
        (2, 2.5, 20),
    ]:
        asha = AsyncHyperBandScheduler(
            time_attr="training_iteration",
            metric="score",
            mode="max",
            max_t=max_t,
            grace_period=grace,
            reduction_factor=rf,
            brackets=1,
        )
        milestones = {m for m, _ in asha._brackets[0]._rungs if m < max_t}
        assert rung_epochs(grace, rf, max_t) == tuple(sorted(math.ceil(m) for m in milestones))
    assert rung_epochs(2, 3, 12) == (2, 6)
    assert rung_epochs(1, 2, 4) == (1, 2)


@pytest.mark.parametrize("probes", [True, False], ids=["probes", "no-probes"])
def test_asha_ranks_tuned_trials_by_their_cooldown_probes(
    ray_session: None, tmp_path: Path, probes: bool
) -> None:
    """Trials 6 and 7 learn nothing visible mid-run but their probes say they will: ranked by
    probes ASHA lets them finish; ranked by mid-run accuracy it stops them at the first rung."""
    text = SPEC.replace("seed_runs: 0}", f"seed_runs: 0, cooldown_probes: {str(probes).lower()}}}")
    eng = engine(
        tmp_path,
        text,
        trial_config={"fake_late_bloomers": [6, 7], "fake_probe_log": str(tmp_path / "probes")},
    )
    assert eng.probe_epochs() == ((1, 2) if probes else ())
    result = eng.run()
    late = [o for o in result.outcomes if o.number in (6, 7)]
    if probes:
        assert [(o.status, o.epochs_done) for o in late] == [("completed", 4)] * 2
    else:
        assert [(o.status, o.epochs_done) for o in late] == [("stopped", 1)] * 2
    issued = dict(json.loads(line) for line in (tmp_path / "probes").read_text().splitlines())
    assert sorted(issued) == list(range(8))
    for number, probe_at in issued.items():
        # Baselines run to the end whatever ASHA sees: they are never probed.
        assert probe_at == ([1, 2] if probes and number >= 3 else []), number


def test_tuned_trials_extend_the_first_stages_of_the_best_trials_so_far(
    ray_session: None, tmp_path: Path
) -> None:
    """With prefix reuse, trials past the startup ones keep the first stages of a good trial
    (its parameters enqueued as fixed in Optuna) and the sampler draws the rest."""
    text = """
task: digits
schedule: {total_epochs: 6}
space: {stages: {min: 2, max: 3}, batch_size: {min: 32, max: 512}}
budget: {trials: 14, grace_period_epochs: 1, reduction_factor: 2, max_failures: 0,
         startup_trials: 3, prefix_reuse: 0.8, seed_runs: 0}
"""
    result = engine(tmp_path, text).run()
    assert len(result.outcomes) == 14
    study = optuna.load_study(study_name="study-1", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    by_number = {t.user_attrs["stagetune_number"]: t for t in study.trials}
    children = [t for t in study.trials if "stagetune_parent" in t.user_attrs]
    assert len(children) >= 3, [t.user_attrs for t in study.trials]
    for child in children:
        parent = by_number[child.user_attrs["stagetune_parent"]]
        stages = child.user_attrs["stagetune_prefix_stages"]
        mine = Schedule.from_dict(child.user_attrs["stagetune_schedule"]).stages
        theirs = Schedule.from_dict(parent.user_attrs["stagetune_schedule"]).stages
        assert 1 <= stages < len(theirs)
        assert mine[:stages] == theirs[:stages]
        assert parent.user_attrs["stagetune_number"] < child.user_attrs["stagetune_number"]
    # The sampler still draws whole schedules too.
    assert len(children) < 11
    assert result.summary["prefixes"] == {
        "states": 0,  # the simulated trainable saves no states
        "bytes": 0,
        "max_bytes": 2048 * 2**20,
        "forks": 0,
        "epochs_reused": 0,
    }


def test_should_stop_cancels_the_experiment(ray_session: None, tmp_path: Path) -> None:
    marker = tmp_path / "cancel"
    eng = engine(
        tmp_path,
        SPEC.replace("trials: 8", "trials: 12"),
        trial_config={"fake_marker_number": 3, "fake_marker": str(marker), "fake_delay_s": 0.2},
        should_stop=StopWhenFileExists(marker),
    )
    result = eng.run()
    gc.collect()  # Ray's leaked file handles warn now, under this test's filters
    assert result.cancelled
    assert result.summary["cancelled"] is True
    assert len(result.outcomes) < 12
    assert max(epochs_trained(tmp_path)) < 11


def test_a_finished_experiment_is_restored_not_rerun(ray_session: None, tmp_path: Path) -> None:
    text = (
        "task: digits\nschedule: {total_epochs: 2}\nbaselines: false\n"
        "budget: {trials: 3, early_stopping: false, seed_runs: 0}"
    )
    first = engine(tmp_path, text).run()
    assert not first.resumed
    trained = epochs_trained(tmp_path)
    assert len(trained) == 3 * 2
    again = engine(tmp_path, text).run()
    assert again.resumed
    assert epochs_trained(tmp_path) == trained  # nothing trained again
    assert [(o.number, o.val_accuracy) for o in again.outcomes] == [
        (o.number, o.val_accuracy) for o in first.outcomes
    ]
    assert again.summary["best"] == first.summary["best"]


def test_the_result_is_picked_on_fresh_seeds_and_a_rerun_restores_the_seed_runs(
    ray_session: None, tmp_path: Path
) -> None:
    """One lucky run (Goyal's large batch on the study seed) wins the search, but the finalists
    train again on two fresh seeds and the result is the best mean; running the finished
    study again trains nothing (the seed runs' experiment is restored too)."""
    text = (
        "task: digits\nschedule: {total_epochs: 2}\n"
        "budget: {trials: 5, early_stopping: false, seed_runs: 2, finalists: 2}"
    )
    lucky = {"fake_lucky": [1, 0]}
    first = engine(tmp_path, text, trial_config=lucky).run()
    seeded = first.summary["seed_runs"]
    assert seeded["search_pick"] == 1  # the lucky run is the best single run
    tuned = sorted(
        (o for o in first.outcomes if o.baseline is None),
        key=lambda o: (-(o.val_accuracy or 0), o.steps, o.number),
    )
    assert [f["number"] for f in seeded["finalists"]] == [tuned[0].number, tuned[1].number, 1]
    assert len(seeded["seeds"]) == 2
    assert 0 not in seeded["seeds"]
    by_number = {f["number"]: f for f in seeded["finalists"]}
    assert by_number[1]["mean"] < 0.9  # not lucky on the fresh seeds
    best = checked_pick(seeded)  # the best mean, or a cheaper finalist within noise of it
    assert first.summary["best"]["number"] == seeded["picked"] == best["number"] != 1
    assert first.summary["best"]["seeds"] == best
    assert "best mean over 2 fresh seeds" in first.summary["note"]
    # Each finalist trained its 2 epochs on each fresh seed, after the 5 search trials.
    trained = epochs_trained(tmp_path)
    assert len(trained) == 5 * 2 + 3 * 2 * 2
    assert sorted(trained[10:]) == sorted([tuned[0].number, tuned[1].number, 1] * 4)
    assert first.summary["compute_epochs"] == 5 * 2 + 3 * 2 * 2
    assert seeded["compute_epochs"] == 3 * 2 * 2

    again = engine(tmp_path, text, trial_config=lucky).run()
    assert epochs_trained(tmp_path) == trained  # nothing trained again
    assert again.summary["seed_runs"] == seeded
    assert again.summary["best"] == first.summary["best"]


def test_an_unstable_pick_sends_the_next_best_schedule_to_the_fresh_seeds(
    ray_session: None, tmp_path: Path
) -> None:
    """The search's best run (trial 0) trains well on one fresh seed and fails on the other:
    its pick is unstable, so the next schedule the search rated above its mean (trial 1) trains
    on the same fresh seeds as a reserve, and is the result; a rerun restores both."""
    text = (
        "task: digits\nschedule: {total_epochs: 2}\nbaselines: false\n"
        "budget: {trials: 3, early_stopping: false, seed_runs: 2, finalists: 1, "
        "reserve_finalists: 1}"
    )
    seeds = fresh_seeds(0, 2)
    final = {
        "fake_final": {
            "0": {"0": 0.99, str(seeds[0]): 0.95, str(seeds[1]): 0.30},
            "1": {"0": 0.98, str(seeds[0]): 0.90, str(seeds[1]): 0.91},
        }
    }
    first = engine(tmp_path, text, trial_config=final).run()
    seeded = first.summary["seed_runs"]
    assert seeded["search_pick"] == 0
    rows = {f["number"]: f for f in seeded["finalists"]}
    assert sorted(rows) == [0, 1]
    assert not rows[0]["reserve"]
    assert rows[1]["reserve"]
    assert rows[0]["val_accuracy"] == [0.95, 0.30]
    assert rows[1]["val_accuracy"] == [0.90, 0.91]
    assert seeded["picked"] == first.summary["best"]["number"] == 1
    assert seeded["reserves_why"] == "the pick's seed runs disagree"
    assert "Warning" not in first.summary["note"]  # the reserve is stable
    # 3 search trials, then trial 0 and (as the reserve) trial 1 on both seeds, 2 epochs each.
    trained = epochs_trained(tmp_path)
    assert trained[6:] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert first.summary["compute_epochs"] == 3 * 2 + 2 * 2 * 2

    again = engine(tmp_path, text, trial_config=final).run()
    assert epochs_trained(tmp_path) == trained  # nothing trained again
    assert again.summary["seed_runs"] == seeded


def test_a_run_the_validation_split_cannot_tell_from_the_finalist_trains_on_the_fresh_seeds(
    ray_session: None, tmp_path: Path
) -> None:
    """One finalist place, a stable pick (trial 0), but trial 1's search run is 0.2 point under
    it on a 1,000-sample split, which reads accuracy to about ± 0.3 point there: it trains on
    the same fresh seeds as a reserve and wins; trial 2, 1 point under, does not train."""
    text = (
        "task: digits\nschedule: {total_epochs: 2}\nbaselines: false\n"
        "budget: {trials: 3, early_stopping: false, seed_runs: 2, finalists: 1, "
        "reserve_finalists: 2}"
    )
    seeds = fresh_seeds(0, 2)
    final = {
        "fake_final": {
            "0": {"0": 0.99, str(seeds[0]): 0.95, str(seeds[1]): 0.96},
            "1": {"0": 0.988, str(seeds[0]): 0.97, str(seeds[1]): 0.97},
            "2": {"0": 0.98},
        }
    }
    result = engine(tmp_path, text, trial_config=final, val_size=1000).run()
    seeded = result.summary["seed_runs"]
    rows = {f["number"]: f for f in seeded["finalists"]}
    assert sorted(rows) == [0, 1]
    assert not rows[0]["reserve"]
    assert rows[1]["reserve"]
    assert seeded["picked"] == result.summary["best"]["number"] == 1
    assert epochs_trained(tmp_path)[6:] == [0, 0, 0, 0, 1, 1, 1, 1]
    why = "the validation split reads one run to about ± 0.315 points, and some ran as close to a "
    assert seeded["reserves_why"] == why + "finalist"
    assert f"1 of them as reserve: {why}" in search_text(result.summary)


def test_the_noise_scale_candidate_follows_the_small_batch_baselines_measurements(
    ray_session: None, tmp_path: Path
) -> None:
    """Once the small-batch baseline has finished, the next tuned trial is the schedule that
    follows its measured noise scale: drawn by Optuna (so it seeds the sampler), and reported
    beside the baselines."""
    text = (
        "task: digits\nschedule: {total_epochs: 4}\n"
        "space: {stages: {min: 1, max: 3}, batch_size: {min: 32, max: 512}}\n"
        "budget: {trials: 6, early_stopping: false, seed_runs: 0, max_concurrent: 1}\n"
        "resources: {workers: 2}"  # two gradients per step: the noise scale is measured
    )
    eng = engine(tmp_path, text)
    result = eng.run()
    space = eng.space
    # 24, 48, 96, 192 per epoch -> 32 (the smallest batch: 24 is under it), 32, 64, 128 (the
    # largest batch not above).
    expected = noise_scale_schedule(space, [24.0, 48.0, 96.0, 192.0])
    assert expected is not None
    assert expected.summary() == "32@0-2 -> 64@2-3 -> 128@3-4"
    candidates = [o for o in result.outcomes if o.extra.get("candidate") == "noise_scale"]
    assert len(candidates) == 1
    cand = candidates[0]
    assert cand.number == 3  # the first tuned trial: the baselines ran one at a time before it
    assert Schedule.from_dict(cand.schedule).stages == expected.stages
    ot = optuna.load_study(study_name="study-1", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    drawn = [t for t in ot.trials if t.user_attrs.get("stagetune_candidate") == "noise_scale"]
    assert [t.user_attrs["stagetune_number"] for t in drawn] == [3]
    assert drawn[0].state is TrialState.COMPLETE
    rows = result.summary["candidates"]
    # Then the recipe candidates (tuner.recipes), reported the same way.
    assert [(r["number"], r["candidate"]) for r in rows] == [
        (3, "noise_scale"),
        (4, "fitted_constant"),
        (5, "fitted_increase"),
    ]
    assert result.summary["noise_candidate"] == {
        "number": 3,
        "schedule": "32@0-2 -> 64@2-3 -> 128@3-4",
        "note": None,
    }
    # Without the small-batch baseline there is nothing to follow.
    plain = engine(
        tmp_path / "no-baselines", text.replace("task: digits", "task: digits\nbaselines: false")
    )
    without = plain.run()
    assert not [o for o in without.outcomes if o.extra.get("candidate") == "noise_scale"]
    assert "baselines are off" in without.summary["noise_candidate"]["note"]


def test_trial_directories_without_metric_files_log_no_warning(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Tune warns once per trial ("Failed to fetch metrics ... were not found") when a trial
    directory lacks result.json and progress.csv; the engine does not read them (each trial's
    last result is in Tune's trial state), so the study's log stays quiet and its outcomes are
    whole."""
    text = (
        "task: digits\nschedule: {total_epochs: 2}\nbaselines: false\n"
        "budget: {trials: 3, early_stopping: false, seed_runs: 0}"
    )
    first = engine(tmp_path, text).run()
    files = [
        f
        for pattern in ("result.json", "progress.csv")
        for f in (tmp_path / "ray" / "study-1").glob(f"trial_*/{pattern}")
    ]
    assert len(files) == 6
    for f in files:
        f.unlink()
    with caplog.at_level(logging.WARNING):
        again = engine(tmp_path, text).run()
    assert not [r for r in caplog.records if "Failed to fetch metrics" in r.getMessage()]
    assert [(o.number, o.val_accuracy, o.steps) for o in again.outcomes] == [
        (o.number, o.val_accuracy, o.steps) for o in first.outcomes
    ]


def test_a_clones_missing_metric_files_log_no_warning_while_the_study_runs(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ray Tune's file loggers warn "Remote file not found: .../progress.csv" when a PBT clone
    starts from a checkpoint before its trial directory has metric files (seen in a CLI PBT
    study's output); the engine does not read those files, so the warning is dropped while a
    study runs. Other files' warnings stay."""
    from ray import tune
    from ray.tune.logger import logger as tune_file_logger

    ray_logger = logging.getLogger(tune_file_logger.__name__)

    class WarnLikeTunesFileLogger(tune.Callback):
        def on_trial_start(
            self, iteration: int, trials: list[Any], trial: Any, **info: Any
        ) -> None:
            ray_logger.warning("Remote file not found: %s/trial_7/progress.csv", tmp_path)
            ray_logger.warning("Remote file not found: %s/trial_7/notes.txt", tmp_path)

    text = (
        "task: digits\nschedule: {total_epochs: 2}\nbaselines: false\n"
        "budget: {trials: 1, early_stopping: false, seed_runs: 0}"
    )
    with caplog.at_level(logging.WARNING):
        engine(tmp_path, text, callbacks=[WarnLikeTunesFileLogger()]).run()
    found = [r.getMessage() for r in caplog.records if "Remote file not found" in r.getMessage()]
    assert found == [f"Remote file not found: {tmp_path}/trial_7/notes.txt"]


def test_pbt_grows_schedules_by_cloning_and_perturbing_at_its_interval(
    ray_session: None, tmp_path: Path
) -> None:
    """budget.search: pbt: the population starts from one-stage schedules; at each
    perturbation epoch the worst clone the best and go on with a new stage (batch doubled or
    kept, LR multiplier perturbed), so every trial's final schedule is a lineage of the
    space's kind; baselines train beside it, untouched."""
    text = (
        "task: digits\nschedule: {total_epochs: 6}\n"
        "space: {stages: {min: 1, max: 3}, batch_size: {min: 32, max: 512}}\n"
        "budget: {trials: 11, search: pbt, seed_runs: 0, max_failures: 0}"
    )
    eng = engine(tmp_path, text)
    assert eng.probe_epochs() == (2, 4)  # the run cut into 3 segments: probes at the cuts
    result = eng.run()
    assert len(result.outcomes) == 11
    assert all(o.status == "completed" and o.epochs_done == 6 for o in result.outcomes)
    pbt = result.summary["pbt"]
    assert pbt["interval_epochs"] == 2
    assert pbt["population"] == 8
    lineages = {int(k): v for k, v in pbt["lineages"].items()}
    cloned = {n: v for n, v in lineages.items() if v}
    assert cloned, "the worst quarter clones the best at each perturbation"
    for o in result.outcomes:
        schedule = Schedule.from_dict(o.schedule)
        if o.baseline is not None:
            assert o.number in (0, 1, 2)
            assert o.extra.get("pbt_lineage") is None  # never cloned, never perturbed
            continue
        batches = [st.batch_size for st in schedule.stages]
        assert batches == sorted(batches)
        assert all(b in eng.space.batch_sizes for b in batches)
        assert len(schedule.stages) <= 3
        assert all(st.start_epoch % 2 == 0 for st in schedule.stages)
        for epoch, donor in lineages[o.number]:
            assert epoch in (2, 4)
            assert donor not in (0, 1, 2)
            assert donor != o.number
    assert result.summary["search"] == "pbt"
    assert result.summary["noise_candidate"]["note"].startswith("PBT grows")


def test_pbt_keeps_only_the_newest_checkpoints_of_each_trial(
    ray_session: None, tmp_path: Path
) -> None:
    """A PBT trial saves its state at every perturbation epoch where it waits for the
    population (or is one the others may clone), so with a perturbation every epoch each trial
    saves more states than Tune keeps. Tune deletes all but the newest PBT_CHECKPOINTS_KEPT of
    each trial as it goes, so a study's checkpoint disk use stays bounded whatever its number of
    perturbations, and the summary reports the bytes left on the storage path.

    Tune's clean-up can leave an old checkpoint on disk and out of its bookkeeping (a deletion
    that found a path gone raised midway; seen once in CI). Each trial here puts its deleted
    first checkpoint back at its last epoch, as such a leftover, and the engine removes what
    no trial tracks when the search ends."""
    text = (
        "task: digits\nschedule: {total_epochs: 7}\nbaselines: false\n"
        "space: {stages: {min: 1, max: 3}, batch_size: {min: 32, max: 512}}\n"
        "budget: {trials: 4, search: pbt, pbt_interval_epochs: 1, seed_runs: 0,"
        " max_failures: 0}"
    )
    strays = tmp_path / "strays.log"
    result = engine(tmp_path, text, trial_config={"fake_stray_checkpoint_log": str(strays)}).run()
    ended = [(o.number, o.status, o.epochs_done, o.stop_reason) for o in result.outcomes]
    assert all(o.status == "completed" and o.epochs_done == 7 for o in result.outcomes), ended
    experiment = tmp_path / "ray" / "study-1"
    kept = {
        trial.name: sorted(int(c.name.rsplit("_", 1)[1]) for c in trial.glob("checkpoint_*"))
        for trial in experiment.iterdir()
        if trial.is_dir() and trial.name.startswith("trial_")
    }
    assert len(kept) == 4
    # Tune numbers a trial's checkpoints from 0: an index past the number kept means it saved
    # more and deleted the oldest.
    assert any(k and k[-1] >= PBT_CHECKPOINTS_KEPT for k in kept.values()), kept
    for indices in kept.values():
        assert len(indices) <= PBT_CHECKPOINTS_KEPT
        assert not indices or indices[0] > indices[-1] - PBT_CHECKPOINTS_KEPT  # the newest
    checkpoints = result.summary["pbt"]["checkpoints"]
    assert checkpoints["kept_per_trial"] == PBT_CHECKPOINTS_KEPT
    assert checkpoints["bytes"] == checkpoint_bytes(experiment) > 0
    left_over = strays.read_text(encoding="utf-8").split()
    assert left_over
    assert not any(Path(p).exists() for p in left_over)
    assert checkpoints["untracked_removed"] >= len(left_over)


@pytest.mark.timeout(240)
def test_a_pbt_trial_that_diverges_while_the_others_wait_does_not_hang_the_study(
    ray_session: None, tmp_path: Path
) -> None:
    """The last population trial short of the first perturbation epoch is slow and diverges
    before it: every other one is paused there waiting for it. The perturbation happens
    anyway and the population trains to the end (before, the study hung with seven trials
    paused and nothing running)."""
    text = (
        "task: digits\nschedule: {total_epochs: 6}\n"
        "space: {stages: {min: 1, max: 3}, batch_size: {min: 32, max: 512}}\n"
        "budget: {trials: 11, search: pbt, seed_runs: 0, max_failures: 0}"
    )
    result = engine(
        tmp_path, text, trial_config={"fake_slow": {"10": 1.0}, "fake_diverge": {"10": 1}}
    ).run()
    assert len(result.outcomes) == 11
    by_number = {o.number: o for o in result.outcomes}
    assert by_number[10].epochs_done == 1
    assert all(
        o.status == "completed" and o.epochs_done == 6 for n, o in by_number.items() if n != 10
    )
    assert {int(k) for k, v in result.summary["pbt"]["lineages"].items() if v}, "no perturbation"


def test_pareto_studies_run_without_early_stopping(ray_session: None, tmp_path: Path) -> None:
    text = (
        "task: digits\nschedule: {total_epochs: 2}\nbaselines: false\n"
        "objective: {kind: pareto, cost: steps}\nbudget: {trials: 4, grace_period_epochs: 1}"
    )
    result = engine(tmp_path, text).run()
    assert all(o.status == "completed" and o.epochs_done == 2 for o in result.outcomes)
    front = result.summary["pareto_front"]
    assert front
    assert result.summary["best"]["number"] in [row["number"] for row in front]
    assert all(set(row["objective_values"]) == {"val_accuracy", "steps"} for row in front)


def test_without_its_experiment_directory_a_study_finishes_from_the_database(
    ray_session: None, tmp_path: Path
) -> None:
    """A worker on another host (no shared Ray storage) takes a study over: the database's
    finished trials count and are not rerun, the interrupted one runs again as it was."""
    text = (
        "task: digits\nschedule: {total_epochs: 2}\nbaselines: false\n"
        "budget: {trials: 5, early_stopping: false, seed_runs: 0}"
    )
    first = engine(tmp_path, text).run()
    by_number = {o.number: o for o in first.outcomes}
    prior = _prior_from(first.outcomes, finished=3, total=4)
    (tmp_path / "epochs.log").unlink()
    other_host = tmp_path / "other-host"
    other_host.mkdir()
    spec = StudySpec.from_yaml(text)
    second = TuningEngine(
        spec.resolve(DEFAULTS),
        make_fake_trainable(),
        storage_path=other_host / "ray",
        experiment_name="study-1",
        optuna_storage=f"sqlite:///{tmp_path / 'optuna.db'}",
        optuna_study_name="study-1",
        train_size=TRAIN_SIZE,
        trial_config={"fake_log": str(tmp_path / "epochs.log")},
        prior_trials=prior,
    ).run()
    assert not second.resumed
    assert sorted(set(epochs_trained(tmp_path))) == [3, 4]  # only what was left
    assert [o.number for o in second.outcomes] == [0, 1, 2, 3, 4]
    assert second.outcomes[3].schedule == by_number[3].schedule  # the interrupted one, again
    for n in range(3):
        assert second.outcomes[n] == by_number[n]


def _prior_from(outcomes: Any, finished: int, total: int) -> list[PriorTrial]:
    """What the database holds: trials ``0..finished-1`` finished, the rest up to ``total``
    interrupted (running when the worker died)."""
    by_number = {o.number: o for o in outcomes}
    return [
        PriorTrial(
            number=n,
            baseline=None,
            schedule=by_number[n].schedule,
            params={
                **by_number[n].extra["params"],
                "optuna_trial": by_number[n].extra["optuna_trial"],
            },
            finished=n < finished,
            outcome=by_number[n] if n < finished else None,
        )
        for n in range(total)
    ]


def _empty_state_files(experiment: Path) -> None:
    """What a SIGKILL during Tune's copy of its state into the experiment directory leaves."""
    for pattern in ("experiment_state-*", "search_gen_state-*", "searcher-state-*"):
        for f in experiment.glob(pattern):
            f.write_bytes(b"")


def _unrestorable_trials(experiment: Path) -> None:
    """A state file that parses, but whose trials Tune cannot rebuild: its restore fails,
    Tune logs it and starts the experiment over (what the engine must notice)."""
    for f in experiment.glob("experiment_state-*.json"):
        state = json.loads(f.read_text())
        state["trial_data"] = [["{not json", {}] for _ in state["trial_data"]]
        f.write_text(json.dumps(state))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_empty_state_files, id="emptied-state-files"),
        pytest.param(_unrestorable_trials, id="restore-fails-inside-tune"),
    ],
)
def test_an_unreadable_experiment_is_set_aside_and_the_study_finishes_from_the_database(
    ray_session: None, tmp_path: Path, damage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    text = (
        "task: digits\nschedule: {total_epochs: 2}\nbaselines: false\n"
        "budget: {trials: 3, early_stopping: false, seed_runs: 0}"
    )
    first = engine(tmp_path, text).run()
    experiment = tmp_path / "ray" / "study-1"
    damage(experiment)
    (tmp_path / "epochs.log").unlink()

    with caplog.at_level(logging.WARNING, logger="tuner.engine"):
        second = engine(tmp_path, text, prior_trials=_prior_from(first.outcomes, 1, 2)).run()

    assert not second.resumed
    kept = list((tmp_path / "ray").glob("study-1.unreadable-*"))
    assert len(kept) == 1, sorted((tmp_path / "ray").iterdir())
    assert (kept[0] / "tuner.pkl").exists()  # the dead worker's directory, for a post-mortem
    assert any("cannot be restored" in r.getMessage() for r in caplog.records)
    assert sorted(set(epochs_trained(tmp_path))) == [1, 2]  # only what was left
    assert [o.number for o in second.outcomes] == [0, 1, 2]
    by_number = {o.number: o for o in first.outcomes}
    assert second.outcomes[1].schedule == by_number[1].schedule  # the interrupted one, again
    assert second.outcomes[0] == by_number[0]
    # The new experiment directory restores normally.
    assert unreadable_state(experiment) == (None, 2)


def test_unreadable_state_names_the_file_a_restore_could_not_read(tmp_path: Path) -> None:
    state = json.dumps({"trial_data": [["{}", {}], ["{}", {}]], "runner_data": {}})
    files = {
        "tuner.pkl": pickle.dumps({"_param_space": {}}),
        "experiment_state-2026-01-01_00-00-00.json": state.encode(),
        "search_gen_state-2026-01-01_00-00-00.json": pickle.dumps({"counter": 2}),
        "searcher-state-2026-01-01_00-00-00.pkl": pickle.dumps({"next_number": 2}),
    }

    def check(**changes: bytes | None) -> str | None:
        exp = tmp_path / f"exp-{len(list(tmp_path.iterdir()))}"
        exp.mkdir()
        for name, data in {**files, **changes}.items():
            if data is not None:
                (exp / name).write_bytes(data)
        problem, trials = unreadable_state(exp)
        assert trials == (2 if problem is None else 0)
        return problem

    assert check() is None
    newest = "experiment_state-2026-01-02_00-00-00.json"
    problem = check(**{newest: state.encode()[:20]})  # the newest one is what Tune reads
    assert problem is not None
    assert problem.startswith(f"{newest} cannot be read (JSONDecodeError: ")
    assert check(**{newest: b""}) == f"{newest} is empty"
    assert check(**{newest: b'{"trial_data": []}'}) == f"{newest} holds no trials"
    cut = files["searcher-state-2026-01-01_00-00-00.pkl"][:-3]
    problem = check(**{"searcher-state-2026-01-01_00-00-00.pkl": cut})
    assert problem is not None
    assert problem.startswith("searcher-state-2026-01-01_00-00-00.pkl cannot be loaded")
    assert check(**{"search_gen_state-2026-01-01_00-00-00.json": b""}) == (
        "search_gen_state-2026-01-01_00-00-00.json is empty"
    )
    assert check(**{"searcher-state-2026-01-01_00-00-00.pkl": None}) == (
        "no searcher-state-*.pkl next to experiment_state-2026-01-01_00-00-00.json"
    )
    assert check(**{"tuner.pkl": files["tuner.pkl"][:5]}) is not None
    assert check(**{"callback-states-2026-01-01_00-00-00.pkl": b"\x80"}) is not None


def test_a_trial_epoch_budget_ends_the_search_when_it_is_spent(
    ray_session: None, tmp_path: Path
) -> None:
    """budget.trial_epochs: no trial starts once the trials have trained that many epochs;
    the one running finishes, and the search counts as complete (not interrupted)."""
    text = SPEC.replace(
        "budget: {trials: 8,", "budget: {trials: 40, trial_epochs: 15, max_concurrent: 1,"
    )
    eng = engine(tmp_path, text)
    result = eng.run()

    trained = epochs_trained(tmp_path)
    assert len(trained) >= 15
    numbers = [o.number for o in result.outcomes]
    assert numbers == list(range(len(numbers)))
    assert len(numbers) < 40
    # One trial at a time: the last one started before the budget was spent.
    last = numbers[-1]
    assert sum(1 for n in trained if n != last) < 15
    assert result.complete is True
    assert result.summary["trial_epochs_budget"] == 15
    assert result.summary["search_compute_epochs"] == len(trained)
    assert "of a 15 trial-epoch budget" in search_text(result.summary)


class StopAfterEpochs:
    """A picklable ``should_stop``: true once ``count`` epochs have been trained (the
    epochs log), a cancel in the middle of the seed runs."""

    def __init__(self, log: Path, count: int) -> None:
        self.log = log
        self.count = count

    def __call__(self) -> bool:
        return self.log.exists() and len(self.log.read_text().split()) >= self.count


def _finished_runs(experiment: Path) -> dict[tuple[int, int], float]:
    """(trial number, seed) -> final accuracy of each run a Tune experiment holds as run to
    its end (the cancel ends the others as ``TERMINATED`` too, without a final result)."""
    from ray import tune

    return {
        (t.config["stagetune"]["number"], t.config["seed"]): t.last_result["val_accuracy"]
        for t in tune.ExperimentAnalysis(str(experiment)).trials
        if t.status == "TERMINATED" and (t.last_result or {}).get("done")
    }


def test_seed_runs_finished_before_a_kill_cut_their_state_short_are_not_trained_again(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A kill while Tune copies the seed runs' state leaves a pickle empty (seen in CI): the
    take-over sets the directory aside, reuses the runs its experiment state holds as
    finished, and trains only the others; a later restore keeps both."""
    text = (
        "task: digits\nschedule: {total_epochs: 2}\n"
        "budget: {trials: 5, early_stopping: false, seed_runs: 2, finalists: 2}"
    )
    slow = {"fake_delay_s": 0.3}
    # The search trains 5 x 2 epochs; the cancel lands once the seed runs have trained 4.
    stop = StopAfterEpochs(tmp_path / "epochs.log", 5 * 2 + 4)
    engine(tmp_path, text, should_stop=stop, trial_config=slow).run()
    seeds_dir = tmp_path / "ray" / "study-1.seeds"
    before = _finished_runs(seeds_dir)
    assert before, "no seed run finished before the cancel"
    for f in seeds_dir.glob("search_gen_state-*"):
        f.write_bytes(b"")  # what the kill in the copy left (the JSON state is readable)
    (tmp_path / "epochs.log").unlink()

    with caplog.at_level(logging.INFO, logger="tuner.engine"):
        second = engine(tmp_path, text, trial_config=slow).run()

    seeded = second.summary["seed_runs"]
    runs = len(seeded["finalists"]) * 2  # finalists x fresh seeds
    assert len(before) < runs, before
    assert any("cannot be restored" in r.getMessage() for r in caplog.records)
    assert any(
        f"reusing {len(before)} finished seed run(s)" in r.getMessage() for r in caplog.records
    )
    assert len(list((tmp_path / "ray").glob("study-1.seeds.unreadable-*"))) == 1
    trained = epochs_trained(tmp_path)
    assert len(trained) == (runs - len(before)) * 2  # only the runs left, no search trial
    by_number = {f["number"]: f for f in seeded["finalists"]}
    for (number, seed), accuracy in before.items():
        assert by_number[number]["metric_values"][seeded["seeds"].index(seed)] == accuracy
    for finalist in seeded["finalists"]:
        assert finalist["failed"] == 0
        assert None not in finalist["values"]
    assert seeded["compute_epochs"] == runs * 2  # the reused runs' compute counts too
    after = _finished_runs(seeds_dir)
    assert len(after) == runs - len(before)
    assert not set(after) & set(before)

    # Resumed again: the new experiment is restored, the set-aside runs are reused again.
    again = engine(tmp_path, text, trial_config=slow).run()
    assert epochs_trained(tmp_path) == trained
    assert again.summary["seed_runs"] == seeded
    assert again.summary["best"] == second.summary["best"]
