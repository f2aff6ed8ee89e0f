"""inikit: INI-style config parsing, CSV record splitting and slugs."""

from __future__ import annotations

from crl_envs.swe.libs import Bug, Library

_INIT = '''\
"""inikit: small text utilities for config files and flat data."""

from inikit.csvline import split_csv_line
from inikit.ini import ParseError, parse_ini
from inikit.text import slugify

__all__ = ["ParseError", "parse_ini", "slugify", "split_csv_line"]
'''

_INI = '''\
"""Parse INI-style configuration text into nested dicts."""

from __future__ import annotations


class ParseError(ValueError):
    """A line that is neither a section header, a key/value pair nor a comment."""

    def __init__(self, lineno: int, message: str):
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


_COMMENT_PREFIXES = ("#", ";")


def parse_ini(text: str, *, default_section: str = "default") -> dict[str, dict[str, str]]:
    """Parse ``text`` into ``{section: {key: value}}``.

    Section names and keys are case-insensitive (stored lower-case); values keep their case.
    A ``;`` or ``#`` preceded by whitespace starts an inline comment, except inside double quotes.
    """
    data: dict[str, dict[str, str]] = {}
    section = default_section
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(_COMMENT_PREFIXES):
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(lineno, f"unterminated section header {line!r}")
            section = line[1:-1].strip().lower()
            data.setdefault(section, {})
            continue
        if "=" not in line:
            raise ParseError(lineno, f"expected 'key = value', got {line!r}")
        key, value = line.split("=", 1)
        data.setdefault(section, {})[key.strip().lower()] = _strip_inline_comment(value).strip()
    return data


def _strip_inline_comment(value: str) -> str:
    in_quotes = False
    for i, ch in enumerate(value):
        if ch == '"':
            in_quotes = not in_quotes
        elif ch in "#;" and not in_quotes and (i == 0 or value[i - 1].isspace()):
            return value[:i]
    return value
'''

_CSV = '''\
"""Split one CSV record without the csv module's dialect machinery."""

from __future__ import annotations


def split_csv_line(line: str, delimiter: str = ",") -> list[str]:
    """Split one record; double quotes group a field and ``""`` inside quotes is a literal quote."""
    fields: list[str] = []
    buf: list[str] = []
    in_quotes = False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_quotes:
            if ch == '"':
                if i + 1 < len(line) and line[i + 1] == '"':
                    buf.append('"')
                    i += 1
                else:
                    in_quotes = False
            else:
                buf.append(ch)
        elif ch == '"':
            in_quotes = True
        elif ch == delimiter:
            fields.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    if in_quotes:
        raise ValueError(f"unterminated quoted field in {line!r}")
    fields.append("".join(buf))
    return fields
'''

_TEXT = '''\
"""Text helpers."""

from __future__ import annotations

import re
import unicodedata


def slugify(text: str, sep: str = "-") -> str:
    """ASCII, lower-case words joined by ``sep``: ``"Crème Brûlée!"`` -> ``"creme-brulee"``."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return sep.join(re.findall(r"[a-z0-9]+", ascii_text.lower()))
'''

_TEST_INI = '''\
import pytest

from inikit import ParseError, parse_ini

CONFIG = """
# global settings
name = demo

[Server]
Host = example.org
port = 8080   ; the default

[paths]
data = /var/lib/demo
"""


def test_sections_keys_and_values():
    cfg = parse_ini(CONFIG)
    assert cfg["default"] == {"name": "demo"}
    assert cfg["server"] == {"host": "example.org", "port": "8080"}
    assert cfg["paths"]["data"] == "/var/lib/demo"


def test_comment_lines_and_blank_lines_are_skipped():
    assert parse_ini("; only a comment\\n\\n# another\\n") == {}


def test_bad_lines_raise_with_line_number():
    with pytest.raises(ParseError, match="line 2"):
        parse_ini("[a]\\nnot a pair\\n")
    with pytest.raises(ParseError, match="line 1"):
        parse_ini("[broken\\n")
'''

_TEST_CSV = '''\
import pytest

from inikit import split_csv_line


def test_plain_fields():
    assert split_csv_line("a,b,,c") == ["a", "b", "", "c"]


def test_quoted_fields_keep_delimiters():
    assert split_csv_line('x,"hello, world",y') == ["x", "hello, world", "y"]


def test_other_delimiter():
    assert split_csv_line("1;2;3", delimiter=";") == ["1", "2", "3"]


def test_unterminated_quote_is_an_error():
    with pytest.raises(ValueError, match="unterminated"):
        split_csv_line('a,"b')
'''

_TEST_TEXT = '''\
from inikit import slugify


def test_slugify_words():
    assert slugify("Hello World") == "hello-world"
    assert slugify("Crème brûlée") == "creme-brulee"


def test_slugify_custom_separator():
    assert slugify("Release Notes 2024", sep="_") == "release_notes_2024"
'''

LIBRARY = Library(
    repo="crl-mini/inikit",
    description="INI-style config parsing, CSV record splitting and slugs.",
    files={
        "README.md": "# inikit\n\nSmall text utilities: INI-style config parsing, CSV record splitting, slugs.\n",
        "pyproject.toml": '[project]\nname = "inikit"\nversion = "0.2.0"\nrequires-python = ">=3.9"\n',
        "inikit/__init__.py": _INIT,
        "inikit/ini.py": _INI,
        "inikit/csvline.py": _CSV,
        "inikit/text.py": _TEXT,
        "tests/test_ini.py": _TEST_INI,
        "tests/test_csvline.py": _TEST_CSV,
        "tests/test_text.py": _TEST_TEXT,
    },
    readme_addition=(
        "\n## Usage\n\n```python\n>>> from inikit import parse_ini, split_csv_line\n"
        ">>> parse_ini(\"[db]\\nhost = localhost\")\n{'db': {'host': 'localhost'}}\n"
        ">>> split_csv_line('a,\"b, c\"')\n['a', 'b, c']\n```\n"
    ),
    bugs=(
        Bug(
            number=4,
            title="parse_ini crashes on values that contain '='",
            issue=(
                "A config with a URL query string cannot be parsed:\n\n```ini\n[api]\nurl = https://example.org/"
                "search?q=1&page=2\n```\n\n```\n>>> parse_ini(open('app.ini').read())\nValueError: too many "
                "values to unpack (expected 2)\n```\n\nOnly the first `=` should separate the key from the value; "
                "the value should be `https://example.org/search?q=1&page=2`."
            ),
            file="inikit/ini.py",
            replacements=(('key, value = line.split("=", 1)', 'key, value = line.split("=")'),),
            test_file="tests/test_ini.py",
            tests='''

def test_value_may_contain_equals_signs():
    cfg = parse_ini("[api]\\nurl = https://example.org/search?q=1&page=2\\n")
    assert cfg["api"]["url"] == "https://example.org/search?q=1&page=2"
''',
            fail_to_pass=("test_value_may_contain_equals_signs",),
        ),
        Bug(
            number=9,
            title="Semicolons inside quoted values are treated as comments",
            issue=(
                "The docs say inline comments are ignored inside double quotes, but:\n\n```python\n>>> parse_ini("
                "'[db]\\npassword = \"s3cret ;x\" ; prod only')['db']['password']\n'\"s3cret'\n```\n\nExpected "
                "`'\"s3cret ;x\"'` (the comment after the closing quote should still be dropped)."
            ),
            file="inikit/ini.py",
            replacements=(
                (
                    "    in_quotes = False\n    for i, ch in enumerate(value):\n        if ch == '\"':\n"
                    "            in_quotes = not in_quotes\n        elif ch in \"#;\" and not in_quotes and",
                    "    for i, ch in enumerate(value):\n        if ch in \"#;\" and",
                ),
            ),
            test_file="tests/test_ini.py",
            tests='''

def test_comment_markers_inside_quotes_are_kept():
    cfg = parse_ini('[db]\\npassword = "s3cret ;x" ; prod only\\ntag = "a #1"\\n')
    assert cfg["db"]["password"] == '"s3cret ;x"'
    assert cfg["db"]["tag"] == '"a #1"'
''',
            fail_to_pass=("test_comment_markers_inside_quotes_are_kept",),
        ),
        Bug(
            number=15,
            title='split_csv_line does not unescape doubled quotes ("")',
            issue=(
                "RFC 4180: a double quote inside a quoted field is escaped by doubling it. inikit ends the field "
                "instead:\n\n```python\n>>> split_csv_line('1,\"say \"\"hi\"\"\",2')\n['1', 'say hi\"\"', '2']\n"
                "```\n\nExpected `['1', 'say \"hi\"', '2']`. Files exported from spreadsheets hit this all the time."
            ),
            file="inikit/csvline.py",
            replacements=(
                (
                    "            if ch == '\"':\n                if i + 1 < len(line) and line[i + 1] == '\"':\n"
                    "                    buf.append('\"')\n                    i += 1\n                else:\n"
                    "                    in_quotes = False\n",
                    "            if ch == '\"':\n                in_quotes = False\n",
                ),
            ),
            test_file="tests/test_csvline.py",
            tests='''

def test_doubled_quotes_inside_a_quoted_field_are_literal_quotes():
    assert split_csv_line('1,"say ""hi""",2') == ["1", 'say "hi"', "2"]


def test_field_that_is_just_an_escaped_quote():
    assert split_csv_line('"""",x') == ['"', "x"]
''',
            fail_to_pass=(
                "test_doubled_quotes_inside_a_quoted_field_are_literal_quotes",
                "test_field_that_is_just_an_escaped_quote",
            ),
        ),
        Bug(
            number=22,
            title="slugify leaves repeated and trailing separators",
            issue=(
                "```python\n>>> slugify('Hello,  World!')\n'hello---world-'\n```\n\nExpected `'hello-world'`: "
                "runs of punctuation/whitespace should collapse into one separator and none should be left at "
                "either end. Our URLs end up with `---` in them."
            ),
            file="inikit/text.py",
            replacements=(
                (
                    'return sep.join(re.findall(r"[a-z0-9]+", ascii_text.lower()))',
                    'return re.sub(r"[^a-z0-9]", sep, ascii_text.lower())',
                ),
            ),
            test_file="tests/test_text.py",
            tests='''

def test_slugify_collapses_and_trims_separators():
    assert slugify("Hello,  World!") == "hello-world"
    assert slugify("  --Already--Slugged--  ") == "already-slugged"
''',
            fail_to_pass=("test_slugify_collapses_and_trims_separators",),
        ),
    ),
)
