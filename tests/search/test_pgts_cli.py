"""The PGTS pipeline CLI: bad config values exit 2 before anything compiles; one tiny end-to-end run
(SFT, reward model, PPO on the search env, evaluation table) writes every output, a second call
with --resume finds every stage complete, and one after a kill inside the PPO stage (its last
checkpoint lost, or all of them) continues that stage exactly."""

import json

import pytest
from kill_windows import assert_kill_windows_replay

from jaxrl_hier import train

# One GPS layer for the policy: the PPO, imitation and search programs hold one copy of the layer
# instead of two, and compile sooner.
TINY = ["model.hidden_size=32", "model.layers=1", "model.heads=2", "model.kv_heads=1", "model.intermediate_size=64",
        "sft.steps=4", "sft.batch_size=8", "rm_problems=8", "rm_samples=2", "rm_eval_problems=8", "rm_steps=3",
        "rm_batch_size=8", "train_problems=16", "ppo.total_timesteps=64", "ppo.num_envs=4", "ppo.num_steps=8",
        "ppo.num_minibatches=2", "ppo.update_epochs=1", "eval_problems=4", "eval_every=1", "sc_samples=[2]",
        "mcts_simulations=2", "max_nodes=4", "checkpoint_every=1", "rm_sft_steps=4", "imitation_problems=4",
        "imitation_batch_size=8", "ppo.num_layers=1"]


@pytest.mark.parametrize("override, message", [
    ("max_depth=2", "max_depth"),
    ("step_tokens=4", "step_tokens"),
    ("max_prompt_length=4", "are longer than max_prompt_length=4"),  # every split's pool, as GRPO's check
    ("sc_samples=[0]", "sc_samples"),
    ("ppo.num_minibatches=3", "section 'ppo': num_steps (16) must be divisible by num_minibatches (3)"),
    ("ppo.network=mlp", "'ppo.network' is PGTS's own (gps)"),
    ("sft.batch_size=0", "section 'sft': 'batch_size' must be a positive integer"),
    ("num_minibatches=3", "config key 'num_minibatches' in the command-line overrides is now 'ppo.num_minibatches'"),
    ("sft_steps=10", "is now 'sft.steps'"),
    ("dtype=bfloat16", "is now 'model.dtype'"),
    ("cost_branch=-1", "cost_branch"),
    ("max_nodez=3", "unknown config key"),
    ("rm_kind=oracle", "rm_kind"),
    ("rm_sft_steps=0", "rm_sft_steps"),
    ("imitation_steps=-1", "imitation_steps"),
    ("imitation_batch_size=0", "imitation_batch_size"),
])
def test_bad_config_exits_2(tmp_path, capsys, override, message):
    rc = train.main(["--config", "configs/pgts_arithmetic.yaml", "--output-dir", str(tmp_path / "run"),
                     "--no-progress", override])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_swap_siblings_need_greedy_first_children(tmp_path, capsys):
    rc = train.main(["--config", "configs/pgts_arithmetic.yaml", "--output-dir", str(tmp_path / "run"),
                     "--no-progress", "greedy_first_child=false"])
    assert rc == 2
    assert "greedy_first_child" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_resume_refuses_another_total_timesteps(tmp_path, capsys):
    """PPO anneals its learning rate over total_timesteps: a resume with another length would go on
    at rates the checkpoint was not trained to, so it is refused (as by PPO's own CLI) before
    anything is written."""
    from jaxrl_hier.config import build_dataclass, parse_overrides, read_yaml
    from jaxrl_hier.runs import save_run_config
    from jaxrl_hier.search.config import PGTSConfig

    out = tmp_path / "run"
    raw = {**read_yaml("configs/pgts_arithmetic.yaml"), **parse_overrides(TINY)}
    save_run_config(out / "config.yaml", raw.pop("algorithm"), build_dataclass(PGTSConfig, raw))
    before = (out / "config.yaml").read_bytes()
    assert train.main(["--resume", "--output-dir", str(out), "--no-progress", "ppo.total_timesteps=128"]) == 2
    assert "cannot change 'ppo.total_timesteps' on --resume (64 in the run, 128 asked)" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["config.yaml"] and (out / "config.yaml").read_bytes() == before


@pytest.fixture(scope="module")
def staged_run(tmp_path_factory):
    """A run stopped after SFT, then moved on by --resume to stop after the reward model: what each
    stop left behind is recorded here, and the end-to-end test goes on with this very run (one set
    of SFT and reward-model programs for the file, and the pipeline's stages up to the reward model
    are the ones a stopped run left)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("pgts") / "run"
    args = ["--config", "configs/pgts_arithmetic.yaml", "--output-dir", str(out), "--no-progress", *TINY,
            "imitation_steps=3"]
    listing = lambda: {str(p.relative_to(out)): p.is_file() for p in out.rglob("*")}  # noqa: E731 (path: a file?)
    seen = {"rc_sft": train.main(args + ["stop_after=sft"])}
    seen["after_sft"] = listing()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        seen["rc_reward_model"] = train.main(["--resume", "--output-dir", str(out), "--no-progress",
                                              "stop_after=reward_model"])
    seen.update(after_reward_model=listing(), err=err.getvalue(), config=(out / "config.yaml").read_text())
    return out, args, seen


def test_stop_after_ends_the_pipeline_at_a_stage_and_a_resume_lifts_it(staged_run):
    """stop_after: the models a validation sweep compares, with no look at the test split (no PPO
    stage, whose evaluations are on test, and no evaluation stage); a --resume may move it on."""
    _, _, seen = staged_run
    assert seen["rc_sft"] == 0
    assert seen["after_sft"].get("sft/DONE") and "reward_model" not in seen["after_sft"]
    assert seen["rc_reward_model"] == 0
    assert "stop_after: reward_model: the pipeline ends here" in seen["err"]
    after = seen["after_reward_model"]
    assert after.get("reward_model/DONE") and after.get("reward_model/sft/DONE")
    assert not {"checkpoints", "eval", "metrics.jsonl"} & after.keys()
    assert "stop_after: reward_model" in seen["config"]


@pytest.mark.slow
def test_pipeline_end_to_end(staged_run, capsys):
    """Our shipped config: swap siblings, the likelihood verifier with its own SFT stage under
    reward_model/sft, PPO started from the threshold rule by imitation. (The paper's config, with
    sampled siblings, the classifier reward model and PPO from scratch, runs through its PPO stage
    in test_pgts_reward_model_bench.py, which benchmarks that run.) The run is the one stopped after
    its reward model: a --resume with stop_after lifted runs the rest of the pipeline."""
    out, args, _ = staged_run
    assert train.main(args + ["--resume", "stop_after=null"]) == 0
    for path in ("config.yaml", "sft/DONE", "sft/model", "reward_model/DONE", "metrics.jsonl", "trees.txt",
                 "learning_curve.png", "eval/results.json", "eval/table.md", "eval/accuracy_vs_tokens.png",
                 "eval/trees.txt"):
        assert (out / path).exists(), path
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == [0, 1, 2]
    assert all("eval/accuracy" in r and "eval/tokens" in r for r in records)
    assert "loss" in records[-1] and "search_steps_per_s" in records[-1]
    rows = json.loads((out / "eval/results.json").read_text())["rows"]
    methods = [r["method"] for r in rows]
    assert methods[0] == "CoT greedy" and "self-consistency@2" in methods and "best-of-2 (RM)" in methods
    assert "MCTS (2 simulations)" in methods and methods[-1] == "PGTS (policy)"
    # the imitation teacher and the cloned policy PPO started from, beside the trained one
    assert methods[-3:-1] == ["threshold rule (tau 0.3, imitation teacher)", "PGTS (imitation only)"]
    demos = json.loads((out / "imitation/DONE").read_text())["demos"]
    assert demos["problems"] == 4 and demos["actions"] >= 4
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["tokens"] > 0 for r in rows)
    rm = json.loads((out / "reward_model/DONE").read_text())
    assert {"accuracy", "auc", "loss"} <= set(rm["eval"])
    assert (out / "reward_model/sft/model").is_dir()
    trees = (out / "trees.txt").read_text()
    assert trees.count("=== update") == 3 and "[0] <prompt>" in trees
    # every stage is complete: --resume skips them all and leaves the results alone
    before = (out / "eval/results.json").read_text()
    capsys.readouterr()
    assert train.main(args + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert "SFT stage already complete" in err and "reward model stage already complete" in err
    assert "evaluation stage already complete" in err and "imitation stage already complete" in err
    assert (out / "eval/results.json").read_text() == before
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    # The kill windows of the PPO stage (tests/kill_windows.py): after update 2 was logged but before
    # its checkpoint (--resume restores update 1 and replays 2), and before the first checkpoint after
    # the update-0 evaluation was logged (--resume starts the stage over, logs neither that row nor its
    # tree twice: trees.txt still holds the later trees too, which the stage must drop and write again).
    assert_kill_windows_replay(out, lambda: train.main(args + ["--resume"]), files=("trees.txt",))
    # A kill between the imitation stage's checkpoint and its DONE: --resume redoes that stage over the
    # orphaned checkpoint, to the same result (the classifier reward model's: test_pgts_reward_model_bench.py).
    stage = out / "imitation"
    done = json.loads((stage / "DONE").read_text())
    (stage / "DONE").unlink()
    capsys.readouterr()
    assert train.main(args + ["--resume"]) == 0
    assert "imitation: 3 steps" in capsys.readouterr().err
    again = json.loads((stage / "DONE").read_text())
    assert {k: v for k, v in again.items() if k != "time_s"} == {k: v for k, v in done.items() if k != "time_s"}
