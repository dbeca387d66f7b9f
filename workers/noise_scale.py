"""The "simple" gradient noise scale of McCandlish et al. 2018 from data-parallel gradients.

``B_simple = tr(Σ) / |G|^2`` where ``G`` is the true gradient and ``Σ`` the per-sample gradient
covariance. Data-parallel training already has two gradient estimates per optimizer step: each
worker's local mean gradient (a *small* batch of ``b_r`` samples) and the all-reduced mean
gradient (the *big* global batch of ``B`` samples). For a mean over ``b`` i.i.d. samples
``E|g_b|^2 = |G|^2 + tr(Σ)/b``, so with

* ``small`` = the mean over workers of ``|g_r|^2`` and ``a`` = the mean of ``1/b_r``
  (with equal local batches ``a = 1/B_small``; unequal splits are handled exactly), and
* ``big`` = ``|g_B|^2`` and ``c = 1/B``,

the unbiased estimators of the paper's appendix A.1 are ::

    tr(Σ) ≈ S  = (small - big) / (a - c)
    |G|^2 ≈ G2 = (a * big - c * small) / (a - c)

Both are noisy per step; like the paper we smooth ``S`` and ``G2`` separately with an
exponential moving average and report the ratio of the averages. With one worker the same
estimator runs over gradient-accumulation micro-batches instead. With one worker and no
accumulation there is no smaller batch inside a step: the noise scale is unknown (``None``)
unless the trial config asks for ``noise_batches``, which the loop measures at each epoch's
end from that many batches at fixed parameters (each one's gradient a small batch, their mean
the big one; ``TrialWorker._measure_noise_scale``), the estimator then holding that
measurement alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["NoiseScaleEstimator", "unbiased_estimates"]


def unbiased_estimates(
    small_sq: float, inv_small: float, big_sq: float, inv_big: float
) -> tuple[float, float] | None:
    """``(G2, S)``: unbiased estimates of ``|G|^2`` and ``tr(Σ)``, or None if undefined.

    ``small_sq``: mean squared norm of the small-batch mean gradients; ``inv_small``: mean of
    their ``1/batch``; ``big_sq``, ``inv_big``: the same for the big batch. Undefined when the
    small batches are not smaller than the big one or an input is not finite.
    """
    values = (small_sq, inv_small, big_sq, inv_big)
    if not all(math.isfinite(v) for v in values):
        return None
    gap = inv_small - inv_big
    if gap <= 1e-12 * max(inv_small, 1e-300):
        return None
    trace = (small_sq - big_sq) / gap
    g2 = (inv_small * big_sq - inv_big * small_sq) / gap
    return g2, trace


@dataclass
class NoiseScaleEstimator:
    """EMA-smoothed ``B_simple`` over a stream of per-step measurements."""

    beta: float = 0.9
    _g2: float = field(default=0.0, init=False)
    _trace: float = field(default=0.0, init=False)
    _weight: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta < 1.0:
            raise ValueError(f"noise-scale EMA beta must be in [0, 1), got {self.beta}")

    def reset(self) -> None:
        self._g2 = self._trace = self._weight = 0.0

    def get_state(self) -> tuple[float, float, float]:
        return self._g2, self._trace, self._weight

    def set_state(self, state: tuple[float, float, float]) -> None:
        self._g2, self._trace, self._weight = (float(v) for v in state)

    def update(self, small_sq: float, inv_small: float, big_sq: float, inv_big: float) -> None:
        """Add one step's measurement (ignored when the estimate is undefined)."""
        est = unbiased_estimates(small_sq, inv_small, big_sq, inv_big)
        if est is None:
            return
        g2, trace = est
        b = self.beta
        self._g2 = b * self._g2 + (1.0 - b) * g2
        self._trace = b * self._trace + (1.0 - b) * trace
        self._weight = b * self._weight + (1.0 - b)

    @property
    def updates_seen(self) -> bool:
        return self._weight > 0.0

    @property
    def gradient_sq(self) -> float | None:
        """Smoothed (bias-corrected) ``|G|^2`` or None before the first update."""
        return self._g2 / self._weight if self._weight > 0.0 else None

    @property
    def trace(self) -> float | None:
        """Smoothed (bias-corrected) ``tr(Σ)`` or None before the first update."""
        return self._trace / self._weight if self._weight > 0.0 else None

    @property
    def value(self) -> float | None:
        """``B_simple = tr(Σ)/|G|^2`` of the smoothed estimates; None when not measurable
        (no update yet, or a smoothed estimate that is not positive and finite)."""
        if self._weight <= 0.0 or self._g2 <= 0.0 or self._trace <= 0.0:
            return None
        ratio = self._trace / self._g2
        return ratio if math.isfinite(ratio) else None
