from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_finds_no_problems():
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    if not os.path.exists(ruff):
        pytest.skip("ruff is not installed (it comes with the test extra)")
    proc = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_crl_envs_never_imports_crl_agent_or_eval():
    code = "import sys, crl_envs, crl_envs.testing, crl_envs.registry; " \
           "bad = [m for m in sys.modules if m.split('.')[0] in ('crl_agent', 'eval')]; print(bad); assert not bad"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True)
