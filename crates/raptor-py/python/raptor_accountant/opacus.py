"""An Opacus accountant backed by raptor's certified PRV accountant.

:class:`RaptorPRVAccountant` has the interface of Opacus's ``IAccountant`` (and subclasses it
when Opacus is installed): ``step(noise_multiplier=, sample_rate=)``, ``get_epsilon(delta)``,
``len()``, ``mechanism()``, ``history``, ``state_dict()`` / ``load_state_dict()`` and
``get_optimizer_hook_fn(sample_rate)``. Plug it into a ``PrivacyEngine`` before
``make_private``::

    from opacus import PrivacyEngine
    from raptor_accountant.opacus import RaptorPRVAccountant

    engine = PrivacyEngine()
    engine.accountant = RaptorPRVAccountant()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=loader,
        noise_multiplier=1.0, max_grad_norm=1.0,
    )
    ...  # train
    print(engine.get_epsilon(delta=1e-5))  # the certified upper bound

Importing this module also registers the class with Opacus under the name ``"raptor_prv"``, so
``PrivacyEngine(accountant="raptor_prv")`` and ``make_private_with_epsilon`` (which calibrates
the noise by creating accountants by name) use it.

This module imports Opacus (and so torch) only if it is installed; without it the class works
the same, as a plain object.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from copy import deepcopy
from typing import Any, Callable, List, Mapping, Optional, Tuple

from . import DEFAULT_EPS_ERROR, Composition, EpsilonBounds, PRVAccountant, SubsampledGaussian

try:  # pragma: no cover - depends on the environment
    from opacus.accountants.accountant import IAccountant as _Base  # type: ignore[import-untyped]

    OPACUS_AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the environment
    _Base = object
    OPACUS_AVAILABLE = False

__all__ = ["RaptorPRVAccountant", "OPACUS_AVAILABLE"]


class RaptorPRVAccountant(_Base):  # type: ignore[misc]
    """Opacus-style accountant: records steps, reports raptor's certified epsilon upper bound.

    ``history`` is a list of ``(noise_multiplier, sample_rate, num_steps)`` like Opacus's own
    accountants (consecutive identical steps are merged), so ``state_dict()`` round-trips.
    ``eps_error`` is the relative accuracy of the PRV bounds.

    A step with ``noise_multiplier == 0`` (non-private) makes ``get_epsilon`` return ``inf``.
    """

    def __init__(self, eps_error: float = DEFAULT_EPS_ERROR) -> None:
        self.history: List[Tuple[float, float, int]] = []
        self._eps_error = eps_error
        self._accountant = PRVAccountant(eps_error)

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Record one optimizer step of the Poisson-subsampled Gaussian.

        Raises ``ValueError`` at once for a sample rate outside (0, 1] or a negative or
        non-finite noise multiplier (so a bad step fails where it is taken).
        """
        noise_multiplier, sample_rate = _checked(noise_multiplier, sample_rate)
        if self.history:
            last_sigma, last_q, n = self.history[-1]
            if last_sigma == noise_multiplier and last_q == sample_rate:
                self.history[-1] = (last_sigma, last_q, n + 1)
                return
        self.history.append((noise_multiplier, sample_rate, 1))

    def composition(self) -> Composition:
        """The steps so far as a :class:`Composition` (identical mechanisms merged)."""
        comp = Composition()
        for sigma, q, n in self.history:
            comp.add(SubsampledGaussian(q, sigma), n)
        return comp

    def get_epsilon_bounds(self, delta: float) -> EpsilonBounds:
        """Upper bound, estimate and lower bound of the epsilon spent so far at ``delta``."""
        if any(sigma == 0.0 for sigma, _, _ in self.history):
            inf = float("inf")
            return EpsilonBounds(inf, inf, inf, inf, inf)
        return self._accountant.get_epsilon(self.composition(), delta)

    def get_epsilon(self, delta: float, *, eps_error: Optional[float] = None) -> float:
        """The certified upper bound on the epsilon spent so far at ``delta`` (0 before any step).

        ``eps_error`` (relative accuracy) overrides the accountant's for this call; any other
        keyword is a ``TypeError`` (it would otherwise be ignored silently).
        """
        if not self.history:
            return 0.0
        if eps_error is not None and eps_error != self._eps_error:
            if any(sigma == 0.0 for sigma, _, _ in self.history):
                return float("inf")
            return PRVAccountant(eps_error).get_epsilon(self.composition(), delta).upper
        return self.get_epsilon_bounds(delta).upper

    def __len__(self) -> int:
        """The number of history entries, as for Opacus's accountants (runs of identical steps
        are merged into one entry; the total step count is :meth:`steps`)."""
        return len(self.history)

    def steps(self) -> int:
        """The number of steps recorded."""
        return sum(n for _, _, n in self.history)

    @classmethod
    def mechanism(cls) -> str:
        """The accountant's name in Opacus state dicts."""
        return "raptor_prv"

    # The three methods below are Opacus's IAccountant's; they are defined here too so the
    # class behaves the same without Opacus.
    def get_optimizer_hook_fn(self, sample_rate: float) -> Callable[[Any], None]:
        """A hook for Opacus's ``DPOptimizer.attach_step_hook`` that records each step."""

        def hook_fn(optim: Any) -> None:
            self.step(
                noise_multiplier=optim.noise_multiplier,
                sample_rate=sample_rate * optim.accumulated_iterations,
            )

        return hook_fn

    def state_dict(self, destination: Optional[Any] = None) -> Any:
        """``{"history": ..., "mechanism": "raptor_prv"}`` (Opacus's format)."""
        if destination is None:
            destination = OrderedDict()
        destination["history"] = deepcopy(self.history)
        destination["mechanism"] = self.mechanism()
        return destination

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the history from :meth:`state_dict`'s output (``ValueError`` if invalid)."""
        if not state_dict:
            raise ValueError("state dict is None or empty")
        if "history" not in state_dict or "mechanism" not in state_dict:
            raise ValueError("state_dict needs the keys `history` and `mechanism`")
        if state_dict["mechanism"] != self.mechanism():
            raise ValueError(
                f"state_dict of {state_dict['mechanism']} cannot be loaded into an "
                f"accountant with mechanism {self.mechanism()}"
            )
        history = []
        for entry in state_dict["history"]:
            try:
                sigma, q, n = entry
            except (TypeError, ValueError):
                raise ValueError(
                    f"history entry {entry!r} is not (noise_multiplier, sample_rate, num_steps)"
                ) from None
            sigma, q = _checked(sigma, q)
            if isinstance(n, bool) or not isinstance(n, int) and not (
                isinstance(n, float) and n.is_integer()
            ):
                raise ValueError(f"history entry {entry!r}: num_steps must be an integer")
            if int(n) < 1:
                raise ValueError(f"history entry {entry!r}: num_steps must be at least 1")
            history.append((sigma, q, int(n)))
        self.history = history


def _checked(noise_multiplier: Any, sample_rate: Any) -> Tuple[float, float]:
    """``(noise_multiplier, sample_rate)`` as floats, or ``ValueError`` if out of range."""
    noise_multiplier = float(noise_multiplier)
    sample_rate = float(sample_rate)
    if not (math.isfinite(sample_rate) and 0.0 < sample_rate <= 1.0):
        raise ValueError(f"sample_rate = {sample_rate} is outside (0, 1]")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0.0):
        raise ValueError(f"noise_multiplier = {noise_multiplier} must be finite and >= 0")
    return noise_multiplier, sample_rate


if OPACUS_AVAILABLE:  # pragma: no cover - depends on the environment
    try:
        from opacus.accountants.registry import register_accountant as _register

        _register(RaptorPRVAccountant.mechanism(), RaptorPRVAccountant, force=True)
    except ImportError:  # an Opacus without the registry: set engine.accountant instead
        pass
