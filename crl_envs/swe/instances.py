"""SWE-bench instances: the schema, loaders for JSON/JSONL/parquet, and repository lookup.

An instance file is what users export from SWE-bench Lite/Verified (or write themselves):
a JSON list (or ``{"instances": [...]}``), one JSON object per line (``.jsonl``), or a
parquet table. Both the classic 12-field form (:class:`swebench.types.SWEbenchInstance`) and
swebench 5.x's form with ``image``, ``log_parser``, ``eval_type`` and ``eval_script`` load.
``FAIL_TO_PASS``/``PASS_TO_PASS`` may be lists or JSON-encoded strings, as in the published data.

Exports of the Hugging Face datasets load as written: ``Dataset.to_json`` (JSON lines, even in a
``.json`` file), every ``DataFrame.to_json`` orient (``columns``, ``records``, ``index``, ``split``),
parquet with ``created_at`` as a timestamp (stored back as ISO text; pandas' epoch milliseconds
too) and ``version`` as a number (a warning: pandas reads ``"1.10"`` as ``1.1``, which names another
version). Extra columns (``difficulty``, ``image_assets``, ...) are kept in ``extra``, JSON-safe.

**Where the repository comes from.** A real instance needs its git repository at
``base_commit``. It is looked up, in order:

1. the instance's own ``repo_path`` field (a clone, a bare mirror or a ``.bundle`` file;
   relative paths are relative to the instance file);
2. ``repos_dir`` (kwarg) or ``$SWE_REPOS``: ``<repos_dir>/<owner>__<name>`` as a clone or
   mirror directory, ``<owner>__<name>.git`` or ``<owner>__<name>.bundle``. For example
   ``git clone --mirror https://github.com/psf/requests $SWE_REPOS/psf__requests.git``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
            "FAIL_TO_PASS", "PASS_TO_PASS")
OPTIONAL_TEXT = ("version", "environment_setup_commit", "hints_text", "created_at", "image", "log_parser",
                 "eval_type", "eval_script", "test_cmd", "repo_path")
_CLASSIC = (*REQUIRED, "version", "environment_setup_commit", "hints_text", "created_at")
_SHA = re.compile(r"^[0-9a-fA-F]{7,40}$")
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
# Test commands for the classic SWE-bench repos whose suites are not run with plain pytest.
_REPO_TEST_CMD = {
    "django/django": "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {django_labels}",
    "sympy/sympy": "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose {files}",
}

# swebench's per-language repo -> log parser tables (Multimodal's JavaScript repos, SWE-bench-java, ...).
_PARSER_TABLES = (("python", "MAP_REPO_TO_PARSER_PY"), ("javascript", "MAP_REPO_TO_PARSER_JS"),
                  ("java", "MAP_REPO_TO_PARSER_JAVA"), ("go", "MAP_REPO_TO_PARSER_GO"),
                  ("rust", "MAP_REPO_TO_PARSER_RUST"), ("c", "MAP_REPO_TO_PARSER_C"),
                  ("php", "MAP_REPO_TO_PARSER_PHP"), ("ruby", "MAP_REPO_TO_PARSER_RUBY"))


class InstanceFileError(ValueError):
    """A malformed instance file; the message names the file, the instance and the field."""


@dataclass(frozen=True)
class SWEInstance:
    """One SWE-bench task instance (field names follow the published datasets)."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    version: str = ""
    environment_setup_commit: str = ""
    hints_text: str = ""
    created_at: str = ""
    image: str = ""
    log_parser: str = ""
    eval_type: str = ""
    eval_script: str = ""
    test_cmd: str = ""
    repo_path: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def test_files(self) -> list[str]:
        """Files the test patch touches (they are reset to ``base_commit`` before it is applied)."""
        return sorted({b for _, b in _DIFF_FILE.findall(self.test_patch)})

    @property
    def parser_name(self) -> str:
        """The swebench log parser (``PARSER_REGISTRY`` key) for this instance."""
        if self.log_parser:
            return self.log_parser
        import importlib

        for module, table_name in _PARSER_TABLES:
            try:
                table = getattr(importlib.import_module(f"swebench.harness.log_parsers.{module}"), table_name)
            except (ImportError, AttributeError):
                continue
            if self.repo in table:
                return table[self.repo].__name__
        return "parse_log_pytest"

    def test_command(self) -> str:
        """The shell command that runs this instance's tests (pytest ``-rA`` unless the repo needs another)."""
        if self.test_cmd:
            return self.test_cmd
        files = " ".join(self.test_files)
        template = _REPO_TEST_CMD.get(self.repo, "python -m pytest -rA -p no:cacheprovider {files}")
        labels = " ".join(f.removeprefix("tests/").removesuffix(".py").replace("/", ".") for f in self.test_files)
        return template.format(files=files, django_labels=labels)

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready dict in the published form (test lists JSON-encoded as strings)."""
        rec = {k: v for k, v in asdict(self).items() if k != "extra" and (v != "" or k in _CLASSIC)}
        rec["FAIL_TO_PASS"] = json.dumps(list(self.FAIL_TO_PASS))
        rec["PASS_TO_PASS"] = json.dumps(list(self.PASS_TO_PASS))
        return {**self.extra, **rec}


def instance_from_dict(raw: Any, where: str) -> SWEInstance:
    """Validate one raw record. ``where`` (file and position) prefixes every error."""
    if not isinstance(raw, dict):
        raise InstanceFileError(f"{where}: an instance must be a JSON object, got {type(raw).__name__}")
    name = raw.get("instance_id")
    where = f"{where} (instance_id={name!r})" if isinstance(name, str) else where
    missing = [k for k in REQUIRED if k not in raw or raw[k] is None]
    if missing:
        raise InstanceFileError(f"{where}: missing required field {missing[0]!r} (required: {', '.join(REQUIRED)})")
    values: dict[str, Any] = {key: _text(raw.get(key), key, where) for key in REQUIRED[:6] + OPTIONAL_TEXT}
    if not _SHA.match(values["base_commit"]):
        raise InstanceFileError(f"{where}: field 'base_commit' must be a git commit sha, got {values['base_commit']!r}")
    if not _REPO.match(values["repo"]):
        raise InstanceFileError(f"{where}: field 'repo' must look like 'owner/name', got {values['repo']!r}")
    if not values["instance_id"]:
        raise InstanceFileError(f"{where}: field 'instance_id' must not be empty")
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        values[key] = _test_list(raw[key], where, key)
    if not values["FAIL_TO_PASS"]:
        raise InstanceFileError(f"{where}: field 'FAIL_TO_PASS' is empty; an instance needs a test that the fix makes pass")
    extra = {k: _plain(v) for k, v in raw.items() if k not in values and not _is_nan(v)}
    return SWEInstance(**values, extra=extra)


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and v != v


def _iso(t: dt.datetime | dt.date) -> str:
    """ISO text as the published data writes it (``2014-11-01T02:20:16Z`` for UTC)."""
    if isinstance(t, dt.datetime) and t.tzinfo is not None and t.utcoffset() == dt.timedelta(0):
        return t.replace(tzinfo=None).isoformat() + "Z"
    return t.isoformat()


def _text(value: Any, key: str, where: str) -> str:
    """A text field; missing/NaN is empty; timestamps and numbers (as pandas exports them) become text."""
    if value is None or _is_nan(value):
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (dt.datetime, dt.date)):  # pandas.Timestamp is a datetime
        return _iso(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if key == "created_at":  # pandas writes datetimes as epoch milliseconds
            seconds = value / 1000 if abs(value) > 1e11 else value
            return _iso(dt.datetime.fromtimestamp(seconds, dt.timezone.utc))
        if key == "version" and isinstance(value, float):
            warnings.warn(f"{where}: field 'version' is a number ({value!r}); SWE-bench versions are text, and a "
                          "number cannot tell '1.10' and '1.1' apart: re-export the file keeping the column as text "
                          "(e.g. pandas.read_json(..., dtype={'version': str}))", UserWarning, stacklevel=4)
        return str(value)
    raise InstanceFileError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")


def _plain(value: Any) -> Any:
    """An extra column's value as plain JSON data (timestamps as ISO text, arrays as lists)."""
    if isinstance(value, (dt.datetime, dt.date)):
        return _iso(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _test_list(value: Any, where: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise InstanceFileError(f"{where}: field {key!r} is a string but not valid JSON ({e})") from e
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise InstanceFileError(f"{where}: field {key!r} must be a list of test names (or a JSON-encoded list)")
    return tuple(value)


def load_instances(path: str | os.PathLike) -> list[SWEInstance]:
    """Load instances from a ``.json``, ``.jsonl`` or ``.parquet`` file.

    Raises:
        InstanceFileError: naming the file, the record and the field at fault.
        FileNotFoundError: when ``path`` does not exist.
    """
    p = Path(path)
    if p.is_dir():  # e.g. a Hugging Face snapshot folder holding data/test-00000-of-00001.parquet
        found = sorted(str(f) for ext in ("parquet", "jsonl", "json") for f in p.rglob(f"*.{ext}"))[:5]
        hint = f"; files here: {', '.join(found)}" if found else ""
        raise InstanceFileError(f"{p}: is a folder; pass one instance file (one split), e.g. "
                                f"data/test-00000-of-00001.parquet of a SWE-bench snapshot{hint}")
    if not p.is_file():
        raise FileNotFoundError(f"SWE instance file not found: {p}")
    suffix = p.suffix.lower()
    records: list[tuple[str, Any]]
    if suffix == ".jsonl":
        records = _jsonl_records(p, _read_text(p))
    elif suffix == ".json":
        records = _json_records(p)
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError('reading parquet instance files needs pyarrow: pip install -e ".[swe]"') from e
        try:
            rows = pq.read_table(p).to_pylist()
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types
            raise InstanceFileError(f"{p}: not a readable parquet file ({e})") from e
        records = [(f"{p} row {i}", r) for i, r in enumerate(rows)]
    else:
        raise InstanceFileError(f"{p}: unknown instance file type {suffix!r}; use .json, .jsonl or .parquet")
    out = [instance_from_dict(r, where) for where, r in records]
    if not out:
        raise InstanceFileError(f"{p}: the file holds no instances")
    seen: set[str] = set()
    for inst in out:
        if inst.instance_id in seen:
            raise InstanceFileError(f"{p}: duplicate instance_id {inst.instance_id!r}")
        seen.add(inst.instance_id)
    base = p.parent
    return [_rebase(inst, base) for inst in out]


def _read_text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8-sig")  # a BOM from Windows tools is dropped
    except UnicodeDecodeError as e:
        raise InstanceFileError(f"{p}: not UTF-8 text ({e})") from e


def _jsonl_records(p: Path, text: str) -> list[tuple[str, Any]]:
    records = []
    for i, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append((f"{p}:{i}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise InstanceFileError(f"{p}:{i}: not valid JSON ({e})") from e
    return records


def _json_records(p: Path) -> list[tuple[str, Any]]:
    """Records of a ``.json`` file: a list, ``{"instances": [...]}``, one instance, any pandas orient, or JSON lines."""
    text = _read_text(p)
    if not text.strip():
        raise InstanceFileError(f"{p}: the file is empty; export the instances again")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON lines in a .json file, as datasets' Dataset.to_json writes it
            return _jsonl_records(p, text)
        raise InstanceFileError(f"{p}: not valid JSON ({e})") from e
    if isinstance(data, dict):
        data = _from_mapping(data)
    if not isinstance(data, list):
        raise InstanceFileError(f"{p}: expected a list of instances, got {type(data).__name__}")
    return [(f"{p}[{i}]", r) for i, r in enumerate(data)]


def _from_mapping(data: dict[str, Any]) -> list[Any]:
    """The instances of a JSON object: ``{"instances": [...]}``, pandas' orients, or one instance."""
    if "instances" in data:
        return data["instances"]
    if set(data) >= {"columns", "data"} and isinstance(data["columns"], list):  # orient="split"
        return [dict(zip(data["columns"], row, strict=False)) if isinstance(row, list) else row for row in data["data"]]
    ids = data.get("instance_id")
    if isinstance(ids, dict):  # orient="columns": column -> {row index -> value}
        return [{col: (vals.get(idx) if isinstance(vals, dict) else None) for col, vals in data.items()}
                for idx in ids]
    if data and "instance_id" not in data and all(isinstance(v, dict) and "instance_id" in v for v in data.values()):
        return list(data.values())  # orient="index": row index -> record
    return [data]


def _rebase(inst: SWEInstance, base: Path) -> SWEInstance:
    if inst.repo_path and not os.path.isabs(inst.repo_path):
        from dataclasses import replace

        return replace(inst, repo_path=str(base / inst.repo_path))
    return inst


def save_instances(instances: list[SWEInstance], path: str | os.PathLike) -> Path:
    """Write instances as ``.jsonl``, ``.json`` or ``.parquet`` (by suffix), in the published form."""
    p = Path(path)
    records = [i.to_record() for i in instances]
    if p.suffix == ".jsonl":
        p.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    elif p.suffix == ".json":
        p.write_text(json.dumps(records, indent=1), encoding="utf-8")
    elif p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), p)
    else:
        raise ValueError(f"unknown instance file type {p.suffix!r}; use .json, .jsonl or .parquet")
    return p


# --------------------------------------------------------------------------- repositories
def find_repo_source(inst: SWEInstance, repos_dir: str | os.PathLike | None = None) -> Path:
    """The clone, mirror or bundle that holds ``inst.base_commit`` (see the module docstring)."""
    tried = []
    if inst.repo_path:
        p = Path(inst.repo_path)
        if p.exists():
            return p
        tried.append(str(p))
    root = repos_dir if repos_dir is not None else os.environ.get("SWE_REPOS")
    if root:
        slug = inst.repo.replace("/", "__")
        for name in (slug, f"{slug}.git", f"{slug}.bundle"):
            p = Path(root) / name
            if p.exists():
                return p
            tried.append(str(p))
    hint = f" (looked in: {', '.join(tried)})" if tried else ""
    raise FileNotFoundError(
        f"No repository for {inst.instance_id} ({inst.repo}){hint}. Put a clone, mirror or bundle at "
        f"$SWE_REPOS/{inst.repo.replace('/', '__')}[.git|.bundle], pass repos_dir=..., or set 'repo_path' "
        f"in the instance."
    )


def git(*args: str, cwd: str | os.PathLike | None = None, check: bool = True, timeout: float = 600) -> str:
    """Run a trusted git command on the host (never on agent-controlled directories)."""
    proc = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-c", "protocol.file.allow=always", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"},
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} failed in {cwd}: {proc.stderr.strip()[:2000]}")
    return proc.stdout


def checkout(source: str | os.PathLike, commit: str, dest: str | os.PathLike) -> Path:
    """Materialise ``commit`` of ``source`` in the new directory ``dest``.

    Only history reachable from ``commit`` is fetched, so later commits (which may hold the
    fix) are not visible to the agent when the source is a directory.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=False)
    git("init", "-q", "-b", "main", cwd=dest)
    src = str(Path(source).resolve())
    try:
        git("fetch", "-q", "--no-tags", src, commit, cwd=dest)
    except RuntimeError:  # an abbreviated sha: fetch everything, then drop the refs
        git("fetch", "-q", "--no-tags", src, "+refs/*:refs/crl-src/*", cwd=dest)
        for ref in git("for-each-ref", "--format=%(refname)", "refs/crl-src", cwd=dest).split():
            git("update-ref", "-d", ref, cwd=dest)
    try:
        git("reset", "-q", "--hard", commit, cwd=dest)
    except RuntimeError as e:
        raise RuntimeError(f"commit {commit} is not in the repository at {src}; point the instance at a clone or "
                           f"mirror that contains it (git fetch it there) ({e})") from e
    return dest
