"""The SWE text env: fix a real repository's issue with shell commands in a sandbox."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
import warnings
import weakref
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from crl_envs.core import MAX_ACTION_CHARS, MAX_OBS_CHARS, InvalidAction, StepOutcome, TextEnv
from crl_envs.swe.grading import GradeResult, grade_patch
from crl_envs.swe.instances import SWEInstance, checkout, find_repo_source, git, load_instances
from crl_envs.swe.sandbox import Limits, Sandbox, bwrap_mode, free_bytes
from crl_envs.swe.sandboxes import default_sandbox_kind, make_sandbox

SUBMIT = "submit"
ISSUE_CHARS = 8000
LAYOUT_LINES = 60
PATCH_BYTES = 2 * 1024 * 1024
_ORACLE_CHUNK = 3000
_HELP = (
    "Send one bash command per step; it runs in /workspace (the repository) in a fresh sandbox with no network. "
    "Only /workspace persists between commands. Send `submit` when done: your changes (the diff against the base "
    "commit) are applied to a fresh checkout and graded with the repository's tests."
)


class SWEEnv(TextEnv):
    """Resolve a GitHub issue in a real repository, SWE-bench style, through a sandboxed shell.

    ## Description
    Each episode is one SWE-bench instance: a repository at ``base_commit`` and the text of an
    issue. The agent explores and edits the code with shell commands; on ``submit`` (or at the
    step limit) its diff is graded as SWE-bench does: applied to a fresh checkout, the test
    files reset and ``test_patch`` applied, the ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` tests
    run, and the log parsed with swebench's log parsers and ``get_eval_report``.
    ``crl/SWE-Mini-v0`` uses the bundled offline set (14 instances over 3 small libraries, see
    :mod:`crl_envs.swe.bundled`); ``crl/SWE-Bench-v0`` loads real instances from a file.

    ## Action Space
    ``UnicodeText``: a bash command (multi-line allowed, at most 4096 characters), run with
    ``bash -c`` in ``/workspace`` (``/testbed`` with ``sandbox="docker"``), one sandboxed subprocess per command with a wall-clock
    timeout; or ``submit``. A command with a NUL byte, or an empty one, is an invalid move.

    ## Observation Space
    ``UnicodeText``: the issue text, the repository layout, and the last command with its
    output (head and tail kept, the middle replaced by a ``[... N bytes of output truncated ...]``
    marker; undecodable bytes become U+FFFD) and its exit status or the limit that stopped it.

    ## Starting State
    A fresh checkout of the instance's ``base_commit`` (only history up to it), in a new workspace.

    ## Rewards
    1 on the final step if the patch resolves the instance (every FAIL_TO_PASS and PASS_TO_PASS
    test passes), else 0.

    ## Episode End
    Terminates on ``submit``, or (ungraded, reward 0) when the workspace outgrows its disk quota
    (``limits["disk_mb"]``). At ``max_episode_steps`` the current diff is graded as if submitted
    and the episode is truncated.

    ## Information
    ``task`` (the issue), ``admissible_actions`` (``None``), ``valid_action``, ``success``
    (resolved) and ``progress``: the fraction of FAIL_TO_PASS tests passing, but 0 unless every
    PASS_TO_PASS test still passes. Also ``instance_id``, ``repo``, ``base_commit``; after
    grading ``model_patch`` and ``grade`` (test lists and swebench's report).

    ## Arguments
    ``instances``: path to a .json/.jsonl/.parquet instance file (default ``$SWE_INSTANCES``);
    ``bundled``: use the bundled set instead; ``repos_dir``: where repositories live (default
    ``$SWE_REPOS``); ``sandbox``: ``"bwrap"`` (default), ``"docker"`` (one container per episode
    from the instance's image; build images with ``python -m crl_envs.swe.images build``) or
    ``"local"`` (no isolation, opt-in); ``instance_ids``: restrict to these ids; ``command_timeout_s``,
    ``grade_timeout_s``, ``limits`` (dict of :class:`~crl_envs.swe.sandbox.Limits` fields),
    ``output_chars``, ``python`` (interpreter for bwrap/local), ``max_steps`` (the step at which the
    diff is graded; registered equal to ``max_episode_steps``), ``render_mode``.

    ## Version History
    * v0: initial version (bundled set version 1).
    """

    family = "SWE"

    def __init__(
        self,
        instances: str | None = None,
        *,
        bundled: bool = False,
        repos_dir: str | None = None,
        sandbox: str | None = None,
        instance_ids: list[str] | None = None,
        command_timeout_s: float = 60.0,
        grade_timeout_s: float = 900.0,
        limits: dict[str, Any] | None = None,
        output_chars: int = 12000,
        python: str | None = None,
        max_steps: int = 50,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if bundled:
            from crl_envs.swe.bundled import bundled_instances, bundled_repos_dir

            self.instances = bundled_instances()
            repos_dir = repos_dir or str(bundled_repos_dir())
        else:
            path = instances or os.environ.get("SWE_INSTANCES")
            if not path:
                raise ValueError(
                    "crl/SWE-Bench-v0 needs SWE-bench instances: pass instances='path/to/instances.jsonl' "
                    "(.json/.jsonl/.parquet exported from SWE-bench Lite/Verified) or set $SWE_INSTANCES; "
                    "use crl/SWE-Mini-v0 for the bundled offline set."
                )
            self.instances = load_instances(path)
        if instance_ids:
            wanted = set(instance_ids)
            self.instances = [i for i in self.instances if i.instance_id in wanted]
            if not self.instances:
                raise ValueError(f"none of instance_ids={sorted(wanted)[:5]} is in the instance file")
        self.repos_dir = repos_dir
        self.sandbox_kind = sandbox or default_sandbox_kind()
        if self.sandbox_kind == "bwrap":
            bwrap_mode()  # fail now, with the fix named, if bubblewrap cannot run here
        elif self.sandbox_kind not in ("docker", "local"):
            raise ValueError(f"unknown sandbox {self.sandbox_kind!r}; use 'bwrap', 'docker' or 'local'")
        if self.sandbox_kind == "docker":  # docker images hold their repos; they must be in the engine
            self._check_images()
        else:
            self._check_repositories()
        known = {f.name for f in fields(Limits)}
        bad = set(limits or {}) - known
        if bad:
            raise ValueError(f"unknown limits {sorted(bad)}; known: {sorted(known)}")
        self.limits = Limits(**{"timeout_s": command_timeout_s, **(limits or {})})
        self.grade_timeout_s = float(grade_timeout_s)
        # submit = take the diff (<= max(60 s, a command)) + grade (<= grade_timeout_s) + cleanup
        self.step_time_limit_s = self.grade_timeout_s + 2 * max(60.0, self.limits.timeout_s) + 30.0
        self.output_chars = int(output_chars)
        self.python = python
        self._inst: SWEInstance | None = None
        self._sandbox: Sandbox | None = None
        self._workdir: Path | None = None
        self._cleanup: weakref.finalize | None = None
        self._free_at_open = 0
        self._layout = ""
        self._steps = 0
        self._max_steps = int(max_steps)
        self._oracle_plan: list[str] = []
        self.last_grade: GradeResult | None = None

    # ------------------------------------------------------------------ env
    def _reset_task(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        self._teardown()
        wanted = (options or {}).get("instance_id")
        if wanted is not None:
            matches = [i for i in self.instances if i.instance_id == wanted]
            if not matches:
                raise ValueError(f"unknown instance_id {wanted!r}")
            inst = matches[0]
        else:
            inst = self.instances[int(self.np_random.integers(len(self.instances)))]
        self._inst = inst
        self._steps = 0
        self._oracle_plan = []
        self.last_grade = None
        self._open_workspace(inst)
        info = {"task": inst.problem_statement, "instance_id": inst.instance_id, "repo": inst.repo,
                "base_commit": inst.base_commit}
        return self._render("(no command yet)"), info

    def _open_workspace(self, inst: SWEInstance) -> None:
        if self.sandbox_kind == "docker":
            from crl_envs.swe.docker_sandbox import DockerSandbox

            self._sandbox = DockerSandbox(inst, self.limits)
            listing = self._sandbox.run(f"git ls-tree -r --name-only {inst.base_commit}", output_bytes=1 << 20).output
            if self._sandbox.local_workspace:
                self._free_at_open = free_bytes(self._sandbox.workspace)
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="crl-swe-ws-"))
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._workdir), True)
            repo = checkout(find_repo_source(inst, self.repos_dir), inst.base_commit, self._workdir / "repo")
            listing = git("ls-tree", "-r", "--name-only", inst.base_commit, cwd=repo)
            self._sandbox = make_sandbox(self.sandbox_kind, repo, self.limits, python=self.python)
            self._free_at_open = free_bytes(self._workdir)
        self._layout = render_layout(listing.split("\n"), inst.base_commit, workdir=self._workdir_name())

    def normalize_action(self, action: str) -> str:
        return action.strip()

    def _apply(self, action: str) -> StepOutcome:
        assert self._sandbox is not None
        if action.lower() == SUBMIT:
            return self._submit("submitted")
        res = self._sandbox.run(action)
        if res.error == "the command contains a NUL byte":
            raise InvalidAction("the command contains a NUL byte; send plain shell text.")
        output = res.output
        if len(output) > self.output_chars:
            keep = self.output_chars // 2
            output = f"{output[:keep]}\n[... {len(output) - 2 * keep:,} characters truncated ...]\n{output[-keep:]}"
        text = f"$ {_clip(action, 2000)}\n{output}{'' if output.endswith(chr(10)) or not output else chr(10)}"
        text += res.status_line(self.limits.timeout_s)
        info = {"exit_code": res.exit_code, "timed_out": res.timed_out}
        if self._over_disk_quota():
            self._teardown()  # free the disk now
            text += (f"\nThe workspace grew past its disk quota ({self.limits.disk_mb} MiB); it was deleted and the "
                     "episode is over (not graded).")
            return StepOutcome(self._render(text), terminated=True, info={**info, "disk_quota_exceeded": True})
        return StepOutcome(self._render(text), info=info)

    def _over_disk_quota(self) -> bool:
        """Whether the workspace outgrew ``limits.disk_mb`` (walked only when the filesystem filled up)."""
        sb = self._sandbox
        if sb is None or not (self._workdir is not None or getattr(sb, "local_workspace", False)):
            return False
        quota = self.limits.disk_mb * 1024 * 1024
        if self._free_at_open - free_bytes(sb.workspace) <= quota:
            return False
        return self._sandbox.workspace_bytes() > quota

    def _check_images(self) -> None:
        """Fail at ``make`` when no instance has its Docker image; warn when only some have."""
        from crl_envs.swe.docker_sandbox import docker_available
        from crl_envs.swe.images import ImageMissing, resolve_image
        from crl_envs.swe.sandbox import SandboxUnavailable

        reason = docker_available()
        if reason:
            raise SandboxUnavailable(f"sandbox='docker' needs a running Docker engine: {reason}. Use "
                                     "sandbox='bwrap' (apt-get install bubblewrap) instead.")
        missing: dict[str, str] = {}
        for inst in self.instances:
            try:
                resolve_image(inst)
            except ImageMissing as e:
                missing[inst.instance_id] = str(e)
        if len(missing) == len(self.instances):
            raise ImageMissing(f"none of the {len(self.instances)} instances has its Docker image; for example: "
                               f"{next(iter(missing.values()))}")
        if missing:
            warnings.warn(f"{len(missing)} of {len(self.instances)} instances have no Docker image "
                          f"({', '.join(sorted(missing)[:5])}); their episodes fail at reset. Build them with "
                          "`python -m crl_envs.swe.images build`.", stacklevel=3)

    def _check_repositories(self) -> None:
        """Fail at ``make`` when no instance's repository is on disk; warn when only some are."""
        missing: dict[str, str] = {}
        for inst in self.instances:
            try:
                find_repo_source(inst, self.repos_dir)
            except FileNotFoundError as e:
                missing[inst.instance_id] = str(e)
        if not missing:
            return
        if len(missing) == len(self.instances):
            raise FileNotFoundError(f"none of the {len(self.instances)} instances has its repository on disk; "
                                    f"for example: {next(iter(missing.values()))}")
        repos = sorted({i.repo for i in self.instances if i.instance_id in missing})
        warnings.warn(f"{len(missing)} of {len(self.instances)} instances have no repository on disk "
                      f"({', '.join(repos[:5])}{', ...' if len(repos) > 5 else ''}); their episodes fail at reset. "
                      "Pass instance_ids=... to play only the others.", stacklevel=3)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._steps += 1
        obs, reward, terminated, truncated, info = super().step(action)
        if not terminated and not self._done and self._inst is not None and self._steps >= self._max_steps:
            outcome = self._submit("step limit reached")
            self._success, self._progress, self._done = outcome.success, outcome.progress, True
            self._last_obs = outcome.obs
            info = {**info, **outcome.info, **self._info(valid=bool(info["valid_action"]))}
            return outcome.obs, outcome.reward, False, True, info
        return obs, reward, terminated, truncated, info

    def _submit(self, why: str) -> StepOutcome:
        assert self._sandbox is not None and self._inst is not None
        inst = self._inst
        patch, problem = self.extract_patch()
        if problem:
            grade = GradeResult(False, 0.0, False, f2p_failed=list(inst.FAIL_TO_PASS), note=problem)
        else:
            source = None if self.sandbox_kind == "docker" else find_repo_source(inst, self.repos_dir)
            limits = replace(self.limits, timeout_s=self.grade_timeout_s,
                             cpu_s=max(self.limits.cpu_s, int(self.grade_timeout_s)))  # a whole test run
            grade = grade_patch(inst, patch, source=source, sandbox=self.sandbox_kind, limits=limits,
                                python=self.python, timeout_s=self.grade_timeout_s)
        self.last_grade = grade
        text = f"Episode over ({why}). Your patch: {len(patch.splitlines())} diff lines.\n{grade.summary()}"
        info = {"instance_id": inst.instance_id, "model_patch": patch, "resolved": grade.resolved,
                "grade": {"patch_applied": grade.patch_applied, "f2p_passed": grade.f2p_passed,
                          "f2p_failed": grade.f2p_failed, "p2p_passed": grade.p2p_passed,
                          "p2p_failed": grade.p2p_failed, "note": grade.note}}
        return StepOutcome(self._render(text), reward=1.0 if grade.resolved else 0.0, terminated=True,
                           success=grade.resolved, progress=grade.progress, info=info)

    def extract_patch(self) -> tuple[str, str]:
        """The workspace's diff against ``base_commit`` (new files included), computed inside the sandbox.

        Returns:
            ``(patch, problem)``; ``problem`` is non-empty when no usable patch could be taken.
        """
        assert self._sandbox is not None and self._inst is not None
        cmd = ("git add -A >/dev/null 2>&1; git -c core.quotepath=off diff --cached --binary --no-color --no-ext-diff "
               f"{self._inst.base_commit}")
        res = self._sandbox.run(cmd, timeout_s=max(60.0, self.limits.timeout_s), output_bytes=PATCH_BYTES)
        if res.timed_out or res.error:
            return "", "the diff could not be taken from the workspace"
        if res.output_truncated:
            return "", f"the diff is larger than {PATCH_BYTES // (1024 * 1024)} MiB"
        if res.exit_code != 0:
            return "", f"`git diff` failed in the workspace: {_clip(res.output, 300)}"
        return res.output, ""

    def _render(self, last: str) -> str:
        inst = self._inst
        assert inst is not None
        issue = _clip(inst.problem_statement.strip(), ISSUE_CHARS)
        obs = (f"# Issue ({inst.repo}, {inst.instance_id})\n{issue}\n\n# Repository layout\n{self._layout}\n\n"
               f"# Last command (step {self._steps}/{self._max_steps})\n{last}\n\n# How to act\n{self._help()}")
        return _clip(obs, MAX_OBS_CHARS - 100)

    def _help(self) -> str:
        return _HELP.replace("/workspace", self._workdir_name())

    def _workdir_name(self) -> str:
        """Where commands run, as the agent sees it (the docker images keep SWE-bench's /testbed)."""
        return "/testbed" if self.sandbox_kind == "docker" else "/workspace"

    # --------------------------------------------------------------- oracle
    def oracle_action(self) -> str:
        """Reset the workspace, write the gold patch in base64 chunks, ``git apply`` it, then ``submit``."""
        assert self._inst is not None
        if not self._oracle_plan:
            b64 = base64.b64encode(self._inst.patch.encode()).decode()
            store = ".git/crl_gold.b64"
            steps = [f"git reset -q --hard {self._inst.base_commit} && git clean -fdxq && rm -f {store}"]
            steps += [f"printf '%s' '{b64[i:i + _ORACLE_CHUNK]}' >> {store}" for i in range(0, len(b64), _ORACLE_CHUNK)]
            steps += [f"base64 -d {store} > .git/crl_gold.patch && git apply .git/crl_gold.patch && "
                      f"rm -f {store} .git/crl_gold.patch && git status --short"]
            joined = " && ".join(f"{{ {s}; }}" for s in steps)
            plan = [joined] if len(joined) <= MAX_ACTION_CHARS else steps  # one command when it fits
            plan.append(SUBMIT)
            self._oracle_plan = plan
        return self._oracle_plan.pop(0)

    # ------------------------------------------------------------ lifecycle
    def _teardown(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
        if self._cleanup is not None:
            self._cleanup()
            self._cleanup = None
        self._workdir = None

    def close(self) -> None:
        self._teardown()
        super().close()


def render_layout(paths: list[str], base_commit: str, max_lines: int = LAYOUT_LINES, workdir: str = "/workspace") -> str:
    """The repository's files as a compact tree: every file for small repos, directories with counts for big ones."""
    files = sorted(p for p in paths if p)
    header = f"{workdir} at base commit {base_commit[:12]} ({len(files)} tracked files)"
    if len(files) <= max_lines:
        return "\n".join([header, *files])
    for depth in (3, 2, 1):
        counts: dict[str, int] = {}
        for f in files:
            parts = f.split("/")
            key = "/".join(parts[:depth]) + ("/" if len(parts) > depth else "")
            counts[key] = counts.get(key, 0) + 1
        if len(counts) <= max_lines or depth == 1:
            rows = [f"{k}  ({n} files)" if k.endswith("/") else k for k, n in sorted(counts.items())]
            if len(rows) > max_lines:
                rows = [*rows[:max_lines], f"... {len(rows) - max_lines} more entries"]
            return "\n".join([header, *rows])
    return header


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else f"{text[:n]}\n[... {len(text) - n:,} characters truncated ...]"
