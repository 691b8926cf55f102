"""benchmarks/search/pgts_seeds.py: bad input exits 2 before anything runs; the choice reads validation rows
only (the best rule's mean over seeds, then the fewer tokens); the test summary gives each method's
mean and standard error over seeds under one name. (The protocol itself ran at a tiny size by hand:
its steps are the pipeline and pgts_rule_search.py, each tested on its own.)"""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.search import pgts_seeds as bench  # noqa: E402


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0"], "two or more distinct seeds"),
    (["--candidates", "rm_sft_steps"], "key=value"),
    (["--config", "/nonexistent.yaml"], "is not a file"),
])
def test_bad_input_exits_2(tmp_path, capsys, argv, message):
    assert bench.main(["--out", str(tmp_path / "o"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def rule(tau, extra, accuracy, tokens):
    return dict(tau=tau, extra=extra, accuracy=accuracy, tokens=tokens)


def test_the_choice_is_the_best_mean_validation_rule():
    cot = rule(float("-inf"), 0, 0.9, 10.0)  # chain-of-thought: a baseline, never chosen
    validation = {
        "0": {0: [cot, rule(0.3, 1, 0.5, 12.0), rule(0.5, 1, 0.7, 14.0)],
              1: [cot, rule(0.3, 1, 0.5, 12.0), rule(0.5, 1, 0.3, 14.0)]},  # 0.5:1 means 0.5, as 0.3:1
        "1": {0: [cot, rule(0.3, 1, 0.4, 11.0), rule(0.5, 1, 0.6, 13.0)],
              1: [cot, rule(0.3, 1, 0.6, 11.0), rule(0.5, 1, 0.2, 13.0)]},
    }
    options = bench.validation_options(validation)
    assert [o["tau"] for o in options] == [None, 0.3, 0.5] * 2  # chain-of-thought first, not a choice
    chosen = bench.choose(options)
    # three options tie at 0.5: the fewest tokens wins (candidate 1's 0.3:1, 11 tokens)
    assert (chosen["candidate"], chosen["tau"], chosen["extra"]) == ("1", 0.3, 1)
    assert chosen["accuracy"] == pytest.approx(0.5) and chosen["accuracy_se"] == pytest.approx(0.1)


def test_summary_pools_each_method_over_seeds_under_one_name():
    tests = {s: {"rows": [dict(method="CoT greedy", accuracy=c, tokens=30.0),
                          dict(method=f"threshold rule (tau {t}, imitation teacher)", accuracy=a, tokens=33.0)]}
             for s, (c, a, t) in enumerate([(0.2, 0.5, 0.3), (0.6, 0.6, 0.3), (0.4, 0.4, 0.5)])}
    rows = {r["method"]: r for r in bench.summarize(tests)}
    assert set(rows) == {"CoT greedy", "threshold rule (imitation teacher)"}
    r = rows["threshold rule (imitation teacher)"]
    assert r["seeds"] == 3 and r["accuracy"] == pytest.approx(0.5) and r["per_seed"] == [0.5, 0.6, 0.4]
    assert r["accuracy_se"] == pytest.approx(0.1 / math.sqrt(3))
    assert r["vs_cot"] == pytest.approx(0.1) and r["tokens_vs_cot"] == pytest.approx(1.1)
