"""The raptor_accountant Python API: values, composition, calibration, plans, errors."""

import math

import pytest

import raptor_accountant as ra
from conftest import golden_rows, require


def comp_of(mechanisms: str) -> ra.Composition:
    """A composition from the golden file's "q:sigma:T;..." spelling."""
    parts = []
    for m in mechanisms.split(";"):
        q, sigma, steps = m.split(":")
        parts.append((ra.SubsampledGaussian(float(q), float(sigma)), int(steps)))
    return ra.Composition(parts)


def test_get_epsilon_bounds_are_ordered_and_float_is_the_upper_bound():
    e = ra.get_epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=10_000, delta=1e-5)
    assert isinstance(e, ra.EpsilonBounds)
    assert e.lower <= e.estimate <= e.upper
    assert float(e) == e.upper
    assert e.upper == max(e.upper_remove, e.upper_add)
    # the same value as the class API
    c = ra.Composition([(ra.SubsampledGaussian(sample_rate=0.01, noise_multiplier=1.0), 10_000)])
    assert ra.PRVAccountant().get_epsilon(c, 1e-5).upper == e.upper
    assert 6.0 < e.upper < 6.4


def test_get_delta_is_consistent_with_get_epsilon():
    e = ra.get_epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=1_000, delta=1e-5)
    d = ra.get_delta(noise_multiplier=1.0, sample_rate=0.01, steps=1_000, epsilon=e.upper)
    assert isinstance(d, ra.DeltaBounds)
    assert d.lower <= d.estimate <= d.upper
    assert float(d) == d.upper
    # at the certified epsilon for delta = 1e-5, delta is at most about 1e-5
    assert d.estimate <= 1e-5


@pytest.mark.parametrize(
    "eps_error,tolerance", [(ra.DEFAULT_EPS_ERROR, 0.001), (0.005, 0.01), (0.01, 0.01)]
)
def test_agrees_with_dp_accounting_pld_on_the_golden_grid(eps_error, tolerance):
    """Upper bound >= dp_accounting's optimistic epsilon on every golden case, and within
    `tolerance` (relative) of its pessimistic epsilon (PLD at value_discretization_interval
    1e-4) for delta >= 1e-8. At delta = 1e-12 the accountant's delta error allowance (FFT
    round-off, about 1e-15 per composed step) is a visible share of delta, and its bound sits
    1.5-3 % above the pessimistic PLD epsilon: checked within 5 % there."""
    acc = ra.PRVAccountant(eps_error)
    checked = 0
    for row in golden_rows():
        if not row["dp_pld_upper"]:
            continue
        delta = float(row["delta"])
        e = acc.get_epsilon(comp_of(row["mechanisms"]), delta)
        optimistic, pessimistic = float(row["dp_pld_lower"]), float(row["dp_pld_upper"])
        assert e.upper >= optimistic, row["case"]
        tol = tolerance if delta >= 1e-8 else 0.05
        assert e.upper <= pessimistic * (1 + tol), (row["case"], e.upper, pessimistic)
        checked += 1
    assert checked >= 40


def test_agrees_with_dp_accounting_live():
    """The same check against dp_accounting itself (PLD, both add and remove, as in
    fixtures/accountant/generate.py, at a 2e-4 interval), in this process, on a small grid."""
    require("dp_accounting")
    from dp_accounting.pld import privacy_loss_distribution as pld

    for q, sigma, steps in [(0.01, 1.0, 100), (0.1, 2.0, 100), (1.0, 4.0, 10)]:
        bounds = []
        for pessimistic in (True, False):
            p = pld.from_gaussian_mechanism(
                standard_deviation=sigma,
                sensitivity=1.0,
                pessimistic_estimate=pessimistic,
                value_discretization_interval=2e-4,
                sampling_prob=q,
                use_connect_dots=True,
            ).self_compose(steps)
            bounds.append(float(p.get_epsilon_for_delta(1e-5)))
        pessimistic_eps, optimistic_eps = bounds
        ours = ra.get_epsilon(
            noise_multiplier=sigma, sample_rate=q, steps=steps, delta=1e-5, eps_error=0.005
        )
        assert ours.upper >= optimistic_eps, (q, sigma, steps)
        assert ours.upper <= pessimistic_eps * 1.01, (q, sigma, steps, ours.upper, pessimistic_eps)


def test_heterogeneous_composition_is_one_prv_not_a_sum():
    a = ra.SubsampledGaussian(0.01, 1.0)
    b = ra.SubsampledGaussian(0.05, 2.0)
    both = ra.Composition().add(a, 500).add(b, 500)
    assert both.total_steps == 1000 and len(both) == 2
    acc = ra.PRVAccountant()
    e_both = acc.get_epsilon(both, 1e-5).upper
    e_a = acc.get_epsilon(ra.Composition([(a, 500)]), 1e-5).upper
    e_b = acc.get_epsilon(ra.Composition([(b, 500)]), 1e-5).upper
    assert max(e_a, e_b) < e_both < e_a + e_b
    # identical mechanisms are merged
    merged = ra.Composition([(a, 300), (a, 200), a])
    assert merged.parts == [(a, 501)]


def test_parallel_group_costs_the_worst_member():
    acc = ra.PRVAccountant()
    weak = ra.Composition([(ra.SubsampledGaussian(0.02, 1.0), 300)])
    strong = ra.Composition([(ra.SubsampledGaussian(0.02, 3.0), 300)])
    group = ra.ParallelGroup([weak, strong, strong])
    assert len(group) == 3
    e_group = acc.get_epsilon(group, 1e-5).upper
    e_weak = acc.get_epsilon(weak, 1e-5).upper
    assert e_group == pytest.approx(e_weak, rel=1e-9)
    # a shared stream followed by the parallel expert layer
    shared = ra.SubsampledGaussian(0.02, 1.5)
    comp = ra.Composition([(shared, 300), group])
    assert len(comp) == 2
    assert acc.get_epsilon(comp, 1e-5).upper > e_weak


def test_rdp_cross_check_is_looser():
    c = ra.Composition([(ra.SubsampledGaussian(0.01, 1.0), 1000)])
    eps, order = ra.RDPAccountant().get_epsilon(c, 1e-5)
    assert order > 1
    assert eps >= ra.PRVAccountant().get_epsilon(c, 1e-5).lower


def test_calibrate_sigma_meets_the_target_on_the_upper_bound():
    cal = ra.calibrate_sigma(2.0, 1e-5, 0.01, 1000)
    assert isinstance(cal, ra.Calibration)
    assert cal.epsilon.upper <= 2.0
    assert cal.epsilon.upper > 1.9
    assert float(cal) == cal.noise_multiplier
    again = ra.get_epsilon(
        noise_multiplier=cal.noise_multiplier, sample_rate=0.01, steps=1000, delta=1e-5
    )
    assert again.upper <= 2.0
    assert ra.get_noise_multiplier(
        target_epsilon=2.0, target_delta=1e-5, sample_rate=0.01, steps=1000
    ) == cal.noise_multiplier


def test_plan_budget_returns_both_plans():
    p = ra.plan_budget(4.0, 1e-5, (0.02, 300), (0.02, 300), rho=0.9, layers=1)
    assert set(p) >= {"additive", "joint", "variance_ratio", "request"}
    assert p["joint"]["epsilon_composed"]["upper"] <= 4.0
    # the joint split needs no more noise on the shared stream than the additive one
    assert p["joint"]["shared"]["sigma"] <= p["additive"]["shared"]["sigma"]


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: ra.SubsampledGaussian(1.5, 1.0), "q = 1.5"),
        (lambda: ra.SubsampledGaussian(0.0, 1.0), "q = 0"),
        (lambda: ra.SubsampledGaussian(0.1, 0.0), "sigma = 0"),
        (lambda: ra.SubsampledGaussian(0.1, float("nan")), "sigma = NaN"),
        (
            lambda: ra.get_epsilon(noise_multiplier=1, sample_rate=0.1, steps=10, delta=0.0),
            "delta = 0",
        ),
        (
            lambda: ra.get_epsilon(noise_multiplier=1, sample_rate=0.1, steps=10, delta=1.0),
            "delta = 1",
        ),
        (
            lambda: ra.get_epsilon(noise_multiplier=1, sample_rate=0.1, steps=0, delta=1e-5),
            "step count must be at least 1",
        ),
        (lambda: ra.PRVAccountant().get_epsilon(ra.Composition(), 1e-5), "empty composition"),
        (
            lambda: ra.get_epsilon(noise_multiplier=1, sample_rate=0.1, steps=-3, delta=1e-5),
            "got -3",
        ),
        (lambda: ra.Composition().add(ra.SubsampledGaussian(0.1, 1.0), -1), "got -1"),
        (lambda: ra.calibrate_sigma(1.0, 1e-5, 0.01, -10), "got -10"),
        (lambda: ra.plan_budget(1.0, 1e-5, (0.1, 10), (0.1, 10), layers=-1), "got -1"),
        (lambda: ra.plan_budget(1.0, 1e-5, (0.1, 10), (0.1, 10), layers=0), "layers"),
        (lambda: ra.ParallelGroup([]), "no members"),
        (lambda: ra.calibrate_sigma(0.0, 1e-5, 0.01, 10), "> 0 as the target"),
        (lambda: ra.calibrate_sigma(-1.0, 1e-5, 0.01, 10), "epsilon = -1"),
        (lambda: ra.plan_budget(1.0, 1e-5, (0.1, 10), (0.1, 10), rho=1.5), "rho = 1.5"),
        (lambda: ra.PRVAccountant(-0.1), "PRVAccountant(eps_error=-0.1)"),
        (lambda: ra.PRVAccountant(delta_error=2.0), "PRVAccountant(delta_error=2)"),
        (lambda: ra.PRVAccountant(max_points=-1), "PRVAccountant(max_points=-1)"),
        (lambda: ra.PRVAccountant(max_points=3), "PRVAccountant(max_points=3)"),
        (lambda: ra.RDPAccountant(orders=[]), "the list is empty"),
        (
            lambda: ra.PRVAccountant().get_epsilon(ra.SubsampledGaussian(0.01, 1e-300), 1e-5),
            "noise multiplier sigma = 1e-300 is too small",
        ),
    ],
)
def test_bad_inputs_raise_value_error_with_a_clear_message(call, needle):
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, ra.InvalidParameterError)
    assert isinstance(info.value, ra.AccountantError)
    assert needle in str(info.value)


def test_a_regime_beyond_the_grid_answers_from_a_coarser_grid_and_says_so():
    comp = ra.Composition([(ra.SubsampledGaussian(0.25, 0.6), 10_000)])
    fine = ra.PRVAccountant(1e-7, absolute=True, max_points=1 << 16).get_epsilon(comp, 1e-5)
    assert fine.method == "prv" and fine.eps_error > 1e-7
    reference = ra.PRVAccountant().get_epsilon(comp, 1e-5)
    assert reference.lower <= fine.upper <= 1.01 * reference.upper
    mech = ra.SubsampledGaussian(0.01, 1.0)
    assert fine.eps_error is not None and "method='prv'" in repr(fine).replace('"', "'")
    # No PRV grid fits 16 points: the RDP bound answers, and says so.
    rdp = ra.PRVAccountant(max_points=16).get_epsilon(mech, 1e-5)
    assert rdp.method == "rdp" and rdp.eps_error is None and rdp.lower == 0.0
    assert rdp.upper == ra.RDPAccountant().get_epsilon(mech, 1e-5)[0]


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError):
        ra.Composition([3])
    with pytest.raises(TypeError):
        ra.PRVAccountant().get_epsilon("not a composition", 1e-5)


def test_docstrings_and_version():
    assert ra.__version__
    for obj in (
        ra.SubsampledGaussian,
        ra.Composition,
        ra.ParallelGroup,
        ra.PRVAccountant,
        ra.PRVAccountant.get_epsilon,
        ra.calibrate_sigma,
        ra.get_epsilon,
        ra.plan_budget,
        ra.InvalidParameterError,
    ):
        assert obj.__doc__ and len(obj.__doc__) > 20, obj
    assert math.isfinite(float(ra.get_epsilon(
        noise_multiplier=2.0, sample_rate=1.0, steps=1, delta=1e-5
    )))


def test_the_module_docstring_examples_run():
    import doctest

    result = doctest.testmod(ra)
    assert result.attempted >= 5 and result.failed == 0


def test_readme_example_digits_are_current():
    """The digits shown in the package README's first example are what the package prints."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    line = next(
        l for l in readme.splitlines() if l.startswith("print(eps.upper, eps.estimate, eps.lower)")
    )
    shown = [float(x) for x in re.findall(r"\d+\.\d+", line.split("#", 1)[1])]
    eps = ra.get_epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=10_000, delta=1e-5)
    assert shown == [round(eps.upper, 4), round(eps.estimate, 4), round(eps.lower, 4)]


def test_calibration_at_the_floor_warns():
    """A target every noise multiplier in the searched range meets returns the floor, and says so."""
    with pytest.warns(UserWarning, match="floor of the range searched"):
        c = ra.calibrate_sigma(1e6, 1e-5, 1e-4, 10)
    assert c.noise_multiplier == 0.01
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ra.calibrate_sigma(1.0, 1e-5, 0.01, 1000).noise_multiplier > 0.01
