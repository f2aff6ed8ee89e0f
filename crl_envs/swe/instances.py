"""SWE-bench instances: the schema, loaders for JSON/JSONL/parquet, and repository lookup.

An instance file is what users export from SWE-bench Lite/Verified (or write themselves):
a JSON list (or ``{"instances": [...]}``), one JSON object per line (``.jsonl``), or a
parquet table. Both the classic 12-field form (:class:`swebench.types.SWEbenchInstance`) and
swebench 5.x's form with ``image``, ``log_parser``, ``eval_type`` and ``eval_script`` load.
``FAIL_TO_PASS``/``PASS_TO_PASS`` may be lists or JSON-encoded strings, as in the published data.

**Where the repository comes from.** A real instance needs its git repository at
``base_commit``. It is looked up, in order:

1. the instance's own ``repo_path`` field (a clone, a bare mirror or a ``.bundle`` file;
   relative paths are relative to the instance file);
2. ``repos_dir`` (kwarg) or ``$SWE_REPOS``: ``<repos_dir>/<owner>__<name>`` as a clone or
   mirror directory, ``<owner>__<name>.git`` or ``<owner>__<name>.bundle``. For example
   ``git clone --mirror https://github.com/psf/requests $SWE_REPOS/psf__requests.git``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
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
        try:
            from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY

            return MAP_REPO_TO_PARSER_PY[self.repo].__name__
        except (ImportError, KeyError):
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
    values: dict[str, Any] = {}
    for key in REQUIRED[:6] + OPTIONAL_TEXT:
        value = raw.get(key, "")
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise InstanceFileError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
        values[key] = value
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
    extra = {k: v for k, v in raw.items() if k not in values and not _is_nan(v)}
    return SWEInstance(**values, extra=extra)


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and v != v


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
    if not p.is_file():
        raise FileNotFoundError(f"SWE instance file not found: {p}")
    suffix = p.suffix.lower()
    records: list[tuple[str, Any]]
    if suffix == ".jsonl":
        records = []
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    records.append((f"{p}:{i}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise InstanceFileError(f"{p}:{i}: not valid JSON ({e})") from e
    elif suffix == ".json":
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise InstanceFileError(f"{p}: not valid JSON ({e})") from e
        if isinstance(data, dict):
            data = data.get("instances", [data])
        if not isinstance(data, list):
            raise InstanceFileError(f"{p}: expected a list of instances, got {type(data).__name__}")
        records = [(f"{p}[{i}]", r) for i, r in enumerate(data)]
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
