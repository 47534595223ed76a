"""Behaviour of dispatch_service.geocoding.breaker: closed -> open -> half-open -> closed."""

from __future__ import annotations

from geocoding_helpers import ManualClock

from dispatch_service.geocoding.breaker import BreakerState, CircuitBreaker


def test_opens_after_consecutive_failures(clock: ManualClock) -> None:
    breaker = CircuitBreaker(failure_threshold=3, open_s=10.0, clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()


def test_a_success_resets_the_count(clock: ManualClock) -> None:
    breaker = CircuitBreaker(failure_threshold=2, clock=clock)
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED


def test_half_open_lets_one_trial_through_and_closes_on_success(clock: ManualClock) -> None:
    breaker = CircuitBreaker(failure_threshold=1, open_s=10.0, clock=clock)
    breaker.record_failure()
    clock.advance(9.9)
    assert not breaker.allow()
    clock.advance(0.2)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()
    assert not breaker.allow()  # one trial at a time
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allow()


def test_a_failed_trial_opens_it_again(clock: ManualClock) -> None:
    breaker = CircuitBreaker(failure_threshold=1, open_s=10.0, clock=clock)
    breaker.record_failure()
    clock.advance(10.0)
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    assert breaker.times_opened == 2
    clock.advance(10.0)
    assert breaker.allow()


def test_a_cancelled_trial_frees_the_slot(clock: ManualClock) -> None:
    breaker = CircuitBreaker(failure_threshold=1, open_s=1.0, clock=clock)
    breaker.record_failure()
    clock.advance(1.0)
    assert breaker.allow()
    breaker.release()
    assert breaker.allow()
