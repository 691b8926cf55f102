"""`python -m jaxrl_hier.train --config configs/grpo_arithmetic.yaml`: SFT warm-start, then GRPO/DAPO/Dr.GRPO.

The `grpo` and `sft` entries of `jaxrl_hier.train.ALGORITHMS`. A run directory holds:

    config.yaml            the resolved config (variant defaults filled in)
    sft/                   the warm-start stage: metrics.jsonl, checkpoints/, model/ (save_pretrained +
                           tokenizer), DONE (written last: its presence means the stage is complete)
    metrics.jsonl          one record per GRPO step (rewards, accuracy, lengths, clip, KL, entropy,
                           dropped groups, per-stage times, tokens/s); eval/accuracy on the validation
                           split at step 0 and every eval_every; test/accuracy at step 0 and the last step
    samples.jsonl          a few prompts with their completions and rewards every log_every steps
    checkpoints/           Orbax checkpoints of the GRPO state (trainable params or adapter, optimiser, RNG)
    learning_curve.png     reward, train accuracy, validation and test accuracy against steps
    model/                 the final policy (LoRA merged), loadable by transformers

Each stage is skipped when its output exists, so a killed run resumes at the stage it was in;
`--resume` continues the GRPO stage from its last checkpoint and gives the same numbers as an
uninterrupted run (the problems of a step are drawn from the seed and the step).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

from jaxrl_hier.config import ConfigError, config_from_args
from jaxrl_hier.llm_rl.config import GRPOConfig
from jaxrl_hier.llm_rl.data import evaluation_problems, held_out_row
from jaxrl_hier.llm_rl.sft_stage import run_sft_stage
from jaxrl_hier.runs import (ResumableRun, RunConfigFile, check_resume_changes, is_primary, load_saved_config, log,
                             refuse_existing_run, resolve_output_dir, sync_processes,
                             use_compilation_cache)

#: keys a resume may change: logging, evaluation and retention only, never what is learned
GRPO_RESUME_SAFE_KEYS = ("log_every", "sample_log_count", "eval_every", "eval_problems", "checkpoint_every",
                         "keep_checkpoints", "total_steps")


def _task_and_tokenizer(config: GRPOConfig) -> tuple[Any, Any]:
    from jaxrl_hier.llm_rl.model_setup import policy_tokenizer
    from jaxrl_hier.tasks import task_from_config

    return task_from_config(config), policy_tokenizer(config.model.path, "GRPO")


def check_inputs(config: GRPOConfig, task: Any, tokenizer: Any) -> None:
    """Prompts, and the SFT stage's targets, must fit the static shapes: checked before anything compiles.

    On every problem of a finite pool: a prompt too long would otherwise stop the run whenever it is
    drawn, and a target too long would silently lose its answer line and EOS. On CHECK_SAMPLE
    problems of each split of a procedural task (the SFT stage counts any truncated target it meets
    in metrics.jsonl as `truncated_targets`)."""
    from jaxrl_hier.llm_rl.data import completion_lengths, input_pool, prompt_lengths, refuse_longer, special_ids
    from jaxrl_hier.tasks.base import SPLITS

    special_ids(tokenizer)
    pools = {split: input_pool(task, split, config.seed) for split in SPLITS}
    for split, problems in pools.items():
        if problems:
            refuse_longer(problems, prompt_lengths(tokenizer, [p.prompt for p in problems]),
                           config.max_prompt_length, f"{split} prompts (BOS included)", "max_prompt_length")
    # the targets serve the warm-start only, which trains on the train split
    if config.sft.steps and pools["train"]:
        train = pools["train"]
        refuse_longer(train, completion_lengths(tokenizer, [p.target for p in train]), config.max_new_tokens,
                       "train targets (solution + answer line + EOS)", "max_new_tokens")


def _sample_records(step: int, samples: dict, tokenizer: Any, count: int, config: GRPOConfig,
                    rewards: Any) -> list[dict]:
    import numpy as np

    from jaxrl_hier.tasks.jax_rewards import decode_completions

    rollout = samples["rollout"]
    g = config.num_generations
    rows = list(range(0, min(count, config.prompts_per_step) * g, g))  # the first completion of the first prompts
    tokens, mask = np.asarray(rollout.tokens)[rows], np.asarray(rollout.mask)[rows]
    texts = decode_completions(tokenizer, tokens, mask)
    out = []
    for i, r in enumerate(rows):
        problem = samples["problems"][r // g]
        out.append({"update": step, "step": step, "prompt": problem.prompt, "answer": problem.answer,
                    "completion": texts[i], "correct": bool(rewards.task.is_correct(problem, texts[i]))})
    return out


def plot_grpo_curve(records: list[dict], path: Path, title: str) -> None:
    """Mean reward, train accuracy, and greedy accuracy on validation (the curve) and on test (start and end)
    against the GRPO step."""
    from jaxrl_hier.logging.plots import Panel, Series, plot_curves

    plot_curves(records, path, x="step", panels=[Panel("GRPO step", (
        Series("reward", "mean reward", alpha=0.8), Series("accuracy", "train accuracy (sampled)", alpha=0.8),
        Series("eval/accuracy", "validation accuracy (greedy)", style="o-", color="black"),
        Series("test/accuracy", "test accuracy (greedy; start and end)", style="s", color="tab:red")), title=title)])


def run_grpo(args: argparse.Namespace, raw_config: dict, algorithm: str = "grpo") -> int:
    """The `grpo` entry of jaxrl_hier.train.ALGORITHMS (contract in that module)."""
    config = config_from_args(GRPOConfig, raw_config, args).resolved()
    if algorithm == "sft" and config.sft.steps < 1:
        raise ConfigError("algorithm: sft needs sft.steps >= 1.")
    if args.resume:
        out = args.output_dir
        saved_raw = dict(load_saved_config(GRPOConfig, out).__dict__)
        saved = GRPOConfig(**saved_raw).resolved()
        check_resume_changes(saved, config, GRPO_RESUME_SAFE_KEYS)
    else:
        out = resolve_output_dir(args, f"{algorithm}-{config.task}")
        refuse_existing_run(out)
        if (out / "sft").exists():
            raise ConfigError(f"{out} already holds an SFT stage (sft/): pass --resume, or choose another --output-dir.")
    task, tokenizer = _task_and_tokenizer(config)
    check_inputs(config, task, tokenizer)

    import jax

    use_compilation_cache(out)  # a resume loads the compiled programs (runs.compile_cache)

    from jaxrl_hier.llm import merge_lora, save_pretrained
    from jaxrl_hier.llm_rl.grpo import make_train
    from jaxrl_hier.llm_rl.model_setup import build_lora, build_mesh, build_policy
    from jaxrl_hier.logging import read_jsonl

    mesh = build_mesh(config)
    lm, tokenizer = build_policy(config, tokenizer, mesh=mesh)
    sync_processes("jaxrl_hier.llm_rl:checked")
    # config.yaml: a fresh run's now, a resumed run's once the warm-start's or the GRPO stage's checkpoint is restored
    config_file = RunConfigFile(out, algorithm, config, resume=args.resume)
    config_file.checked()
    t0 = time.perf_counter()
    sft_info: dict = {}
    if config.sft.steps:
        lm, sft_info = run_sft_stage(config.sft_stage(), args, out, lm, tokenizer, task, mesh, config_file)
    if algorithm == "sft":
        return 0

    validation = evaluation_problems(task, config.eval_problems, config.seed, "validation")
    test = evaluation_problems(task, config.eval_problems, config.seed)
    lora = build_lora(config, lm, mesh)
    trainer = make_train(config, lm, tokenizer, task, lora=lora)
    state = trainer.init(jax.random.key(config.seed))
    meta = {"stage": "grpo", "lora_rank": config.lora_rank, "loss_type": config.loss_type}
    primary = is_primary()
    with ResumableRun(out / "checkpoints", meta, keep=config.keep_checkpoints, every=config.checkpoint_every,
                      total=config.total_steps, resume=args.resume, primary=primary, config_file=config_file) as run:
        state, start = run.restore(state)
        if start:
            log(f"GRPO resumed at step {start}")
        writer = run.log(out)
        samples_writer = run.log(out, filename="samples.jsonl")

        def held_out(i: int, state: Any) -> dict:
            def score(problems: list) -> Callable[[], dict]:
                return lambda: {k: v for k, v in trainer.evaluate(state, problems).items() if k != "completions"}

            return held_out_row(i, config.eval_every, config.total_steps, score(validation), score(test))

        if run.first_row_due(writer):
            writer.write({"update": 0, "step": 0, **held_out(0, state), "eval/problems": len(validation),
                          "test/problems": len(test)})

        def step(state: Any, done: int) -> tuple[Any, int, dict]:
            state, metrics, samples = trainer.step(state)
            i = done + 1  # this step's number
            if metrics.get("update_skipped"):
                log(f"step {i}: no completion token in the loss (every group dropped or filtered); "
                    "the optimiser update was skipped")
            rec = {"update": i, "step": i, "time_s": time.perf_counter() - t0, **metrics}
            evaluated = held_out(i, state)
            rec.update(evaluated)
            if i % config.log_every == 0 or evaluated:
                writer.write(rec)
            if config.sample_log_count and i % config.log_every == 0:
                for s in _sample_records(i, samples, tokenizer, config.sample_log_count, config, trainer.rewards):
                    samples_writer.write(s)
            return state, 1, dict(reward=f"{metrics['reward']:.2f}", acc=f"{metrics.get('accuracy', 0):.2f}")

        state, _ = run.run_steps(args, state, total=config.total_steps, desc=config.loss_type, step=step)
    params, adapter = trainer.params_and_lora(state)
    if primary:
        final = merge_lora(params, adapter)
        save_pretrained(lm, final, out / "model")
        from jaxrl_hier.tasks import save_tokenizer

        save_tokenizer(tokenizer, out / "model")
        records = read_jsonl(out / "metrics.jsonl")
        plot_grpo_curve(records, out / "learning_curve.png", f"{config.loss_type} on {config.task}")
        tests = [r["test/accuracy"] for r in records if r.get("test/accuracy") is not None]
        log(f"done: {config.loss_type} {config.total_steps} steps in {time.perf_counter() - t0:.0f}s; test "
            f"accuracy {tests[0] if tests else None} -> {tests[-1] if tests else None}"
            + (f" (SFT model {sft_info.get('eval_accuracy')})" if sft_info else "") + f"; outputs in {out}")
    return 0


def run_sft(args: argparse.Namespace, raw_config: dict) -> int:
    """The `sft` entry of ALGORITHMS: only the warm-start stage of a grpo config."""
    return run_grpo(args, raw_config, algorithm="sft")


__all__ = ["run_grpo", "run_sft", "check_inputs", "plot_grpo_curve", "GRPO_RESUME_SAFE_KEYS"]
