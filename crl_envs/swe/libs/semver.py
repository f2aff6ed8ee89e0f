"""tinysemver: parse, compare, bump and match semantic versions."""

from __future__ import annotations

from crl_envs.swe.libs import Bug, Library

_INIT = '''\
"""tinysemver: parse, compare, bump and match semantic versions (https://semver.org)."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

__all__ = ["InvalidVersion", "Version", "parse", "satisfies"]
__version__ = "0.3.1"

_PATTERN = re.compile(
    r"^(?P<major>0|[1-9]\\d*)\\.(?P<minor>0|[1-9]\\d*)\\.(?P<patch>0|[1-9]\\d*)"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\\.[0-9A-Za-z-]+)*))?"
    r"(?:\\+(?P<build>[0-9A-Za-z-]+(?:\\.[0-9A-Za-z-]+)*))?$"
)


class InvalidVersion(ValueError):
    """Raised for text that is not a semantic version or a version range."""


def _pre_key(pre: tuple[str, ...]) -> tuple:
    """Sort key for pre-release identifiers (a release sorts after its pre-releases)."""
    if not pre:
        return (1, ())
    return (0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre))


@dataclass(frozen=True, eq=False)
class Version:
    """A semantic version; build metadata is kept but ignored by comparisons."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    def _key(self) -> tuple:
        return (self.major, self.minor, self.patch, _pre_key(self.pre))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Version) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: Version) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: Version) -> bool:
        return self._key() >= other._key()

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def bump_major(self) -> Version:
        return Version(self.major + 1, 0, 0)

    def bump_minor(self) -> Version:
        return Version(self.major, self.minor + 1, 0)

    def bump_patch(self) -> Version:
        if self.pre:  # 1.2.3-rc.1 -> 1.2.3
            return Version(self.major, self.minor, self.patch)
        return Version(self.major, self.minor, self.patch + 1)


def parse(text: str) -> Version:
    """Parse ``MAJOR.MINOR.PATCH[-PRE][+BUILD]``."""
    m = _PATTERN.match(text.strip())
    if m is None:
        raise InvalidVersion(f"not a semantic version: {text!r}")
    pre = tuple(m["pre"].split(".")) if m["pre"] else ()
    build = tuple(m["build"].split(".")) if m["build"] else ()
    return Version(int(m["major"]), int(m["minor"]), int(m["patch"]), pre, build)


_OPS = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}


def _caret_upper(v: Version) -> Version:
    """Exclusive upper bound of ``^v``: the next version that changes the left-most non-zero part."""
    if v.major > 0:
        return Version(v.major + 1, 0, 0)
    if v.minor > 0:
        return Version(0, v.minor + 1, 0)
    return Version(0, 0, v.patch + 1)


def satisfies(version: str | Version, spec: str) -> bool:
    """Whether ``version`` matches every comma-separated clause of ``spec``.

    Clauses: ``>=1.2.0``, ``<2.0.0``, ``==1.2.3``, ``!=1.2.4``, ``^1.2.3``, ``~1.2.3``.
    """
    v = parse(version) if isinstance(version, str) else version
    for clause in spec.split(","):
        clause = clause.strip()
        if not clause:
            continue
        if clause[0] == "^":
            low = parse(clause[1:])
            ok = low <= v < _caret_upper(low)
        elif clause[0] == "~":
            low = parse(clause[1:])
            ok = low <= v < Version(low.major, low.minor + 1, 0)
        else:
            for op in _OPS:
                if clause.startswith(op):
                    ok = _OPS[op](v, parse(clause[len(op):]))
                    break
            else:
                raise InvalidVersion(f"unknown comparator in {clause!r}")
        if not ok:
            return False
    return True
'''

_TESTS = '''\
import pytest

from tinysemver import InvalidVersion, parse, satisfies


def test_parse_components():
    v = parse("1.2.3-rc.1+build.5")
    assert (v.major, v.minor, v.patch) == (1, 2, 3)
    assert v.pre == ("rc", "1") and v.build == ("build", "5")


@pytest.mark.parametrize("text", ["1.2", "01.2.3", "a.b.c", "1.2.3-", ""])
def test_parse_rejects_garbage(text):
    with pytest.raises(InvalidVersion):
        parse(text)


def test_str_round_trips():
    for text in ["0.0.1", "1.2.3-alpha.1", "10.20.30+meta", "1.0.0-x.7.z.92+exp.sha.5114f85"]:
        assert str(parse(text)) == text


def test_release_ordering_is_numeric():
    assert parse("1.2.3") < parse("1.10.0") < parse("2.0.0")
    assert sorted(["2.0.0", "1.10.0", "1.2.3"], key=parse) == ["1.2.3", "1.10.0", "2.0.0"]


def test_build_metadata_is_ignored_in_equality():
    assert parse("1.0.0+a") == parse("1.0.0+b")
    assert len({parse("1.0.0+a"), parse("1.0.0")}) == 1


def test_bump_major_and_patch():
    assert str(parse("1.4.7").bump_major()) == "2.0.0"
    assert str(parse("1.4.7").bump_patch()) == "1.4.8"
    assert str(parse("1.5.0-rc.1").bump_patch()) == "1.5.0"


def test_satisfies_strict_comparators():
    assert satisfies("1.5.0", ">1.0.0, <2.0.0")
    assert not satisfies("2.0.0", "<2.0.0")
    assert satisfies("1.2.3", "==1.2.3") and satisfies("1.2.4", "!=1.2.3")


def test_caret_and_tilde_ranges():
    assert satisfies("1.9.9", "^1.2.3") and not satisfies("2.0.0", "^1.2.3")
    assert satisfies("1.2.9", "~1.2.3") and not satisfies("1.3.0", "~1.2.3")


def test_unknown_comparator_is_an_error():
    with pytest.raises(InvalidVersion):
        satisfies("1.0.0", "=~1.0.0")
'''

LIBRARY = Library(
    repo="crl-mini/tinysemver",
    description="Parse, compare, bump and match semantic versions.",
    files={
        "README.md": "# tinysemver\n\nParse, compare, bump and match [semantic versions](https://semver.org).\n",
        "pyproject.toml": '[project]\nname = "tinysemver"\nversion = "0.3.1"\nrequires-python = ">=3.9"\n',
        "tinysemver/__init__.py": _INIT,
        "tests/test_semver.py": _TESTS,
    },
    readme_addition=(
        "\n## Usage\n\n```python\n>>> from tinysemver import parse, satisfies\n"
        ">>> parse(\"1.2.3\") < parse(\"1.10.0\")\nTrue\n>>> satisfies(\"1.4.0\", \"^1.2.0\")\nTrue\n```\n"
    ),
    bugs=(
        Bug(
            number=12,
            title="Pre-releases sort after the release they precede",
            issue=(
                "According to the SemVer spec a pre-release has lower precedence than the associated normal "
                "version, but tinysemver orders them the other way round:\n\n```python\n>>> from tinysemver "
                "import parse\n>>> parse(\"1.0.0-rc.1\") < parse(\"1.0.0\")\nFalse\n```\n\nThis breaks our "
                "release tooling: `max()` over the published versions picks `1.0.0-rc.1` instead of `1.0.0`, "
                "and `satisfies(\"1.0.0-rc.1\", \"<1.0.0\")` is False. Expected: `1.0.0-alpha < 1.0.0-rc.1 < 1.0.0`."
            ),
            file="tinysemver/__init__.py",
            replacements=(
                ("        return (1, ())\n    return (0, tuple(", "        return (0, ())\n    return (1, tuple("),
            ),
            test_file="tests/test_semver.py",
            tests='''

def test_prerelease_sorts_before_its_release():
    assert parse("1.0.0-rc.1") < parse("1.0.0")
    assert max(["1.0.0-rc.1", "1.0.0", "0.9.0"], key=parse) == "1.0.0"


def test_range_upper_bound_admits_prereleases_of_the_bound():
    assert satisfies("1.0.0-rc.1", "<1.0.0")
''',
            fail_to_pass=("test_prerelease_sorts_before_its_release", "test_range_upper_bound_admits_prereleases_of_the_bound"),
        ),
        Bug(
            number=17,
            title="Numeric pre-release identifiers compare as strings (alpha.10 < alpha.2)",
            issue=(
                "Spec item 11.4.1: identifiers consisting of only digits are compared numerically. "
                "tinysemver compares them as text:\n\n```python\n>>> parse(\"1.0.0-alpha.10\") > "
                "parse(\"1.0.0-alpha.2\")\nFalse\n```\n\nSo our nightly builds `-dev.10`, `-dev.11` are "
                "considered older than `-dev.9`. Numeric identifiers should also sort before alphanumeric ones "
                "(`1.0.0-alpha.1 < 1.0.0-alpha.beta`)."
            ),
            file="tinysemver/__init__.py",
            replacements=(
                ('tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre)', "tuple((1, 0, p) for p in pre)"),
            ),
            test_file="tests/test_semver.py",
            tests='''

def test_numeric_prerelease_identifiers_compare_numerically():
    assert parse("1.0.0-alpha.2") < parse("1.0.0-alpha.10")
    assert sorted(["1.0.0-dev.10", "1.0.0-dev.9", "1.0.0-dev.11"], key=parse)[-1] == "1.0.0-dev.11"
''',
            fail_to_pass=("test_numeric_prerelease_identifiers_compare_numerically",),
        ),
        Bug(
            number=21,
            title="bump_minor() keeps the patch number",
            issue=(
                "`Version.bump_minor()` should reset the patch component, like `bump_major()` resets minor and "
                "patch:\n\n```python\n>>> str(parse(\"1.4.7\").bump_minor())\n'1.5.7'\n```\n\nExpected "
                "`'1.5.0'`. Our release script produced a 2.3.4 release right after 2.2.4 because of this."
            ),
            file="tinysemver/__init__.py",
            replacements=(
                ("return Version(self.major, self.minor + 1, 0)", "return Version(self.major, self.minor + 1, self.patch)"),
            ),
            test_file="tests/test_semver.py",
            tests='''

def test_bump_minor_resets_patch():
    assert str(parse("1.4.7").bump_minor()) == "1.5.0"
    assert str(parse("0.0.9").bump_minor()) == "0.1.0"
''',
            fail_to_pass=("test_bump_minor_resets_patch",),
        ),
        Bug(
            number=26,
            title="Caret ranges on 0.x versions allow breaking minor releases",
            issue=(
                "For versions below 1.0.0 the caret should only allow changes that do not modify the left-most "
                "non-zero component (as npm and cargo do): `^0.2.3` means `>=0.2.3 <0.3.0` and `^0.0.3` means "
                "`>=0.0.3 <0.0.4`. tinysemver treats every caret like a major-version caret:\n\n```python\n>>> "
                "satisfies(\"0.9.0\", \"^0.2.3\")\nTrue\n```\n\nWe pinned a 0.x dependency with `^` and got a "
                "breaking release."
            ),
            file="tinysemver/__init__.py",
            replacements=(
                (
                    "    if v.major > 0:\n        return Version(v.major + 1, 0, 0)\n    if v.minor > 0:\n"
                    "        return Version(0, v.minor + 1, 0)\n    return Version(0, 0, v.patch + 1)\n",
                    "    return Version(v.major + 1, 0, 0)\n",
                ),
            ),
            test_file="tests/test_semver.py",
            tests='''

def test_caret_on_zero_minor_versions_stops_at_the_next_minor():
    assert satisfies("0.2.9", "^0.2.3")
    assert not satisfies("0.3.0", "^0.2.3")


def test_caret_on_zero_zero_versions_pins_the_patch():
    assert satisfies("0.0.3", "^0.0.3")
    assert not satisfies("0.0.4", "^0.0.3")
''',
            fail_to_pass=(
                "test_caret_on_zero_minor_versions_stops_at_the_next_minor",
                "test_caret_on_zero_zero_versions_pins_the_patch",
            ),
        ),
        Bug(
            number=31,
            title="satisfies() raises on inclusive comparators (>=, <=)",
            issue=(
                "```python\n>>> satisfies(\"1.2.0\", \">=1.2.0\")\nTraceback (most recent call last):\n  ...\n"
                "tinysemver.InvalidVersion: not a semantic version: '=1.2.0'\n```\n\n`>=` and `<=` are "
                "documented in the docstring but every range that uses them blows up. Looks like the operator "
                "is matched as `>` and the rest is parsed as the version."
            ),
            file="tinysemver/__init__.py",
            replacements=(
                (
                    '    ">=": operator.ge,\n    "<=": operator.le,\n    "==": operator.eq,\n    "!=": operator.ne,\n'
                    '    ">": operator.gt,\n    "<": operator.lt,\n',
                    '    ">": operator.gt,\n    "<": operator.lt,\n    ">=": operator.ge,\n    "<=": operator.le,\n'
                    '    "==": operator.eq,\n    "!=": operator.ne,\n',
                ),
            ),
            test_file="tests/test_semver.py",
            tests='''

def test_inclusive_comparators():
    assert satisfies("1.2.0", ">=1.2.0") and satisfies("2.0.0", "<=2.0.0")
    assert not satisfies("1.1.9", ">=1.2.0, <2.0.0")
''',
            fail_to_pass=("test_inclusive_comparators",),
        ),
    ),
)
