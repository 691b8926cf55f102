"""benchmarks/grpo.py's rounds: step times pooled over rounds, per-round medians kept, speedups with
their per-round range, and a bad --rounds refused before anything runs."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import grpo as bench  # noqa: E402


def run_record(steps, startup=2.0, rss=900.0):
    rec = {"step_s": steps, "step_cpu_s": [2 * s for s in steps], "startup_s": startup, "peak_rss_mib": rss,
           "load_average_1min": [1.0, 1.0], "warmup_step_s": [4.0, 0.3]}
    return bench.summarize("ours", 0.0, rec, bench.Settings())


def test_rounds_pool_step_times_and_keep_each_rounds_median():
    rounds = [run_record([0.1, 0.2, 0.3], startup=2.0, rss=900), run_record([0.5, 0.6, 0.7], startup=4.0, rss=950)]
    rec = bench.merge_rounds("ours", 0.0, rounds, bench.Settings())
    assert rec["median_step_s"] == pytest.approx(0.4) and rec["min_step_s"] == 0.1 and rec["max_step_s"] == 0.7
    assert rec["round_median_step_s"] == [pytest.approx(0.2), pytest.approx(0.6)]
    assert rec["median_step_cpu_s"] == pytest.approx(0.8) and rec["step_s"] == [0.1, 0.2, 0.3, 0.5, 0.6, 0.7]
    assert rec["startup_s"] == 3.0 and rec["peak_rss_mib"] == 950 and rec["warmup_step_s"] == [4.0, 0.3]
    assert rec["completion_tokens_per_s"] == pytest.approx(bench.Settings().tokens_per_step / 0.4)


def test_speedups_are_ratios_of_pooled_medians_with_the_per_round_range():
    ours = {"system": "ours", "beta": 0.0, "median_step_s": 0.2, "round_median_step_s": [0.2, 0.25]}
    peer = {"system": "tunix", "beta": 0.0, "median_step_s": 0.3, "round_median_step_s": [0.3, 0.25]}
    other_beta = {"system": "tunix", "beta": 0.04, "median_step_s": 0.3, "round_median_step_s": [0.3]}
    (s,) = bench.speedups([ours, peer, other_beta])  # no "ours" at beta 0.04: nothing to compare
    assert (s["system"], s["beta"]) == ("tunix", 0.0)
    assert s["speedup"] == pytest.approx(1.5) and s["round_min"] == pytest.approx(1.0)
    assert s["round_max"] == pytest.approx(1.5)


def test_bad_rounds_exit_2(capsys):
    assert bench.main(["--rounds", "0", "--systems", "ours", "--out", "/nonexistent-never-written"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
