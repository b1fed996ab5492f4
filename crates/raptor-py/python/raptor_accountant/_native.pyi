"""Type stubs of the native module (Rust, PyO3). Import from ``raptor_accountant``."""

from typing import List, Optional, Sequence, Tuple, Union

__version__: str
DEFAULT_EPS_ERROR: float

class AccountantError(ValueError):
    """Base class of the accountant's errors; the message is the Rust error's."""

class InvalidParameterError(AccountantError):
    """An input is out of range; the message names the offending value."""

class AccuracyError(AccountantError):
    """The regime cannot be handled to the requested accuracy; the message says what to do."""

class CalibrationError(AccountantError):
    """No noise multiplier in the searched range meets the target epsilon."""

class SubsampledGaussian:
    """The Poisson-subsampled Gaussian mechanism (sampling rate q, noise multiplier sigma)."""

    def __init__(self, sample_rate: float, noise_multiplier: float) -> None: ...
    @property
    def sample_rate(self) -> float: ...
    @property
    def noise_multiplier(self) -> float: ...
    def __eq__(self, other: object) -> bool: ...

Part = Union[SubsampledGaussian, Tuple[SubsampledGaussian, int], "ParallelGroup"]

class Composition:
    """Sequential composition of (mechanism, count) parts, then parallel groups; one PRV."""

    def __init__(self, parts: Optional[Sequence[Part]] = None) -> None: ...
    def add(self, mechanism: SubsampledGaussian, count: int = 1) -> Composition: ...
    def add_parallel(self, group: ParallelGroup) -> Composition: ...
    @property
    def parts(self) -> List[Tuple[SubsampledGaussian, int]]: ...
    @property
    def total_steps(self) -> int: ...
    def __len__(self) -> int: ...

class ParallelGroup:
    """Parallel composition over a partition: costs the worst member, never the sum."""

    def __init__(self, members: Sequence[Composition]) -> None: ...
    def __len__(self) -> int: ...

Accountable = Union[Composition, ParallelGroup, SubsampledGaussian]

class EpsilonBounds:
    """epsilon(delta): certified upper bound (report it), estimate, lower bound, and which
    computation certified it: method "prv" (eps_error: the absolute tolerance of the grid that
    answered) or "rdp" (eps_error None)."""

    upper: float
    estimate: float
    lower: float
    upper_remove: float
    upper_add: float
    method: str
    eps_error: Optional[float]
    def __init__(
        self,
        upper: float,
        estimate: float,
        lower: float,
        upper_remove: float,
        upper_add: float,
        method: str = "prv",
        eps_error: Optional[float] = None,
    ) -> None: ...
    def __float__(self) -> float: ...

class DeltaBounds:
    """delta(epsilon): certified upper bound, estimate, lower bound."""

    upper: float
    estimate: float
    lower: float
    def __float__(self) -> float: ...

class PRVAccountant:
    """The PRV accountant with certified bounds, both adjacency directions."""

    def __init__(
        self,
        eps_error: float = ...,
        *,
        absolute: bool = False,
        delta_error: Optional[float] = None,
        max_points: Optional[int] = None,
    ) -> None: ...
    def get_epsilon(self, composition: Accountable, delta: float) -> EpsilonBounds: ...
    def get_delta(self, composition: Accountable, epsilon: float) -> DeltaBounds: ...

class RDPAccountant:
    """Renyi DP cross-check (a valid, looser upper bound)."""

    def __init__(self, orders: Optional[Sequence[float]] = None) -> None: ...
    def get_epsilon(self, composition: Accountable, delta: float) -> Tuple[float, float]: ...

class Calibration:
    """Result of calibrate_sigma."""

    noise_multiplier: float
    epsilon: EpsilonBounds
    relative_bracket: float
    evaluations: int
    def __float__(self) -> float: ...

def calibrate_sigma(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    *,
    eps_error: float = ...,
) -> Calibration: ...
def plan_budget_json(
    epsilon: float,
    delta: float,
    shared: Tuple[float, int],
    expert: Tuple[float, int],
    *,
    rho: float = 0.9,
    layers: int = 1,
    simultaneous: bool = False,
    eps_error: float = ...,
) -> str: ...
