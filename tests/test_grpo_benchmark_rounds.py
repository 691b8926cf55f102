"""benchmarks/llm_rl/grpo.py's rounds: step times pooled over rounds, per-round medians kept, speedups with
their per-round range, and a bad --rounds refused before anything runs."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.llm_rl import grpo as bench  # noqa: E402


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
    assert bench.main(["--cooldown-s", "-1", "--systems", "ours", "--out", "/nonexistent-never-written"]) == 2
    assert "--cooldown-s must be >= 0" in capsys.readouterr().err


def test_each_rounds_steal_is_kept_and_shown(monkeypatch):
    """The hypervisor's steal while each worker ran (jaxrl_hier.bench.steal_fraction) reaches the record
    and the table, so a slow round can be told from a slow system."""
    from dataclasses import asdict

    rounds = [dict(run_record([0.1]), cpu_steal=0.02), dict(run_record([0.3]), cpu_steal=0.38)]
    rec = bench.merge_rounds("ours", 0.0, rounds, bench.Settings())
    assert rec["cpu_steal"] == [0.02, 0.38]
    md = bench.markdown(dict(settings=asdict(bench.Settings()), records=[rec], speedups=[], rounds=2, steps=1,
                             warmup=1, device={"device": "cpu:cpu", "cpu_count": 2}, notes="", model={}))
    assert "steal % (rounds) |" in md and md.splitlines()[2].endswith("| 2, 38 |")
    # a worker waits for the steal to fall before it starts, and measures it while it runs
    ticks = iter([(0, 0, 0), (100, 0, 30), (200, 0, 30), (300, 0, 31), (300, 0, 31), (400, 0, 41)])
    monkeypatch.setattr("jaxrl_hier.bench.cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr("jaxrl_hier.bench.time.sleep", lambda s: None)
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: "done")
    proc, steal = bench.run_timed_worker(["true"], {}, cooldown_s=60)
    assert proc == "done" and steal["steal_before"] == pytest.approx(0.01) and steal["cpu_steal"] == pytest.approx(0.1)


def test_preset_vocabulary_beyond_the_tokenizer_is_suppressed_and_the_config_has_the_preset_shape():
    from jaxrl_hier.tasks.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    config = bench.preset_config("qwen2.5-0.5b", tok)
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (151936, 896, 24)
    assert config.bos_token_id == tok.bos_token_id and config.tie_word_embeddings
    tiny = bench.special_ids(tok)
    full = bench.special_ids(tok, config.vocab_size)
    assert max(tiny) < len(tok) and set(tiny) <= set(full)
    # every id the tokenizer lacks is suppressed, every character it has stays sampleable
    assert set(full) - set(tiny) == set(range(len(tok), config.vocab_size))


def test_device_peak_column_and_run_settings_in_the_markdown():
    rec = run_record([0.1, 0.2])
    rec.update(peak_device_mib=4812.0, warmup_step_s=[20.0])
    settings = bench.Settings(preset="qwen2.5-0.5b", dtype="bfloat16", lora_rank=16, platform="gpu")
    from dataclasses import asdict

    md = bench.markdown(dict(settings=asdict(settings), records=[rec], speedups=[], rounds=1, steps=2, warmup=1,
                             device={"device": "gpu:H100", "cpu_count": 16}, notes="", model={"preset": "qwen2.5-0.5b"}))
    assert "peak device MiB" in md and "| 4812 |" in md
    assert "qwen2.5-0.5b model, bfloat16, LoRA rank 16" in md


def test_tunix_refused_outside_the_float32_cpu_comparison():
    assert bench.main(["--systems", "tunix", "--dtype", "bfloat16", "--out", "/nonexistent-never-written"]) == 2
