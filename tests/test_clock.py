import time
from pathlib import Path

import pytest

from waymark.clock import ManualClock, OffsetClock, SystemClock


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


def test_an_offset_clock_jumps_when_its_file_is_rewritten(tmp_path: Path) -> None:
    offset = tmp_path / "offset"
    clock = OffsetClock(offset, reread_s=0)  # absent: the wall clock
    assert abs(clock.now_ms() - time.time_ns() // 1_000_000) < 1_000
    offset.write_text("3600000\n")  # an hour ahead
    assert clock.now_ms() - time.time_ns() // 1_000_000 > 3_599_000
    offset.write_text("-3600000")  # and back, past the wall clock
    assert time.time_ns() // 1_000_000 - clock.now_ms() > 3_599_000
    offset.write_text("not a number")  # caught mid-write: the last offset stays
    assert time.time_ns() // 1_000_000 - clock.now_ms() > 3_599_000
