"""`python -m jaxrl_hier.train --config <grpo yaml>`: bad input exits 2 before compiling; SFT then GRPO
end to end; --resume gives the same numbers as an uninterrupted run."""

import json

import pytest
import yaml
from value_checks import assert_rows_match

from jaxrl_hier.train import main

TINY = dict(algorithm="grpo", task="arithmetic", task_operators="+", task_digits=1, task_steps=1,
            model_hidden_size=32, model_layers=1, model_heads=2, model_kv_heads=1, model_intermediate_size=64,
            sft_steps=6, sft_batch_size=16, sft_checkpoint_every=3, max_prompt_length=6, max_new_tokens=8,
            total_steps=4, prompts_per_step=4, num_generations=4, eval_every=2, eval_problems=8,
            checkpoint_every=2, sample_log_count=2, beta=0.0, learning_rate=3e-3)


def write_config(tmp_path, **overrides):
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump({**TINY, **overrides}))
    return path


@pytest.mark.parametrize("override, message", [
    ("num_generations=1", "num_generations must be >= 2"),
    ("num_generatoins=4", "Did you mean 'num_generations'"),
    ("model_path=/nonexistent/model", "not a local directory"),
    ("max_new_tokens=3", "raise max_new_tokens"),
    ("task=gsm8k", "task_path"),
    ("loss_type=ppo", "loss_type"),
    ("micro_batch_size=3", "micro_batch_size=3 must divide"),
    ("micro_batch_size=2", "splits a prompt's group of num_generations=4"),
])
def test_bad_input_exits_2_before_compiling(tmp_path, capsys, override, message):
    out = tmp_path / "run"
    assert main(["--config", str(write_config(tmp_path)), "--output-dir", str(out), "--no-progress", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert not out.exists()  # nothing written


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_sft_then_grpo_and_exact_resume(tmp_path, capsys):
    cfg = write_config(tmp_path)
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["--config", str(cfg), "--output-dir", str(full), "--no-progress"]) == 0
    for name in ("config.yaml", "metrics.jsonl", "samples.jsonl", "learning_curve.png", "sft/DONE",
                 "sft/model/config.json", "sft/model/tokenizer.json", "model/model.safetensors"):
        assert (full / name).exists(), name
    saved = yaml.safe_load((full / "config.yaml").read_text())
    assert saved["algorithm"] == "grpo" and saved["eps_high"] == 0.2 and saved["scale_rewards"] == "group"
    recs = records(full / "metrics.jsonl")
    assert [r["step"] for r in recs] == [0, 1, 2, 3, 4]
    assert all("eval/accuracy" in recs[i] for i in (0, 2, 4))
    samples = records(full / "samples.jsonl")
    assert {"prompt", "completion", "answer", "correct"} <= set(samples[0])

    # a fresh run over an existing run directory is refused
    assert main(["--config", str(cfg), "--output-dir", str(full), "--no-progress"]) == 2
    # the same run stopped after 2 steps, then resumed: the SFT stage is skipped, numbers identical
    assert main(["--config", str(cfg), "--output-dir", str(part), "--no-progress", "total_steps=2"]) == 0
    assert main(["--resume", "--output-dir", str(part), "--no-progress", "loss_type=dapo"]) == 2  # unsafe change
    assert main(["--resume", "--output-dir", str(part), "--no-progress", "total_steps=4"]) == 0
    assert "SFT stage already complete" in capsys.readouterr().err
    resumed = records(part / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    assert_rows_match(resumed, recs, ("reward", "loss", "eval/accuracy", "completion_length"))
