#!/usr/bin/env python3
"""raptor_accountant beside dp_accounting (PLD) and prv_accountant, in one process.

    pip install target/wheels/raptor_accountant-*.whl dp-accounting==0.6.0 prv-accountant==0.2.0
    python crates/raptor-py/bench/bench.py            # prints a Markdown table

Each cell is the fastest of REPEATS warm calls (wall clock, one thread of Python; the libraries
may use more). Accuracy settings: raptor at its default (relative eps_error
ra.DEFAULT_EPS_ERROR, printed with the table: the certified upper bound is expected within that
fraction of the truth); dp_accounting's PLDAccountant at its default
value_discretization_interval 1e-4 (add-or-remove, pessimistic: an upper bound up to
discretization); prv_accountant with eps_error 0.01 and delta_error 1e-3 * delta (removal only;
its "upper" is not certified). Calibration: raptor's calibrate_sigma (bisection on
the certified upper bound, to a relative bracket of 1e-3) against dp_accounting's
calibrate_dp_mechanism (Brent's method on the PLD epsilon, tolerance 1e-3 in sigma) and, when
Opacus is installed, Opacus's get_noise_multiplier with its PRV accountant.
"""

import platform
import sys
import time
import warnings

import raptor_accountant as ra

REPEATS = 3
DELTA = 1e-5


def best(fn, repeats=REPEATS):
    """(fastest wall-clock seconds, last result)."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def raptor_eps(mechs):
    comp = ra.Composition([(ra.SubsampledGaussian(q, s), t) for q, s, t in mechs])
    return ra.PRVAccountant().get_epsilon(comp, DELTA).upper


def dp_eps(mechs):
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(
        dp_event.ComposedDpEvent(
            [
                dp_event.SelfComposedDpEvent(
                    dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), t
                )
                for q, s, t in mechs
            ]
        )
    )
    return acc.get_epsilon(DELTA)


def prv_eps(mechs):
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    prvs = [PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=s) for q, s, _ in mechs]
    acc = PRVAccountant(
        prvs=prvs,
        max_self_compositions=[t for _, _, t in mechs],
        eps_error=0.01,
        delta_error=DELTA * 1e-3,
    )
    _, _, upper = acc.compute_epsilon(delta=DELTA, num_self_compositions=[t for _, _, t in mechs])
    return upper


def raptor_cal(eps, q, t):
    return ra.calibrate_sigma(eps, DELTA, q, t).noise_multiplier


def dp_cal(eps, q, t):
    from dp_accounting import dp_event, mechanism_calibration
    from dp_accounting.pld import pld_privacy_accountant

    return mechanism_calibration.calibrate_dp_mechanism(
        pld_privacy_accountant.PLDAccountant,
        lambda s: dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), t
        ),
        eps,
        DELTA,
        tol=1e-3,
    )


def opacus_cal(eps, q, t):
    from opacus.accountants.utils import get_noise_multiplier

    return get_noise_multiplier(
        target_epsilon=eps, target_delta=DELTA, sample_rate=q, steps=t, accountant="prv"
    )


def main():
    warnings.simplefilter("ignore")
    rows = []
    one = [(0.01, 1.0, 10_000)]
    two = [(0.01, 1.0, 10_000), (0.05, 2.0, 10_000)]
    for name, mechs in [("ε, q = 0.01, σ = 1, T = 10⁴", one),
                        ("ε, two streams (0.01, 1, 10⁴) + (0.05, 2, 10⁴)", two)]:
        row = [name]
        for fn in (raptor_eps, dp_eps, prv_eps):
            try:
                secs, val = best(lambda: fn(mechs))
                row.append((secs, val))
            except Exception as e:  # noqa: BLE001 - a reference failing is a result
                row.append((None, f"{type(e).__name__}"))
        rows.append(row)
    cal = ["σ for ε = 8, q = 0.01, T = 10⁴"]
    for fn in (raptor_cal, dp_cal):
        secs, val = best(lambda: fn(8.0, 0.01, 10_000), repeats=2)
        cal.append((secs, val))
    try:
        import opacus  # noqa: F401

        secs, val = best(lambda: opacus_cal(8.0, 0.01, 10_000), repeats=2)
        cal.append((secs, val))
    except ImportError:
        cal.append((None, "no opacus"))
    rows.append(cal)

    import dp_accounting
    import prv_accountant

    print(f"python {platform.python_version()}, raptor_accountant {ra.__version__}, "
          f"dp-accounting {getattr(dp_accounting, '__version__', '0.6.0')}, "
          f"prv-accountant {getattr(prv_accountant, '__version__', '0.2.0')}; "
          f"fastest of {REPEATS} warm calls ({platform.machine()}, {sys.platform}); "
          f"raptor at relative eps_error {ra.DEFAULT_EPS_ERROR:g}\n")
    print("| task | raptor_accountant | dp_accounting PLD | prv_accountant (calibration: Opacus PRV) | speed-up vs dp_accounting |")
    print("|---|---|---|---|---|")
    for name, ours, dp, third in rows:
        def cell(x):
            secs, val = x
            if secs is None:
                return str(val)
            return f"{secs * 1e3:.1f} ms ({val:.4f})"
        speed = f"{dp[0] / ours[0]:.0f}×" if dp[0] else "—"
        print(f"| {name} | {cell(ours)} | {cell(dp)} | {cell(third)} | {speed} |")


if __name__ == "__main__":
    main()
