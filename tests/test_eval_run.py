from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

import eval.run as run_mod
from eval.run import main
from eval.suites import TaskSetError, resolve_tasks
from tests.toy_envs import GuessEnv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tmp_path, *args):
    return main(["--quiet", "--out", str(tmp_path), *args])


def test_oracle_run_writes_versioned_results(tmp_path):
    assert _run(tmp_path, "--agent", "oracle", "--tasks", "test/Guess-v0", "--episodes", "5") == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["schema_version"] and summary["package_version"]
    task = summary["tasks"]["test/Guess-v0"]
    assert task["episodes"] == 5 and task["success"] == 1.0 and task["mean_actions"] == 1.0
    assert task["version"] == 0 and task["max_episode_steps"] == 12
    assert summary["macro"]["success"] == 1.0
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert [json.loads(x)["seed"] for x in lines] == [0, 1, 2, 3, 4]
    assert "| test/Guess-v0 |" in (tmp_path / "results.md").read_text()


def test_same_seeds_give_the_same_episodes(tmp_path):
    for d in ("a", "b"):
        _run(tmp_path / d, "--agent", "random", "--tasks", "test/Guess-v0", "--episodes", "6", "--seed", "7")
    strip = lambda p: [  # noqa: E731
        {k: v for k, v in json.loads(x).items() if k != "wall_time_s"} for x in p.read_text().splitlines()
    ]
    assert strip(tmp_path / "a" / "episodes.jsonl") == strip(tmp_path / "b" / "episodes.jsonl")


def test_resume_skips_recorded_episodes_and_tolerates_a_torn_line(tmp_path):
    _run(tmp_path, "--agent", "oracle", "--tasks", "test/Guess-v0", "--episodes", "3")
    with (tmp_path / "episodes.jsonl").open("a") as f:
        f.write('{"env_id": "test/Gue')  # a kill mid-write
    with pytest.raises(SystemExit):
        _run(tmp_path, "--agent", "oracle", "--tasks", "test/Guess-v0", "--episodes", "5")
    _run(tmp_path, "--agent", "oracle", "--tasks", "test/Guess-v0", "--episodes", "5", "--resume")
    records = [json.loads(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["seed"] for r in records) == [0, 1, 2, 3, 4]
    assert json.loads((tmp_path / "summary.json").read_text())["tasks"]["test/Guess-v0"]["episodes"] == 5


def test_agent_errors_are_recorded_not_raised(tmp_path):
    _run(tmp_path, "--agent", "oracle", "--tasks", "test/GuessRaising-v0", "--episodes", "2")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tasks"]["test/GuessRaising-v0"]["errored"] == 0  # the oracle never sends bad input
    # an agent without a solver to use: the episode is recorded as errored
    from tests.toy_envs import GuessEnv  # noqa: F401

    (tmp_path / "x").mkdir()
    _run(tmp_path / "x", "--agent", "tests.test_eval_run:CrashingAgent", "--tasks", "test/Guess-v0", "--episodes", "2")
    task = json.loads((tmp_path / "x" / "summary.json").read_text())["tasks"]["test/Guess-v0"]
    assert task["errored"] == 2 and task["success"] == 0.0


from crl_agent.agents.base import Agent, Policy  # noqa: E402


class _Crash(Policy):
    async def act(self, obs, info):
        raise RuntimeError("agent bug")


class CrashingAgent(Agent):
    name = "crashing"

    def make_policy(self, ctx):
        return _Crash()


def test_unknown_set_member_is_named():
    with pytest.raises(TaskSetError, match="crl/Future-Easy-v0"):
        resolve_tasks("crl/Sokoban-6x6-2-v0,crl/Future-Easy-v0")


@pytest.mark.parametrize(
    "args",
    [["--episodes", "x"], ["--agent", "nope"], ["--tasks", "crl/Nope-v0"], ["--episodes", "0"], ["--bogus"]],
)
def test_bad_cli_input_exits_2_with_usage(args, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "eval.run", "--out", str(tmp_path / "o"), *args],
        capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    assert "error" in proc.stderr and "Traceback" not in proc.stderr


def test_pool_run_equals_in_process_run_and_records_crashed_episodes(tmp_path):
    args = ["--agent", "random", "--tasks", "crl/Sokoban-6x6-2-v0", "--episodes", "6", "--seed", "3"]
    _run(tmp_path / "local", *args)
    _run(tmp_path / "pool", *args, "--num-workers", "2", "--concurrency", "3")
    load = lambda p: sorted(  # noqa: E731
        ({k: v for k, v in json.loads(x).items() if k != "wall_time_s"} for x in p.read_text().splitlines()),
        key=lambda r: r["seed"],
    )
    assert load(tmp_path / "local" / "episodes.jsonl") == load(tmp_path / "pool" / "episodes.jsonl")

    _run(tmp_path / "crash", "--agent", "tests.test_eval_run:CrashCommandAgent", "--tasks", "test/Faulty-v0",
         "--episodes", "3", "--num-workers", "1")
    recs = [json.loads(x) for x in (tmp_path / "crash" / "episodes.jsonl").read_text().splitlines()]
    errored = [r for r in recs if r["error"]]
    assert [r["seed"] for r in errored] == [1] and "crash" in errored[0]["error"]
    assert sum(r["success"] for r in recs) == 2  # the episodes after the crash ran on a restarted worker


class _CrashOnSeed1(Policy):
    def __init__(self, ctx):
        self.ctx = ctx

    async def act(self, obs, info):
        return "crash" if self.ctx.seed == 1 else await self.ctx.oracle()


class CrashCommandAgent(Agent):
    name = "crash-command"

    def make_policy(self, ctx):
        return _CrashOnSeed1(ctx)


class _SlowOracle(Policy):
    def __init__(self, ctx):
        self.ctx = ctx

    async def act(self, obs, info):
        import asyncio

        await asyncio.sleep(0.02)
        return await self.ctx.oracle()


class SlowOracleAgent(Agent):
    name = "slow-oracle"

    def make_policy(self, ctx):
        return _SlowOracle(ctx)


class KwargsAgent(Agent):
    """Records the constructor arguments the harness passed."""

    name = "kwargs"

    def __init__(self, seed=0, model=None, temperature=1.0, run_dir=None):
        self.kw = {"seed": seed, "model": model, "temperature": temperature, "run_dir": run_dir}

    def make_policy(self, ctx):
        return _SlowOracle(ctx)

    def config(self):
        return {**super().config(), **self.kw}


def test_resume_after_kill_9_mid_run_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "eval.run", "--quiet", "--out", str(out), "--agent",
           "tests.test_eval_run:SlowOracleAgent", "--tasks", "crl/Sokoban-6x6-1-v0,crl/Sokoban-6x6-2-v0", "--episodes", "30"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    episodes = out / "episodes.jsonl"
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if episodes.exists() and len(episodes.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    proc.kill()  # SIGKILL: no cleanup runs
    proc.wait()
    before = len(episodes.read_text().splitlines())
    assert 5 <= before < 60
    assert not (out / "summary.json").exists()
    done = subprocess.run([*cmd, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(x) for x in episodes.read_text().splitlines()]
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)) == 60
    # the trajectories agree with episodes.jsonl: the same keys, each once (no torn or orphan member left)
    from eval.trajectories import _read_members

    members, _, torn = _read_members(out / "trajectories.jsonl.gz")
    assert not torn and sorted(m["key"] for m in members) == sorted(keys)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"]["crl/Sokoban-6x6-1-v0"]["success"] == 1.0
    assert summary["tasks"]["crl/Sokoban-6x6-2-v0"]["episodes"] == 30


def test_agent_options_reach_the_constructor_and_unknown_ones_are_refused(tmp_path):
    _run(tmp_path / "a", "--agent", "tests.test_eval_run:KwargsAgent", "--tasks", "test/Guess-v0", "--episodes", "1",
         "--model", "my-model", "--agent-arg", "temperature=0.25", "--seed", "5")
    agent = json.loads((tmp_path / "a" / "summary.json").read_text())["agent"]
    assert agent["model"] == "my-model" and agent["temperature"] == 0.25 and agent["seed"] == 5
    assert agent["run_dir"] == str(tmp_path / "a")
    proc = subprocess.run(
        [sys.executable, "-m", "eval.run", "--out", str(tmp_path / "b"), "--agent", "random", "--tasks",
         "crl/Sokoban-6x6-1-v0", "--model", "x"], capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 2 and "does not take --model" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "eval.run", "--out", str(tmp_path / "c"), "--agent", "random", "--tasks",
         "crl/Sokoban-6x6-1-v0", "--agent-arg", "no-equals"], capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 2 and "KEY=VALUE" in proc.stderr


def test_run_writes_plots_and_lists_errored_episodes(tmp_path):
    _run(tmp_path / "x", "--agent", "tests.test_eval_run:CrashingAgent", "--tasks", "test/Guess-v0", "--episodes", "2")
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert [e["key"] for e in summary["errors"]] == ["test/Guess-v0#0#0", "test/Guess-v0#1#0"]
    assert "agent bug" in summary["errors"][0]["error"]
    md = (tmp_path / "x" / "results.md").read_text()
    assert "## Errored episodes (2)" in md and "test/Guess-v0#1" in md
    for name in ("success.png", "actions.png"):
        assert (tmp_path / "x" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_compares_runs_of_several_agents(tmp_path):
    for agent in ("random", "oracle"):
        _run(tmp_path / agent, "--agent", agent, "--tasks", "test/Guess-v0,crl/Sokoban-6x6-1-v0", "--episodes", "4")
    from eval.report import main as report_main

    assert report_main([str(tmp_path / "random"), str(tmp_path / "oracle"), "--out", str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "cmp" / "success.png").stat().st_size > 1000
    md = (tmp_path / "cmp" / "results.md").read_text()
    assert "agent `random`" in md and "agent `oracle`" in md
    with pytest.raises(SystemExit):
        report_main([str(tmp_path / "missing"), "--out", str(tmp_path / "cmp2")])


def test_max_steps_caps_episode_length_and_is_recorded(tmp_path):
    _run(tmp_path, "--agent", "random", "--tasks", "crl/Sokoban-6x6-2-v0", "--episodes", "4", "--max-steps", "3")
    recs = [json.loads(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert all(r["actions"] <= 3 for r in recs) and any(r["truncated"] for r in recs)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tasks"]["crl/Sokoban-6x6-2-v0"]["max_episode_steps"] == 3
    assert summary["run"]["max_steps"] == 3


def test_the_readme_example_agent_runs_as_written(tmp_path):
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = readme.split("## Writing your own agent", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    command = section.split("```bash\n", 1)[1].split("```", 1)[0].strip()
    (tmp_path / "my_agent.py").write_text(code)
    args = command.split()[1:]  # drop the interpreter path
    assert args[:2] == ["-m", "eval.run"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])}
    proc = subprocess.run([sys.executable, *args, "--quiet", "--out", str(tmp_path / "out")], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    (task,) = summary["tasks"].values()
    assert task["episodes"] == 10 and task["errored"] == 0 and summary["agent"]["name"] == "first-action"


def test_a_named_flag_the_agent_lacks_is_refused_even_with_var_kwargs():
    from eval.run import make_agent

    with pytest.raises(ValueError, match="does not take --experience"):
        make_agent("llm", 0, {"experience": "on"})


def test_resume_refuses_episodes_recorded_with_another_agent_or_step_cap(tmp_path, capsys):
    _run(tmp_path, "--agent", "random", "--tasks", "test/Guess-v0", "--episodes", "2")
    with pytest.raises(ValueError, match=r"another configuration .*agent: recorded .*RandomAgent.*OracleAgent"):
        asyncio.run(run_mod.run(run_mod.build_parser().parse_args(
            ["--quiet", "--out", str(tmp_path), "--agent", "oracle", "--tasks", "test/Guess-v0", "--episodes", "4",
             "--resume"])))
    with pytest.raises(SystemExit) as exc:
        _run(tmp_path, "--agent", "random", "--tasks", "test/Guess-v0", "--episodes", "4", "--max-steps", "3",
             "--resume")
    assert exc.value.code == 2 and "max_episode_steps: recorded 12, now 3" in capsys.readouterr().err
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 2  # nothing was mixed in
    _run(tmp_path, "--agent", "random", "--tasks", "test/Guess-v0", "--episodes", "4", "--resume")  # same flags: fine
    assert json.loads((tmp_path / "summary.json").read_text())["tasks"]["test/Guess-v0"]["episodes"] == 4


class _SyncPolicy(Policy):
    def act(self, obs, info):  # a common slip: not async
        return "5"


class SyncActAgent(Agent):
    name = "sync-act"

    def make_policy(self, ctx):
        return _SyncPolicy()


def test_a_policy_with_a_sync_act_gives_errored_episodes_that_name_the_fix(tmp_path):
    _run(tmp_path, "--agent", "tests.test_eval_run:SyncActAgent", "--tasks", "test/Guess-v0", "--episodes", "2")
    errors = json.loads((tmp_path / "summary.json").read_text())["errors"]
    assert len(errors) == 2 and "declare it `async def act" in errors[0]["error"]


def test_an_unknown_agent_arg_is_named_as_agent_arg_not_as_a_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _run(tmp_path, "--agent", "random", "--tasks", "test/Guess-v0", "--agent-arg", "temprature=0.2")
    assert exc.value.code == 2 and "does not take --agent-arg temprature" in capsys.readouterr().err


class NumpyExtrasAgent(Agent):
    """Reports numpy metrics and keeps a Path in its config, as third-party agents do."""

    name = "numpy-extras"

    def make_policy(self, ctx):
        return _SlowOracle(ctx)

    def on_episode_end(self, ctx, result):
        import numpy as np

        result.extra["steps_np"] = np.int64(result.actions)

    def config(self):
        from pathlib import Path

        return {**super().config(), "cache": Path("/tmp/cache")}


def test_numpy_extras_and_a_path_in_the_config_do_not_crash_the_run(tmp_path):
    _run(tmp_path, "--agent", "tests.test_eval_run:NumpyExtrasAgent", "--tasks", "test/Guess-v0", "--episodes", "2")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["agent"]["cache"] == "/tmp/cache"
    assert summary["tasks"]["test/Guess-v0"]["extra"] == {"steps_np": 1.0} and not summary["errors"]


def test_report_tells_apart_two_runs_of_one_agent_and_plots_only_summarised_episodes(tmp_path):
    from eval.report import load_run
    from eval.report import main as report_main

    for d, seed in (("s0", "0"), ("s9", "9")):
        _run(tmp_path / d, "--agent", "random", "--tasks", "test/Guess-v0", "--episodes", "4", "--seed", seed)
    _run(tmp_path / "s0", "--agent", "random", "--tasks", "test/Guess-v0", "--episodes", "2", "--resume")
    summary, records = load_run(tmp_path / "s0")
    assert summary["tasks"]["test/Guess-v0"]["episodes"] == 2
    assert sorted(r["seed"] for r in records) == [0, 1]  # not the 4 episodes.jsonl holds
    assert report_main([str(tmp_path / "s0"), str(tmp_path / "s9"), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "results.md").read_text()
    assert "agent `random [s0]`" in md and "agent `random [s9]`" in md


def test_report_labels_name_the_model_of_llm_agents():
    from eval.report import agent_label

    assert agent_label({"agent": {"name": "llm", "llm": {"backend": "openai", "model": "Qwen2.5-7B"}}}) == "llm (Qwen2.5-7B)"
    assert agent_label({"agent": {"name": "fake", "model": "m"}}) == "fake (m)"
    assert agent_label({"agent": {"name": "random"}}) == "random"


def test_an_env_without_a_step_limit_needs_max_steps_instead_of_running_forever(tmp_path, capsys):
    import gymnasium as gym

    if "test/GuessUnbounded-v0" not in gym.registry:
        gym.register("test/GuessUnbounded-v0", entry_point="tests.toy_envs:GuessEnv")
    with pytest.raises(SystemExit) as exc:
        _run(tmp_path / "a", "--agent", "tests.test_eval_run:SyncActAgent", "--tasks", "test/GuessUnbounded-v0")
    assert exc.value.code == 2 and "without max_episode_steps: pass --max-steps N" in capsys.readouterr().err
    _run(tmp_path / "b", "--agent", "random", "--tasks", "test/GuessUnbounded-v0", "--episodes", "2", "--max-steps", "4")
    task = json.loads((tmp_path / "b" / "summary.json").read_text())["tasks"]["test/GuessUnbounded-v0"]
    assert task["episodes"] == 2 and task["max_episode_steps"] == 4


class _OutageOracle(_SlowOracle):
    async def act(self, obs, info):
        if os.path.exists(self.marker):
            raise ConnectionError("LLM server unreachable")
        return await super().act(obs, info)


class OutageAgent(Agent):
    """Errors every episode while the ``marker`` file exists (a server outage), else plays the oracle."""

    name = "outage"

    def __init__(self, seed=0, marker=""):
        self.marker = marker

    def make_policy(self, ctx):
        policy = _OutageOracle(ctx)
        policy.marker = self.marker
        return policy


def test_retry_errored_replays_only_the_errored_episodes_and_counts_each_once(tmp_path):
    marker = tmp_path / "outage"
    marker.write_text("down")
    args = ["--agent", "tests.test_eval_run:OutageAgent", "--agent-arg", f"marker={marker}",
            "--tasks", "test/Guess-v0", "--episodes", "3"]
    out = tmp_path / "run"
    _run(out, *args)
    assert json.loads((out / "summary.json").read_text())["tasks"]["test/Guess-v0"]["errored"] == 3
    marker.unlink()
    _run(out, *args, "--resume")  # a plain resume keeps recorded episodes, errored or not
    assert json.loads((out / "summary.json").read_text())["tasks"]["test/Guess-v0"]["errored"] == 3
    _run(out, *args, "--resume", "--retry-errored")
    task = json.loads((out / "summary.json").read_text())["tasks"]["test/Guess-v0"]
    assert task["episodes"] == 3 and task["errored"] == 0 and task["success"] == 1.0
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 6  # the errored records are kept, superseded
    with pytest.raises(SystemExit):
        _run(tmp_path / "other", *args, "--retry-errored")  # needs --resume


def test_ctrl_c_stops_cleanly_and_names_the_resume_command(tmp_path):
    import signal
    import time

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "eval.run", "--quiet", "--out", str(out), "--agent",
           "tests.test_eval_run:SlowOracleAgent", "--tasks", "crl/Sokoban-6x6-1-v0", "--episodes", "200"]
    # as a terminal's Ctrl-C finds it: a suite started in the background (`cmd &`) inherits SIGINT ignored,
    # and so would the run, which would then never see the signal
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    episodes = out / "episodes.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if episodes.exists() and len(episodes.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "interrupted" in err and "--resume" in err and str(out) in err
    kept = len({json.loads(x)["key"] for x in episodes.read_text().splitlines()})
    assert f"{kept} episode(s) recorded" in err and 3 <= kept < 200


def test_the_oracle_on_an_env_without_a_solver_is_refused_before_playing(tmp_path, capsys):
    import gymnasium as gym

    from crl_envs.core import TextEnv
    from tests.toy_envs import GuessEnv

    class NoSolverEnv(GuessEnv):
        oracle_action = TextEnv.oracle_action

    gym.register("test/NoSolver-v0", entry_point=NoSolverEnv, max_episode_steps=5)
    try:
        with pytest.raises(SystemExit) as exc:
            _run(tmp_path, "--agent", "oracle", "--tasks", "test/NoSolver-v0", "--episodes", "2")
        assert exc.value.code == 2 and "has no solver" in capsys.readouterr().err
        assert not (tmp_path / "episodes.jsonl").exists() or not (tmp_path / "episodes.jsonl").read_text()
        assert _run(tmp_path / "r", "--agent", "random", "--tasks", "test/NoSolver-v0", "--episodes", "2") == 0
    finally:
        del gym.registry["test/NoSolver-v0"]


class SlowSubmitEnv(GuessEnv):
    """Its winning step takes 2 s (like SWE grading on submit) and it says so in ``step_time_limit_s``."""

    step_time_limit_s = 3.0

    def _apply(self, action):
        import time

        if action == str(self.target):
            time.sleep(2.0)
        return super()._apply(action)


def test_pooled_steps_get_the_time_the_env_declares_beyond_step_timeout(tmp_path):
    import gymnasium as gym

    gym.register("test/SlowSubmit-v0", entry_point="tests.test_eval_run:SlowSubmitEnv", max_episode_steps=5)
    try:
        assert _run(tmp_path, "--agent", "oracle", "--tasks", "test/SlowSubmit-v0", "--episodes", "1",
                    "--num-workers", "1", "--step-timeout", "1") == 0
    finally:
        del gym.registry["test/SlowSubmit-v0"]
    task = json.loads((tmp_path / "summary.json").read_text())["tasks"]["test/SlowSubmit-v0"]
    assert task["errored"] == 0 and task["success"] == 1.0


class BrokenAgent(Agent):
    name = "broken"

    def __init__(self, seed=0):
        raise OSError("model weights at /nowhere cannot be read")

    def make_policy(self, ctx):
        raise AssertionError("never reached")


def test_an_agent_that_cannot_be_built_is_one_clear_error_not_a_traceback(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _run(tmp_path, "--agent", "tests.test_eval_run:BrokenAgent", "--tasks", "test/Guess-v0")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "could not create" in err and "OSError: model weights at /nowhere" in err
