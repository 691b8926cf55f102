"""benchmarks/search/pgts_reward_model.py and pgts_rule_search.py refuse bad input with exit 2 before loading anything,
sweep on the validation split, and report the chosen setting once on test (--test)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.search import pgts_reward_model as bench  # noqa: E402
from benchmarks.search import pgts_rule_search as rule_bench  # noqa: E402


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


def test_rule_search_chooses_the_best_rule_after_cot():
    rows = [dict(tau=float("-inf"), extra=0, accuracy=0.9, tokens=10.0),  # CoT: a baseline, never chosen
            dict(tau=0.1, extra=1, accuracy=0.5, tokens=12.0), dict(tau=0.3, extra=1, accuracy=0.6, tokens=20.0),
            dict(tau=0.5, extra=2, accuracy=0.6, tokens=15.0)]
    assert rule_bench.chosen_rule(rows) == (0.5, 2)  # the most accurate, then the cheaper


def test_reward_model_figures_come_from_distinct_validation_problems(monkeypatch):
    """The paths that measure (and so select) a reward model are sampled from the validation split,
    distinct problems; the test split only when asked for."""
    import types

    from jaxrl_hier.search import cli, reward_model
    from jaxrl_hier.search.config import PGTSConfig
    from jaxrl_hier.tasks import make_task

    seen = {}
    monkeypatch.setattr(reward_model, "sample_path_data",
                        lambda lm, params, tok, task, problems, **kw: seen.setdefault(kw["labels"], problems))
    config = PGTSConfig(rm_eval_problems=64, rm_labels="final")
    task = make_task("arithmetic", operators="+-", digits=1, steps=3)
    problems = cli.held_out_paths(config, types.SimpleNamespace(params=None), None, task)
    assert len(problems) == len({p.prompt for p in problems}) == 64
    assert {p.meta["split"] for p in problems} == {"validation"}
    test = cli.held_out_paths(config, types.SimpleNamespace(params=None), None, task, split="test", labels="steps")
    assert {p.meta["split"] for p in test} == {"test"} and seen["steps"] is test


@pytest.mark.slow
def test_sweeps_run_on_validation_and_report_the_choice_once_on_test(tmp_path, capsys):
    """The paper's shipped config at a tiny size through its PPO stage (sampled siblings, the
    classifier reward model, PPO from scratch; the evaluation stage, the pipeline's other stages and
    its kill windows are test_pgts_cli.py's end-to-end run, on our config), then both benchmarks on
    that run: the sweep's rows are of validation problems, and --test adds the chosen setting's
    figures on the test split."""
    import json

    from jaxrl_hier import train

    from test_pgts_cli import TINY

    run = tmp_path / "run"
    args = ["--config", "configs/pgts_arithmetic_paper.yaml", "--output-dir", str(run), "--no-progress", *TINY,
            "stop_after=ppo"]
    assert train.main(args) == 0
    for path in ("sft/DONE", "reward_model/DONE", "metrics.jsonl", "trees.txt"):
        assert (run / path).exists(), path
    # PPO from scratch: no imitation stage, no reward model SFT (the classifier), and no evaluation yet
    assert not (run / "imitation").exists() and not (run / "reward_model/sft").exists() and not (run / "eval").exists()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == [0, 1, 2] and "loss" in records[-1]
    # A kill between the classifier reward model's checkpoint and its DONE: --resume redoes that stage
    # over the orphaned checkpoint, to the same result, and finds every later stage complete.
    done = json.loads((run / "reward_model/DONE").read_text())
    assert {"accuracy", "auc", "loss"} <= set(done["eval"])
    (run / "reward_model/DONE").unlink()
    capsys.readouterr()
    assert train.main(args + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert "reward model: held-out accuracy" in err and "stop_after: ppo: the pipeline ends here" in err
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3  # the finished PPO stage is not run again
    again = json.loads((run / "reward_model/DONE").read_text())
    assert {k: v for k, v in again.items() if k != "time_s"} == {k: v for k, v in done.items() if k != "time_s"}
    assert rule_bench.main(["--run-dir", str(run), "--out", str(tmp_path / "rules"), "--rules", "0.3:1", "0.5:1",
                            "--test"]) == 0
    rules = json.loads((tmp_path / "rules" / "pgts_rule_search.json").read_text())
    assert rules["split"] == "validation" and rules["problems"] == 4 and len(rules["rows"]) == 3
    assert rules["test_problems"] == 4 and len(rules["test_rows"]) == 2  # CoT and the chosen rule, once
    chosen = rules["test_rows"][1]
    assert (chosen["tau"], chosen["extra"]) == rule_bench.chosen_rule(rules["rows"])
    assert bench.main(["--run-dir", str(run), "--out", str(tmp_path / "rm"), "--problems", "4",
                       "--settings", "2:1e-3", "3:1e-3", "--test"]) == 0
    rm = json.loads((tmp_path / "rm" / "pgts_reward_model.json").read_text())
    assert rm["split"] == "validation" and len(rm["runs"]) == 2
    best = max(rm["runs"], key=lambda r: r["eval"]["auc"])
    assert rm["chosen"]["steps"] == best["steps"] and rm["chosen"]["validation"] == best["eval"]
    assert {"accuracy", "auc", "loss"} <= set(rm["chosen"]["test"])
