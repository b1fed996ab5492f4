//! raptor-accountant: certified privacy accounting for the Poisson-subsampled Gaussian mechanism.
//!
//! - [`PrvAccountant`]: the privacy-random-variable accountant of Gopi, Lee and Wutschitz (2021)
//!   with certified upper and lower bounds (see [`prv`] for the method: a pessimistic, "connect
//!   the dots" discretization, so the default certified ε is within about 0.01 % of the truth;
//!   presets [`Accuracy::fast`], [`Accuracy::default`], [`Accuracy::tight`]), heterogeneous
//!   sequential composition of any list of (mechanism, count) in one PRV, both add/remove
//!   directions.
//! - [`ParallelGroup`]: parallel composition over a partition (max over members).
//! - [`RdpAccountant`]: Rényi DP (integer and fractional orders) as an independent cross-check.
//! - [`calibrate_sigma`] and [`plan_budget`]: σ calibration on the certified upper bound and
//!   RAPTOR's budget plans (additive and joint).
//! - [`Ledger`]: a serializable record of the samples charged during training, one
//!   [`SampleCharge`] per Poisson sample: every release a sample made is folded into the one
//!   mechanism the sample costs (see [`charge`] for the rule and its derivation).
//! - [`PoissonSampler`]: the per-record Bernoulli(q) sampling (CSPRNG) the accountants certify.
//!
//! ```
//! use raptor_accountant::{Composition, PrvAccountant, SubsampledGaussian};
//! let c = Composition::single(SubsampledGaussian::new(0.01, 1.0)?, 1_000)?;
//! let e = PrvAccountant::default().epsilon(&c, 1e-5)?;
//! println!("epsilon <= {:.4} (estimate {:.4})", e.upper, e.estimate);
//! # Ok::<(), raptor_accountant::AccountantError>(())
//! ```

pub mod calibrate;
pub mod charge;
pub mod error;
pub mod ledger;
pub mod prv;
pub mod rdp;
pub mod sampling;
mod special;
pub mod types;

pub use calibrate::{
    BudgetPlan, BudgetPlans, Calibration, MAX_LAYERS, PlanRequest, SIGMA_TOLERANCE, Stream,
    StreamPlan, StreamSampling, calibrate_sigma, expert_update_charge, plan_budget,
};
pub use charge::SampleCharge;
pub use error::{AccountantError, Result};
pub use ledger::{Ledger, LedgerEntry, ParallelEntry};
pub use prv::{
    Accuracy, ComposedPrv, DEFAULT_DELTA_ERROR_REL, DEFAULT_RELATIVE_EPS_ERROR, DeltaBounds,
    Direction, EpsTolerance, EpsilonBounds, Method, PrvAccountant, RELATIVE_FLOOR,
};
pub use rdp::{RdpAccountant, RdpEpsilon};
pub use sampling::PoissonSampler;
pub use types::{
    Composition, Delta, Epsilon, MAX_TOTAL_STEPS, NoiseMultiplier, ParallelGroup, SamplingRate,
    Steps, SubsampledGaussian,
};
