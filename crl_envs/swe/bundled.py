"""The bundled offline SWE set (``crl/SWE-Mini-v0``), generated in code.

For every bug of every library in :mod:`crl_envs.swe.libs` we commit a small, self-contained
history into the library's git repository: "Initial import" (the library with this bug, and its
tests) and a README commit on top, which is the instance's ``base_commit``. Each instance
lives on its own root, so a workspace fetched at ``base_commit`` holds no commit with the fix.
The gold ``patch`` and the ``test_patch`` are produced by git itself, so they apply exactly.

Commit dates and authors are fixed, so commit shas are the same on every machine. The set is
built once into a cache directory (``$CRL_SWE_CACHE``, else ``~/.cache/crl-bench/swe``) keyed by
a hash of its content, and rebuilt atomically when that changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from crl_envs.swe.instances import SWEInstance, git, load_instances, save_instances
from crl_envs.swe.libs import Bug, Library

BUNDLE_VERSION = 1
_DATE = "2024-05-01T12:00:00+00:00"
_TEST_DEF = re.compile(r"^def (test_\w+)\(", re.M)


def all_libraries() -> list[Library]:
    """Every bundled library, in a fixed order."""
    from crl_envs.swe.libs.inikit import LIBRARY as INIKIT
    from crl_envs.swe.libs.semver import LIBRARY as SEMVER
    from crl_envs.swe.libs.spanlib import LIBRARY as SPANLIB

    return [SEMVER, INIKIT, SPANLIB]


def cache_root() -> Path:
    """Where the bundled set is built (``$CRL_SWE_CACHE`` or ``~/.cache/crl-bench/swe``)."""
    env = os.environ.get("CRL_SWE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "crl-bench" / "swe"


def _fingerprint(libs: list[Library]) -> str:
    blob = json.dumps([BUNDLE_VERSION, [repr(lib) for lib in libs]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def bundled_dir() -> Path:
    """Build the bundled set if needed; return its directory (``instances.jsonl`` and ``repos/``)."""
    libs = all_libraries()
    target = cache_root() / f"bundled-v{BUNDLE_VERSION}-{_fingerprint(libs)}"
    if (target / "instances.jsonl").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        instances = []
        for lib in libs:
            instances += _build_library(lib, tmp / "repos")
        save_instances(instances, tmp / "instances.jsonl")
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first
            if not (target / "instances.jsonl").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def bundled_instances() -> list[SWEInstance]:
    """Every bundled instance (at least 12, across 3 libraries), in a fixed order."""
    return load_instances(bundled_dir() / "instances.jsonl")


def bundled_repos_dir() -> Path:
    """The ``repos_dir`` holding the bundled repositories (``<owner>__<name>`` folders)."""
    return bundled_dir() / "repos"


def _commit(repo: Path, message: str) -> str:
    git("add", "-A", cwd=repo)
    git("-c", "user.name=crl-bench", "-c", "user.email=crl-bench@example.org", "-c", "commit.gpgsign=false",
        "commit", "-q", "--allow-empty", "-m", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo).strip()


def _write(repo: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _buggy(lib: Library, bug: Bug) -> str:
    text = lib.files[bug.file]
    for good, bad in bug.replacements:
        if text.count(good) != 1:
            raise AssertionError(f"{lib.repo}#{bug.number}: snippet must occur once in {bug.file}: {good!r}")
        text = text.replace(good, bad)
    return text


def _build_library(lib: Library, repos: Path) -> list[SWEInstance]:
    repo = repos / lib.repo.replace("/", "__")
    repo.mkdir(parents=True)
    env_backup = {k: os.environ.get(k) for k in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE")}
    os.environ["GIT_AUTHOR_DATE"] = os.environ["GIT_COMMITTER_DATE"] = _DATE
    try:
        git("init", "-q", "-b", "main", cwd=repo)
        out = [_build_instance(lib, bug, repo) for bug in lib.bugs]
    finally:
        for k, v in env_backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def _build_instance(lib: Library, bug: Bug, repo: Path) -> SWEInstance:
    owner, name = lib.repo.split("/")
    instance_id = f"{owner}__{name}-{bug.number}"
    git("checkout", "-q", "--orphan", f"issue-{bug.number}", cwd=repo)
    git("rm", "-rfq", "--ignore-unmatch", ".", cwd=repo)
    files = dict(lib.files)
    files[bug.file] = _buggy(lib, bug)
    _write(repo, files)
    setup_commit = _commit(repo, f"Initial import of {name}")
    _write(repo, {"README.md": files["README.md"] + lib.readme_addition})
    base = _commit(repo, "Document basic usage in the README")
    # the gold patch: the correct source file
    _write(repo, {bug.file: lib.files[bug.file]})
    patch = git("diff", "--no-color", "--no-ext-diff", cwd=repo)
    git("checkout", "-q", "--", ".", cwd=repo)
    # the test patch: the new tests appended to the test file
    _write(repo, {bug.test_file: lib.files[bug.test_file] + bug.tests})
    test_patch = git("diff", "--no-color", "--no-ext-diff", cwd=repo)
    git("checkout", "-q", "--", ".", cwd=repo)
    new_tests = _TEST_DEF.findall(bug.tests)
    if sorted(new_tests) != sorted(bug.fail_to_pass):
        raise AssertionError(f"{instance_id}: fail_to_pass {bug.fail_to_pass} != tests defined {new_tests}")
    base_tests = _TEST_DEF.findall(lib.files[bug.test_file])
    return SWEInstance(
        instance_id=instance_id,
        repo=lib.repo,
        base_commit=base,
        problem_statement=f"{bug.title}\n\n{bug.issue}\n",
        patch=patch,
        test_patch=test_patch,
        FAIL_TO_PASS=tuple(f"{bug.test_file}::{t}" for t in bug.fail_to_pass),
        PASS_TO_PASS=tuple(_expand_parametrized(lib.files[bug.test_file], bug.test_file, base_tests)),
        version="0.1",
        environment_setup_commit=setup_commit,
        created_at="2024-05-01T12:00:00Z",
        log_parser="parse_log_pytest",
        eval_type="pass_and_fail",
        test_cmd=f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider {bug.test_file}",
    )


def _expand_parametrized(source: str, test_file: str, names: list[str]) -> list[str]:
    """Test ids as pytest prints them; parametrized tests list one id per parameter."""
    ids = []
    for name in names:
        m = re.search(r'@pytest\.mark\.parametrize\("\w+", \[([^\]]*)\]\)\ndef ' + name + r"\(", source)
        if m is None:
            ids.append(f"{test_file}::{name}")
            continue
        params = [p.strip().strip('"') for p in m.group(1).split(",")]
        ids += [f"{test_file}::{name}[{p}]" for p in params]
    return ids
