"""runs.stage: a stage is complete exactly when its DONE is written; a sealed params stage is loaded
without training again, and one killed between its checkpoint and DONE trains again and replaces
that checkpoint."""

import json

import numpy as np
import pytest

from jaxrl_hier.runs import run_params_stage, seal_stage, stage_summary


def test_seal_and_read(tmp_path):
    stage = tmp_path / "sft"
    assert stage_summary(stage) is None  # no folder yet
    stage.mkdir()
    assert stage_summary(stage) is None
    seal_stage(stage, {"eval_accuracy": 0.5})
    assert stage_summary(stage) == {"eval_accuracy": 0.5}
    assert json.loads((stage / "DONE").read_text()) == {"eval_accuracy": 0.5}
    assert [p.name for p in stage.iterdir()] == ["DONE"]  # no temporary file left beside it


def test_params_stage_trains_once_then_loads(tmp_path):
    stage, target = tmp_path / "rm", {"w": np.zeros(3, np.float32)}
    calls = []

    def train(params):
        calls.append(1)
        return {"w": params["w"] + 1.0 + len(calls)}, {"loss": 0.1 * len(calls)}

    params, summary, finished = run_params_stage(stage, target, {"stage": "rm"}, 7, train)
    assert not finished and summary == {"loss": 0.1} and np.allclose(params["w"], 2.0)
    params, summary, finished = run_params_stage(stage, target, {"stage": "rm"}, 7, train)
    assert finished and summary == {"loss": 0.1} and len(calls) == 1
    np.testing.assert_allclose(np.asarray(params["w"]), 2.0)


def test_params_stage_killed_before_done_trains_again(tmp_path):
    stage, target = tmp_path / "imitation", {"w": np.zeros(2, np.float32)}
    run_params_stage(stage, target, {}, 3, lambda p: ({"w": p["w"] + 5.0}, {"n": 1}))
    (stage / "DONE").unlink()  # the kill window: checkpoint saved, DONE not yet written
    params, summary, finished = run_params_stage(stage, target, {}, 3, lambda p: ({"w": p["w"] - 1.0}, {"n": 2}))
    assert not finished and summary == {"n": 2}
    params, summary, finished = run_params_stage(stage, target, {}, 3, pytest.fail)
    assert finished and summary == {"n": 2}
    np.testing.assert_allclose(np.asarray(params["w"]), -1.0)  # the second training's, not the killed one's
