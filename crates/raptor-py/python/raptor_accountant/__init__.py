"""Certified privacy accounting for DP training, from Rust (raptor-accountant), without libtorch.

The Poisson-subsampled Gaussian mechanism (sampling rate ``q``, noise multiplier ``sigma``)
composed over training steps, accounted with the PRV accountant (Gopi, Lee, Wutschitz 2021):
a **certified upper bound** on epsilon (report this one), an estimate and a lower bound, for
both add and remove adjacency. Heterogeneous sequential composition is exact (one PRV, never a
sum of epsilons); parallel composition over a partition (RAPTOR's expert groups) is a typed
combinator that costs the worst member. Bad inputs raise :class:`InvalidParameterError` (a
``ValueError``) with a message that names the offending value.

Quick start::

    >>> import raptor_accountant as ra
    >>> eps = ra.get_epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=10_000, delta=1e-5)
    >>> round(eps.upper, 2), eps.lower <= eps.estimate <= eps.upper
    (6.19, True)

Compositions::

    >>> shared = ra.SubsampledGaussian(sample_rate=0.01, noise_multiplier=1.0)
    >>> expert = ra.SubsampledGaussian(sample_rate=0.01, noise_multiplier=3.0)
    >>> layer = ra.ParallelGroup([ra.Composition([(expert, 5_000)])] * 8)
    >>> comp = ra.Composition([(shared, 5_000), layer])
    >>> ra.PRVAccountant().get_epsilon(comp, delta=1e-5).upper > 0
    True

Opacus users: :class:`raptor_accountant.opacus.RaptorPRVAccountant` has the interface of
Opacus's ``IAccountant`` (``step(noise_multiplier=, sample_rate=)``, ``get_epsilon(delta)``).
"""

from __future__ import annotations

import json
from typing import Any, Dict, Tuple

from ._native import (
    DEFAULT_EPS_ERROR,
    AccountantError,
    AccuracyError,
    Calibration,
    CalibrationError,
    Composition,
    DeltaBounds,
    EpsilonBounds,
    InvalidParameterError,
    ParallelGroup,
    PRVAccountant,
    RDPAccountant,
    SubsampledGaussian,
    __version__,
    calibrate_sigma,
)
from . import _native

__all__ = [
    "DEFAULT_EPS_ERROR",
    "AccountantError",
    "AccuracyError",
    "Calibration",
    "CalibrationError",
    "Composition",
    "DeltaBounds",
    "EpsilonBounds",
    "InvalidParameterError",
    "ParallelGroup",
    "PRVAccountant",
    "RDPAccountant",
    "SubsampledGaussian",
    "__version__",
    "calibrate_sigma",
    "get_delta",
    "get_epsilon",
    "get_noise_multiplier",
    "plan_budget",
]


def get_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    eps_error: float = DEFAULT_EPS_ERROR,
) -> EpsilonBounds:
    """Epsilon of ``steps`` steps of the Poisson-subsampled Gaussian at ``delta``.

    Returns :class:`EpsilonBounds`; ``.upper`` (also ``float(bounds)``) is the certified upper
    bound to report. ``eps_error`` is the relative accuracy: the certified upper bound is
    expected within ``eps_error * epsilon`` of the truth (default :data:`DEFAULT_EPS_ERROR`,
    the Rust library's, 1e-4).

    Raises :class:`InvalidParameterError` (a ``ValueError``) for q outside (0, 1], sigma <= 0,
    delta outside (0, 1), NaN or zero steps, and :class:`AccuracyError` when the regime needs a
    coarser ``eps_error``.
    """
    comp = Composition([(SubsampledGaussian(sample_rate, noise_multiplier), steps)])
    return PRVAccountant(eps_error).get_epsilon(comp, delta)


def get_delta(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    epsilon: float,
    eps_error: float = DEFAULT_EPS_ERROR,
) -> DeltaBounds:
    """Delta of ``steps`` steps of the Poisson-subsampled Gaussian at ``epsilon``.

    Returns :class:`DeltaBounds`; ``.upper`` (also ``float(bounds)``) is the certified upper
    bound.
    """
    comp = Composition([(SubsampledGaussian(sample_rate, noise_multiplier), steps)])
    return PRVAccountant(eps_error).get_delta(comp, epsilon)


def get_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    eps_error: float = DEFAULT_EPS_ERROR,
) -> float:
    """The noise multiplier whose certified epsilon upper bound meets ``target_epsilon``.

    The same arguments as Opacus's ``get_noise_multiplier`` (with ``steps``, not ``epochs``);
    :func:`calibrate_sigma` returns the full :class:`Calibration` (epsilon bounds at that sigma,
    bracket, evaluations). ``target_epsilon`` must be > 0.
    """
    return calibrate_sigma(
        target_epsilon, target_delta, sample_rate, steps, eps_error=eps_error
    ).noise_multiplier


def plan_budget(
    epsilon: float,
    delta: float,
    shared: Tuple[float, int],
    expert: Tuple[float, int],
    *,
    rho: float = 0.9,
    layers: int = 1,
    simultaneous: bool = False,
    eps_error: float = DEFAULT_EPS_ERROR,
) -> Dict[str, Any]:
    """RAPTOR budget plans for a shared stream and expert updates over ``layers`` trained layers.

    An expert update draws one Poisson sample and releases every layer's experts from it, so it
    is charged as one mechanism with ``1/sigma_eff**2 = layers/sigma_e**2`` (never as
    ``layers`` independent samples).

    ``shared`` and ``expert`` are ``(sample_rate, steps)``; ``rho`` is the shared stream's share
    of the budget. Returns a dict with ``"additive"`` (the paper's split: each stream calibrated
    alone on its share) and ``"joint"`` (both noise multipliers calibrated together so that the
    composition of all streams in one PRV meets ``(epsilon, delta)``: less noise for the same
    guarantee), each with ``"shared"`` and ``"expert"`` stream plans (``"sigma"`` ...) and
    ``"epsilon_composed"`` bounds, plus ``"variance_ratio"`` and the ``"request"``.

    ``simultaneous=True``: both streams release from one sample per update (no alternation;
    ``shared`` and ``expert`` must be equal). Each update is then one mechanism with
    ``1/sigma_eff**2 = 1/sigma_s**2 + layers/sigma_e**2``, so the budget cannot be split
    additively: both plans are the joint one, ``rho`` being the shared stream's share of
    ``1/sigma_eff**2``.
    """
    text = _native.plan_budget_json(
        epsilon,
        delta,
        shared,
        expert,
        rho=rho,
        layers=layers,
        simultaneous=simultaneous,
        eps_error=eps_error,
    )
    plans: Dict[str, Any] = json.loads(text)
    return plans
