"""Trainer correctness: configuration errors up front, usage errors only for configuration, the bank flushed
before held-out evaluations and checkpoints, a transactional resume of the experience side, the extractor's
samples (cooldown, policy version, the temperature they were sampled at)."""

from __future__ import annotations

import math

import pytest

from crl_agent.train import TrainConfig


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan])
def test_a_temperature_that_is_not_positive_is_refused_before_the_run_starts(temperature):
    with pytest.raises(ValueError, match="--temperature must be > 0"):
        TrainConfig(temperature=temperature).check()
    TrainConfig(temperature=0.1).check()
