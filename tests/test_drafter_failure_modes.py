"""The failure-mode checks every training-free drafter passes (``tests/drafter_checks.py``), run for
suffix decoding, token recycling, REST and the mixture tree on small random models: EOS inside an accepted
block, the max-new-tokens cap, no EOS id, streamed text equal to the final text, and sampling that
keeps the target's distribution (chi-square; the false-alarm odds are in the check's docstring)."""

from __future__ import annotations

import pytest

import drafter_checks as checks
import test_mixture
import test_recycling
import test_rest
import test_suffix

FACTORIES = {"suffix": test_suffix.factory, "recycling": test_recycling.factory, "rest": test_rest.factory,
             "mixture": test_mixture.factory}
CHECKS = {"eos_inside_block": checks.eos_inside_block, "max_new_tokens_cap": checks.max_new_tokens_cap,
          "no_eos_id": checks.no_eos_id, "streamed_equals_final": checks.streamed_equals_final,
          "sampling_exact": checks.sampling_exact}


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("method", FACTORIES)
def test_failure_modes(method, check):
    CHECKS[check](FACTORIES[method])
