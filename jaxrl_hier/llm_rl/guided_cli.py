"""`python -m jaxrl_hier.train --config configs/guided_arithmetic.yaml`: warm-start, then the guided agent.

The `guided` entry of `jaxrl_hier.train.ALGORITHMS`. A run directory holds:

    config.yaml            the config
    sft/                   the backbone's warm-start on the environment's supervised examples (the
                           `grpo` CLI's stage: metrics.jsonl, checkpoints/, model/, DONE)
    metrics.jsonl          one record per iteration: the sampled episodes' summary (train/...), critic
                           losses and Q/V means, advantage, policy loss and KL per role, seconds per
                           stage; the greedy episodes' summary on the validation split (eval/...) at
                           iteration 0 and every eval_every, on the test split (test/...) at 0 and the last
    samples.jsonl          a few episodes per logged iteration (two_turn: problem, turn 1, hint, turn 2, reward)
    checkpoints/           Orbax checkpoints of the whole agent: adapters, their optimiser state, critic,
                           target critic, critic optimiser state, replay buffer, RNG key
    learning_curve.png     greedy turn-1 / turn-2 accuracy (validation; test at start and end), or turns per game
    model/, guidance_model/  the actor (and guidance) adapters merged into the backbone, loadable by transformers

Each stage is skipped when its output exists; `--resume` continues from the last checkpoint and gives
the same numbers as an uninterrupted run (episodes are drawn from the seed and the iteration).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

from jaxrl_hier.config import ConfigError, config_from_args
from jaxrl_hier.llm_rl.config import SFTStageConfig
from jaxrl_hier.llm_rl.data import held_out_row
from jaxrl_hier.llm_rl.guided_config import GuidedConfig
from jaxrl_hier.runs import (ResumableRun, RunConfigFile, check_resume_changes, is_primary, load_saved_config, log,
                             refuse_existing_run, resolve_output_dir, sync_processes,
                             use_compilation_cache)

#: keys a resume may change: logging, evaluation and retention only, never what is learned
GUIDED_RESUME_SAFE_KEYS = ("log_every", "sample_log_count", "eval_every", "eval_episodes", "checkpoint_every",
                           "keep_checkpoints", "iterations")


def check_guided_inputs(config: GuidedConfig, env: Any, tokenizer: Any) -> None:
    """Prompts, states and warm-start targets must fit the static shapes: checked before anything compiles."""
    from jaxrl_hier.llm_rl.data import encode_completions, encode_prompts, special_ids
    from jaxrl_hier.llm_rl.guided import state_length

    special_ids(tokenizer)
    S = state_length(config, env)
    first = [env.observation(ep) for ep in env.reset("train", 32, config.seed) + env.reset("test", 8, config.seed)]
    if config.on_task:
        longest = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in first)
        if longest > config.max_prompt_length:
            raise ConfigError(f"a problem has {longest} tokens (with BOS) but max_prompt_length is "
                              f"{config.max_prompt_length}; raise max_prompt_length.")
    sample = env.sft_problems("train", 96, config.seed)
    encode_prompts(tokenizer, [p.prompt for p in sample] + first, S)
    _, _, truncated = encode_completions(tokenizer, [p.target for p in sample], config.max_new_tokens)
    if truncated:
        raise ConfigError(f"{truncated} of {len(sample)} warm-start targets (answer or hint + EOS) are longer than "
                          f"max_new_tokens={config.max_new_tokens}; raise max_new_tokens.")


def _sft_settings(config: GuidedConfig, state_len: int) -> SFTStageConfig:
    """The warm-start: full fine-tuning of the backbone on [S] states (no adapter). Its greedy check
    decodes unfiltered; the guided trainer's own evaluation suppresses the special tokens (guided.py)."""
    return config.sft.stage_config(max_prompt_length=state_len, max_new_tokens=config.max_new_tokens,
                                   seed=config.seed, eval_problems=config.eval_episodes, log_every=config.log_every,
                                   keep_checkpoints=config.keep_checkpoints)


def evaluation_episodes(env: Any, n: int, seed: int, split: str = "test") -> Callable[[], list]:
    """A fresh list of the evaluation games of `split` (`env.evaluation_episodes`: distinct problems, or
    distinct secrets) for each evaluation, after a log line of how many there are. `env.step`
    copies an episode rather than changing it, so the games can be reused."""
    first = env.evaluation_episodes(split, n, seed)
    short = "; all the split holds" if len(first) < n else ""
    log(f"evaluation: {len(first)} distinct {env.evaluation_label(split)} (asked for {n}{short})")
    return lambda: list(first)


def plot_guided_curve(records: list[dict], path: Path, title: str, env: str) -> None:
    """two_turn: turn-1 and turn-2 accuracy (sampled train; greedy on validation, and on test at the start
    and the end); the games: turns per game and success (wordle: greedy on validation and test words;
    guess_number: greedy over every secret, which come from the range training uses: `GuessNumberEnv`)."""
    from jaxrl_hier.llm_rl.guided import env_class
    from jaxrl_hier.logging.plots import Panel, Series, plot_curves

    keys = env_class(env).METRICS[:2]
    evaluated = "every secret" if env == "guess_number" else "validation"
    series = []
    for (key, label), color in zip(keys, ("tab:blue", "tab:orange")):
        series += [Series(f"train/{key}", f"{label} (sampled, train)", color=color, alpha=0.35),
                   Series(f"eval/{key}", f"{label} (greedy, {evaluated})", style="o-", color=color)]
        if env != "guess_number":  # its validation and test games are the same secrets
            series.append(Series(f"test/{key}", f"{label} (greedy, test: start, end)", style="s", color=color))
    plot_curves(records, path, x="step", legend_fontsize=8, panels=[Panel("iteration", tuple(series), title=title)])


def run_guided(args: argparse.Namespace, raw_config: dict) -> int:
    """The `guided` entry of jaxrl_hier.train.ALGORITHMS (contract in that module)."""
    config = config_from_args(GuidedConfig, raw_config, args)
    if args.resume:
        out = args.output_dir
        check_resume_changes(load_saved_config(GuidedConfig, out), config, GUIDED_RESUME_SAFE_KEYS)
    else:
        out = resolve_output_dir(args, f"guided-{config.env}")
        refuse_existing_run(out)
        if (out / "sft").exists():
            raise ConfigError(f"{out} already holds an SFT stage (sft/): pass --resume, or choose another --output-dir.")
    for key, path in (("model.path", config.model.path), ("guidance_model_path", config.guidance_model_path)):
        if path is not None and not Path(path).is_dir():
            raise ConfigError(f"{key} {path} is not a local directory (nothing is downloaded).")
    use_compilation_cache(out)  # a resume loads the compiled programs (runs.compile_cache)

    from jaxrl_hier.llm_rl.guided import WarmStartTask, make_env, state_length
    from jaxrl_hier.tasks import build_char_tokenizer

    env = make_env(config)
    tokenizer = build_char_tokenizer() if config.model.path is None else None
    if tokenizer is not None:
        check_guided_inputs(config, env, tokenizer)

    import jax

    from jaxrl_hier.llm import merge_lora, save_pretrained
    from jaxrl_hier.llm_rl.sft_stage import run_sft_stage
    from jaxrl_hier.llm_rl.guided import make_train
    from jaxrl_hier.llm_rl.model_setup import build_mesh, build_policy
    from jaxrl_hier.logging import read_jsonl
    from jaxrl_hier.tasks import save_tokenizer

    mesh = build_mesh(config)
    lm, tokenizer = build_policy(config, tokenizer, mesh=mesh)
    if config.model.path is not None:
        check_guided_inputs(config, env, tokenizer)
    guidance_lm = None
    if config.guidance_model_path is not None:
        guidance_lm, gtok = build_policy(config, tokenizer, mesh=mesh, model_path=config.guidance_model_path)
        if gtok.get_vocab() != tokenizer.get_vocab():
            raise ConfigError(f"guidance_model_path {config.guidance_model_path} has another tokenizer than the "
                              "policy; the roles exchange token ids, so they must share one.")
    S = state_length(config, env)
    for name, model in (("policy", lm), ("guidance", guidance_lm)):
        if model is not None and model.config.max_position_embeddings < S + config.max_new_tokens:
            raise ConfigError(f"the {name} model has {model.config.max_position_embeddings} positions but states "
                              f"({S} tokens) plus utterances ({config.max_new_tokens}) need {S + config.max_new_tokens}.")
    sync_processes("jaxrl_hier.llm_rl.guided:checked")
    # config.yaml: a fresh run's now, a resumed run's once the warm-start's or the agent's checkpoint is restored
    config_file = RunConfigFile(out, "guided", config, resume=args.resume)
    config_file.checked()
    t0 = time.perf_counter()
    sft_info: dict = {}
    if config.sft.steps:
        lm, sft_info = run_sft_stage(_sft_settings(config, S), args, out, lm, tokenizer, WarmStartTask(env), mesh,
                                     config_file)

    agent = make_train(config, env, lm, tokenizer, guidance_lm=guidance_lm)
    state = agent.init(jax.random.key(config.seed))
    meta = {"stage": "guided", "env": config.env, "critic": config.critic, "lora_rank": config.lora_rank,
            "replay_capacity": config.replay_capacity}
    validation = evaluation_episodes(env, config.eval_episodes, config.seed, "validation")
    test = evaluation_episodes(env, config.eval_episodes, config.seed)
    primary = is_primary()
    with ResumableRun(out / "checkpoints", meta, keep=config.keep_checkpoints, every=config.checkpoint_every,
                      total=config.iterations, resume=args.resume, primary=primary, config_file=config_file) as run:
        state, start = run.restore(state)
        if start:
            log(f"guided agent resumed at iteration {start}")
        writer = run.log(out)
        samples_writer = run.log(out, filename="samples.jsonl")

        def held_out(i: int, state: Any) -> dict:
            return held_out_row(i, config.eval_every, config.iterations,
                                lambda: agent.evaluate(state, validation())[0], lambda: agent.evaluate(state, test())[0])

        if run.first_row_due(writer):
            writer.write({"update": 0, "step": 0, **held_out(0, state), "eval/episodes": len(validation()),
                          "test/episodes": len(test())})

        def step(state: Any, done: int) -> tuple[Any, int, dict]:
            state, metrics, episodes = agent.iteration(state)
            i = done + 1  # this iteration's number
            rec = {"update": i, "step": i, "time_s": time.perf_counter() - t0, **metrics}
            evaluated = held_out(i, state)
            rec.update(evaluated)
            if i % config.log_every == 0 or evaluated:
                writer.write(rec)
            if config.sample_log_count and i % config.log_every == 0:
                for ep in episodes[:config.sample_log_count]:
                    samples_writer.write({"update": i, "step": i, **env.record(ep)})
            shown = ("train/turn2_accuracy", "train/turns")
            return state, 1, {k.split("/")[1]: f"{metrics[k]:.2f}" for k in shown if k in metrics}

        state, _ = run.run_steps(args, state, total=config.iterations, desc=f"guided-{config.env}", step=step)
    if primary:
        for name, directory in (("actor", "model"), ("guidance", "guidance_model")):
            if name in state.policy:
                role = agent.roles[name]
                save_pretrained(role.lm, merge_lora(role.base, state.policy[name]), out / directory)
                save_tokenizer(tokenizer, out / directory)
        records = read_jsonl(out / "metrics.jsonl")
        plot_guided_curve(records, out / "learning_curve.png", f"guided agent on {env.name}", config.env)
        key = f"test/{env.METRICS[0][0]}"
        evals = [(r["step"], r.get("test/turn1_accuracy"), r[key]) for r in records if r.get(key) is not None]
        log(f"done: {config.iterations} iterations in {time.perf_counter() - t0:.0f}s; over {len(test())} "
            f"{env.evaluation_label('test')}, {key} "
            f"{evals[0][2] if evals else None} -> {evals[-1][2] if evals else None}"
            + (f" (turn 1: {evals[0][1]} -> {evals[-1][1]})" if config.env == "two_turn" and evals else "")
            + (f"; SFT {sft_info.get('eval_accuracy')}" if sft_info else "") + f"; outputs in {out}")
    return 0


__all__ = ["run_guided", "check_guided_inputs", "plot_guided_curve", "GUIDED_RESUME_SAFE_KEYS"]
