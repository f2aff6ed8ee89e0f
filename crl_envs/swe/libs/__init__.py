"""Small real Python libraries that the bundled SWE set (``crl/SWE-Mini-v0``) is built from.

Each library is written in its *correct* form; each :class:`Bug` lists exact text
replacements that turn a correct file into the buggy one shipped at the instance's base
commit, plus the issue a user would file and the tests that pin the fix.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    """One bundled instance: a realistic bug in a library, its issue and its tests.

    Attributes:
        number: the issue/PR number (the instance id is ``<owner>__<name>-<number>``).
        title: the issue title.
        issue: the issue body a user would write (repro, expected, actual).
        file: the source file the bug lives in.
        replacements: ``(correct, buggy)`` snippets; each ``correct`` occurs once in ``file``.
        test_file: the test file the test patch appends ``tests`` to.
        tests: pytest functions (source) added by the test patch; they fail with the bug.
        fail_to_pass: the names of the functions in ``tests``.
    """

    number: int
    title: str
    issue: str
    file: str
    replacements: tuple[tuple[str, str], ...]
    test_file: str
    tests: str
    fail_to_pass: tuple[str, ...]


@dataclass(frozen=True)
class Library:
    """A small pure-Python library: its files in correct form (tests included) and its bugs.

    ``readme_addition`` is appended to README.md in the second commit of each history.
    """

    repo: str
    description: str
    files: dict[str, str]
    bugs: tuple[Bug, ...]
    readme_addition: str = ""
