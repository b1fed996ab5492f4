"""Shared helpers of the raptor_accountant tests."""

import csv
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "fixtures" / "accountant" / "golden.csv"


def golden_rows():
    """The rows of fixtures/accountant/golden.csv (dp_accounting PLD and prv_accountant)."""
    with open(GOLDEN, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def require(module: str):
    """Import an optional reference package; skip without it, unless RAPTOR_PY_REQUIRE lists it
    (`cargo xtask test` sets it, so that a missing package fails there instead of skipping)."""
    required = os.environ.get("RAPTOR_PY_REQUIRE", "").split(",")
    if module in required:
        return __import__(module)
    return pytest.importorskip(module)
