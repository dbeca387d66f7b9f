"""The vocabulary shared by the modules of :mod:`tuner.schedule`.

Constants (the format version, the fixed units, the ``MAX_*`` limits, the allowed decays,
scaling rules and optimizers), :class:`ScheduleError` and the base it shares with
:class:`~tuner.schedule.placement.PlacementError` (a list of problems joined into one message
line), and the small value helpers every module uses to check values and to show them in
messages (``_show``, ``_num``, ``_is_int``, ``_stage_label``...). Nothing here knows about
stages, schedules, documents or placements.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, cast, get_args

from tuner.errors import ValidationError

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

#: The schedule format version this module reads and writes.
FORMAT_VERSION: Final = 1
#: The fixed ``units`` block of a version-1 document.
UNITS: Final[Mapping[str, str]] = {"time": "epochs", "batch_size": "samples", "lr": "absolute"}

#: Upper bounds that stop absurd input early (they are far above any real run).
MAX_STAGES: Final = 1_000
MAX_EPOCHS: Final = 100_000
MAX_BATCH_SIZE: Final = 2**30
MAX_WORLD_SIZE: Final = 131_072
MAX_ACCUMULATION_STEPS: Final = 1_024
#: Largest ``world_size * accumulation_steps`` a placement may describe.
MAX_PLACEMENT_ENTRIES: Final = 2**24
#: Limits on the free-form ``provenance`` mapping and on YAML input.
MAX_PROVENANCE_DEPTH: Final = 8
MAX_PROVENANCE_ITEMS: Final = 10_000
MAX_YAML_CHARS: Final = 4 * 1024 * 1024

Decay = Literal["constant", "cosine", "linear", "step"]
ScalingRule = Literal["none", "linear", "sqrt"]
Optimizer = Literal["sgd", "adamw", "lars"]
DECAYS: Final[tuple[Decay, ...]] = get_args(Decay)
SCALING_RULES: Final[tuple[ScalingRule, ...]] = get_args(ScalingRule)
OPTIMIZERS: Final[tuple[Optimizer, ...]] = get_args(Optimizer)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class _ProblemsError(ValidationError):
    """A ValidationError that lists every problem found; the message joins them on one line.

    Pickles (and so crosses process boundaries) with its ``problems``.
    """

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems: tuple[str, ...] = (
            (problems,) if isinstance(problems, str) else tuple(problems)
        )
        super().__init__(_join_problems(self.problems))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (list(self.problems),))


class ScheduleError(_ProblemsError):
    """A schedule (or a schedule document) is invalid.

    ``problems`` lists every problem found; the message joins them on one line.
    """


def _join_problems(problems: Sequence[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    numbered = "; ".join(f"({i}) {p}" for i, p in enumerate(problems, start=1))
    return f"{len(problems)} problems: {numbered}"


# --------------------------------------------------------------------------------------------
# Small value helpers
# --------------------------------------------------------------------------------------------


def _show(value: object) -> str:
    """A value as a message shows it, with its type where that is the likely mistake."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f"{value!r} (a string)"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return f"{value!r} (a {type(value).__name__})"


def _num(x: float) -> str:
    """A number for a message: integers without a trailing .0, others compactly."""
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:g}"


def _to_float(value: object) -> float | None:
    """``value`` as a float if it is a real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        return None


def _norm_float(value: object) -> object:
    converted = _to_float(value)
    return value if converted is None or type(value) is float else converted


def _norm_int(value: object) -> object:
    if isinstance(value, (bool, int)):
        return value
    if isinstance(value, numbers.Integral):  # numpy integers and the like
        return int(value)
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite_float(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def _valid_batch(value: object) -> bool:
    return _is_int(value) and 1 <= cast(int, value) <= MAX_BATCH_SIZE


def _stage_label(index: int, start: object, end: object) -> str:
    if _is_int(start) and _is_int(end):
        return f"stage {index + 1} (epochs {start}-{end})"
    return f"stage {index + 1}"
