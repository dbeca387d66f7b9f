"""Variable batch-size schedules: the central type of stagetune.

A :class:`Schedule` is an ordered tuple of :class:`Stage` objects that cover the epochs
``[0, total_epochs)`` without gaps or overlaps, plus the run-wide settings (base LR at a base
batch size, LR scaling rule, optimizer, momentum, weight decay, label smoothing). Everything
here is pure arithmetic on epochs and optimizer steps; nothing imports torch.

Units, everywhere in this package and in the YAML format:

* time is in **epochs** (``start_epoch``, ``end_epoch``, ``warmup_epochs``,
  ``step_every_epochs``); a fractional epoch ``e + k / steps_in_epoch`` is the moment of
  optimizer step ``k`` of epoch ``e``;
* batch sizes are **global samples per optimizer step** (summed over all workers and
  accumulation micro-batches);
* ``base_lr`` and ``warmup_start_lr`` are **absolute** learning rates; ``lr_multiplier`` is
  relative to the base LR scaled to the stage's batch size.

Messages name stages 1-based with their epochs, e.g. ``stage 2 (epochs 3-8)``; worker ranks
(placement) are 0-based like ``torch.distributed`` ranks.

The YAML/dict format is described in ``docs/schedule-format.md``.

The package, by concern (import everything from ``tuner.schedule``; the modules are its
layout, lowest first):

* :mod:`tuner.schedule.values`: constants and limits, :class:`ScheduleError`, the helpers
  that check values and show them in messages;
* :mod:`tuner.schedule.stage`: :class:`Stage` and the LR arithmetic of one stage: the
  scaling rule, the peak LR, warm-up and decay shapes; ``lr_in_stage`` there is the one
  function that computes a stage's LR at a fractional epoch;
* :mod:`tuner.schedule.document`: the YAML / dict document (``to_dict`` / ``from_dict``,
  ``to_yaml`` / ``from_yaml``, ``load`` / ``dump``) and :class:`PlacementHint`;
* :mod:`tuner.schedule.model`: :class:`Schedule` (stages covering the run, LR and batch size
  at an epoch, step arithmetic, ``iter_steps``, ``summary``), :class:`StepInfo` and
  :func:`schedule_summary`;
* :mod:`tuner.schedule.placement`: splitting global batches over workers
  (:func:`place_batch`, :func:`place`, :class:`BatchPlacement`, :class:`StagePlacement`,
  :class:`PlacementError`).
"""

from tuner.schedule.document import PlacementHint
from tuner.schedule.model import Schedule, StepInfo, schedule_summary
from tuner.schedule.placement import (
    BatchPlacement,
    PlacementError,
    StagePlacement,
    place,
    place_batch,
)
from tuner.schedule.stage import Stage
from tuner.schedule.values import (
    DECAYS,
    FORMAT_VERSION,
    MAX_ACCUMULATION_STEPS,
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    MAX_PLACEMENT_ENTRIES,
    MAX_PROVENANCE_DEPTH,
    MAX_PROVENANCE_ITEMS,
    MAX_STAGES,
    MAX_WORLD_SIZE,
    MAX_YAML_CHARS,
    OPTIMIZERS,
    SCALING_RULES,
    UNITS,
    Decay,
    Optimizer,
    ScalingRule,
    ScheduleError,
)

__all__ = [
    "DECAYS",
    "FORMAT_VERSION",
    "MAX_ACCUMULATION_STEPS",
    "MAX_BATCH_SIZE",
    "MAX_EPOCHS",
    "MAX_PLACEMENT_ENTRIES",
    "MAX_PROVENANCE_DEPTH",
    "MAX_PROVENANCE_ITEMS",
    "MAX_STAGES",
    "MAX_WORLD_SIZE",
    "MAX_YAML_CHARS",
    "OPTIMIZERS",
    "SCALING_RULES",
    "UNITS",
    "BatchPlacement",
    "Decay",
    "Optimizer",
    "PlacementError",
    "PlacementHint",
    "ScalingRule",
    "Schedule",
    "ScheduleError",
    "Stage",
    "StagePlacement",
    "StepInfo",
    "place",
    "place_batch",
    "schedule_summary",
]
