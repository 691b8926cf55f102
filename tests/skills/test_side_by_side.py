"""benchmarks/skills/side_by_side.py: agents side by side from eval reports and skills_vs_ppo.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.skills.side_by_side import main  # noqa: E402


def report(wood: float, stone: float, score: float, greedy_score: float) -> dict:
    return {"sampled": {"achievements": {"collect_wood": wood, "collect_stone": stone, "collect_iron": 0.0},
                        "score_percent_of_max": score},
            "greedy": {"achievements": {"collect_wood": wood / 2, "collect_stone": 0.0, "collect_iron": 0.0},
                       "score_percent_of_max": greedy_score}}


def test_columns_are_means_over_seeds_and_rows_the_achievements_reached(tmp_path, capsys):
    for seed, (wood, score) in enumerate([(1.0, 50.0), (0.5, 40.0)]):
        (tmp_path / f"s{seed}.json").write_text(json.dumps(report(wood, 0.25, score, score - 10)))
    (tmp_path / "cmp.json").write_text(json.dumps({"runs": [{"seed": 0, "ppo": report(0.2, 0.0, 30.0, 20.0)}]}))
    out = tmp_path / "table.md"
    assert main(["--agent", "managed", str(tmp_path / "s0.json"), str(tmp_path / "s1.json"),
                 "--agent", "flat PPO", f"{tmp_path / 'cmp.json'}:ppo", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| sampled (greedy), % | managed | flat PPO |"
    assert lines[2] == "| collect_wood | 75.0 (37.5) | 20.0 (10.0) |"
    assert lines[3] == "| collect_stone | 25.0 (0.0) | 0.0 (0.0) |"  # collect_iron: reached by nobody
    assert lines[4] == "| score, % of max | **45.0** ± 5.0 (35.0 ± 5.0) | **30.0** (20.0) |"
    assert lines[5] == "| seeds | 2 | 1 |" and out.read_text().splitlines() == lines


def test_a_comparison_file_without_its_agent_is_refused(tmp_path):
    (tmp_path / "cmp.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(SystemExit, match="name the agent"):
        main(["--agent", "flat PPO", str(tmp_path / "cmp.json")])
