"""benchmarks/skills/generalist_alone.py end to end on a tiny TechTree config: the manager's network
trained with its skills closed (and the library's conditions as inputs, `manager.features`), then
played from validation and test worlds; a manager section it cannot use exits 2; a killed run resumes
to the same numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.skills import generalist_alone  # noqa: E402

CONFIG = """env: TechTree-v0
target: place_table
max_experts: 4
updates_per_round: 2
ppo: {num_envs: 8, num_steps: 4, num_minibatches: 2, update_epochs: 1, hidden_size: 8, num_layers: 1}
manager: {timesteps: 64, skills: [collect_wood, place_table], primitives: true, generalist_timesteps: 64,
          features: all}
"""


def test_a_tiny_generalist_trains_and_is_played_from_both_splits(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(CONFIG)
    argv = ["--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"), "--budget", "200",
            "--anneal-start", "0.5", "--episodes", "4", "--validation-episodes", "3"]
    assert generalist_alone.main(argv) == 0
    out = json.loads((tmp_path / "out" / "generalist_alone.json").read_text())
    assert out["env_steps"] == 192 and len(out["curve"]) == 3  # whole chunks of 2 updates x 32 steps
    assert out["ppo"]["anneal_start"] == 0.5 and out["ppo"]["total_timesteps"] == 192
    assert out["validation"]["worlds_seed"] == 1000 and out["test"]["worlds_seed"] == 2000
    assert out["test"]["sampled"]["episodes"] == 4 and out["validation"]["greedy"]["episodes"] == 3
    # the closed skills never act: every step is the network's own base action
    assert out["test"]["sampled"]["acting"] == {"manager (base action)": 1.0}


def test_a_manager_without_base_actions_exits_2(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(CONFIG.replace("primitives: true, generalist_timesteps: 64", "primitives: false"))
    argv = ["--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"), "--budget", "200"]
    assert generalist_alone.main(argv) == 2
    assert "take base actions (primitives: true)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_killed_generalist_resumes_to_the_same_numbers_and_a_used_directory_is_refused(tmp_path, monkeypatch,
                                                                                         capsys):
    (tmp_path / "c.yaml").write_text(CONFIG)
    argv = ["--config", str(tmp_path / "c.yaml"), "--budget", "200", "--episodes", "4", "--validation-episodes", "3",
            "--checkpoint-every", "1", "--no-progress"]
    assert generalist_alone.main([*argv, "--out", str(tmp_path / "straight")]) == 0

    train = generalist_alone.ManagerTrainer.train

    def counted(calls, kill_at=None):
        def wrapped(self, runner):
            calls.append(1)
            if len(calls) == kill_at:
                raise KeyboardInterrupt  # a kill after the chunks before it were checkpointed
            return train(self, runner)
        return wrapped

    monkeypatch.setattr(generalist_alone.ManagerTrainer, "train", counted([], kill_at=3))
    killed = ["--out", str(tmp_path / "killed")]
    with pytest.raises(KeyboardInterrupt):
        generalist_alone.main([*argv, *killed])
    assert not (tmp_path / "killed" / "generalist_alone.json").exists()
    assert generalist_alone.main([*argv, *killed]) == 2  # a fresh command refuses the run's directory
    assert "already holds an earlier run" in capsys.readouterr().err
    resumed_calls = []
    monkeypatch.setattr(generalist_alone.ManagerTrainer, "train", counted(resumed_calls))
    assert generalist_alone.main([*argv, *killed, "--resume"]) == 0
    assert len(resumed_calls) == 1  # only the third chunk: the first two came from the checkpoint

    straight, resumed = (json.loads((tmp_path / d / "generalist_alone.json").read_text()) for d in ("straight", "killed"))
    assert [c["episode_return"] for c in resumed["curve"]] == [c["episode_return"] for c in straight["curve"]]
    for split in ("validation", "test"):
        for mode in ("sampled", "greedy"):
            assert resumed[split][mode]["achievements"] == straight[split][mode]["achievements"]
            assert resumed[split][mode]["mean_return"] == straight[split][mode]["mean_return"]
