"""The Opacus adapter: its IAccountant interface (no torch needed) and a short Opacus training
loop with it as the PrivacyEngine's accountant (when Opacus installs)."""

import math

import pytest

import raptor_accountant as ra
from conftest import require
from raptor_accountant.opacus import RaptorPRVAccountant


def test_interface_without_torch():
    acc = RaptorPRVAccountant()
    assert len(acc) == 0 and acc.get_epsilon(1e-5) == 0.0
    assert RaptorPRVAccountant.mechanism() == "raptor_prv"
    for _ in range(200):
        acc.step(noise_multiplier=1.0, sample_rate=0.01)
    for _ in range(50):
        acc.step(noise_multiplier=2.0, sample_rate=0.05)
    # len() is the history's length, as for Opacus's accountants; steps() counts the steps.
    assert len(acc) == 2 and acc.steps() == 250
    assert acc.history == [(1.0, 0.01, 200), (2.0, 0.05, 50)]
    expected = ra.PRVAccountant().get_epsilon(
        ra.Composition(
            [(ra.SubsampledGaussian(0.01, 1.0), 200), (ra.SubsampledGaussian(0.05, 2.0), 50)]
        ),
        1e-5,
    )
    assert acc.get_epsilon(1e-5) == expected.upper
    assert acc.get_epsilon_bounds(1e-5).lower == expected.lower

    restored = RaptorPRVAccountant()
    restored.load_state_dict(acc.state_dict())
    assert restored.history == acc.history and restored.steps() == 250
    with pytest.raises(ValueError, match="mechanism"):
        restored.load_state_dict({"history": [], "mechanism": "rdp"})
    # load_state_dict validates every entry (and leaves the history as it was).
    for bad, needle in [
        ([(1.0, 1.5, 3)], "sample_rate"),
        ([(-1.0, 0.1, 3)], "noise_multiplier"),
        ([(1.0, 0.1, 0)], "at least 1"),
        ([(1.0, 0.1, 2.5)], "integer"),
        ([(1.0, 0.1)], "not \\(noise_multiplier"),
    ]:
        with pytest.raises(ValueError, match=needle):
            restored.load_state_dict({"history": bad, "mechanism": "raptor_prv"})
    assert restored.history == acc.history
    # Unknown keyword arguments raise instead of being ignored; eps_error is honoured.
    with pytest.raises(TypeError):
        acc.get_epsilon(1e-5, alphas=[2, 4])
    assert acc.get_epsilon(1e-5, eps_error=1e-3) >= expected.lower


def test_hook_records_steps_like_opacus():
    class FakeOptimizer:
        noise_multiplier = 1.3
        accumulated_iterations = 2

    acc = RaptorPRVAccountant()
    hook = acc.get_optimizer_hook_fn(sample_rate=0.01)
    hook(FakeOptimizer())
    hook(FakeOptimizer())
    assert acc.history == [(1.3, 0.02, 2)]


def test_bad_steps_fail_where_they_are_taken_and_non_private_steps_cost_infinity():
    acc = RaptorPRVAccountant()
    with pytest.raises(ValueError, match="sample_rate"):
        acc.step(noise_multiplier=1.0, sample_rate=1.5)
    with pytest.raises(ValueError, match="noise_multiplier"):
        acc.step(noise_multiplier=-1.0, sample_rate=0.1)
    assert len(acc) == 0
    acc.step(noise_multiplier=0.0, sample_rate=0.1)
    assert math.isinf(acc.get_epsilon(1e-5))
    with pytest.raises(ValueError, match="delta"):
        ok = RaptorPRVAccountant()
        ok.step(noise_multiplier=1.0, sample_rate=0.1)
        ok.get_epsilon(0.0)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_in_an_opacus_training_loop():
    """Opacus's PrivacyEngine with our accountant: every optimizer step is recorded, the
    reported epsilon is ours, and it agrees with Opacus's own PRV accountant (ours is a
    certified upper bound: not below Opacus's estimate by more than its accuracy, and not above
    Opacus's RDP bound)."""
    opacus = require("opacus")
    torch = require("torch")
    from opacus.accountants import IAccountant, PRVAccountant, RDPAccountant

    torch.manual_seed(0)
    n, batch = 256, 32
    x = torch.randn(n, 8)
    y = (x[:, 0] > 0).long()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch
    )
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    engine = opacus.PrivacyEngine()
    ours = RaptorPRVAccountant()
    assert isinstance(ours, IAccountant)
    engine.accountant = ours
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        poisson_sampling=True,
    )
    steps = 0
    for _ in range(3):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            steps += 1
    assert steps > 0 and ours.steps() == steps and len(ours) == 1
    assert ours.history == [(1.0, batch / n, steps)]
    eps = engine.get_epsilon(delta=1e-5)
    assert eps == ours.get_epsilon(1e-5)

    theirs_prv = PRVAccountant()
    theirs_rdp = RDPAccountant()
    theirs_prv.history = list(ours.history)
    theirs_rdp.history = list(ours.history)
    prv_eps = theirs_prv.get_epsilon(delta=1e-5)
    rdp_eps = theirs_rdp.get_epsilon(delta=1e-5)
    assert eps >= prv_eps * 0.98, (eps, prv_eps)
    assert eps <= rdp_eps, (eps, rdp_eps)


def test_registered_with_opacus_by_name():
    opacus = require("opacus")
    from opacus.accountants.registry import create_accountant
    from opacus.accountants.utils import get_noise_multiplier

    assert isinstance(create_accountant("raptor_prv"), RaptorPRVAccountant)
    engine = opacus.PrivacyEngine(accountant="raptor_prv")
    assert isinstance(engine.accountant, RaptorPRVAccountant)
    # make_private_with_epsilon's calibration path: sigma by name, checked by our own bound.
    sigma = get_noise_multiplier(
        target_epsilon=2.0, target_delta=1e-5, sample_rate=0.01, steps=1000, accountant="raptor_prv"
    )
    acc = RaptorPRVAccountant()
    acc.history = [(sigma, 0.01, 1000)]
    assert acc.get_epsilon(1e-5) <= 2.0
