"""`python -m jaxrl_hier.train --config configs/pgts_arithmetic.yaml`: the whole PGTS pipeline.

The `pgts` entry of `jaxrl_hier.train.ALGORITHMS`. Stages, each skipped when its output exists in
the run directory (so a killed run resumes at the stage it was in):

    sft/                 generator warm-start on worked multi-step arithmetic (jaxrl_hier.llm_rl.sft):
                         metrics.jsonl, checkpoints/, model/, DONE
    reward_model/        sampled solutions labelled by their final answer, a classification head
                         trained on partial paths: metrics.jsonl (loss per step), checkpoints/, DONE
                         (held-out accuracy and AUC)
    imitation/           imitation_steps > 0: the threshold rule's searches of training problems, a
                         policy cloned from them (search.imitation) as PPO's start: metrics.jsonl,
                         checkpoints/, DONE (the rule's training accuracy, the fit)
    metrics.jsonl        PGTS PPO, one record per log_every updates (return, training accuracy of
                         finished searches, losses, search steps/s) and eval/* (the validation
                         split) every eval_every
    checkpoints/         Orbax checkpoints of the PPO runner state (--resume continues exactly)
    trees.txt            one searched validation tree per evaluation, as text (steps, scores, path)
    learning_curve.png   return, training and validation accuracy against PPO updates
    eval/                results.json, table.md, accuracy_vs_tokens.png, trees of PGTS and MCTS:
                         PGTS against CoT greedy, self-consistency, best-of-N and MCTS on the same
                         test problems, evaluated once (with imitation also the rule and the cloned policy)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from jaxrl_hier.config import ConfigError, config_from_args
from jaxrl_hier.runs import (ResumableRun, RunConfigFile, check_resume_changes, is_primary, load_saved_config, log,
                             refuse_existing_run, resolve_output_dir, run_params_stage, seal_stage,
                             stage_summary, sync_processes, use_compilation_cache)
from jaxrl_hier.search.config import PGTS_RESUME_SAFE_KEYS, PGTSConfig


def make_task_and_tokenizer(config: PGTSConfig) -> tuple[Any, Any]:
    from jaxrl_hier.llm_rl.model_setup import policy_tokenizer
    from jaxrl_hier.tasks import task_from_config

    return task_from_config(config, worked=True), policy_tokenizer(config.model.path, "PGTS")


def load_finished_run(run_dir: Path) -> tuple[PGTSConfig, Any, Any, Any]:
    """A pipeline run's config, task, tokenizer and SFT generator (RUN/config.yaml, RUN/sft/model), for
    the benchmarks that study a finished run; a bad config.yaml raises ConfigError."""
    from jaxrl_hier.llm import load_pretrained

    config = load_saved_config(PGTSConfig, run_dir)
    task, tokenizer = make_task_and_tokenizer(config)
    lm = load_pretrained(run_dir / "sft" / "model")
    lm.tokenizer = tokenizer
    return config, task, tokenizer, lm


def check_inputs(config: PGTSConfig, task: Any, tokenizer: Any) -> None:
    """Prompts, steps and whole solutions must fit the static shapes: checked before anything compiles,
    on every problem of a finite pool and a sample of each split of a procedural one (`input_pool`,
    as GRPO's check)."""
    from jaxrl_hier.llm_rl.data import encode_completions, input_pool, prompt_lengths, refuse_longer, special_ids
    from jaxrl_hier.search.reward_model import split_steps
    from jaxrl_hier.tasks.base import SPLITS
    from jaxrl_hier.tasks.jax_rewards import answer_token_spec

    _, _, eos = special_ids(tokenizer)
    answer_token_spec(tokenizer)
    if tokenizer.convert_tokens_to_ids("\n") in (None, tokenizer.unk_token_id):
        raise ConfigError("the tokenizer has no token for the step delimiter '\\n'.")
    sample = [p for split in SPLITS for p in input_pool(task, split, config.seed)]
    refuse_longer(sample, prompt_lengths(tokenizer, [p.prompt for p in sample]), config.max_prompt_length,
                  "prompts (BOS included)", "max_prompt_length")
    ids, mask, truncated = encode_completions(tokenizer, [p.target for p in sample], config.cot_max_tokens)
    if truncated:
        raise ConfigError(f"{truncated} of {len(sample)} worked solutions are longer than max_depth x step_tokens = "
                          f"{config.cot_max_tokens} tokens; raise max_depth or step_tokens.")
    delimiter = tokenizer.convert_tokens_to_ids("\n")
    for row, m in zip(ids, mask):
        steps = split_steps(row[m > 0].tolist(), delimiter, eos, 10**6)
        if max(len(s) for s in steps) > config.step_tokens:
            raise ConfigError(f"a worked step has {max(len(s) for s in steps)} tokens but step_tokens is "
                              f"{config.step_tokens}; raise step_tokens.")
        if len(steps) > config.max_depth:
            raise ConfigError(f"a worked solution has {len(steps)} steps but max_depth is {config.max_depth}; "
                              "raise max_depth.")


def build_env(config: PGTSConfig, lm: Any, rm: Any, tokenizer: Any, *, max_nodes: int | None = None,
              max_children: int | None = None, token_budget: int | None = None):
    from jaxrl_hier.llm_rl.data import special_ids
    from jaxrl_hier.search.env import SearchEnv

    pad, _, eos = special_ids(tokenizer)
    return SearchEnv(lm, rm.score, prompt_length=config.max_prompt_length,
                     max_nodes=max_nodes or config.max_nodes, max_depth=config.max_depth,
                     max_children=max_children or config.max_children, step_tokens=config.step_tokens,
                     token_budget=token_budget or config.token_budget, temperature=config.temperature,
                     greedy_first_child=config.greedy_first_child, sibling=config.sibling,
                     delimiter_id=tokenizer.convert_tokens_to_ids("\n"), eos_id=eos, pad_id=pad,
                     final_ids=(tokenizer.convert_tokens_to_ids("#"),))


def env_params_for(config: PGTSConfig, env: Any, lm_params: Any, rm_params: Any, tokenizer: Any, problems) -> Any:
    from jaxrl_hier.llm_rl.data import encode_prompts
    from jaxrl_hier.tasks.jax_rewards import answer_token_spec, encode_answers

    enc = encode_prompts(tokenizer, [p.prompt for p in problems], config.max_prompt_length)
    return env.make_params(lm_params, rm_params, enc.ids, enc.mask, encode_answers(tokenizer, [p.answer for p in problems]),
                           answer_token_spec(tokenizer),
                           costs=(config.cost_expand, config.cost_branch, config.cost_backtrack, config.cost_terminate),
                           correct_reward=config.correct_reward)


# ----------------------------------------------------------------------------- reward model stage


def held_out_paths(config: PGTSConfig, lm: Any, tokenizer: Any, task: Any, split: str = "validation",
                   labels: str | None = None) -> tuple[Any, dict]:
    """The labelled paths that measure either kind of reward model: the generator's samples of
    `rm_eval_problems` distinct held-out problems, cut and labelled as `rm_labels` (or `labels`)
    says. Of the validation split by default: these figures choose reward-model settings
    (benchmarks/search/pgts_reward_model.py), so the test split stays for reporting a chosen one once."""
    import jax

    from jaxrl_hier.llm_rl.data import evaluation_problems
    from jaxrl_hier.search.reward_model import sample_path_data

    problems = evaluation_problems(task, config.rm_eval_problems, config.seed + 1, split)
    sampling = {**_path_sampling(config), **({} if labels is None else {"labels": labels})}
    return sample_path_data(lm, lm.params, tokenizer, task, problems, samples=config.rm_samples,
                            key=jax.random.key(config.seed + 13), **sampling)


def _path_sampling(config: PGTSConfig) -> dict:
    return dict(temperature=config.temperature, prompt_length=config.max_prompt_length, step_tokens=config.step_tokens,
                max_depth=config.max_depth, labels=config.rm_labels)


def run_verifier_stage(config: PGTSConfig, out: Path, lm: Any, tokenizer: Any, task: Any,
                       args: argparse.Namespace | None = None) -> tuple[Any, Any, dict]:
    """`rm_kind: likelihood`: a second decoder of the generator's shape trained by SFT on the worked
    solutions (`rm_sft_steps` steps, seed + 1) in reward_model/sft/, scoring paths by the probability
    of their least likely step token; measured on the held-out labelled paths. Returns (verifier,
    its params, summary); a finished stage is loaded."""
    import dataclasses

    from jaxrl_hier.llm_rl.sft_stage import run_sft_stage
    from jaxrl_hier.llm_rl.model_setup import build_mesh, build_policy
    from jaxrl_hier.search.reward_model import LikelihoodVerifier, evaluate_reward_model

    stage = out / "reward_model"
    sft_cfg = dataclasses.replace(config, seed=config.seed + 1,
                                  sft=dataclasses.replace(config.sft, steps=config.rm_sft_steps)).sft_config()
    mesh = build_mesh(sft_cfg)
    model, _ = build_policy(sft_cfg, tokenizer, mesh=mesh)
    model, sft_info = run_sft_stage(sft_cfg.sft_stage(), args or argparse.Namespace(no_progress=True), stage, model, tokenizer,
                                    task, mesh)
    verifier = LikelihoodVerifier(model)
    info = stage_summary(stage)
    if info is not None:
        log(f"reward model stage already complete ({stage}): likelihood verifier, held-out AUC {info['eval']['auc']:.3f}")
        return verifier, model.params, info
    t0 = time.perf_counter()
    test_data, test_info = held_out_paths(config, lm, tokenizer, task)
    ev = evaluate_reward_model(verifier, model.params, test_data)
    info = {"kind": "likelihood", "verifier_sft": sft_info, "held_out": test_info, "eval": ev,
            "time_s": time.perf_counter() - t0}
    seal_stage(stage, info)
    log(f"likelihood verifier (greedy accuracy as a generator {sft_info.get('eval_accuracy')}): held-out accuracy "
        f"{ev['accuracy']:.3f}, AUC {ev['auc']:.3f} (complete paths {ev['final_auc']:.3f})")
    return verifier, model.params, info


def run_reward_model_stage(config: PGTSConfig, out: Path, lm: Any, tokenizer: Any, task: Any,
                           args: argparse.Namespace | None = None) -> tuple[Any, Any, dict]:
    """Sample, label, train and evaluate the reward model (or load it); returns (rm, params, summary).
    With `rm_kind: likelihood` the stage is `run_verifier_stage`."""
    import jax

    if config.rm_kind == "likelihood":
        return run_verifier_stage(config, out, lm, tokenizer, task, args)

    from jaxrl_hier.logging import MetricsWriter
    from jaxrl_hier.search.reward_model import (RewardModel, evaluate_reward_model, sample_path_data,
                                                train_reward_model)

    stage = out / "reward_model"
    rm = RewardModel(lm)

    def train(params):
        t0 = time.perf_counter()
        train_data, train_info = sample_path_data(lm, lm.params, tokenizer, task,
                                                  task.problems("train", config.rm_problems, config.seed + 1),
                                                  samples=config.rm_samples, key=jax.random.key(config.seed + 12),
                                                  **_path_sampling(config))
        test_data, test_info = held_out_paths(config, lm, tokenizer, task)
        log(f"reward model data: {train_info['examples']} partial paths from {train_info['solutions']} solutions "
            f"(sampled accuracy {train_info['solution_accuracy']:.3f}); held-out {test_info['examples']}")
        before = evaluate_reward_model(rm, params, test_data)
        writer = MetricsWriter(stage, primary=is_primary())
        writer.truncate_after(0)
        try:
            params, losses = train_reward_model(
                rm, params, train_data, steps=config.rm_steps, batch_size=config.rm_batch_size,
                learning_rate=config.rm_learning_rate, seed=config.seed,
                on_step=lambda i, loss: writer.write({"update": i, "step": i, "loss": loss})
                if i % config.log_every == 0 or i == config.rm_steps else None)
        finally:
            writer.close()
        ev = evaluate_reward_model(rm, params, test_data)
        return params, {"train": train_info, "held_out": test_info, "eval_before": before, "eval": ev,
                        "final_train_loss": float(sum(losses[-20:]) / len(losses[-20:])),
                        "time_s": time.perf_counter() - t0}

    params = rm.init(jax.random.key(config.seed + 11), lm.params)  # backbone: a copy of the generator
    meta = {"stage": "reward_model", "hidden": int(lm.config.hidden_size)}
    params, info, finished = run_params_stage(stage, params, meta, config.rm_steps, train)
    ev = info["eval"]
    if finished:
        log(f"reward model stage already complete ({stage}): held-out accuracy {ev['accuracy']:.3f}, "
            f"AUC {ev['auc']:.3f}")
    else:
        log(f"reward model: held-out accuracy {ev['accuracy']:.3f} (AUC {ev['auc']:.3f}; untrained "
            f"{info['eval_before']['accuracy']:.3f} / {info['eval_before']['auc']:.3f}) in {info['time_s']:.0f}s")
    return rm, params, info


# ----------------------------------------------------------------------------- plots and tables


def plot_pgts_curve(records: list[dict], path: Path, title: str) -> None:
    """PPO's episode return, and train (sampled) and validation (greedy) accuracy, against the update."""
    from jaxrl_hier.logging.plots import Panel, Series, plot_curves

    plot_curves(records, path, x="update", size=(10, 3.8), panels=[
        Panel("PPO update", (Series("episode_return", "episode return"),), "return", title),
        Panel("PPO update", (Series("achievement/correct", "train accuracy (sampled policy)", alpha=0.8),
                             Series("eval/accuracy", "validation accuracy (greedy policy)", style="o-",
                                    color="black")), "accuracy")])


def results_table(rows: list[dict]) -> str:
    """Markdown: method, accuracy, tokens per problem, tokens relative to CoT greedy."""
    cot = next((r["tokens"] for r in rows if r["method"] == "CoT greedy"), None)
    lines = ["| method | accuracy | tokens / problem | tokens vs CoT |", "|---|---:|---:|---:|"]
    for r in rows:
        rel = f"{r['tokens'] / cot:.2f}x" if cot else "n/a"
        lines.append(f"| {r['method']} | {100 * r['accuracy']:.1f}% | {r['tokens']:.1f} | {rel} |")
    return "\n".join(lines) + "\n"


def plot_accuracy_vs_tokens(rows: list[dict], path: Path, title: str) -> None:
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    families: dict[str, list[dict]] = {}
    for r in rows:
        families.setdefault(r["method"].split("@")[0].split(" (")[0].split("-of-")[0], []).append(r)
    for name, rs in families.items():
        rs = sorted(rs, key=lambda r: r["tokens"])
        ax.plot([r["tokens"] for r in rs], [100 * r["accuracy"] for r in rs], "o-", label=name)
        for r in rs:
            ax.annotate(r["method"].replace(name, "").strip(" @()") or "", (r["tokens"], 100 * r["accuracy"]),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set(xlabel="tokens generated per problem", ylabel="held-out accuracy (%)", title=title, xscale="log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def evaluate_all(config: PGTSConfig, lm: Any, rm: Any, rm_params: Any, tokenizer: Any, task: Any, problems: list,
                 policy: tuple[Any, Any] | None, *, sc_samples: tuple[int, ...] | None = None,
                 mcts_simulations: tuple[int, ...] | None = None,
                 start_params: Any = None) -> tuple[list[dict], dict[str, str]]:
    """Every method on `problems`: rows (accuracy, tokens) and text renderings of one tree each for
    PGTS and MCTS. `policy` = (runner, network params) of a trained PGTS policy, or None;
    `start_params`: the policy's imitation start, evaluated beside it with its teacher rule."""
    import numpy as np

    from jaxrl_hier.search import baselines as B
    from jaxrl_hier.search.env import render_tree

    common = dict(prompt_length=config.max_prompt_length, max_new_tokens=config.cot_max_tokens)
    rows = [B.cot_greedy(lm, lm.params, tokenizer, task, problems, **common)]
    rows[0].pop("completions")
    sizes = tuple(sc_samples or config.sc_samples)
    texts, lengths, ids = B.sample_solutions(lm, lm.params, tokenizer, problems, max(sizes),
                                             temperature=config.temperature, seed=config.seed + 21, **common)
    scores = B.score_solutions(rm, rm_params, tokenizer, problems, ids, prompt_length=config.max_prompt_length,
                               step_tokens=config.step_tokens, max_depth=config.max_depth)
    rows.append(B.summarize("sampled path@1", [task.is_correct(p, t[0]) for p, t in zip(problems, texts)],
                            lengths[:, 0]))
    for n in sizes:
        rows.append(B.self_consistency(task, problems, texts, lengths, n))
        rows.append(B.best_of_n(task, problems, texts, lengths, scores, n))
    trees: dict[str, str] = {}
    for sims in mcts_simulations or (config.mcts_simulations,):
        menv = build_env(config, lm, rm, tokenizer, max_nodes=sims + 1 + config.max_depth,
                         max_children=config.mcts_children, token_budget=10**9)
        mparams = env_params_for(config, menv, lm.params, rm_params, tokenizer, problems)
        mstates, row = B.mcts(menv, mparams, len(problems), simulations=sims, c=config.mcts_c, seed=config.seed)
        rows.append(row)
        trees[f"MCTS ({sims} simulations)"] = render_tree(menv, _index(mstates, 0), tokenizer, problems[0].prompt,
                                                          problems[0].answer)
    if policy is not None:
        runner, net_params = policy
        env = build_env(config, lm, rm, tokenizer)
        params = env_params_for(config, env, lm.params, rm_params, tokenizer, problems)
        if start_params is not None:
            rows.append(_rule_row(config, env, params, len(problems)))
            _, row = B.run_search(runner, start_params, params, len(problems), seed=config.seed)
            rows.append({**row, "method": "PGTS (imitation only)"})
        states, row = B.run_search(runner, net_params, params, len(problems), seed=config.seed)
        rows.append(row)
        trees["PGTS"] = render_tree(env, _index(states, 0), tokenizer, problems[0].prompt, problems[0].answer)
    for r in rows:
        r["accuracy"] = float(np.round(r["accuracy"], 6))
    return rows, trees


def _rule_row(config: PGTSConfig, env: Any, env_params: Any, num_problems: int) -> dict:
    """The imitation teacher (search.imitation.threshold_rule) searching problems 0..num_problems-1."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_hier.search.baselines import make_runner, summarize
    from jaxrl_hier.search.imitation import threshold_rule

    run = make_runner(env, threshold_rule(env), config.max_search_actions)
    rule = (jnp.float32(config.imitation_tau), jnp.int32(config.imitation_extra))
    states, _ = jax.device_get(run(rule, env_params, jnp.arange(num_problems), jax.random.key(config.seed)))
    return summarize(f"threshold rule (tau {config.imitation_tau:g}, imitation teacher)", np.asarray(states.correct),
                     np.asarray(states.tokens_used), nodes=float(np.mean(states.num_nodes)))


def _index(tree: Any, i: int) -> Any:
    import jax

    return jax.tree.map(lambda x: x[i], tree)


# ----------------------------------------------------------------------------- the pipeline


def run_pgts(args: argparse.Namespace, raw_config: dict) -> int:
    """The `pgts` entry of jaxrl_hier.train.ALGORITHMS (contract in that module)."""
    config = config_from_args(PGTSConfig, raw_config, args)
    if args.resume:
        out = args.output_dir
        if out is None:
            raise ConfigError("--resume needs --output-dir (the run directory to continue).")
        check_resume_changes(load_saved_config(PGTSConfig, out), config, PGTS_RESUME_SAFE_KEYS)
    else:
        out = resolve_output_dir(args, f"pgts-{config.task}")
        refuse_existing_run(out)
        for stage in ("sft", "reward_model", "eval"):
            if (out / stage).exists():
                raise ConfigError(f"{out} already holds a {stage}/ stage: pass --resume, or choose another --output-dir.")
    task, tokenizer = make_task_and_tokenizer(config)
    check_inputs(config, task, tokenizer)
    config.ppo_config().validate()
    use_compilation_cache(out)  # a resume loads the compiled programs (runs.compile_cache)

    from jaxrl_hier.llm_rl.sft_stage import run_sft_stage
    from jaxrl_hier.llm_rl.model_setup import build_mesh, build_policy

    sft_cfg = config.sft_config()
    mesh = build_mesh(sft_cfg)
    lm, tokenizer = build_policy(sft_cfg, tokenizer, mesh=mesh)
    sync_processes("jaxrl_hier.search:checked")
    # config.yaml: a fresh run's now, a resumed run's once the warm-start's or the PPO stage's checkpoint is restored
    config_file = RunConfigFile(out, "pgts", config, resume=args.resume)
    config_file.checked()
    t0 = time.perf_counter()
    times: dict[str, float] = {}
    sft_info: dict = {}

    def stops_after(stage: str) -> bool:
        if config.stop_after == stage:
            config_file.restored()  # every stage so far is complete: a resume's changed keys are recorded
            log(f"stop_after: {stage}: the pipeline ends here ({', '.join(f'{k} {v:.0f}' for k, v in times.items())}); "
                f"--resume stop_after=null goes on; outputs in {out}")
        return config.stop_after == stage

    if config.sft.steps:
        tick = time.perf_counter()
        lm, sft_info = run_sft_stage(sft_cfg.sft_stage(), args, out, lm, tokenizer, task, mesh, config_file)
        times["sft_s"] = time.perf_counter() - tick
    if stops_after("sft"):
        return 0
    tick = time.perf_counter()
    rm, rm_params, rm_info = run_reward_model_stage(config, out, lm, tokenizer, task, args)
    times["reward_model_s"] = time.perf_counter() - tick
    if stops_after("reward_model"):
        return 0
    tick = time.perf_counter()
    runner_fn, net_params, start_params = run_ppo_stage(config, args, out, lm, rm, rm_params, tokenizer, task,
                                                        config_file)
    times["ppo_s"] = time.perf_counter() - tick
    if stops_after("ppo"):
        return 0
    tick = time.perf_counter()
    rows = run_eval_stage(config, out, lm, rm, rm_params, tokenizer, task, (runner_fn, net_params),
                          {"sft": sft_info, "reward_model": rm_info.get("eval")}, start_params)
    times["eval_s"] = time.perf_counter() - tick
    by = {r["method"]: r for r in rows}
    pg, cot = by.get("PGTS (policy)"), by.get("CoT greedy")
    log(f"done in {time.perf_counter() - t0:.0f}s ({', '.join(f'{k} {v:.0f}' for k, v in times.items())}): "
        + (f"PGTS {100 * pg['accuracy']:.1f}% at {pg['tokens']:.1f} tokens vs CoT greedy {100 * cot['accuracy']:.1f}% "
           f"at {cot['tokens']:.1f}" if pg and cot else "") + f"; outputs in {out}")
    return 0


def run_ppo_stage(config: PGTSConfig, args: argparse.Namespace, out: Path, lm: Any, rm: Any, rm_params: Any,
                  tokenizer: Any, task: Any, config_file: RunConfigFile | None = None) -> tuple[Any, Any]:
    """Train the GPS policy with PPO on the search env (resumable); returns (search runner, network params).
    `config_file`: the run's config.yaml, written once the stage's checkpoint is restored."""
    import jax
    import numpy as np

    from jaxrl_hier.algorithms.ppo import make_train, train_chunk
    from jaxrl_hier.io import atomic_write_text
    from jaxrl_hier.logging import read_jsonl
    from jaxrl_hier.search.baselines import make_search_runner, run_search
    from jaxrl_hier.search.env import render_tree

    from jaxrl_hier.llm_rl.data import evaluation_problems

    env = build_env(config, lm, rm, tokenizer)
    train_problems = task.problems("train", config.train_problems, config.seed + 2)
    env_params = env_params_for(config, env, lm.params, rm_params, tokenizer, train_problems)
    # the training curve's problems: the validation split (the evaluation stage reports test, once)
    validation = evaluation_problems(task, config.eval_problems, config.seed, "validation")
    validation_params = env_params_for(config, env, lm.params, rm_params, tokenizer, validation)
    ppo_cfg = config.ppo_config()
    from jaxrl_hier.networks.gps import GPSActorCritic

    network = GPSActorCritic(env.num_actions, config.ppo.hidden_size, config.ppo.num_layers, config.ppo.activation,
                             prior=config.policy_prior)
    start_params = run_imitation_stage(config, out, env, network, lm, rm_params, tokenizer, task)
    trainer = make_train(ppo_cfg, env=env, env_params=env_params, network=network)
    search = make_search_runner(env, trainer.network, config.max_search_actions)
    net = lambda r: jax.tree.map(lambda x: x[0], {"params": r.train_state.params})  # noqa: E731 (seed 0)
    meta = {"stage": "pgts_ppo", "max_nodes": config.max_nodes, "max_depth": config.max_depth,
            "num_envs": config.ppo.num_envs, "policy_hidden_size": config.ppo.hidden_size}
    runner = trainer.init(jax.random.key(config.seed), params=start_params)
    total = config.num_updates
    trees_path = out / "trees.txt"
    primary = is_primary()
    # A stage of the pipeline: it always goes on from its latest checkpoint.
    with ResumableRun(out / "checkpoints", meta, keep=config.keep_checkpoints, every=config.checkpoint_every,
                      total=total, resume=True, primary=primary, config_file=config_file) as run:
        runner, start = run.restore(runner)
        if start:
            log(f"PGTS PPO resumed at update {start}")
        writer = run.log(out)
        evaluate_first = total > 0 and run.first_row_due(writer)
        # trees.txt holds a tree per logged evaluation: those of the kept rows stay, and an update-0
        # tree whose row was not logged goes, as that evaluation runs again
        last_kept = -1 if evaluate_first else start
        trees = trees_path.read_text().split("\n\n=== ") if trees_path.is_file() else []
        trees = [t for t in trees if t.strip() and _tree_update(t) <= last_kept]

        def evaluate(update: int, rec: dict, runner: Any) -> None:
            states, row = run_search(search, net(runner), validation_params, len(validation), seed=config.seed)
            rec.update({"eval/accuracy": row["accuracy"], "eval/tokens": row["tokens"], "eval/nodes": row["nodes"],
                        "eval/actions": row["actions"]})
            text = render_tree(env, jax.tree.map(lambda x: x[0], states), tokenizer, validation[0].prompt,
                               validation[0].answer)
            trees.append(f"update {update}: validation accuracy {100 * row['accuracy']:.1f}%, "
                         f"{row['tokens']:.1f} tokens / problem\n{text}")
            if primary:
                atomic_write_text(trees_path, "".join(f"=== {t.removeprefix('=== ')}\n\n" for t in trees))

        if evaluate_first:
            rec = {"update": 0}
            evaluate(0, rec, runner)
            writer.write(rec)
        steps_per_update = ppo_cfg.steps_per_update
        t0 = time.perf_counter()

        def step(runner: Any, done: int) -> tuple[Any, int, dict]:
            n = min(config.log_every, total - done)
            runner, rec, elapsed = train_chunk(trainer, runner, n)
            update = done + n
            rec.update(update=update, env_steps=update * steps_per_update,
                       search_steps_per_s=n * steps_per_update / elapsed, time_s=time.perf_counter() - t0)
            if (config.eval_every and update % config.eval_every == 0) or update == total:
                evaluate(update, rec, runner)
            writer.write(rec)
            acc = rec.get("achievement/correct")
            return runner, n, dict(ret=f"{rec.get('episode_return', float('nan')):.2f}",
                                   acc="n/a" if acc is None or np.isnan(acc) else f"{acc:.2f}")

        runner, _ = run.run_steps(args, runner, total=total, desc="pgts ppo", step=step)
    if primary:
        plot_pgts_curve(read_jsonl(out / "metrics.jsonl"), out / "learning_curve.png", "PGTS PPO on arithmetic")
    return search, net(runner), None if start_params is None else {"params": start_params}


def run_imitation_stage(config: PGTSConfig, out: Path, env: Any, network: Any, lm: Any, rm_params: Any,
                        tokenizer: Any, task: Any) -> Any | None:
    """`imitation_steps > 0`: the policy's start for PPO, cloned from the threshold rule's searches of
    `imitation_problems` training problems (search.imitation), in imitation/ (metrics.jsonl, the
    params' checkpoint, DONE with the rule's training accuracy and the fit); None when off. A
    finished stage is loaded."""
    if not config.imitation_steps:
        return None
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_hier.logging import MetricsWriter
    from jaxrl_hier.search.imitation import behaviour_cloning, make_demo_collector, threshold_rule

    stage = out / "imitation"

    def train(params):
        t0 = time.perf_counter()
        problems = task.problems("train", config.imitation_problems, config.seed + 3)
        env_params = env_params_for(config, env, lm.params, rm_params, tokenizer, problems)
        collect = make_demo_collector(env, threshold_rule(env), config.max_search_actions, gamma=config.ppo.gamma)
        rule = (jnp.float32(config.imitation_tau), jnp.int32(config.imitation_extra))
        demos = jax.device_get(collect(rule, env_params, jnp.arange(len(problems)), jax.random.key(config.seed + 32)))
        actions = demos.action[demos.valid]
        demo_info = {"problems": len(problems), "actions": int(actions.size),
                     "rule_accuracy": float(np.mean(demos.correct)), "rule_tokens": float(np.mean(demos.tokens)),
                     "branch_fraction": float(np.mean(actions == 1)), "mean_return": float(np.mean(demos.returns[:, 0]))}
        log(f"imitation: the rule (tau {config.imitation_tau}, {config.imitation_extra} extra) solves "
            f"{100 * demo_info['rule_accuracy']:.1f}% of {len(problems)} training problems; {demo_info['actions']} "
            f"actions, {100 * demo_info['branch_fraction']:.1f}% Branch")
        writer = MetricsWriter(stage, primary=is_primary())
        writer.truncate_after(0)
        try:
            params, history = behaviour_cloning(
                env, network, params, demos, steps=config.imitation_steps, batch_size=config.imitation_batch_size,
                learning_rate=config.imitation_learning_rate, vf_coef=config.ppo.vf_coef, seed=config.seed,
                on_step=lambda i, m: writer.write({"update": i, "step": i, **m})
                if i % config.log_every == 0 or i == config.imitation_steps else None)
        finally:
            writer.close()
        last = history[-min(20, len(history)):]
        final = {k: float(np.mean([h[k] for h in last])) for k in last[0]}
        return params, {"demos": demo_info, "first": history[0], "final": final, "time_s": time.perf_counter() - t0}

    params = network.init(jax.random.key(config.seed + 31), env.reset_to(0)[0])["params"]
    meta = {"stage": "imitation", "max_nodes": config.max_nodes, "policy_hidden_size": config.ppo.hidden_size}
    params, info, finished = run_params_stage(stage, params, meta, config.imitation_steps, train)
    final = info["final"]
    if finished:
        log(f"imitation stage already complete ({stage}): action accuracy {final['accuracy']:.3f}")
    else:
        log(f"imitation: {config.imitation_steps} steps, action accuracy {final['accuracy']:.3f} "
            f"(nll {info['first']['nll']:.3f} -> {final['nll']:.3f}) in {info['time_s']:.0f}s")
    return params


def _tree_update(text: str) -> int:
    try:
        return int(text.removeprefix("=== ").split(":", 1)[0].split()[1])
    except (IndexError, ValueError):
        return 10**9


def run_eval_stage(config: PGTSConfig, out: Path, lm: Any, rm: Any, rm_params: Any, tokenizer: Any, task: Any,
                   policy: tuple[Any, Any], extra: dict, start_params: Any = None) -> list[dict]:
    """PGTS against the baselines on the held-out problems: eval/results.json, table.md, the plot, trees."""
    from jaxrl_hier.io import atomic_write_json, atomic_write_text
    from jaxrl_hier.llm_rl.data import evaluation_problems

    stage = out / "eval"
    if (stage / "results.json").is_file():
        rows = json.loads((stage / "results.json").read_text())["rows"]
        log(f"evaluation stage already complete ({stage})")
        return rows
    test = evaluation_problems(task, config.eval_problems, config.seed)
    rows, trees = evaluate_all(config, lm, rm, rm_params, tokenizer, task, test, policy, start_params=start_params)
    if is_primary():
        table = results_table(rows)
        atomic_write_text(stage / "table.md", table)
        atomic_write_text(stage / "trees.txt", "".join(f"=== {k}\n{v}\n\n" for k, v in trees.items()))
        plot_accuracy_vs_tokens(rows, stage / "accuracy_vs_tokens.png", "held-out arithmetic")
        atomic_write_json(stage / "results.json", {"rows": rows, "problems": len(test), **extra})
        log("\n" + table)
    return rows


__all__ = ["run_pgts", "evaluate_all", "results_table", "check_inputs", "build_env", "env_params_for",
           "load_finished_run"]
