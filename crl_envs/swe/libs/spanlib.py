"""spanlib: half-open intervals, durations and business days."""

from __future__ import annotations

from crl_envs.swe.libs import Bug, Library

_INIT = '''\
"""spanlib: half-open intervals, human durations and business-day arithmetic."""

from spanlib.durations import format_duration, parse_duration
from spanlib.intervals import Interval, merge, total_length
from spanlib.workdays import add_business_days

__all__ = ["Interval", "add_business_days", "format_duration", "merge", "parse_duration", "total_length"]
'''

_INTERVALS = '''\
"""Half-open intervals ``[start, end)`` on the real line."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    """The half-open interval ``[start, end)``."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval end {self.end} is before its start {self.start}")

    @property
    def length(self) -> float:
        return self.end - self.start

    def overlaps(self, other: Interval) -> bool:
        """Whether the two intervals share at least one point."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other: Interval) -> Interval | None:
        lo, hi = max(self.start, other.start), min(self.end, other.end)
        return Interval(lo, hi) if lo < hi else None


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping or touching intervals; the result is sorted and disjoint."""
    out: list[Interval] = []
    for iv in sorted(intervals):
        if out and iv.start <= out[-1].end:
            out[-1] = Interval(out[-1].start, max(out[-1].end, iv.end))
        else:
            out.append(iv)
    return out


def total_length(intervals: Iterable[Interval]) -> float:
    """Length of the union of ``intervals``."""
    return sum(iv.length for iv in merge(intervals))
'''

_DURATIONS = '''\
"""Human-friendly durations such as ``1h30m``."""

from __future__ import annotations

import re

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_TOKEN = re.compile(r"(\\d+)([dhms])")


def parse_duration(text: str) -> int:
    """Seconds in ``text``: ``"1h30m"`` -> 5400. Units: d, h, m, s; spaces are ignored."""
    s = text.replace(" ", "").lower()
    if not s:
        raise ValueError("empty duration")
    pos = total = 0
    for m in _TOKEN.finditer(s):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"bad duration {text!r} at {s[pos:]!r}")
    return total


def format_duration(seconds: int) -> str:
    """The inverse of :func:`parse_duration`: 5400 -> ``"1h30m"``."""
    if seconds < 0:
        raise ValueError("negative duration")
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in _UNITS.items():
        q, seconds = divmod(seconds, size)
        if q:
            parts.append(f"{q}{unit}")
    return "".join(parts)
'''

_WORKDAYS = '''\
"""Business-day arithmetic (Monday to Friday; no holidays)."""

from __future__ import annotations

from datetime import date, timedelta


def add_business_days(start: date, days: int) -> date:
    """The date ``days`` business days after ``start`` (before it when ``days`` is negative)."""
    step = 1 if days >= 0 else -1
    remaining = abs(days)
    current = start
    while remaining:
        current += timedelta(days=step)
        if current.weekday() < 5:
            remaining -= 1
    return current
'''

_TEST_INTERVALS = '''\
import pytest

from spanlib import Interval, merge, total_length


def test_length_and_validation():
    assert Interval(2, 5).length == 3
    with pytest.raises(ValueError):
        Interval(5, 2)


def test_overlapping_intervals():
    assert Interval(0, 5).overlaps(Interval(3, 8))
    assert not Interval(0, 2).overlaps(Interval(5, 8))


def test_intersection():
    assert Interval(0, 5).intersection(Interval(3, 8)) == Interval(3, 5)
    assert Interval(0, 2).intersection(Interval(5, 8)) is None


def test_merge_sorted_input():
    assert merge([Interval(0, 2), Interval(1, 4), Interval(6, 7)]) == [Interval(0, 4), Interval(6, 7)]
    assert total_length([Interval(0, 2), Interval(1, 4)]) == 4
'''

_TEST_DURATIONS = '''\
import pytest

from spanlib import format_duration, parse_duration


def test_parse_single_digit_units():
    assert parse_duration("1h5m") == 3900
    assert parse_duration("2d") == 172800
    assert parse_duration("1m 5s") == 65


@pytest.mark.parametrize("text", ["", "5x", "h1", "1h-"])
def test_parse_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration():
    assert format_duration(0) == "0s"
    assert format_duration(3900) == "1h5m"
'''

_TEST_WORKDAYS = '''\
from datetime import date

from spanlib import add_business_days


def test_within_a_week():
    assert add_business_days(date(2024, 3, 4), 3) == date(2024, 3, 7)  # Mon -> Thu


def test_zero_days_is_the_same_day():
    assert add_business_days(date(2024, 3, 6), 0) == date(2024, 3, 6)
'''

LIBRARY = Library(
    repo="crl-mini/spanlib",
    description="Half-open intervals, human durations and business-day arithmetic.",
    files={
        "README.md": "# spanlib\n\nHalf-open intervals, human-friendly durations and business-day arithmetic.\n",
        "pyproject.toml": '[project]\nname = "spanlib"\nversion = "1.1.0"\nrequires-python = ">=3.9"\n',
        "spanlib/__init__.py": _INIT,
        "spanlib/intervals.py": _INTERVALS,
        "spanlib/durations.py": _DURATIONS,
        "spanlib/workdays.py": _WORKDAYS,
        "tests/test_intervals.py": _TEST_INTERVALS,
        "tests/test_durations.py": _TEST_DURATIONS,
        "tests/test_workdays.py": _TEST_WORKDAYS,
    },
    readme_addition=(
        "\n## Usage\n\n```python\n>>> from spanlib import Interval, merge, parse_duration\n"
        ">>> merge([Interval(0, 2), Interval(1, 4)])\n[Interval(start=0, end=4)]\n"
        ">>> parse_duration(\"1h5m\")\n3900\n```\n"
    ),
    bugs=(
        Bug(
            number=7,
            title="Adjacent half-open intervals are reported as overlapping",
            issue=(
                "Intervals are documented as half-open, so `[1, 3)` and `[3, 5)` share no point, yet:\n\n"
                "```python\n>>> Interval(1, 3).overlaps(Interval(3, 5))\nTrue\n```\n\nOur room-booking code "
                "refuses back-to-back bookings because of this. `Interval(1, 3).intersection(Interval(3, 5))` "
                "already (correctly) returns None."
            ),
            file="spanlib/intervals.py",
            replacements=(
                (
                    "return self.start < other.end and other.start < self.end",
                    "return self.start <= other.end and other.start <= self.end",
                ),
            ),
            test_file="tests/test_intervals.py",
            tests='''

def test_touching_intervals_do_not_overlap():
    assert not Interval(1, 3).overlaps(Interval(3, 5))
    assert not Interval(3, 5).overlaps(Interval(1, 3))
''',
            fail_to_pass=("test_touching_intervals_do_not_overlap",),
        ),
        Bug(
            number=11,
            title="merge() gives overlapping output for unsorted input",
            issue=(
                "`merge` promises a sorted, disjoint result, but only works when the input is already sorted:\n\n"
                "```python\n>>> merge([Interval(5, 6), Interval(0, 2), Interval(1, 5.5)])\n[Interval(start=5, "
                "end=6)]\n```\n\nExpected `[Interval(start=0, end=6)]`. "
                "`total_length` over unsorted intervals is wrong too (it double counts)."
            ),
            file="spanlib/intervals.py",
            replacements=(("    for iv in sorted(intervals):\n", "    for iv in intervals:\n"),),
            test_file="tests/test_intervals.py",
            tests='''

def test_merge_unsorted_input():
    assert merge([Interval(5, 6), Interval(0, 2), Interval(1, 5.5)]) == [Interval(0, 6)]


def test_total_length_of_unsorted_overlapping_intervals():
    assert total_length([Interval(4, 6), Interval(0, 5)]) == 6
''',
            fail_to_pass=("test_merge_unsorted_input", "test_total_length_of_unsorted_overlapping_intervals"),
        ),
        Bug(
            number=18,
            title="merge() truncates an interval that contains the next one",
            issue=(
                "```python\n>>> merge([Interval(0, 10), Interval(2, 3)])\n[Interval(start=0, end=3)]\n```\n\n"
                "The second interval lies inside the first, so the result should be `[Interval(start=0, end=10)]`."
                " This silently drops most of a maintenance window in our scheduler."
            ),
            file="spanlib/intervals.py",
            replacements=(
                (
                    "out[-1] = Interval(out[-1].start, max(out[-1].end, iv.end))",
                    "out[-1] = Interval(out[-1].start, iv.end)",
                ),
            ),
            test_file="tests/test_intervals.py",
            tests='''

def test_merge_keeps_the_end_of_a_containing_interval():
    assert merge([Interval(0, 10), Interval(2, 3)]) == [Interval(0, 10)]
    assert total_length([Interval(0, 10), Interval(2, 3), Interval(4, 5)]) == 10
''',
            fail_to_pass=("test_merge_keeps_the_end_of_a_containing_interval",),
        ),
        Bug(
            number=23,
            title="parse_duration rejects multi-digit numbers like '90m'",
            issue=(
                "```python\n>>> parse_duration('90m')\nValueError: bad duration '90m' at '90m'\n>>> parse_duration"
                "('1h30m')\nValueError: bad duration '1h30m' at '30m'\n```\n\nThe README even uses `1h30m` as "
                "an example. Single-digit values work (`1h5m`)."
            ),
            file="spanlib/durations.py",
            replacements=(('_TOKEN = re.compile(r"(\\d+)([dhms])")', '_TOKEN = re.compile(r"(\\d)([dhms])")'),),
            test_file="tests/test_durations.py",
            tests='''

def test_parse_multi_digit_numbers():
    assert parse_duration("90m") == 5400
    assert parse_duration("1h30m") == 5400
    assert parse_duration("10d 12h") == 907200
''',
            fail_to_pass=("test_parse_multi_digit_numbers",),
        ),
        Bug(
            number=29,
            title="add_business_days lands on Saturdays",
            issue=(
                "```python\n>>> from datetime import date\n>>> add_business_days(date(2024, 3, 1), 1)  # a Friday\n"
                "datetime.date(2024, 3, 2)\n```\n\n2024-03-02 is a Saturday; one business day after Friday "
                "should be Monday 2024-03-04. Going backwards has the same problem."
            ),
            file="spanlib/workdays.py",
            replacements=(("if current.weekday() < 5:", "if current.weekday() < 6:"),),
            test_file="tests/test_workdays.py",
            tests='''

def test_skips_the_weekend_forwards():
    assert add_business_days(date(2024, 3, 1), 1) == date(2024, 3, 4)  # Fri -> Mon
    assert add_business_days(date(2024, 3, 1), 6) == date(2024, 3, 11)


def test_skips_the_weekend_backwards():
    assert add_business_days(date(2024, 3, 4), -1) == date(2024, 3, 1)  # Mon -> Fri
''',
            fail_to_pass=("test_skips_the_weekend_forwards", "test_skips_the_weekend_backwards"),
        ),
    ),
)
