import pytest

from waymark.clock import ManualClock, SystemClock


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(start_ms=1000)
    assert clock.now_ms() == 1000
    clock.advance(250)
    assert clock.now_ms() == 1250
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        clock.set(10)


def test_system_clock_is_epoch_milliseconds() -> None:
    assert SystemClock().now_ms() > 1_600_000_000_000
