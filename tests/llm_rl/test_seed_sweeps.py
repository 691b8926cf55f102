"""The seed sweeps' shared runner (`bench.train_run`) and benchmarks/llm_rl/guided_seeds.py's summary: a run
that saved its model is skipped, a killed one resumed with its recorded config, a fresh one started
with the overrides; a failing step stops the sweep naming its log; guided_seeds reads each run's
test evaluations (after SFT, after RL; never the validation curve) and gives the mean and standard
error over seeds; `held_out_row` evaluates validation on the curve's schedule and test at the ends only."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.llm_rl import guided_seeds  # noqa: E402
from jaxrl_hier import bench  # noqa: E402
from jaxrl_hier.llm_rl import data  # noqa: E402


def test_train_run_starts_resumes_and_skips(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "run_logged", lambda cmd, log, cwd: calls.append(cmd[3:]))
    out = tmp_path / "run"
    bench.train_run(Path("c.yaml"), out, ["seed=1"], tmp_path / "log.txt", tmp_path)
    assert calls[-1] == ["--config", "c.yaml", "seed=1", "--output-dir", str(out), "--no-progress"]
    out.mkdir()
    (out / "config.yaml").write_text("seed: 1\n")  # a killed run: its recorded config wins
    bench.train_run(Path("c.yaml"), out, ["seed=1"], tmp_path / "log.txt", tmp_path)
    assert calls[-1] == ["--resume", "--output-dir", str(out), "--no-progress"]
    (out / "model").mkdir()
    (out / "model" / "model.safetensors").write_bytes(b"")
    bench.train_run(Path("c.yaml"), out, ["seed=1"], tmp_path / "log.txt", tmp_path)
    assert len(calls) == 2


def test_a_failing_step_stops_the_sweep_naming_its_log(tmp_path):
    log = tmp_path / "logs" / "step.txt"
    with pytest.raises(SystemExit, match="exited 3; see .*step.txt"):
        bench.run_logged([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], log, tmp_path)
    assert log.read_text().strip() == "boom"


def write_run(path: Path, evals: list[tuple[int, float, float]]) -> None:
    """A two-turn run's metrics.jsonl: (step, turn-1, turn-2 test accuracy) at its first and last step, with
    a validation evaluation at each of `evals`' steps (turn-2 minus 0.1) between train rows."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("env: two_turn\n")
    rows = []
    for j, (step, t1, t2) in enumerate(evals):
        if step:
            rows.append({"step": step - 1, "train/turn2_accuracy": 0.5})
        rec = {"step": step, "eval/turn2_accuracy": t2 - 0.1, "time_s": 10.0 * step}
        if j in (0, len(evals) - 1):
            rec.update({"test/turn1_accuracy": t1, "test/turn2_accuracy": t2, "test/accuracy_gain": t2 - t1})
        rows.append(rec | ({"eval/episodes": 200, "test/episodes": 256} if j == 0 else {}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_guided_summary_over_seeds(tmp_path):
    write_run(tmp_path / "s0", [(0, 0.5, 0.6), (10, 0.5, 0.7), (20, 0.6, 0.8)])
    write_run(tmp_path / "s1", [(0, 0.4, 0.6), (10, 0.4, 0.6), (20, 0.4, 0.9)])
    runs = {0: guided_seeds.evaluations(tmp_path / "s0"), 1: guided_seeds.evaluations(tmp_path / "s1")}
    assert runs[0]["env"] == "two_turn" and runs[0]["episodes"] == 256 and sorted(runs[0]["evals"]) == [0, 20]
    assert runs[1]["validation"] == pytest.approx({0: 0.5, 10: 0.5, 20: 0.8})  # the curve: validation only
    s = guided_seeds.summarize(runs)
    assert s["turn2_accuracy"]["sft"] == pytest.approx((0.6, 0.0))
    assert s["turn2_accuracy"]["rl"] == pytest.approx((0.85, 0.05))
    assert s["turn2_accuracy"]["change"] == pytest.approx((0.25, 0.05))
    assert s["turn1_accuracy"]["per_seed_rl"] == [0.6, 0.4]
    table = guided_seeds.table("guided_arithmetic", s)
    assert "| turn2_accuracy (%) | 60.0 ± 0.0 | 85.0 ± 5.0 | 25.0 ± 5.0 | 80.0, 90.0 |" in table


def test_bad_config_exits_2_before_any_run(tmp_path, capsys):
    assert guided_seeds.main(["--out", str(tmp_path / "o"), "--configs", "/nonexistent.yaml"]) == 2
    assert "is not a file" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_held_out_row_evaluates_test_at_the_ends_only():
    calls = []

    def split(name):
        return lambda: calls.append(name) or {"accuracy": 0.5}

    rows = {i: data.held_out_row(i, 4, 10, split("validation"), split("test")) for i in range(11)}
    assert [i for i in rows if "test/accuracy" in rows[i]] == [0, 10]
    assert [i for i in rows if "eval/accuracy" in rows[i]] == [0, 4, 8, 10]
    assert calls.count("test") == 2 and calls.count("validation") == 4  # nothing evaluated off schedule
    assert data.held_out_row(5, 0, 10, split("validation"), split("test")) == {}
    assert set(data.held_out_row(10, 0, 10, split("validation"), split("test"))) == {"test/accuracy"}
