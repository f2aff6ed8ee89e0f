"""The README's TRL snippets run as written, each for one GRPO step against a real ``python -m crl_envs.serve``.

Each ``python`` block of the README's TRL section runs unchanged in a subprocess; only three things are
swapped in from outside the text: the server's address (``http://127.0.0.1:8000`` becomes a free loopback
port), the model (``ensure_smollm2`` returns the tiny tool-calling model of ``tests/test_trl.py``, so a step
takes seconds rather than minutes) and the step count (``GRPOConfig`` runs one step into a temporary folder).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.test_trl import MINIHACK, REPO, needs, served, tiny_model  # noqa: F401 - fixtures

# minutes each on 2 cores: one GRPO step, after the tiny model is taught (the fixture) and the servers start
pytestmark = [pytest.mark.trl, pytest.mark.slow, pytest.mark.timeout(3600)]
SOKOBAN_2 = "crl/Sokoban-6x6-2-v0"
README_URL = "http://127.0.0.1:8000"


def trl_snippets() -> list[str]:
    """The ``python`` blocks of the README's TRL section, in order."""
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = readme.split("TRL's `GRPOTrainer` takes an `environment_factory`", 1)[1].split("### verifiers", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def shim(model: str, out: str) -> str:
    """Code run before a snippet: the tiny model for ensure_smollm2, one GRPO step into ``out``."""
    return textwrap.dedent(f"""
        import crl_agent.llm.models
        crl_agent.llm.models.ensure_smollm2 = lambda *a, **k: {str(model)!r}
        import trl

        class OneStep(trl.GRPOConfig):
            def __post_init__(self):
                self.max_steps, self.output_dir = 1, {out!r}
                super().__post_init__()

        trl.GRPOConfig = OneStep
    """)


def run_snippet(code: str, cwd, model: str) -> list[dict]:
    script = shim(model, str(cwd / "out")) + code + "\nimport json\nprint('LOG', json.dumps(trainer.state.log_history))\n"
    out = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=1200,
                         env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("LOG "))
    return json.loads(line[4:])


def test_the_readme_has_the_three_trl_snippets():
    blocks = trl_snippets()
    assert len(blocks) == 3 and blocks[0].startswith("# sokoban_tools.py")
    for block in blocks[1:]:
        assert "use_cpu=True, bf16=False" in block and "ensure_smollm2()" in block and "tool_chat_template" in block
        assert README_URL in blocks[0] + block


@pytest.fixture(scope="module")
def served_sokoban_2():
    needs("openenv")
    from tests.test_served_sessions import crl_serve

    with crl_serve(SOKOBAN_2, max_concurrent=8) as (_, url):
        yield url


def test_the_sokoban_tools_snippets_train_one_step(served_sokoban_2, tiny_model, tmp_path):  # noqa: F811
    tools, train = trl_snippets()[:2]
    (tmp_path / "sokoban_tools.py").write_text(tools.replace(README_URL, served_sokoban_2), encoding="utf-8")
    logs = run_snippet(train, tmp_path, tiny_model)
    steps = [entry for entry in logs if "reward" in entry]
    assert len(steps) == 1 and steps[0]["step"] == 1, logs
    assert "rewards/reward_func/mean" in steps[0]


def test_the_environment_factory_snippet_trains_one_step_and_logs_cut_short(served, tiny_model, tmp_path):  # noqa: F811
    code = trl_snippets()[2].replace(README_URL, served[MINIHACK])
    logs = run_snippet(code, tmp_path, tiny_model)
    steps = [entry for entry in logs if "reward" in entry]
    assert len(steps) == 1, logs
    assert steps[0]["cut_short"] == 0.0  # log_cut_short's metric: no rollout was cut short
    assert "rewards/TextEnvironment/mean" in steps[0], steps  # the env's get_reward scored the rollouts


def test_the_grpo_example_script_runs_one_step(tiny_model, tmp_path):  # noqa: F811
    """``examples/trl_grpo.py`` as the README runs it (it serves the env itself), with the tiny model, one step."""
    needs("openenv")
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", "trl_grpo.py"), "--model", str(tiny_model),
                          "--steps", "1", "--batch", "4", "--max-completion-length", "512", "--max-tool-calls", "2",
                          "--output-dir", str(tmp_path / "out")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    assert re.search(r"step 1: reward \d\.\d{3}, tool calls per rollout \d\.\d\d, cut short 0\.00", out.stdout), out.stdout
