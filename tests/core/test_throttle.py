"""--rate's token bucket on a simulated clock, and the values it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rm_qdrant.core.throttle import TokenBucket, check_rate
from rm_qdrant.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize("seed", range(10))
def test_points_taken_never_run_ahead_of_the_rate_and_barely_behind(seed):
    """Whatever the batch sizes (some above a second's worth), the points taken by time T are at
    most rate*T plus one full bucket, and the bucket never waits longer than the debt needs."""
    rng = np.random.default_rng(seed)
    rate = float(rng.uniform(5, 500))
    batches = rng.integers(1, int(rate * 3) + 2, size=40)
    clock = Clock()
    bucket = TokenBucket(rate, clock=clock, sleep=clock.sleep, burst=int(batches.max()))
    taken = 0
    for n in batches:
        assert bucket.take(int(n), stop=lambda: False)
        taken += int(n)
        assert taken <= rate * clock.now + bucket.capacity + 1e-6
    # all but the first bucketful went at the rate, to within the sleep tick
    assert clock.now <= max(0.0, (taken - bucket.capacity) / rate) + 0.25 + 1e-6


def test_a_stop_ends_the_wait():
    clock = Clock()
    bucket = TokenBucket(1.0, clock=clock, sleep=clock.sleep)
    assert bucket.take(1, stop=lambda: False)
    assert not bucket.take(1, stop=lambda: True)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, -math.inf, True, "10", 10**400])
def test_rates_that_are_not_a_positive_number_are_refused(bad):
    with pytest.raises(ConfigError, match="--rate"):
        check_rate(bad)
