//! raptor-py: the native module `raptor_accountant._native` of the `raptor_accountant` Python
//! package (PyO3, built by maturin: `cargo xtask wheel`).
//!
//! It exposes raptor-accountant's public API as Python classes and functions: mechanisms
//! ([`PySubsampledGaussian`]), sequential and parallel composition ([`PyComposition`],
//! [`PyParallelGroup`]), the PRV accountant with certified bounds ([`PyPrvAccountant`]), the RDP
//! cross-check ([`PyRdpAccountant`]), σ calibration and RAPTOR budget plans. Every
//! [`CoreError`] becomes a Python exception derived from `ValueError` that carries the
//! Rust error's message (see [`to_py_err`]). The Python layer (`python/raptor_accountant`) adds
//! the Opacus adapter, the type stubs and the docs.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use raptor_accountant::{
    AccountantError as CoreError, Accuracy, Composition, DEFAULT_RELATIVE_EPS_ERROR, DeltaBounds,
    EpsilonBounds, Method, ParallelGroup, PlanRequest, PrvAccountant, RdpAccountant, Stream,
    StreamSampling, SubsampledGaussian,
};

pyo3::create_exception!(
    raptor_accountant,
    AccountantError,
    PyValueError,
    "Base class of the accountant's errors (a ValueError): the message is the Rust error's."
);
pyo3::create_exception!(
    raptor_accountant,
    InvalidParameterError,
    AccountantError,
    "An input is out of range (q outside (0, 1], sigma <= 0, delta outside (0, 1), NaN, zero \
     steps, an empty composition...); the message names the offending value."
);
pyo3::create_exception!(
    raptor_accountant,
    AccuracyError,
    AccountantError,
    "The regime cannot be handled to the requested accuracy within the memory bound; the message \
     suggests the remedy (a coarser eps_error, a smaller delta error, or the RDP bound)."
);
pyo3::create_exception!(
    raptor_accountant,
    CalibrationError,
    AccountantError,
    "No noise multiplier in the searched range meets the target epsilon."
);

/// Map a [`CoreError`] to its Python exception (all derive from `ValueError`), keeping
/// the Rust error's message.
pub fn to_py_err(e: CoreError) -> PyErr {
    let msg = python_message(&e);
    match e {
        CoreError::GridTooLarge { .. }
        | CoreError::DeltaBelowAccuracy { .. }
        | CoreError::NumericalFailure(_) => AccuracyError::new_err(msg),
        CoreError::CalibrationFailed { .. } => CalibrationError::new_err(msg),
        CoreError::Rng(_) => AccountantError::new_err(msg),
        _ => InvalidParameterError::new_err(msg),
    }
}

/// The error's message in the Python API's words: the accuracy settings are named as the
/// arguments of `PRVAccountant(...)`, not as the Rust API's methods.
fn python_message(e: &CoreError) -> String {
    match e {
        CoreError::InvalidAccuracy {
            name,
            value,
            reason,
        } => {
            let arg = match *name {
                "eps_error (relative)" | "eps_error (absolute)" | "eps_error" => "eps_error",
                "delta_error_rel" | "delta_error" => "delta_error",
                other => other,
            };
            format!("PRVAccountant({arg}={value}): {reason}")
        }
        CoreError::DeltaBelowAccuracy { delta, delta_error } => format!(
            "delta = {delta:.3e} is not larger than the delta error budget {delta_error:.3e} \
             (truncation, wrap-around and the FFT's round-off allowance); ask for a smaller \
             delta error (PRVAccountant(delta_error=...), relative to delta) or a larger delta"
        ),
        CoreError::GridTooLarge {
            needed,
            limit,
            eps_error,
            suggested_eps_error,
        } => format!(
            "the requested accuracy (an absolute epsilon error of {eps_error:.3e}) needs a grid \
             of {needed} points, above the limit of {limit}; ask for a coarser accuracy \
             (PRVAccountant(eps_error={suggested_eps_error:.3e}, absolute=True) or larger), \
             raise PRVAccountant(max_points=...), or use RDPAccountant for this regime"
        ),
        other => other.to_string(),
    }
}

/// A count from Python (steps, layers): a negative one is an [`InvalidParameterError`] (a
/// `ValueError`, like every bad value), not an `OverflowError`.
fn count(name: &str, value: i128) -> PyResult<u64> {
    u64::try_from(value).map_err(|_| {
        InvalidParameterError::new_err(format!(
            "{name} must be a non-negative integer (at least 1 to count), got {value}"
        ))
    })
}

/// The Poisson-subsampled Gaussian mechanism: each record is included independently with
/// probability `sample_rate`; the sum of the clipped contributions gets Gaussian noise of
/// standard deviation `noise_multiplier` × the clipping norm.
#[pyclass(name = "SubsampledGaussian", module = "raptor_accountant", frozen, eq)]
#[derive(Clone, Copy, PartialEq)]
pub struct PySubsampledGaussian {
    inner: SubsampledGaussian,
}

#[pymethods]
impl PySubsampledGaussian {
    #[new]
    #[pyo3(signature = (sample_rate, noise_multiplier))]
    fn new(sample_rate: f64, noise_multiplier: f64) -> PyResult<Self> {
        Ok(Self {
            inner: SubsampledGaussian::new(sample_rate, noise_multiplier).map_err(to_py_err)?,
        })
    }

    /// The sampling rate q.
    #[getter]
    fn sample_rate(&self) -> f64 {
        self.inner.q()
    }

    /// The noise multiplier σ.
    #[getter]
    fn noise_multiplier(&self) -> f64 {
        self.inner.sigma()
    }

    fn __repr__(&self) -> String {
        format!(
            "SubsampledGaussian(sample_rate={}, noise_multiplier={})",
            self.inner.q(),
            self.inner.sigma()
        )
    }
}

/// A parallel composition over a partition: every record touches exactly one member (the
/// experts of one RAPTOR layer, each trained on the records it owns). It costs its worst
/// member, never the sum.
#[pyclass(name = "ParallelGroup", module = "raptor_accountant", frozen)]
#[derive(Clone)]
pub struct PyParallelGroup {
    inner: ParallelGroup,
}

#[pymethods]
impl PyParallelGroup {
    #[new]
    #[pyo3(signature = (members))]
    fn new(members: Vec<PyRef<'_, PyComposition>>) -> PyResult<Self> {
        let members = members.iter().map(|m| m.inner.clone()).collect();
        Ok(Self {
            inner: ParallelGroup::new(members).map_err(to_py_err)?,
        })
    }

    fn __len__(&self) -> usize {
        self.inner.members().len()
    }

    fn __repr__(&self) -> String {
        format!("ParallelGroup(<{} members>)", self.inner.members().len())
    }
}

/// Sequential composition of mechanisms, each repeated a number of times, then parallel groups.
/// The whole list is composed exactly in one PRV (never by adding ε's).
#[pyclass(name = "Composition", module = "raptor_accountant")]
#[derive(Clone, Default)]
pub struct PyComposition {
    inner: Composition,
}

impl PyComposition {
    fn push_part(&mut self, part: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(m) = part.cast::<PySubsampledGaussian>() {
            return self.inner.push(m.get().inner, 1).map_err(to_py_err);
        }
        if let Ok(g) = part.cast::<PyParallelGroup>() {
            self.inner = std::mem::take(&mut self.inner).then_parallel(g.get().inner.clone());
            return Ok(());
        }
        if let Ok(t) = part.cast::<PyTuple>()
            && t.len() == 2
        {
            let count = count("step count", t.get_item(1)?.extract()?)?;
            let first = t.get_item(0)?;
            if let Ok(m) = first.cast::<PySubsampledGaussian>() {
                return self.inner.push(m.get().inner, count).map_err(to_py_err);
            }
        }
        Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "a composition part is a SubsampledGaussian, a (SubsampledGaussian, count) tuple or a \
             ParallelGroup, not {}",
            part.repr()?
        )))
    }
}

#[pymethods]
impl PyComposition {
    #[new]
    #[pyo3(signature = (parts = None))]
    fn new(parts: Option<Vec<Bound<'_, PyAny>>>) -> PyResult<Self> {
        let mut c = Self::default();
        for p in parts.unwrap_or_default() {
            c.push_part(&p)?;
        }
        Ok(c)
    }

    /// Add `count` steps of `mechanism` (in place; returns the composition for chaining).
    #[pyo3(signature = (mechanism, count = 1))]
    fn add<'a>(
        mut slf: PyRefMut<'a, Self>,
        mechanism: PyRef<'_, PySubsampledGaussian>,
        count: i128,
    ) -> PyResult<PyRefMut<'a, Self>> {
        let count = self::count("step count", count)?;
        slf.inner.push(mechanism.inner, count).map_err(to_py_err)?;
        Ok(slf)
    }

    /// Follow the composition by a parallel group (in place; returns the composition).
    fn add_parallel<'a>(
        mut slf: PyRefMut<'a, Self>,
        group: PyRef<'_, PyParallelGroup>,
    ) -> PyResult<PyRefMut<'a, Self>> {
        slf.inner = std::mem::take(&mut slf.inner).then_parallel(group.inner.clone());
        Ok(slf)
    }

    /// The sequential parts as (mechanism, count) pairs.
    #[getter]
    fn parts(&self) -> Vec<(PySubsampledGaussian, u64)> {
        self.inner
            .parts()
            .map(|(m, t)| (PySubsampledGaussian { inner: m }, t))
            .collect()
    }

    /// Number of steps in the sequential parts (parallel groups not included).
    #[getter]
    fn total_steps(&self) -> u64 {
        self.inner.total_steps()
    }

    fn __len__(&self) -> usize {
        self.inner.parts().count() + self.inner.parallel_groups().len()
    }

    fn __repr__(&self) -> String {
        let parts: Vec<String> = self
            .inner
            .parts()
            .map(|(m, t)| {
                format!(
                    "(SubsampledGaussian(sample_rate={}, noise_multiplier={}), {t})",
                    m.q(),
                    m.sigma()
                )
            })
            .collect();
        let groups = self.inner.parallel_groups().len();
        if groups == 0 {
            format!("Composition([{}])", parts.join(", "))
        } else {
            format!(
                "Composition([{}] + {groups} parallel group(s))",
                parts.join(", ")
            )
        }
    }
}

/// Anything accountable: a composition, a parallel group or one mechanism (one step).
fn as_composition(obj: &Bound<'_, PyAny>) -> PyResult<Composition> {
    if let Ok(c) = obj.cast::<PyComposition>() {
        return Ok(c.borrow().inner.clone());
    }
    if let Ok(g) = obj.cast::<PyParallelGroup>() {
        return Ok(g.get().inner.clone().into_composition());
    }
    if let Ok(m) = obj.cast::<PySubsampledGaussian>() {
        return Composition::single(m.get().inner, 1).map_err(to_py_err);
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "expected a Composition, a ParallelGroup or a SubsampledGaussian, not {}",
        obj.repr()?
    )))
}

/// ε(δ): the certified upper bound (what to report), the estimate and a lower bound, and the
/// upper bounds of the two adjacency directions (the upper bound is their max), and which
/// computation certified it (`method`: "prv", with the absolute ε tolerance `eps_error` of the
/// grid that answered, larger than asked where the grid limit did not allow the requested one;
/// or "rdp", the RDP bound, where no PRV grid fitted). `float(bounds)` is the upper bound.
#[pyclass(name = "EpsilonBounds", module = "raptor_accountant", frozen, get_all)]
#[derive(Clone)]
pub struct PyEpsilonBounds {
    /// Certified upper bound on ε.
    upper: f64,
    /// Point estimate.
    estimate: f64,
    /// Lower bound.
    lower: f64,
    /// Upper bound for removing a record.
    upper_remove: f64,
    /// Upper bound for adding a record.
    upper_add: f64,
    /// "prv" or "rdp".
    method: String,
    /// The absolute ε tolerance of the PRV grid that answered (None for "rdp").
    eps_error: Option<f64>,
}

impl From<EpsilonBounds> for PyEpsilonBounds {
    fn from(e: EpsilonBounds) -> Self {
        let (method, eps_error) = match e.method {
            Method::Prv { eps_error } => ("prv", Some(eps_error).filter(|v| v.is_finite())),
            Method::Rdp { .. } => ("rdp", None),
        };
        Self {
            upper: e.upper,
            estimate: e.estimate,
            lower: e.lower,
            upper_remove: e.upper_remove,
            upper_add: e.upper_add,
            method: method.to_string(),
            eps_error,
        }
    }
}

#[pymethods]
impl PyEpsilonBounds {
    #[new]
    #[pyo3(signature = (upper, estimate, lower, upper_remove, upper_add, method = "prv".to_string(), eps_error = None))]
    fn new(
        upper: f64,
        estimate: f64,
        lower: f64,
        upper_remove: f64,
        upper_add: f64,
        method: String,
        eps_error: Option<f64>,
    ) -> Self {
        Self {
            upper,
            estimate,
            lower,
            upper_remove,
            upper_add,
            method,
            eps_error,
        }
    }

    fn __float__(&self) -> f64 {
        self.upper
    }

    fn __repr__(&self) -> String {
        format!(
            "EpsilonBounds(upper={}, estimate={}, lower={}, upper_remove={}, upper_add={}, method={:?}, eps_error={})",
            self.upper,
            self.estimate,
            self.lower,
            self.upper_remove,
            self.upper_add,
            self.method,
            self.eps_error
                .map_or_else(|| "None".to_string(), |v| v.to_string())
        )
    }
}

/// δ(ε): the certified upper bound, the estimate and a lower bound. `float(bounds)` is the upper
/// bound.
#[pyclass(name = "DeltaBounds", module = "raptor_accountant", frozen, get_all)]
#[derive(Clone, Copy)]
pub struct PyDeltaBounds {
    /// Certified upper bound on δ.
    upper: f64,
    /// Point estimate.
    estimate: f64,
    /// Lower bound.
    lower: f64,
}

impl From<DeltaBounds> for PyDeltaBounds {
    fn from(d: DeltaBounds) -> Self {
        Self {
            upper: d.upper,
            estimate: d.estimate,
            lower: d.lower,
        }
    }
}

#[pymethods]
impl PyDeltaBounds {
    fn __float__(&self) -> f64 {
        self.upper
    }

    fn __repr__(&self) -> String {
        format!(
            "DeltaBounds(upper={}, estimate={}, lower={})",
            self.upper, self.estimate, self.lower
        )
    }
}

/// A PRV accountant; `None` settings take the library's defaults ([`Accuracy::default`]).
fn prv(
    eps_error: f64,
    absolute: bool,
    delta_error: Option<f64>,
    max_points: Option<i128>,
) -> PyResult<PrvAccountant> {
    let default = Accuracy::default();
    let max_points = match max_points {
        None => default.max_points,
        Some(v) => usize::try_from(v).map_err(|_| {
            InvalidParameterError::new_err(format!(
                "PRVAccountant(max_points={v}): must be an integer of at least 16"
            ))
        })?,
    };
    let acc = if absolute {
        Accuracy::absolute(eps_error)
    } else {
        Accuracy::relative(eps_error)
    };
    let acc = acc
        .with_delta_error_rel(delta_error.unwrap_or(default.delta_error_rel))
        .with_max_points(max_points);
    PrvAccountant::new(acc).map_err(to_py_err)
}

/// The PRV accountant (Gopi, Lee, Wutschitz 2021) with certified bounds, both adjacency
/// directions.
#[pyclass(name = "PRVAccountant", module = "raptor_accountant", frozen)]
pub struct PyPrvAccountant {
    inner: PrvAccountant,
}

#[pymethods]
impl PyPrvAccountant {
    #[new]
    #[pyo3(signature = (eps_error = DEFAULT_RELATIVE_EPS_ERROR, *, absolute = false, delta_error = None, max_points = None))]
    fn new(
        eps_error: f64,
        absolute: bool,
        delta_error: Option<f64>,
        max_points: Option<i128>,
    ) -> PyResult<Self> {
        Ok(Self {
            inner: prv(eps_error, absolute, delta_error, max_points)?,
        })
    }

    /// ε(δ) of a composition, a parallel group or one mechanism.
    fn get_epsilon(
        &self,
        py: Python<'_>,
        composition: &Bound<'_, PyAny>,
        delta: f64,
    ) -> PyResult<PyEpsilonBounds> {
        let comp = as_composition(composition)?;
        py.detach(|| self.inner.epsilon(&comp, delta))
            .map(Into::into)
            .map_err(to_py_err)
    }

    /// δ(ε) of a composition, a parallel group or one mechanism.
    fn get_delta(
        &self,
        py: Python<'_>,
        composition: &Bound<'_, PyAny>,
        epsilon: f64,
    ) -> PyResult<PyDeltaBounds> {
        let comp = as_composition(composition)?;
        py.detach(|| self.inner.delta(&comp, epsilon))
            .map(Into::into)
            .map_err(to_py_err)
    }

    fn __repr__(&self) -> String {
        format!("PRVAccountant({:?})", self.inner.accuracy())
    }
}

/// Rényi DP of the subsampled Gaussian (Mironov 2017; Mironov, Talwar, Zhang 2019) as an
/// independent cross-check: a valid but looser upper bound.
#[pyclass(name = "RDPAccountant", module = "raptor_accountant", frozen)]
pub struct PyRdpAccountant {
    inner: RdpAccountant,
}

#[pymethods]
impl PyRdpAccountant {
    #[new]
    #[pyo3(signature = (orders = None))]
    fn new(orders: Option<Vec<f64>>) -> PyResult<Self> {
        let inner = match orders {
            None => RdpAccountant::default(),
            Some(o) => RdpAccountant::with_orders(o).map_err(to_py_err)?,
        };
        Ok(Self { inner })
    }

    /// (ε, best order) at δ.
    fn get_epsilon(
        &self,
        py: Python<'_>,
        composition: &Bound<'_, PyAny>,
        delta: f64,
    ) -> PyResult<(f64, f64)> {
        let comp = as_composition(composition)?;
        let r = py
            .detach(|| self.inner.epsilon(&comp, delta))
            .map_err(to_py_err)?;
        Ok((r.epsilon, r.order))
    }
}

/// σ calibration result.
#[pyclass(name = "Calibration", module = "raptor_accountant", frozen, get_all)]
pub struct PyCalibration {
    /// The noise multiplier.
    noise_multiplier: f64,
    /// ε at that σ (its upper bound meets the target).
    epsilon: PyEpsilonBounds,
    /// Relative width of the final bisection bracket.
    relative_bracket: f64,
    /// Accountant evaluations used.
    evaluations: u32,
}

#[pymethods]
impl PyCalibration {
    fn __float__(&self) -> f64 {
        self.noise_multiplier
    }

    fn __repr__(&self) -> String {
        format!(
            "Calibration(noise_multiplier={}, epsilon={}, relative_bracket={}, evaluations={})",
            self.noise_multiplier,
            self.epsilon.__repr__(),
            self.relative_bracket,
            self.evaluations
        )
    }
}

/// The smallest noise multiplier `calibrate_sigma` searches (raptor-accountant's calibration
/// range is [0.01, 1e5]; `test_calibration_at_the_floor_warns` checks that it still is).
const CALIBRATION_SIGMA_FLOOR: f64 = 1e-2;

/// The smallest σ (to the bisection's tolerance) whose certified ε upper bound meets
/// `target_epsilon` at `delta` for `steps` steps at `sample_rate`.
#[pyfunction]
#[pyo3(signature = (target_epsilon, delta, sample_rate, steps, *, eps_error = DEFAULT_RELATIVE_EPS_ERROR))]
fn calibrate_sigma(
    py: Python<'_>,
    target_epsilon: f64,
    delta: f64,
    sample_rate: f64,
    steps: i128,
    eps_error: f64,
) -> PyResult<PyCalibration> {
    let steps = count("steps", steps)?;
    let acc = prv(eps_error, false, None, None)?;
    let c = py
        .detach(|| {
            raptor_accountant::calibrate_sigma(target_epsilon, delta, sample_rate, steps, &acc)
        })
        .map_err(to_py_err)?;
    if c.sigma <= CALIBRATION_SIGMA_FLOOR * (1.0 + 1e-12) && c.relative_bracket == 0.0 {
        let msg = std::ffi::CString::new(format!(
            "calibrate_sigma(target_epsilon={target_epsilon}): every noise multiplier down to \
             {CALIBRATION_SIGMA_FLOOR}, the floor of the range searched [{CALIBRATION_SIGMA_FLOOR}, \
             1e5], meets the target at sample_rate={sample_rate}, steps={steps}; the floor is \
             returned, not the smallest such noise multiplier"
        ))
        .map_err(|e| AccountantError::new_err(e.to_string()))?;
        PyErr::warn(
            py,
            &py.get_type::<pyo3::exceptions::PyUserWarning>(),
            &msg,
            1,
        )?;
    }
    Ok(PyCalibration {
        noise_multiplier: c.sigma,
        epsilon: c.epsilon.into(),
        relative_bracket: c.relative_bracket,
        evaluations: c.evaluations,
    })
}

/// RAPTOR budget plans (the paper's additive split and the joint split) as a JSON string (the
/// Python wrapper returns it as a dict).
#[pyfunction]
#[pyo3(signature = (epsilon, delta, shared, expert, *, rho = 0.9, layers = 1, simultaneous = false, eps_error = DEFAULT_RELATIVE_EPS_ERROR))]
#[allow(clippy::too_many_arguments)]
fn plan_budget_json(
    py: Python<'_>,
    epsilon: f64,
    delta: f64,
    shared: (f64, i128),
    expert: (f64, i128),
    rho: f64,
    layers: i128,
    simultaneous: bool,
    eps_error: f64,
) -> PyResult<String> {
    let (shared, expert) = (
        (shared.0, count("shared steps", shared.1)?),
        (expert.0, count("expert steps", expert.1)?),
    );
    let layers = count("layers", layers)?;
    let acc = prv(eps_error, false, None, None)?;
    let req = PlanRequest {
        epsilon,
        delta,
        rho,
        shared: Stream {
            q: shared.0,
            steps: shared.1,
        },
        expert: Stream {
            q: expert.0,
            steps: expert.1,
        },
        layers,
        sampling: if simultaneous {
            StreamSampling::Simultaneous
        } else {
            StreamSampling::Alternating
        },
    };
    let plans = py
        .detach(|| raptor_accountant::plan_budget(&req, &acc))
        .map_err(to_py_err)?;
    serde_json::to_string(&plans)
        .map_err(|e| AccountantError::new_err(format!("cannot serialize the plans: {e}")))
}

/// The native module.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySubsampledGaussian>()?;
    m.add_class::<PyComposition>()?;
    m.add_class::<PyParallelGroup>()?;
    m.add_class::<PyEpsilonBounds>()?;
    m.add_class::<PyDeltaBounds>()?;
    m.add_class::<PyPrvAccountant>()?;
    m.add_class::<PyRdpAccountant>()?;
    m.add_class::<PyCalibration>()?;
    m.add_function(wrap_pyfunction!(calibrate_sigma, m)?)?;
    m.add_function(wrap_pyfunction!(plan_budget_json, m)?)?;
    let py = m.py();
    m.add("AccountantError", py.get_type::<AccountantError>())?;
    m.add(
        "InvalidParameterError",
        py.get_type::<InvalidParameterError>(),
    )?;
    m.add("AccuracyError", py.get_type::<AccuracyError>())?;
    m.add("CalibrationError", py.get_type::<CalibrationError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_EPS_ERROR", DEFAULT_RELATIVE_EPS_ERROR)?;
    Ok(())
}
