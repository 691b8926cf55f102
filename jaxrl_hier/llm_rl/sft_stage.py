"""The supervised warm-start stage of a run directory, shared by GRPO (and `algorithm: sft`), the
guided agent, and PGTS's generator and likelihood verifier.

    <out>/sft/   metrics.jsonl, checkpoints/, model/ (save_pretrained + tokenizer), and DONE, written
                 last with the stage's summary: its presence means the stage is complete

A finished stage is loaded, an unfinished one resumed from its latest checkpoint (the trainer is
`sft.SFT`). It lives apart from the CLIs so that no CLI imports another's entry module.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from jaxrl_hier.llm_rl.config import SFTStageConfig
from jaxrl_hier.llm_rl.data import evaluation_problems
from jaxrl_hier.runs import ResumableRun, RunConfigFile, is_primary, log, seal_stage, stage_summary


def run_sft_stage(config: SFTStageConfig, args: argparse.Namespace, out: Path, lm: Any, tokenizer: Any, task: Any,
                  mesh: Any, config_file: RunConfigFile | None = None) -> tuple[Any, dict]:
    """Train (or resume, or skip) the warm-start; returns the model to start RL from and the stage's summary.
    `config_file`: the run's config.yaml, written once the stage's checkpoint is restored."""
    import jax

    from jaxrl_hier.llm import load_pretrained, merge_lora, save_pretrained
    from jaxrl_hier.llm_rl.grpo import evaluate_policy
    from jaxrl_hier.llm_rl.model_setup import build_lora
    from jaxrl_hier.llm_rl.sft import SFT

    stage = out / "sft"
    info = stage_summary(stage)
    if info is not None:
        model = load_pretrained(stage / "model", dtype=lm.dtype, mesh=mesh)
        model.tokenizer = tokenizer
        log(f"SFT stage already complete ({stage}): held-out accuracy {info.get('eval_accuracy')}")
        return model, info
    lora = build_lora(config, lm, mesh)  # None when lora_rank is 0: every weight trains
    sft = SFT(lm, tokenizer, task, steps=config.steps, batch_size=config.batch_size,
              learning_rate=config.learning_rate, warmup_steps=config.warmup_steps,
              max_prompt_length=config.max_prompt_length, max_new_tokens=config.max_new_tokens, seed=config.seed,
              lora=lora)
    state = sft.init()
    t0 = time.perf_counter()
    with ResumableRun(stage / "checkpoints", {"stage": "sft"}, keep=config.keep_checkpoints,
                      every=config.checkpoint_every, total=None, resume=True, primary=is_primary(),
                      config_file=config_file) as run:
        state, start = run.restore(state)
        if start:
            log(f"SFT resumed at step {start}")
        writer = run.log(stage)
        # targets cut to max_new_tokens since the last record (a record covers log_every steps), and in all;
        # logged at the first only, as a long-tailed file would cut some at every step
        truncated = {"since_record": 0, "total": 0}

        def step(state: Any, done: int) -> tuple[Any, int, dict | None]:
            state, metrics = sft.train_step(state, done)
            i = done + 1  # this step's number
            if metrics["truncated_targets"] and not truncated["total"]:
                log(f"SFT step {i}: {metrics['truncated_targets']} of {config.batch_size} targets are "
                    f"longer than max_new_tokens={config.max_new_tokens} and lose their end (answer line, "
                    "EOS); metrics.jsonl counts them as truncated_targets. Raise max_new_tokens.")
            truncated["since_record"] += metrics["truncated_targets"]
            truncated["total"] += metrics["truncated_targets"]
            if i % config.log_every and i != config.steps:
                return state, 1, None
            rec = {k: float(v) for k, v in jax.device_get(metrics).items()}
            rec["truncated_targets"], truncated["since_record"] = float(truncated["since_record"]), 0
            writer.write({"update": i, "step": i, "time_s": time.perf_counter() - t0, **rec})
            return state, 1, dict(loss=f"{rec['loss']:.3f}")

        # the end is saved as the stage's model, not as a checkpoint (total=None above)
        state, _ = run.run_steps(args, state, total=config.steps, desc="sft", step=step)
    params, adapter = sft.params_and_lora(state)
    params = merge_lora(params, adapter)
    test = evaluation_problems(task, config.eval_problems, config.seed)
    ev = evaluate_policy(lm, params, None, tokenizer, task, test, max_prompt_length=config.max_prompt_length,
                         max_new_tokens=config.max_new_tokens, suppress_tokens=config.suppress_tokens)
    lm.params = params
    if is_primary():
        save_pretrained(lm, params, stage / "model")
        from jaxrl_hier.tasks import save_tokenizer

        save_tokenizer(tokenizer, stage / "model")
    info = {"steps": config.steps, "eval_accuracy": ev["accuracy"], "eval_format": ev["format"],
            "eval_problems": len(test), "time_s": time.perf_counter() - t0}
    seal_stage(stage, info)
    cut = f"; {truncated['total']} targets cut to max_new_tokens={config.max_new_tokens}" if truncated["total"] else ""
    log(f"SFT done: {config.steps} steps in {info['time_s']:.0f}s, held-out accuracy {ev['accuracy']:.3f}{cut}")
    return lm, info


__all__ = ["run_sft_stage"]
