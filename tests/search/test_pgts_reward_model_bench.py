"""benchmarks/pgts_reward_model.py and pgts_rule_search.py refuse bad input with exit 2 before loading anything."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import pgts_reward_model as bench  # noqa: E402
from benchmarks import pgts_rule_search as rule_bench  # noqa: E402


def test_bad_settings_and_missing_run_exit_2(tmp_path, capsys):
    assert bench.main(["--run-dir", str(tmp_path), "--out", str(tmp_path / "o"), "--settings", "1000"]) == 2
    assert "steps:learning_rate" in capsys.readouterr().err
    assert bench.main(["--run-dir", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no finished pgts SFT stage" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_rule_search_bad_rules_and_missing_run_exit_2(tmp_path, capsys):
    assert rule_bench.main(["--run-dir", str(tmp_path), "--out", str(tmp_path / "o"), "--rules", "0.3"]) == 2
    assert "tau:extra" in capsys.readouterr().err
    assert rule_bench.main(["--run-dir", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no finished pgts SFT and reward-model stages" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
