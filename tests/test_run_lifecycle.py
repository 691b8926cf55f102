"""The run-directory lifecycle, the same for every algorithm of `python -m jaxrl_hier.train` (PPO, SFT,
GRPO, the guided agent, PGTS; `jaxrl_hier.runs`), at tiny sizes:

- a fresh run into a directory that holds a run is refused (exit 2), the directory untouched;
- a resume whose checkpoint is refused (one of another run, in the stage the run would go on from)
  exits 2 and leaves every file of the run byte-identical, though it asks for a logging-only change;
- the kill windows replay to the same numbers (tests/kill_windows.py): a kill after a metrics row and
  before its checkpoint, and a kill before the first checkpoint (no row written twice). A tiny run
  of PPO, SFT and GRPO is trained here; the guided agent's and PGTS's windows are replayed on the
  runs their end-to-end tests already train (llm_rl/test_guided.py, search/test_pgts_cli.py), as
  those are the suite's dearest. (The skills scheduler, not a `train` algorithm, has its own:
  skills/test_scheduler, skills/test_chain.)"""

import numpy as np
import pytest

from kill_windows import assert_kill_windows_replay

from jaxrl_hier.config import build_dataclass
from jaxrl_hier.runs import save_run_config
from jaxrl_hier.train import main

LLM = dict(model=dict(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64))
RUNS = {
    # algorithm: (config class path, raw config, the stage directory a resume restores first, a safe change)
    "ppo": ("jaxrl_hier.algorithms.ppo_config:PPOConfig",
            dict(env="CartPole-v1", num_envs=4, num_steps=8, num_minibatches=2, hidden_size=8, num_layers=1,
                 total_timesteps=256), "checkpoints", "log_every=1"),
    "sft": ("jaxrl_hier.llm_rl.config:GRPOConfig",
            dict(task_operators="+", task_digits=1, task_steps=1, max_prompt_length=6, max_new_tokens=8,
                 sft={"steps": 4, "batch_size": 8}, **LLM), "sft/checkpoints", "keep_checkpoints=5"),
    "grpo": ("jaxrl_hier.llm_rl.config:GRPOConfig",
             dict(task_operators="+", task_digits=1, task_steps=1, max_prompt_length=6, max_new_tokens=8,
                  total_steps=2, prompts_per_step=2, num_generations=2, **LLM), "checkpoints", "keep_checkpoints=5"),
    "guided": ("jaxrl_hier.llm_rl.guided_config:GuidedConfig",
               dict(task_operators="+", task_steps=1, max_prompt_length=6, max_new_tokens=8, lora_rank=2,
                    iterations=2, episodes_per_iteration=4, warmup_iterations=1, critic_batch_size=4,
                    replay_capacity=64, critic_hidden_size=16, critic_intermediate_size=32, critic_mlp_hidden=16,
                    eval_episodes=4, **LLM), "checkpoints", "keep_checkpoints=5"),
    "pgts": ("jaxrl_hier.search.config:PGTSConfig",
             dict(sft={"steps": 4, "batch_size": 8}, max_nodes=4, eval_problems=4, **LLM), "sft/checkpoints",
             "keep_checkpoints=5"),
}


def _config(algorithm):
    import importlib

    path, raw, _, _ = RUNS[algorithm]
    module, _, name = path.partition(":")
    config = build_dataclass(getattr(importlib.import_module(module), name), raw)
    return config.resolved() if hasattr(config, "resolved") else config


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("algorithm", sorted(RUNS))
def test_a_fresh_run_into_an_existing_run_is_refused(tmp_path, capsys, algorithm):
    out = tmp_path / "run"
    save_run_config(out / "config.yaml", algorithm, _config(algorithm))
    (out / "metrics.jsonl").write_text('{"update": 1}\n')
    before = _files(out)
    assert main(["--config", str(out / "config.yaml"), "--output-dir", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "already holds" in err and "--resume" in err, err
    assert _files(out) == before


@pytest.mark.parametrize("algorithm", sorted(RUNS))
def test_a_refused_restore_leaves_every_file_byte_identical(tmp_path, capsys, algorithm):
    from jaxrl_hier.checkpointing import Checkpointer

    _, _, stage, change = RUNS[algorithm]
    out = tmp_path / "run"
    save_run_config(out / "config.yaml", algorithm, _config(algorithm))
    ckpt = Checkpointer(out / stage, asynchronous=False)
    ckpt.save(2, {"x": np.zeros(2, np.float32)}, {"stage": "another run", "env": "another env"})
    ckpt.close()
    (out / "metrics.jsonl").write_text('{"update": 1}\n{"update": 2}\n')
    before = _files(out)
    assert main(["--resume", "--output-dir", str(out), "--no-progress", change]) == 2
    err = capsys.readouterr().err
    assert "does not match this run" in err, err
    assert _files(out) == before


#: algorithm: (overrides that make a tiny run of two checkpointed steps, the stage, what seals it)
TRAINED = {
    "ppo": (["total_timesteps=64", "log_every=1", "checkpoint_every=1"], ".", ()),
    "sft": (["sft.steps=2", "sft.checkpoint_every=1"], "sft", ("DONE", "model")),
    "grpo": (["checkpoint_every=1", "eval_every=1", "eval_problems=4"], ".", ()),
}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(TRAINED))
def test_kill_windows_replay_to_the_same_numbers(tmp_path, algorithm):
    overrides, stage, seal = TRAINED[algorithm]
    config, out = tmp_path / "config.yaml", tmp_path / "run"
    save_run_config(config, algorithm, _config(algorithm))
    assert main(["--config", str(config), "--output-dir", str(out), "--no-progress", *overrides]) == 0
    assert_kill_windows_replay(out / stage, lambda: main(["--resume", "--output-dir", str(out), "--no-progress"]),
                               seal=seal)
