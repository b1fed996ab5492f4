//! The crate's error type.

/// Everything that can go wrong in accounting. Each variant carries the offending value(s).
///
/// Invalid input is always reported as an error: the accountant never panics and never returns a
/// number it cannot stand behind.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AccountantError {
    /// The sampling rate must lie in (0, 1].
    #[error("sampling rate q = {0} is outside (0, 1]")]
    InvalidSamplingRate(f64),
    /// A population to sample from must hold at least one record.
    #[error("population size {0} must be at least 1")]
    InvalidPopulation(usize),
    /// The operating system's random generator failed.
    #[error("the operating system's random generator failed: {0}")]
    Rng(String),
    /// The noise multiplier must be positive and finite.
    #[error("noise multiplier sigma = {0} must be positive and finite")]
    InvalidNoiseMultiplier(f64),
    /// δ must lie in (0, 1).
    #[error("delta = {0} is outside (0, 1)")]
    InvalidDelta(f64),
    /// ε must be finite and non-negative, and positive where it is a target (calibration and
    /// budget plans: no finite noise reaches ε = 0).
    #[error(
        "epsilon = {0} is invalid: epsilon must be finite and >= 0, and > 0 as the target of a \
         calibration or budget plan (no finite noise multiplier reaches epsilon = 0)"
    )]
    InvalidEpsilon(f64),
    /// A step count must be at least 1.
    #[error("step count must be at least 1 (got {0})")]
    InvalidCount(u64),
    /// The total number of steps overflowed or exceeds the supported maximum.
    #[error("total number of steps {0} exceeds the supported maximum {1}")]
    TooManySteps(u128, u64),
    /// Nothing to account for.
    #[error("empty composition: there is no mechanism to account for")]
    EmptyComposition,
    /// An accuracy parameter is out of range.
    #[error("invalid accuracy setting {name} = {value}: {reason}")]
    InvalidAccuracy {
        /// Which setting.
        name: &'static str,
        /// The offending value.
        value: f64,
        /// What is required.
        reason: &'static str,
    },
    /// The discretization needed for the requested accuracy exceeds the memory bound.
    #[error(
        "the requested accuracy (eps_error = {eps_error:.3e}) needs a grid of {needed} points, \
         above the limit of {limit}; ask for a coarser accuracy (eps_error >= {suggested_eps_error:.3e}), \
         raise the grid limit, or use the RDP bound (RdpAccountant) for this regime"
    )]
    GridTooLarge {
        /// Points needed.
        needed: u64,
        /// The configured limit.
        limit: usize,
        /// The absolute ε error that was requested.
        eps_error: f64,
        /// An absolute ε error that would fit under the limit (approximately).
        suggested_eps_error: f64,
    },
    /// The δ error budget (truncation, wrap-around and the FFT's round-off allowance, about
    /// `N·1e-15` for `N` composed steps) is not small compared with the requested δ.
    #[error(
        "delta = {delta:.3e} is not larger than the delta error budget {delta_error:.3e} \
         (truncation, wrap-around and the FFT's round-off allowance, about 1e-15 per composed \
         step); ask for a smaller delta error (Accuracy::with_delta_error_rel) or a larger delta"
    )]
    DeltaBelowAccuracy {
        /// The requested δ.
        delta: f64,
        /// The δ error budget.
        delta_error: f64,
    },
    /// The privacy parameter ratio ρ must lie in (0, 1).
    #[error("budget ratio rho = {0} is outside (0, 1)")]
    InvalidRho(f64),
    /// The number of trained sparse layers must lie in 1..=[`crate::MAX_LAYERS`] (4096).
    #[error("number of trained layers must be between 1 and 4096 (got {0})")]
    InvalidLayers(u64),
    /// A member of a parallel group was released twice from one sample.
    #[error("member {member} of parallel group {group} was released twice from one sample")]
    DuplicateMember {
        /// The group's index.
        group: usize,
        /// The member index.
        member: usize,
    },
    /// A plan whose streams share one sample per update needs the same rate and step count
    /// for both streams.
    #[error(
        "streams released from one sample must share q and steps: shared (q = {shared_q}, \
         steps = {shared_steps}), expert (q = {expert_q}, steps = {expert_steps})"
    )]
    OneSampleMismatch {
        /// The shared stream's q.
        shared_q: f64,
        /// The shared stream's steps.
        shared_steps: u64,
        /// The expert stream's q.
        expert_q: f64,
        /// The expert stream's steps.
        expert_steps: u64,
    },
    /// Calibration could not meet the target.
    #[error(
        "cannot calibrate sigma for epsilon = {target_epsilon}, delta = {delta}: even sigma = {sigma_max} \
         gives epsilon <= {epsilon_at_max} (upper bound)"
    )]
    CalibrationFailed {
        /// The target ε.
        target_epsilon: f64,
        /// The δ.
        delta: f64,
        /// The largest σ tried.
        sigma_max: f64,
        /// ε upper bound at that σ.
        epsilon_at_max: f64,
    },
    /// A parallel composition inside a sequential one has too many member combinations.
    #[error("parallel composition has {0} distinct member combinations (limit {1})")]
    TooManyCombinations(u64, u64),
    /// A parallel group needs at least one member.
    #[error("parallel group has no members")]
    EmptyParallelGroup,
    /// A parallel step of a ledger group did not give one mechanism per member.
    #[error("parallel group {group:?} has {expected} members, a step gave {got}")]
    ParallelWidth {
        /// The group's name.
        group: String,
        /// Members the group was created with.
        expected: usize,
        /// Mechanisms given.
        got: usize,
    },
    /// A numerical step failed (non-finite intermediate); the result would not be trustworthy.
    #[error("numerical failure in {0}; try a coarser accuracy or the RDP bound")]
    NumericalFailure(&'static str),
    /// The RDP accountant needs at least one order above 1.
    #[error("invalid RDP order {0}: orders must be finite and > 1")]
    InvalidOrder(f64),
    /// The RDP accountant was given no orders.
    #[error("the RDP accountant needs at least one order (finite and > 1); the list is empty")]
    NoOrders,
    /// The privacy loss of one step is too large to represent at this noise multiplier: no
    /// finite ε can be certified.
    #[error(
        "noise multiplier sigma = {sigma:e} is too small: one step's privacy loss (about \
         1/(2 sigma^2) per unit of Renyi order) overflows, so no finite epsilon can be \
         certified; use a larger noise multiplier"
    )]
    NoiseTooSmall {
        /// The noise multiplier.
        sigma: f64,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, AccountantError>;
