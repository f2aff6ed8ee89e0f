"""benchmarks/host.py: the extrapolation from the engine probe, the verdict on what fits a session, the report."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("bench_host", ROOT / "benchmarks" / "host.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


host = _load()

# DESIGN.md 10.6's three 2-core machines: (step seconds, 64-episode evaluation seconds)
AMX_XEON = (62.0, 60.0)
EPYC_BF16 = (171.0, 180.0)
EPYC_AVX2 = (636.0, 33 * 60.0)


def _row(v: dict, prefix: str) -> dict:
    return next(r for r in v["benchmarks"] if r["command"].startswith(prefix))


def test_estimate_gives_back_the_calibration_machines_measured_times():
    units = {k: host.CALIBRATION[k] for k in ("decision_s", "update_s", "diagnostics_s")}
    est = host.estimate(units, diagnose_every=1)  # as that run did
    assert est["step_s"] == pytest.approx(171.0)
    assert est["eval_s"] == pytest.approx(180.0)
    # the trainer's default diagnoses every 4th step: ~14% less a step (README: ~18% -> ~4.5%)
    assert 0.8 * 171 < host.estimate(units)["step_s"] < 0.9 * 171


def test_estimate_scales_with_each_measured_unit():
    base = {"decision_s": 0.3, "update_s": 0.9, "diagnostics_s": 0.7}
    est = host.estimate(base)
    slower_decisions = host.estimate({**base, "decision_s": 0.6})
    assert slower_decisions["eval_s"] == pytest.approx(2 * est["eval_s"])
    assert est["step_s"] < slower_decisions["step_s"] < 2 * est["step_s"]  # the update part did not change
    slower_update = host.estimate({**base, "update_s": 1.8})
    assert slower_update["eval_s"] == pytest.approx(est["eval_s"])
    assert slower_update["step_s"] > est["step_s"]


def test_estimate_refuses_units_that_are_not_positive_seconds():
    with pytest.raises(ValueError, match="positive"):
        host.estimate({"decision_s": 0.3, "update_s": 0.0, "diagnostics_s": 0.7})
    with pytest.raises(ValueError, match="positive"):
        host.estimate({"decision_s": 0.3})


def test_bf16_epyc_runs_one_grpo_seed_but_not_the_issue_38_sweep():
    v = host.verdict(*EPYC_BF16)
    assert v["fast"]
    acceptance = _row(v, "benchmarks/train_cpu.py --modes grpo --seeds S")
    assert acceptance["hours"] == pytest.approx((32 * 171 + 5 * 180) / 3600)  # 1.8 h: 98 training minutes + evals
    assert acceptance["fits"]
    assert not _row(v, "benchmarks/train_cpu.py --modes grpo,static,crl")["fits"]
    assert not _row(v, "benchmarks/crl_overhead.py")["fits"]
    assert v["line"].startswith("FAST") and "run pending learning benchmarks here" in v["line"]


def test_avx2_epyc_is_slow_and_fits_only_the_evaluation_sized_benchmark():
    v = host.verdict(*EPYC_AVX2)
    assert not v["fast"]
    assert not _row(v, "benchmarks/train_cpu.py --modes grpo --seeds S")["fits"]  # 8.4 h
    gold = _row(v, "benchmarks/gold_experience.py")
    # its record was made at this machine's evaluation speed (31 s an episode): ~41 minutes again
    assert gold["hours"] == pytest.approx((998 + 1449) / 3600 * 1980 / (64 * 998 / 32))
    assert gold["fits"]
    assert v["line"].startswith("SLOW") and "engineering" in v["line"]


def test_amx_xeon_fits_a_crl_seed_too():
    v = host.verdict(*AMX_XEON)
    assert v["fast"]
    assert _row(v, "benchmarks/train_cpu.py --modes crl")["fits"]
    assert not _row(v, "benchmarks/train_cpu.py --modes grpo,static,crl")["fits"]


def test_session_length_decides_what_fits():
    hours = _row(host.verdict(*EPYC_BF16), "benchmarks/train_cpu.py --modes grpo --seeds S")["hours"]
    assert host.verdict(*EPYC_BF16, session_hours=hours)["fast"]
    assert not host.verdict(*EPYC_BF16, session_hours=0.99 * hours)["fast"]
    assert "none of the committed learning benchmarks fits" in host.verdict(*EPYC_AVX2, session_hours=0.1)["line"]


def test_verdict_refuses_non_positive_times():
    with pytest.raises(ValueError, match="positive"):
        host.verdict(0.0, 180.0)
    with pytest.raises(ValueError, match="positive"):
        host.verdict(171.0, 180.0, session_hours=-1)


def _record(load: float = 0.1, quick_dtype: str = "bfloat16") -> dict:
    units = {"decision_s": 0.31, "update_s": 0.87, "diagnostics_s": 0.70}
    est = host.estimate(units)
    return {"cpu_model": "AMD EPYC", "cpu_flags": {"avx2": True, "avx512_bf16": True, "amx_bf16": False},
            "cores": 2, "torch_threads": 2, "load_average_1min": load,
            "matmul_gflops": {"shape": [512, 576, 1536], "float32": 190.0, "bfloat16": 430.0},
            "engine_dtype": "bfloat16", "engine_dtype_quick_probe": quick_dtype,
            "probe": {"load_s": 3.0, "episodes": 8, "decisions": 32, "update_samples": 8, "prompt_tokens_mean": 326,
                      "cpu": units, "wall": {k: 2 * v for k, v in units.items()}, "wall_s": 40.0},
            "estimate": est, "verdict": host.verdict(est["step_s"], est["eval_s"])}


def test_report_says_what_was_measured_and_what_extrapolated():
    text = host.report(_record())
    assert "fp32 190 GFLOP/s, bf16 430 GFLOP/s; the engine picks bfloat16" in text
    assert "measured  engine" in text and "0.310 s each (wall 0.620 s)" in text
    assert "estimated GRPO step" in text and "verdict: FAST" in text
    assert "busy" not in text and "load average" not in text and "30 ms probe" not in text


def test_report_warns_about_a_busy_cpu_and_a_dtype_the_engine_may_pick_instead():
    text = host.report(_record(load=6.0, quick_dtype="float32"))
    assert "load average 6.0 on 2 cores" in text
    assert "answered float32 just now" in text


def test_quick_report_has_no_estimate():
    record = {k: v for k, v in _record().items() if k not in ("probe", "estimate", "verdict")}
    text = host.report(record)
    assert "--quick: no engine probe" in text and "verdict" not in text


def test_quick_json_record_of_this_machine(capsys):
    pytest.importorskip("torch")
    assert host.main(["--quick", "--json", "--threads", "1"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["cores"] >= 1 and record["torch_threads"] == 1
    assert record["engine_dtype"] in ("bfloat16", "float32")
    assert record["matmul_gflops"]["float32"] > 0
    assert "probe" not in record


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        host.main(["--session-hours", "0"])
