"""What a real study's seed-run pick must satisfy under the default ``budget.tie_break:
fewer_steps``, for tests that train a study end to end and cannot fix the seeds' outcome."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.seeds import CHEAPER


def checked_pick(seeded: Mapping[str, Any], *, minimize: bool = False) -> dict[str, Any]:
    """The picked finalist of a summary's ``seed_runs``, after checking that it is the best
    mean (failed runs first; ties: the lower number), or a finalist with as many failed runs
    that takes at most :data:`~tuner.seeds.CHEAPER` of the best mean's steps and trails it by
    no more than the best mean's spread over the seeds, the summary's ``lead`` then naming the
    best mean as ``runner_up`` with ``for_steps`` set."""
    finalists: list[dict[str, Any]] = [f for f in seeded["finalists"] if f["mean"] is not None]
    sign = 1.0 if minimize else -1.0
    best = min(finalists, key=lambda f: (f["failed"], sign * f["mean"], f["number"]))
    picked = next(f for f in finalists if f["number"] == seeded["picked"])
    lead = seeded.get("lead") or {}
    if picked is best:
        assert not lead.get("for_steps"), lead
        return picked
    assert lead.get("for_steps") is True, lead
    assert lead["runner_up"] == best["number"]
    assert lead["clear"] is False
    assert picked["failed"] == best["failed"]
    assert picked["steps"] <= CHEAPER * best["steps"]
    assert sign * (picked["mean"] - best["mean"]) <= best["std"] + 1e-12
    return picked
