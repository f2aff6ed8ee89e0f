"""Checkpoints: weights, optimiser, step, config and RNG round-trip; writes are atomic; configs diff by field."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.rl import (  # noqa: E402
    PolicyLearner,
    TurnSample,
    add_lora,
    config_diff,
    load_checkpoint,
    save_checkpoint,
    trainable_state_dict,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny"))


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def train_once(learner):
    sample = TurnSample([5, 6, 7], 1.0, [-1.0], candidate_ids=[[8], [9, 10]], chosen=1, policy_version=learner.version)
    assert learner.update([sample])["updated"] == 1


def same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("lora", [False, True])
def test_checkpoint_round_trip_restores_weights_optimiser_step_config_and_rng(model_dir, tmp_path, lora):
    if lora:
        pytest.importorskip("peft")
    model = add_lora(load(model_dir), r=4) if lora else load(model_dir)
    learner = PolicyLearner(model, lr=1e-2)
    train_once(learner)
    path = save_checkpoint(
        tmp_path / "ckpt.pt", step=7, config={"lr": 0.01, "lora": {"r": 4}}, models={"actor": model},
        learners={"actor": learner}, extra={"bank": "bank/"},
    )
    saved_weights = trainable_state_dict(model)
    saved_opt = copy.deepcopy(learner.optimizer.state_dict()["state"])  # live tensors otherwise
    after_save = torch.rand(3)
    train_once(learner)  # move everything on, then restore into fresh objects
    fresh = add_lora(load(model_dir), r=4) if lora else load(model_dir)
    fresh_learner = PolicyLearner(fresh, lr=1e-2)
    got = load_checkpoint(path, models={"actor": fresh}, learners={"actor": fresh_learner})
    assert got.step == 7 and got.config == {"lr": 0.01, "lora": {"r": 4}} and got.extra == {"bank": "bank/"}
    assert same_state(trainable_state_dict(fresh), saved_weights)
    assert fresh_learner.version == 1
    for k, v in fresh_learner.optimizer.state_dict()["state"].items():
        assert all(torch.equal(v[n], saved_opt[k][n]) for n in v)
    assert torch.equal(torch.rand(3), after_save)
    if lora:
        assert all("lora_" in k for k in saved_weights)  # the adapter only, not the base model


def test_checkpoint_refuses_a_mismatched_model_or_a_foreign_file(model_dir, tmp_path):
    pytest.importorskip("peft")
    plain = load(model_dir)
    save_checkpoint(tmp_path / "full.pt", step=1, config={}, models={"actor": plain})
    with pytest.raises(ValueError, match="full weights but the model given is LoRA-wrapped"):
        load_checkpoint(tmp_path / "full.pt", models={"actor": add_lora(load(model_dir), r=2)})
    with pytest.raises(ValueError, match="no model 'extractor'"):
        load_checkpoint(tmp_path / "full.pt", models={"extractor": plain})
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_a_failed_write_leaves_the_previous_checkpoint_and_no_temp_file(model_dir, tmp_path, monkeypatch):
    model = load(model_dir)
    path = save_checkpoint(tmp_path / "ckpt.pt", step=1, config={"a": 1}, models={"actor": model})
    real_save = torch.save

    def torn(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(path, step=2, config={"a": 1}, models={"actor": model})
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(path).step == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint_intact(model_dir, tmp_path):
    model = load(model_dir)
    path = save_checkpoint(tmp_path / "ckpt.pt", step=1, config={"a": 1}, models={"actor": model})
    before = path.read_bytes()
    child = textwrap.dedent(
        f"""
        import os, sys, time
        from transformers import AutoModelForCausalLM
        from crl_agent.rl import save_checkpoint
        model = AutoModelForCausalLM.from_pretrained({str(model_dir)!r})
        def stuck(fd):  # the new file is written but not yet renamed over the old one
            print("writing", flush=True)
            time.sleep(120)
        os.fsync = stuck
        save_checkpoint({str(path)!r}, step=2, config={{"a": 2}}, models={{"actor": model}})
        """
    )
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = proc.stdout.readline()  # blocks until the child is inside the write (or has died)
        assert line.strip() == "writing", f"the child did not reach the write: {line!r}"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert path.read_bytes() == before
    assert load_checkpoint(path).step == 1
    # the killed writer's temp file is cleaned up by the next successful save
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    save_checkpoint(path, step=3, config={"a": 1}, models={"actor": model})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"] and load_checkpoint(path).step == 3


@dataclass
class RunConfig:
    lr: float = 1e-4
    groups: int = 4
    tasks: list[str] = field(default_factory=lambda: ["a"])
    lora: dict = field(default_factory=lambda: {"r": 16, "alpha": 32})


def test_config_diff_names_every_differing_field():
    assert config_diff(RunConfig(), RunConfig()) == []
    new = RunConfig(lr=3e-4, tasks=["a", "b"], lora={"r": 8, "alpha": 32, "dropout": 0.1})
    assert config_diff(RunConfig(), new) == ["lora.dropout", "lora.r", "lr", "tasks"]
    assert config_diff({"a": 1, "b": 2}, {"a": 1, "c": 2}) == ["b", "c"]
    with pytest.raises(TypeError, match="dict or a dataclass"):
        config_diff([1], {})
