"""`python -m jaxrl_hier.train --config <grpo yaml>`: bad input exits 2 before compiling; SFT then GRPO
end to end; --resume gives the same numbers as an uninterrupted run."""

import dataclasses
import json
import re
import shutil

import pytest
import yaml
from value_checks import assert_rows_match

from jaxrl_hier.config import ConfigError
from jaxrl_hier.train import main

TINY = dict(algorithm="grpo", task="arithmetic", task_operators="+", task_digits=1, task_steps=1,
            model=dict(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64),
            sft=dict(steps=6, batch_size=16, checkpoint_every=3), max_prompt_length=6, max_new_tokens=8,
            total_steps=4, prompts_per_step=4, num_generations=4, eval_every=2, eval_problems=8,
            checkpoint_every=2, sample_log_count=2, beta=0.0, learning_rate=3e-3)


def write_config(tmp_path, **overrides):
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump({**TINY, **overrides}))
    return path


def test_evaluation_problems_are_distinct_and_logged(capsys):
    """GRPO's and PGTS's evaluation sets: distinct problems, their count in the log, and a split
    too small for eval_problems used whole, with a line saying so."""
    from jaxrl_hier.llm_rl.data import evaluation_problems
    from jaxrl_hier.tasks import make_task

    task = make_task("arithmetic", operators="+", digits=1, steps=1)  # about 10 test expressions
    few = evaluation_problems(task, 4, 0)
    assert len({p.prompt for p in few}) == 4 and "evaluation: 4 distinct test problems (asked for 4)" in \
        capsys.readouterr().err
    every = evaluation_problems(task, 512, 0)
    assert len({p.prompt for p in every}) == len(every) < 512
    assert f"the split holds only {len(every)}, all used" in capsys.readouterr().err


@pytest.mark.parametrize("override, message", [
    ("num_generations=1", "num_generations must be >= 2"),
    ("num_generatoins=4", "Did you mean 'num_generations'"),
    ("model.path=/nonexistent/model", "not a local directory"),
    ("max_new_tokens=3", "raise max_new_tokens"),
    ("task=gsm8k", "task_path"),
    ("loss_type=ppo", "loss_type"),
    ("micro_batch_size=3", "micro_batch_size=3 must divide"),
    ("micro_batch_size=2", "splits a prompt's group of num_generations=4"),
    ("max_sampling_rounds=97", "max_sampling_rounds must be in [1, 96]"),
    ("sft_steps=3", "'sft_steps' in the command-line overrides is now 'sft.steps'"),  # the old flat key
    ("sft.lora=true", "sft.lora: true needs lora_rank > 0"),
    ("sft.batch_size=0", "section 'sft': 'batch_size' must be a positive integer"),
    ("model_layers=2", "'model_layers' in the command-line overrides is now 'model.layers'"),  # the old flat key
    ("model.kv_heads=3", "section 'model': heads=2 must be a multiple of kv_heads=3"),
    ("model.hidden_size=0", "section 'model': 'hidden_size' must be an integer >= 1"),
])
def test_bad_input_exits_2_before_compiling(tmp_path, capsys, override, message):
    out = tmp_path / "run"
    assert main(["--config", str(write_config(tmp_path)), "--output-dir", str(out), "--no-progress", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert not out.exists()  # nothing written


@pytest.mark.parametrize("key, value, message", [
    ("eps_high", -0.01, "eps_high must be >= 0"),  # 1 + eps_high < 1 - eps_low: every ratio pinned
    ("overlong_buffer", 9, "overlong_buffer must be in [-1, max_new_tokens=8]"),  # every completion penalised
    ("overlong_buffer", -2, "overlong_buffer must be in [-1, max_new_tokens=8]"),  # silently no penalty
    ("max_sampling_rounds", 97, "max_sampling_rounds must be in [1, 96]"),  # seeds of the next step's rounds
])
def test_loader_refuses_values_out_of_range(key, value, message):
    from jaxrl_hier.config import ConfigError, build_dataclass
    from jaxrl_hier.llm_rl.config import GRPOConfig

    raw = {k: v for k, v in TINY.items() if k != "algorithm"}
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_dataclass(GRPOConfig, {**raw, key: value})
    # the ends of each range load
    for key, value in (("eps_high", 0.0), ("overlong_buffer", -1), ("overlong_buffer", 8),
                       ("max_sampling_rounds", 96)):
        build_dataclass(GRPOConfig, {**raw, key: value})


def write_gsm8k(path, long_at, long_question=False, long_answer=False):
    """400 short problems ("<i>?" -> "#### 1"), and at line `long_at` one with a long question or solution."""
    lines = [{"question": f"{i}?", "answer": "#### 1"} for i in range(400)]
    if long_question:
        lines[long_at - 1] = {"question": "5+6+7+8?", "answer": "#### 26"}  # 9 tokens + BOS (train split)
    if long_answer:
        lines[long_at - 1] = {"question": "1+2 then?", "answer": "1+2=3\n#### 3"}  # 12 tokens + EOS (train)
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_every_problem_of_a_finite_pool_is_checked(tmp_path, capsys):
    """One prompt too long among 400 GSM8K problems stops the run with exit 2, naming its line and
    the length to raise max_prompt_length to (a sample of 80 missed it); with an SFT stage, so does
    one target too long, which would otherwise lose its answer line and EOS."""
    from jaxrl_hier.llm_rl.cli import check_inputs
    from jaxrl_hier.llm_rl.config import GRPOConfig, GRPOSFTSection
    from jaxrl_hier.tasks import build_char_tokenizer, make_task

    data = write_gsm8k(tmp_path / "q.jsonl", 300, long_question=True)
    train = make_task("gsm8k", path=str(data)).size("train")
    out = tmp_path / "run"
    assert main(["--config", str(write_config(tmp_path)), "--output-dir", str(out), "--no-progress", "task=gsm8k",
                 f"task_path={data}"]) == 2
    err = capsys.readouterr().err
    assert f"1 of {train} train prompts (BOS included) are longer than max_prompt_length=6; the longest " \
           f"({data}:300) has 10 tokens: raise max_prompt_length to 10." in err, err
    assert not out.exists()

    tok = build_char_tokenizer()
    config = GRPOConfig(task="gsm8k", task_path="-", max_prompt_length=11, max_new_tokens=8,
                        sft=GRPOSFTSection(steps=1))
    data = write_gsm8k(tmp_path / "a.jsonl", 250, long_answer=True)
    task = make_task("gsm8k", path=str(data))
    with pytest.raises(ConfigError, match=re.escape(f"1 of {task.size('train')} train targets (solution + answer "
                                                    f"line + EOS) are longer than max_new_tokens=8; the longest "
                                                    f"({data}:250) has 13 tokens: raise max_new_tokens to 13.")):
        check_inputs(config, task, tok)
    check_inputs(dataclasses.replace(config, sft=GRPOSFTSection(steps=0)), task, tok)  # targets serve the SFT stage only


@pytest.mark.parametrize("algorithm, stage", [("grpo", "checkpoints"), ("sft", "sft/checkpoints")])
def test_refused_restore_leaves_config_yaml_unchanged(tmp_path, capsys, algorithm, stage):
    """A resume whose checkpoint is refused (one of another run, in the GRPO stage or the warm-start's)
    leaves config.yaml byte-identical, though it asks for a logging-only change; once the checkpoint
    is good, the resume goes through and records the change."""
    import numpy as np

    from jaxrl_hier.checkpointing import Checkpointer
    from jaxrl_hier.config import build_dataclass
    from jaxrl_hier.llm_rl.config import GRPOConfig
    from jaxrl_hier.runs import save_run_config

    out = tmp_path / "run"
    raw = {k: v for k, v in TINY.items() if k != "algorithm"}
    if algorithm == "grpo":
        raw["sft"] = {**raw["sft"], "steps": 0}  # the run is in its GRPO stage from the start
    save_run_config(out / "config.yaml", algorithm, build_dataclass(GRPOConfig, raw).resolved())
    ckpt = Checkpointer(out / stage, asynchronous=False)
    ckpt.save(2, {"x": np.zeros(2, np.float32)}, {"stage": "another run"})
    ckpt.close()
    before = (out / "config.yaml").read_bytes()
    resume = ["--resume", "--output-dir", str(out), "--no-progress", "keep_checkpoints=5"]
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert "does not match this run: stage is 'another run' in the checkpoint" in err, err
    assert (out / "config.yaml").read_bytes() == before
    if algorithm == "sft":  # the warm-start alone is cheap enough to finish
        shutil.rmtree(out / stage)
        assert main(resume) == 0
        assert yaml.safe_load((out / "config.yaml").read_text())["keep_checkpoints"] == 5


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
    # validation every eval_every=2 steps, test at the first and the last step only
    assert [r["step"] for r in recs if "eval/accuracy" in r] == [0, 2, 4]
    assert [r["step"] for r in recs if "test/accuracy" in r] == [0, 4]
    # eval_problems=8 distinct problems (of about 10 per split), counted in the first record and the SFT summary
    assert recs[0]["eval/problems"] == recs[0]["test/problems"] == 8
    assert json.loads((full / "sft/DONE").read_text())["eval_problems"] == 8
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
    # test: the ends of each run (the stopped run's end, step 2, was its own last step)
    assert [r["step"] for r in resumed if "test/accuracy" in r] == [0, 2, 4]
    assert [resumed[i]["test/accuracy"] for i in (0, 4)] == [recs[i]["test/accuracy"] for i in (0, 4)]
    # the warm-start records how many targets it truncated (none here: check_inputs saw them all fit)
    assert [r["truncated_targets"] for r in records(full / "sft" / "metrics.jsonl")] == [0.0] * 6
