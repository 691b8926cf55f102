"""benchmarks/llm_rl/multiturn.py's reading of runs (curves against episodes played, the test split at the two
ends only), its sample-efficiency figure (episodes to reach the group baseline's final validation
success), the same-warm-start check, the table, and its refusals of bad input before any run; and
benchmarks/llm_rl/advantage_ceiling.py's exact values of the warm-start's rule."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.llm_rl import multiturn  # noqa: E402


def write_run(path: Path, validation: list[float], first_test: float = 0.3, per_iter: int = 10) -> None:
    """A game run evaluated on validation every 2 iterations (`validation` in order), test at both ends."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"episodes_per_iteration: {per_iter}\n")
    last = 2 * (len(validation) - 1)
    rows = []
    for step in range(last + 1):
        row = {"step": step} | ({"train/success": 0.1 * step, "actor/kl": 0.01 * step, "critic/q1_loss": 2.0,
                                 "actor/v_return_mse": 0.5, "actor/q_return_mse": 0.4, "actor/return_var": 1.0, "actor/advantage_agreement": 0.2}
                                if step else {})
        if step % 2 == 0:
            row["eval/success"] = validation[step // 2]
        if step in (0, last):
            row |= {"test/success": first_test if step == 0 else validation[-1], "test/turns": 5.0 - step / 10}
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_read_run_puts_curves_on_episodes_played(tmp_path):
    write_run(tmp_path / "r", [0.2, 0.4, 0.5])
    run = multiturn.read_run(tmp_path / "r")
    assert run["validation"] == {0: 0.2, 20: 0.4, 40: 0.5}  # after step iterations of 10 episodes
    assert run["train"] == pytest.approx({10: 0.1, 20: 0.2, 30: 0.3, 40: 0.4})
    assert run["test"] == {0: {"success": 0.3, "turns": 5.0}, 4: {"success": 0.5, "turns": 4.6}}


def test_episodes_to_reach_and_efficiency(tmp_path):
    assert multiturn.episodes_to_reach({0: 0.1, 20: 0.5, 40: 0.4, 60: 0.6}, 0.5) == 20
    assert multiturn.episodes_to_reach({0: 0.1, 20: 0.3}, 0.5) is None
    for algo, seed, curve in (("group", 0, [0.2, 0.3, 0.5, 0.6]), ("archer", 0, [0.2, 0.6, 0.6, 0.7]),
                              ("group", 1, [0.2, 0.4, 0.4, 0.4]), ("archer", 1, [0.2, 0.3, 0.3, 0.3])):
        write_run(tmp_path / algo / str(seed), curve)
    runs = {a: {s: multiturn.read_run(tmp_path / a / str(s)) for s in (0, 1)} for a in ("group", "archer")}
    eff = multiturn.efficiency(runs)
    assert eff[0]["target"] == 0.6 and eff[0]["episodes"] == {"group": 60, "archer": 20}
    assert eff[0]["ratio"]["archer"] == pytest.approx(1 / 3)
    assert eff[1]["episodes"] == {"group": 20, "archer": None} and eff[1]["ratio"]["archer"] is None
    assert multiturn.check_same_warm_start(runs) == []
    # the training curve (0.1 x iteration at every seed), smoothed over 3: both reach the group's final
    # (0.5, the mean of iterations 4-6) at the last iteration
    eff_train = multiturn.efficiency(runs, "train", window=3)
    assert eff_train[0]["target"] == pytest.approx(0.5) and eff_train[0]["episodes"] == {"group": 60, "archer": 60}
    assert multiturn.smoothed({0: 1.0, 10: 0.0, 20: 0.5}, 2) == {0: 1.0, 10: 0.5, 20: 0.25}
    s = multiturn.summarize(runs, eff, eff_train)
    assert s["archer"]["success"]["rl"] == pytest.approx((0.5, 0.2))
    assert s["archer"]["episodes_to_group_final"] == [20, None] and s["archer"]["episodes_played"] == 60
    assert s["group"]["train_success"]["first10"] == pytest.approx((0.35, 0.0))  # iterations 1-6: 0.1 .. 0.6
    assert s["group"]["kl_last10"] == pytest.approx((0.035, 0.0)) and s["group"]["q1_loss_last10"][0] == 2.0
    assert ("| archer | 30.0 ± 0.0 -> 50.0 ± 20.0 | 4.40 ± 0.00 | 35.0 ± 0.0 -> 35.0 ± 0.0 | 20, never; 60, 60 (of 60) "
            "| 0.035 ± 0.000 | 2.00 ± 0.00 | 0.50 ± 0.00 / 0.40 ± 0.00; 1.00 ± 0.00 | 0.20 ± 0.00 |") in multiturn.table("g", s, [0, 1])


def test_different_warm_starts_are_named(tmp_path):
    write_run(tmp_path / "g", [0.2, 0.5], first_test=0.3)
    write_run(tmp_path / "a", [0.2, 0.5], first_test=0.4)
    runs = {"group": {0: multiturn.read_run(tmp_path / "g")}, "archer": {0: multiturn.read_run(tmp_path / "a")}}
    assert multiturn.check_same_warm_start(runs)[0].startswith("seed 0: the warm-starts differ")


@pytest.mark.parametrize("argv, message", [
    (["--configs", "/nonexistent.yaml"], "is not a file"),
    (["--configs", "configs/grpo_arithmetic.yaml"], "not a multi-turn game config"),
    (["--algorithms", "archer"], "must include group"),
])
def test_bad_input_exits_2_before_any_run(tmp_path, capsys, argv, message):
    out = tmp_path / "o"
    argv = [a if not a.startswith("configs/") else str(multiturn.REPO / a) for a in argv]
    assert multiturn.main(["--out", str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_report_only_summarises_finished_runs_without_training(tmp_path, monkeypatch, capsys):
    """Runs brought back from a device: the seeds where every algorithm finished are compared, nothing trains."""
    from jaxrl_hier import bench

    monkeypatch.setattr(bench, "train_run", lambda *a, **k: pytest.fail("--report-only must not train"))
    root = tmp_path / "out" / "guided_guess64"
    for algo, seed, curve in (("group", 0, [0.2, 0.5]), ("archer", 0, [0.2, 0.6]), ("group", 1, [0.2, 0.4]),
                              ("archer", 1, [0.2, 0.4]), ("group", 2, [0.2, 0.3])):
        write_run(root / algo / f"seed{seed}", curve)
        (root / algo / f"seed{seed}" / "model").mkdir()
        (root / algo / f"seed{seed}" / "model" / "model.safetensors").write_bytes(b"")
    write_run(root / "archer" / "seed2", [0.2])  # cut by the lease: no model, left out with its seed
    config = str(multiturn.REPO / "configs" / "guided_guess64.yaml")
    assert multiturn.main(["--out", str(tmp_path / "out"), "--configs", config, "--report-only"]) == 0
    report = json.loads((tmp_path / "out" / "multiturn.json").read_text())["results"]["guided_guess64"]
    assert sorted(report["runs"]["archer"]) == ["0", "1"] and report["efficiency"]["0"]["episodes"]["archer"] == 20
    assert "seeds with every algorithm finished: [0, 1] (of [0, 1, 2])" in capsys.readouterr().out
    assert multiturn.main(["--out", str(tmp_path / "none"), "--configs", config, "--report-only"]) == 2


def test_the_advantage_ceiling_values_the_rule_the_host_game_plays():
    """The dynamic programme's V* of the uniform-guess rule is the mean return of the host game played by
    that rule (Monte Carlo), and a perfect critic fits the returns at least as well with the utterance."""
    import random

    from benchmarks.llm_rl import advantage_ceiling as ceil
    from jaxrl_hier.tasks.text_games import GuessEpisode, GuessNumberEnv

    game = GuessNumberEnv(high=8, max_turns=3)
    value, q = ceil.rule_values(3)
    rng, total, n = random.Random(0), 0.0, 20000
    for _ in range(n):
        ep = GuessEpisode(rng.randint(1, 8))
        while not ep.done:
            lo, hi = game.consistent([int(g) for g in ep.guesses], ep.replies)
            ep, _, _ = game.step(ep, str(rng.randint(lo, hi)))
        total += ep.ret
    assert total / n == pytest.approx(value(1, 8, 3), abs=0.02)
    assert q(1, 8, 3, 9) == -1.0 + value(1, 8, 2)  # a guess outside the interval only spends a turn
    assert q(1, 1, 1, 1) == 0.0 and value(1, 2, 1) == -0.5
    res = ceil.ceiling(high=16, turns=4, games=200, group=4, seed=0)
    assert res["q_star_return_mse"] <= res["v_star_return_mse"] < res["return_var"]
    assert 0.0 < res["agreement_group"] < 1.0 and res["advantage_var"] > 0
