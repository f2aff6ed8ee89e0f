"""Data-parallel training under torchrun (gloo on CPU): averaged gradients, one run folder, crl across ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch build has no torch.distributed with gloo", allow_module_level=True)

from tests.net_support import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOORS = "test/Doors-v0"


# ------------------------------------------------------------------ the gradient average, two processes
def _samples(model, advantages, seed):
    from crl_agent.rl import TurnSample, action_logprob, candidate_logprobs

    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, adv in enumerate(advantages):
        prompt = torch.randint(3, 259, (4 + 3 * i,), generator=gen).tolist()
        cands = [torch.randint(3, 259, (n,), generator=gen).tolist() for n in (1, 2, 3)]
        with torch.no_grad():
            old = action_logprob(candidate_logprobs(model, prompt, cands), i % 3)
        out.append(TurnSample(prompt, adv, [old.item()], candidate_ids=cands, chosen=i % 3))
    return out


# rank 0 holds 3 samples, rank 1 holds 2 (one with a zero advantage), or none at all
SHARES = {"uneven": [(1.0, -0.5, 0.75), (0.0, -1.0)], "empty": [(1.0, -0.5, 0.75), ()]}


def record_step_gradients(learner) -> list[list]:
    """The (clipped) gradients each optimiser step is taken with."""
    seen, step = [], learner.optimizer.step

    def recording(*args, **kwargs):
        seen.append([p.grad.detach().clone() for p in learner.params])
        return step(*args, **kwargs)

    learner.optimizer.step = recording
    return seen


def _worker(rank: int, model_dir: str, port: int, case: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from crl_agent.rl import Distributed, PolicyLearner

    dist = Distributed("cpu")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    learner = PolicyLearner(model, lr=1e-2, reduce_gradients=dist.reduce_gradients)
    grads = record_step_gradients(learner)
    metrics = learner.update(_samples(model, SHARES[case][rank], seed=rank))
    torch.save({"params": [p.detach().clone() for p in learner.params], "grads": grads[0], "metrics": metrics},
               f"{out}.{rank}")
    assert dist.same_weights(learner.params)
    dist.close()


@pytest.mark.parametrize("case", sorted(SHARES))
def test_two_ranks_take_the_step_one_process_takes_on_all_their_samples(tiny, tmp_path, case):
    from transformers import AutoModelForCausalLM

    from crl_agent.rl import PolicyLearner

    torch.multiprocessing.start_processes(_worker, args=(tiny, free_port(), case, str(tmp_path / "r")), nprocs=2,
                                          start_method="spawn")
    ranks = [torch.load(tmp_path / f"r.{r}") for r in range(2)]
    model = AutoModelForCausalLM.from_pretrained(tiny).eval()
    alone = PolicyLearner(model, lr=1e-2)
    everything = [s for r in range(2) for s in _samples(model, SHARES[case][r], seed=r)]
    before = [p.detach().clone() for p in alone.params]
    grads = record_step_gradients(alone)
    assert alone.update(everything)["updated"] == 1.0
    for r in ranks:
        assert r["metrics"]["updated"] == 1.0 and r["metrics"]["version"] == 1.0  # the empty rank stepped too
        for got, want in zip(r["grads"], grads[0], strict=True):  # the gradient of the whole batch's loss
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
        moved = 0.0
        for got, want, old in zip(r["params"], alone.params, before, strict=True):
            # AdamW's first step is ~lr * sign(gradient): a gradient entry near 0 may round either way
            torch.testing.assert_close(got, want.detach(), rtol=0, atol=2e-3)
            moved = max(moved, float((want.detach() - old).abs().max()))
        assert moved > 5e-3  # the update did something (steps are ~lr = 1e-2)
    torch.testing.assert_close(ranks[0]["params"], ranks[1]["params"], rtol=0, atol=0)  # bit for bit
    assert ranks[0]["metrics"]["grad_norm"] == pytest.approx(ranks[1]["metrics"]["grad_norm"])


# ------------------------------------------------------------------ other launchers' variables
def _mpi_worker(rank: int, port: int, out: str) -> None:
    """A process placed only by Open MPI's variables (what ``mpirun`` sets), plus the rendezvous."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    os.environ.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from crl_agent.rl import Distributed

    dist = Distributed("cpu")
    seen = dist.gather((dist.rank, dist.world, dist.local_rank))
    dist.close()
    Path(f"{out}.{rank}").write_text(json.dumps(seen))


def test_an_mpi_launch_is_placed_by_the_mpi_variables(tmp_path):
    torch.multiprocessing.start_processes(_mpi_worker, args=(free_port(), str(tmp_path / "r")), nprocs=2,
                                          start_method="spawn")
    for r in range(2):
        assert json.loads((tmp_path / f"r.{r}").read_text()) == [[0, 2, 0], [1, 2, 1]]


def test_a_launch_without_a_rendezvous_or_with_a_bad_rank_is_a_clear_error(monkeypatch):
    from crl_agent.rl import Distributed
    from crl_agent.rl.distributed import LOCAL_RANK_VARS, RANK_VARS, WORLD_VARS

    for name in (*RANK_VARS, *WORLD_VARS, *LOCAL_RANK_VARS, "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"\(PMI_RANK=1, PMI_SIZE=2\) needs MASTER_ADDR and MASTER_PORT"):
        Distributed("cpu")
    monkeypatch.setenv("PMI_RANK", "2")
    with pytest.raises(RuntimeError, match="rank 2 is outside a world of 2"):
        Distributed("cpu")
    monkeypatch.setenv("PMI_RANK", "one")
    with pytest.raises(RuntimeError, match="PMI_RANK='one' is not an integer"):
        Distributed("cpu")


# ------------------------------------------------------------------ the trainer under torchrun
def torchrun(args: list[str], nproc: int = 2, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "tests.dist_train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_grpo_under_torchrun_learns_the_bandit_with_two_ranks_and_resumes(tiny, tmp_path):
    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "grpo", "--model", tiny, "--dtype", "float32",
            "--groups", "2", "--group-size", "8", "--lr", "3e-3", "--lora-rank", "0", "--score-norm", "mean",
            "--eval-every", "0", "--eval-episodes", "48", "--threads", "1"]
    done = torchrun([*args, "--steps", "20"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    evals, metrics = rows(tmp_path / "evals.jsonl"), rows(tmp_path / "metrics.jsonl")
    # one run folder, written by rank 0; every row counts both ranks' episodes
    assert len(metrics) == 20 and all(m["episodes"] == 16 and m["processes"] == 2 for m in metrics)
    assert 0.05 <= evals[0]["success"] <= 0.5 and evals[-1]["success"] >= 0.9, evals
    assert not (tmp_path / "ranks" / "rank1" / "metrics.jsonl").exists()
    # a resumed run continues on both ranks from rank 0's checkpoint
    done = torchrun([*args, "--steps", "22", "--resume"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [m["step"] for m in rows(tmp_path / "metrics.jsonl")] == list(range(1, 23))


def test_crl_under_torchrun_distils_every_ranks_episodes_on_rank_0(tiny, tmp_path):
    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "crl", "--model", tiny, "--dtype", "float32",
            "--groups", "2", "--group-size", "4", "--eval-episodes", "4", "--eval-every", "1", "--embedder", "hash",
            "--extractor-warmup", "1", "--extractor-batch", "1", "--lora-rank", "4", "--distil-max-tokens", "16",
            "--threads", "1", "--steps", "2", "--dynamic-sampling", "0"]  # 2 groups of 4 a step, exactly
    refused = torchrun(args)
    assert refused.returncode != 0 and "max_tool_calls=0" in refused.stdout + refused.stderr
    done = torchrun([*args, "--agent-arg", "max_tool_calls=0"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = rows(tmp_path / "metrics.jsonl")
    assert [m["episodes"] for m in metrics] == [8, 8] and "train_success_with_experience" in metrics[0]
    assert all("with_experience" in e for e in rows(tmp_path / "evals.jsonl"))
    calls = rows(tmp_path / "extractor_calls.jsonl")
    distilled = [c for c in calls if c.get("type") == "call" and c.get("kind") == "distil"]
    assert len(distilled) == 16, len(distilled)  # 2 steps x 2 groups x 4: rank 1's episodes reached rank 0
    # rank 1 searched a copy of rank 0's bank and made no extractor call of its own
    copy = tmp_path / "ranks" / "rank1" / "experience_bank"
    assert (copy / "bank.sqlite").exists()
    assert not rows(tmp_path / "ranks" / "rank1" / "extractor_calls.jsonl")


def test_a_killed_rank_ends_the_launch_instead_of_hanging_and_the_run_resumes(tiny, tmp_path):
    import signal
    import time

    psutil = pytest.importorskip("psutil")
    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "crl", "--model", tiny, "--dtype", "float32",
            "--groups", "2", "--group-size", "4", "--eval-episodes", "2", "--eval-every", "0", "--embedder", "hash",
            "--extractor-warmup", "1", "--extractor-batch", "2", "--lora-rank", "4", "--distil-max-tokens", "16",
            "--threads", "1", "--agent-arg", "max_tool_calls=0"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "tests.dist_train", *args,
           "--steps", "500"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launcher = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "checkpoint.pt").exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "checkpoint.pt").exists(), "no checkpoint within 180 s"
        ranks = {p.environ().get("RANK"): p for p in psutil.Process(launcher.pid).children(recursive=True)
                 if "tests.dist_train" in " ".join(p.cmdline())}
        ranks["1"].send_signal(signal.SIGKILL)
        launcher.wait(120)  # torchrun sees the dead worker and stops rank 0 too, which would otherwise wait forever
        assert launcher.returncode != 0
    finally:
        if launcher.poll() is None:
            for p in psutil.Process(launcher.pid).children(recursive=True):
                p.kill()
            launcher.kill()
    step = int(json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["step"])
    done = torchrun([*args, "--steps", str(step + 2), "--resume"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [m["step"] for m in rows(tmp_path / "metrics.jsonl")]
    assert steps == list(range(1, step + 3)), steps


def test_accelerate_launch_runs_the_same_data_parallel_trainer(tiny, tmp_path):
    # `accelerate launch --multi_gpu` starts the ranks through torchrun; on a CPU they meet over gloo
    pytest.importorskip("accelerate")
    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "grpo", "--model", tiny, "--dtype", "float32",
            "--groups", "2", "--group-size", "4", "--lora-rank", "4", "--eval-every", "0", "--eval-episodes", "4",
            "--threads", "1"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), "-m", "tests.dist_train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for steps, resume in ((2, []), (3, ["--resume"])):
        done = subprocess.run([*cmd, "--steps", str(steps), *resume], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = rows(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["processes"] == 2 and m["episodes"] == 8 for m in metrics)
