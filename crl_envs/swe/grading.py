"""Grade a model patch the SWE-bench way, with swebench's own log parsers and report.

The model patch is applied to a *fresh* checkout of ``base_commit`` (never the agent's
workspace); the test files are reset to ``base_commit`` and the ``test_patch`` applied on
top; the tests run in a sandbox; the log is parsed by ``swebench.harness.grading``
(``get_logs_eval`` / ``get_eval_report`` with the instance's parser from ``PARSER_REGISTRY``).
Everything that touches the agent's patch (``git apply``, the tests) runs inside the sandbox.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl_envs.swe.instances import SWEInstance, checkout
from crl_envs.swe.sandbox import Limits, Sandbox
from crl_envs.swe.sandboxes import make_sandbox

PATCH_DIR = "/swe_patches"
LOG_BYTES = 4 * 1024 * 1024


def _swebench():
    try:
        from swebench.harness import constants, grading
        from swebench.harness.utils import make_test_spec, record_test_exit_code
        from swebench.types import TestSpec
    except ImportError as e:
        raise ImportError('SWE envs need swebench: pip install -e ".[swe]"') from e
    return constants, grading, make_test_spec, record_test_exit_code, TestSpec


@dataclass
class GradeResult:
    """The outcome of grading one patch."""

    resolved: bool
    progress: float
    patch_applied: bool
    f2p_passed: list[str] = field(default_factory=list)
    f2p_failed: list[str] = field(default_factory=list)
    p2p_passed: list[str] = field(default_factory=list)
    p2p_failed: list[str] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    log: str = ""
    note: str = ""

    def summary(self) -> str:
        """A short human-readable account for the agent's last observation."""
        if self.note:
            head = f"Not resolved: {self.note}."
        elif not self.patch_applied:
            head = "Not resolved: the patch did not apply to a fresh checkout (or the tests could not run)."
        else:
            head = "RESOLVED: every FAIL_TO_PASS and PASS_TO_PASS test passes." if self.resolved else "Not resolved."
        n_f2p = len(self.f2p_passed) + len(self.f2p_failed)
        n_p2p = len(self.p2p_passed) + len(self.p2p_failed)
        lines = [head]
        if n_f2p or n_p2p:
            lines.append(f"FAIL_TO_PASS passing: {len(self.f2p_passed)}/{n_f2p}; "
                         f"PASS_TO_PASS passing: {len(self.p2p_passed)}/{n_p2p}.")
        return "\n".join(lines)


def build_test_spec(inst: SWEInstance, workdir: str = "/testbed", patch_dir: str = PATCH_DIR, *,
              instance_script: bool = False):
    """A ``swebench.types.TestSpec`` for ``inst``.

    With ``instance_script`` (the docker sandbox), instances in swebench 5.x form (``image``,
    ``log_parser``, ``eval_type``, ``eval_script``) go through ``swebench.harness.utils.make_test_spec``
    and run their own eval script. Otherwise the eval script is built here from the instance's
    test command, and its ``log_parser``/``eval_type`` are kept.
    """
    _, _, make_test_spec, record_test_exit_code, TestSpec = _swebench()
    if instance_script and inst.image and inst.log_parser and inst.eval_type and inst.eval_script:
        return make_test_spec(inst.to_record())
    return TestSpec(
        instance_id=inst.instance_id,
        image=inst.image,
        eval_script_list=record_test_exit_code(eval_script_lines(inst, workdir, patch_dir)),
        repo=inst.repo,
        version=inst.version,
        FAIL_TO_PASS=list(inst.FAIL_TO_PASS),
        PASS_TO_PASS=list(inst.PASS_TO_PASS),
        log_parser=inst.parser_name,
        eval_type=inst.eval_type or "pass_and_fail",
    )


def eval_script_lines(inst: SWEInstance, workdir: str, patch_dir: str) -> list[str]:
    """Reset the test files, apply the test patch, run the tests between swebench's markers."""
    constants = _swebench()[0]
    files = " ".join(_quote(f) for f in inst.test_files)
    return [
        f"cd {_quote(workdir)}",
        f"git checkout -q {inst.base_commit} -- {files} 2>/dev/null || true",
        f"git apply --verbose {patch_dir}/test.patch || {{ echo '{constants.RESET_FAILED}: the test patch did not "
        "apply'; exit 1; }",
        f"echo '{constants.START_TEST_OUTPUT}'",
        inst.test_command(),
        f"echo '{constants.END_TEST_OUTPUT}'",
        f"git checkout -q {inst.base_commit} -- {files} 2>/dev/null || true",
    ]


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


def apply_model_patch_lines(patch_dir: str) -> list[str]:
    """Apply the model patch as the SWE-bench harness does (git apply, then ``patch --fuzz``)."""
    constants = _swebench()[0]
    p = f"{patch_dir}/model.patch"
    return [
        f"if git apply --verbose {p} || patch --batch --fuzz=5 -p1 -i {p}; then echo '{constants.APPLY_PATCH_PASS}'; "
        f"else echo '{constants.APPLY_PATCH_FAIL}'; exit 1; fi",
    ]


def grade_patch(
    inst: SWEInstance,
    model_patch: str,
    *,
    source: str | Path | None,
    sandbox: str = "bwrap",
    limits: Limits | None = None,
    python: str | None = None,
    timeout_s: float = 300.0,
) -> GradeResult:
    """Apply ``model_patch`` to a fresh checkout, run the instance's tests, grade with swebench.

    Args:
        inst: the instance.
        model_patch: a unified diff (``git diff`` form) against ``base_commit``.
        source: the repository (clone, mirror or bundle); unused for ``sandbox='docker'``.
        sandbox: ``"bwrap"``, ``"docker"`` or ``"local"``.
        limits: limits for the test run (``timeout_s`` overrides its timeout).
        python: the interpreter that runs the tests (bwrap/local).
        timeout_s: wall-clock limit for applying the patches and running the tests.
    """
    constants, grading, *_ = _swebench()
    if not model_patch.strip():
        return GradeResult(False, 0.0, False, f2p_failed=list(inst.FAIL_TO_PASS), note="the patch is empty")
    tmp = Path(tempfile.mkdtemp(prefix="crl-swe-eval-"))
    sb: Sandbox | None = None
    try:
        patches = tmp / "patches"
        patches.mkdir()
        (patches / "model.patch").write_text(model_patch if model_patch.endswith("\n") else model_patch + "\n")
        (patches / "test.patch").write_text(inst.test_patch)
        patches.chmod(0o755)
        for f in patches.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)
        if sandbox == "docker":
            from crl_envs.swe.docker_sandbox import DockerSandbox

            sb = DockerSandbox(inst, limits, mounts={str(patches): PATCH_DIR})
        else:
            if source is None:
                raise ValueError("grading needs the repository source for sandbox='bwrap'/'local'")
            checkout(source, inst.base_commit, tmp / "repo")
            sb = make_sandbox(sandbox, tmp / "repo", limits, {str(patches): PATCH_DIR}, python)
        patch_dir = sb.path(PATCH_DIR)
        spec = build_test_spec(inst, sb.workdir, patch_dir, instance_script=sandbox == "docker")
        script = "\n".join([f"cd {_quote(sb.workdir)}", *apply_model_patch_lines(patch_dir), *spec.eval_script_list])
        res = sb.run(script, timeout_s=timeout_s, output_bytes=LOG_BYTES)
        log = res.output
        if res.timed_out:
            log += f"\n{constants.TESTS_TIMEOUT}\n"
        if res.error:
            log += f"\n{constants.TESTS_ERROR}: {res.error}\n"
        log_path = tmp / "test_output.txt"
        log_path.write_text(log)
        prediction = {"instance_id": inst.instance_id, "model_patch": model_patch, "model_name_or_path": "crl-bench"}
        report = grading.get_eval_report(spec, prediction, str(log_path), include_tests_status=True)[inst.instance_id]
    finally:
        if sb is not None:
            sb.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return _result(report, log, timed_out=res.timed_out)


def _result(report: dict[str, Any], log: str, *, timed_out: bool) -> GradeResult:
    status = report.get("tests_status", {})
    f2p = status.get("FAIL_TO_PASS", {"success": [], "failure": []})
    p2p = status.get("PASS_TO_PASS", {"success": [], "failure": []})
    n_f2p = len(f2p["success"]) + len(f2p["failure"])
    progress = len(f2p["success"]) / n_f2p if n_f2p and not p2p["failure"] else 0.0
    note = "the tests timed out" if timed_out else ""
    return GradeResult(
        resolved=bool(report.get("resolved")),
        progress=progress if report.get("patch_successfully_applied") else 0.0,
        patch_applied=bool(report.get("patch_successfully_applied")),
        f2p_passed=list(f2p["success"]),
        f2p_failed=list(f2p["failure"]),
        p2p_passed=list(p2p["success"]),
        p2p_failed=list(p2p["failure"]),
        report=report,
        log=log,
        note=note,
    )
