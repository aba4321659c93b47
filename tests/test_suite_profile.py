"""The suite's own rules: the Hypothesis profile every property test runs under."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent


def test_no_property_test_has_a_per_example_deadline() -> None:
    """A loaded machine makes examples slow, never wrong (tests/conftest.py profiles)."""
    assert settings.default.deadline is None


def test_ci_profile_is_derandomized_with_a_fixed_example_count() -> None:
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.deadline is None and ci.max_examples == 100
    assert ci.database is None
    wanted = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    if wanted == "ci":
        assert settings.default.derandomize


def test_ci_runs_the_ci_profile() -> None:
    assert "export HYPOTHESIS_PROFILE=ci" in (ROOT / ".ci" / "run").read_text()
