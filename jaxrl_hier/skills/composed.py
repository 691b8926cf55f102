"""The composed agent: a run's completed skills as one policy, judged from fresh worlds.

Training judges each skill on the episodes its own expert controls, many of them restarted from
anchors (`skills.env`). A Craftax agent is judged otherwise: one policy plays whole episodes from
fresh worlds, and the figure is the share of episodes that unlock each achievement. This module
builds that policy and plays it.

Routing (as in training, `skills.env.route`): the skills on the way to the target, in dependency
order, each hold the expert trained for them; on every step the first skill whose success
conditions do not hold yet acts. Once all of them hold, the target's own expert keeps acting until
the episode ends. Conditions are read from the live state on every step, so a condition that stops
holding (wood spent on a table) hands control back to the skill that provides it.

`evaluate` plays `episodes` fresh worlds for the base env's full episode length (or until every
episode has ended: a `lax.while_loop`), greedy or sampled, and returns per episode the base env's
achievements, return and length, plus whether each completed skill's conditions held at some step
(the composed agent's rate for that skill). `write_report` turns both modes into
`eval/achievements.json`, a bar chart and a GIF of one episode with the acting skill under each frame.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.logging.episode_gif import record_episode, write_annotated_gif
from jaxrl_hier.networks.actor_critic import ACTIVATIONS
from jaxrl_hier.skills.composition import (Composition, EpisodeStats, build_composition, choose_target, episode_limit,
                                           play_both_modes, play_episodes)
from jaxrl_hier.skills.env import conditions_hold, route_to_target
from jaxrl_hier.skills.moe import mixture_for
from jaxrl_hier.skills.spec import SkillError, SkillLibrary

EVAL_DIR = "eval"
BEFORE_CHAIN_DIR = "eval_before_chain"
COMPOSED_DIR = "eval_composed"  # `eval --no-manager` of a run with a manager: the composed agent  # `eval --before-chain` of a run whose chain is tuned: the skills' own experts
REPORT_FILE = "achievements.json"


class ComposedAgent:
    """Plays a `Composition` in the base env (`skill_env`: the run's `SkillEnv`, for its quantities
    and condition tables). Compiled once per (episodes, greedy) pair."""

    def __init__(self, skill_env, base_params: Any, activation: str, dispatch: str = "gather"):
        self.env, self.base, self.base_params = skill_env, skill_env.base, base_params
        self.act = ACTIVATIONS[activation]
        self.dispatch = dispatch
        self._evaluate = jax.jit(self._play, static_argnums=(2, 3, 4))

    def actions(self, comp: Composition, obs: jax.Array, state: Any, key: jax.Array, greedy: bool):
        """(actions [N], acting plan position [N]) for a batch of base observations and states."""
        q = jax.vmap(self.env.quantities)(state)
        acting = jax.vmap(route_to_target, in_axes=(0, None, None))(q, comp.plan, comp.needs)
        x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
        mix = mixture_for(self.dispatch)
        logits = mix(comp.bank, x, acting, self.act)
        if greedy:
            return jnp.argmax(logits, axis=-1), acting
        return jax.random.categorical(key, logits), acting

    def held(self, comp: Composition, state: Any) -> jax.Array:
        """bool[N, W]: each watched skill's conditions hold in each state."""
        return jax.vmap(lambda s: conditions_hold(self.env.quantities(s), comp.watch))(state)

    def _play(self, comp: Composition, key: jax.Array, episodes: int, max_steps: int, greedy: bool) -> EpisodeStats:
        def act(obs, state, k):
            return self.actions(comp, obs, state, k, greedy)

        return play_episodes(self.base, self.base_params, act, lambda state: self.held(comp, state), key, episodes,
                             max_steps, comp.needs.shape[1])

    def evaluate(self, comp: Composition, key: jax.Array, episodes: int, max_steps: int, greedy: bool) -> EpisodeStats:
        return jax.tree.map(np.asarray, self._evaluate(comp, key, episodes, max_steps, greedy))

    def episode_frames(self, comp: Composition, key: jax.Array, max_steps: int, greedy: bool):
        """One sampled (or greedy) episode: frames [T, H, W, 3], acting plan position [T] and
        the base env's achievements [T, A] at each frame, cut at the episode's end."""
        return record_episode(self.base, self.base_params,
                              lambda obs, state, k: self.actions(comp, obs, state, k, greedy), key, max_steps)


# ---------------------------------------------------------------------------- figures
def summarize(stats: EpisodeStats, achievement_names: Sequence[str], achievement_rewards: Sequence[float],
              watched: Sequence[str], labels: Sequence[str] = ()) -> dict:
    """Craftax's measures: per achievement the share of episodes that unlock it, the mean return,
    the score as % of the maximum return, and Crafter's geometric-mean score over the rates. With
    `labels` (what `stats.acting` counts), the share of all steps each label acted, largest first."""
    rates = stats.achievements.mean(axis=0)
    max_return = float(np.sum(achievement_rewards))
    mean_return = float(stats.episode_return.mean())
    percent = 100.0 * rates
    return {
        "episodes": int(stats.episode_return.shape[0]),
        "achievements": {n: float(r) for n, r in zip(achievement_names, rates)},
        "skills": {s: float(r) for s, r in zip(watched, stats.held.mean(axis=0))},
        # mean step at which each skill's conditions first held, over the episodes where they did
        "skills_first_step": {s: (float(stats.first[stats.held[:, i], i].mean()) if stats.held[:, i].any() else None)
                              for i, s in enumerate(watched)},
        "mean_return": mean_return,
        "return_std_error": float(stats.episode_return.std(ddof=1) / math.sqrt(len(stats.episode_return)))
        if len(stats.episode_return) > 1 else None,
        "max_return": max_return,
        "score_percent_of_max": 100.0 * mean_return / max_return if max_return else None,
        "crafter_score": float(np.exp(np.mean(np.log(1.0 + percent))) - 1.0),
        "mean_length": float(stats.length.mean()),
        "acting": _shares(stats.acting.sum(axis=0), labels) if len(labels) else None,
    }


def _shares(steps: np.ndarray, labels: Sequence[str]) -> dict:
    """label -> its share of the steps, for the labels that acted, largest first."""
    total = max(int(steps.sum()), 1)
    return {labels[i]: float(steps[i]) / total for i in np.argsort(-steps, kind="stable") if steps[i]}


def plot_achievements(report: dict, path: Path, title: str) -> None:
    """Per-achievement success rates of each mode, as horizontal bars."""
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()

    modes = [m for m in ("greedy", "sampled") if m in report]
    names = list(report[modes[0]]["achievements"])
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(names) + 1.5))
    height = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        ys = np.arange(len(names)) + i * height
        ax.barh(ys, [100 * report[mode]["achievements"][n] for n in names], height=height, label=mode)
    ax.set_yticks(np.arange(len(names)) + 0.4 - height / 2, names, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="episodes that unlock it (%)", xlim=(0, 100), title=title)
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def write_report(run_dir: Path, agent: ComposedAgent, comp: Composition, plan: Sequence[str],
                 watched: Sequence[str], *, episodes: int, max_steps: int, seed: int, gif_steps: int,
                 achievement_names: Sequence[str], achievement_rewards: Sequence[float],
                 running: Sequence[str] = (), chain: dict | None = None, subdir: str = EVAL_DIR,
                 manager: dict | None = None, labels: Sequence[str] | None = None) -> dict:
    """Evaluate greedy and sampled; write eval/achievements.json, eval/achievements.png and
    eval/episode.gif (the GIF where the env can render). Every file goes through an atomic write.
    `agent` is a `ComposedAgent` or, with `manager` (the state file's record of the manager stage), a
    `skills.manager.ManagedAgent`; `labels` name what its `episode_frames` reports as acting (default
    `plan`)."""

    out = Path(run_dir) / subdir
    out.mkdir(parents=True, exist_ok=True)
    key = jax.random.key(seed)
    report: dict[str, Any] = {"target": None if manager else plan[-1], "plan": list(plan), "episodes": episodes, "max_steps": max_steps,
                              "seed": seed, "fresh_worlds": True,
                              # skills whose experts were still training (their latest checkpoint)
                              "running": [s for s in watched if s in running],
                              # the chain fine-tuning whose experts play (skills.chain); None: the skills' own
                              "chain": {k: chain[k] for k in ("target", "plan", "steps")} if chain else None,
                              # the learned manager over these skills (skills.manager); None: the composed agent
                              # (and whether it also took base actions itself: `manager.primitives`)
                              "manager": {k: manager[k] for k in ("skills", "steps", "primitives") if k in manager}
                              if manager else None}
    report.update(play_both_modes(lambda k, greedy: summarize(agent.evaluate(comp, k, episodes, max_steps, greedy),
                                                              achievement_names, achievement_rewards, watched,
                                                              labels or plan), key))
    title = "managed agent" if manager else f"composed agent towards {plan[-1]}"
    plot_achievements(report, out / "achievements.png", f"{title}, {episodes} fresh worlds")
    try:
        if not gif_steps:  # eval_gif_steps 0: no GIF
            raise NotImplementedError
        frames, acting, unlocked = agent.episode_frames(comp, jax.random.fold_in(key, 2), min(gif_steps, max_steps),
                                                        greedy=False)
    except NotImplementedError:  # an env without a renderer, or none asked for: no GIF
        report["gif"] = None
    else:
        names = [[n for n, on in zip(achievement_names, row) if on] for row in unlocked]
        captions = [f"acting: {(labels or plan)[j]}" for j in acting]
        write_annotated_gif(frames, names, out / "episode.gif", captions=captions)
        report["gif"] = "episode.gif"
    atomic_write_json(out / REPORT_FILE, report)
    return report


def read_report(run_dir: Path) -> dict | None:
    path = Path(run_dir) / EVAL_DIR / REPORT_FILE
    return json.loads(path.read_text()) if path.is_file() else None


class RunAgents(struct.PyTreeNode):
    """What a run directory holds for composing: its env, library and completed experts."""

    env: Any = struct.field(pytree_node=False)  # the run's SkillEnv (quantities, condition tables)
    base_params: Any = struct.field(pytree_node=False)
    library: SkillLibrary = struct.field(pytree_node=False)
    experts: dict = struct.field(pytree_node=False)  # completed skill -> expert, in the state file's order
    agent: ComposedAgent = struct.field(pytree_node=False)
    target: str = struct.field(pytree_node=False)  # the run's target
    running: tuple = struct.field(pytree_node=False, default=())  # skills in `experts` that have not completed
    # The chain fine-tuning whose tuned experts replaced the skills' own (state file's `chain`; {}: none)
    chain: dict = struct.field(pytree_node=False, default_factory=dict)
    # The learned manager over them (state file's `manager`, done; {}: none): `skills eval` plays it
    manager: dict = struct.field(pytree_node=False, default_factory=dict)


def load_run(run_dir: Path, config: Any, catalog: SkillLibrary, include_running: bool = False,
             use_chain: bool = True) -> RunAgents:
    """The completed experts of a run directory and an agent to play them (see `evaluate_run`).
    With `include_running`, the running skills' experts as of the run's latest checkpoint join them
    (after them, in slot order): a run stopped by `max_rounds` or a time budget is then judged with
    its frontier skills as far as they got, not as if they had not started. When the run's chain
    fine-tuning is done (`skills.chain`) and `use_chain`, its tuned experts replace the skills' own
    for the chain's skills (its target joins them, even one that failed as a skill)."""
    from jaxrl_hier.skills.state import load_state, run_library
    from jaxrl_hier.skills.trainer import load_expert, skill_env_and_policy

    run_dir = Path(run_dir)
    state = load_state(run_dir)
    env, base_params, policy = skill_env_and_policy(config, catalog)
    base = env.base
    if not getattr(base, "achievement_names", ()):
        raise SkillError(f"{base.name} reports no achievements: the composed agent's report needs them.")
    like = policy.expert_zeros(int(np.prod(base.observation_space(base_params).shape)))
    experts = {r.name: load_expert(run_dir / "skills" / r.dirname, like) for r in state.by_status("completed")}
    running = sorted(state.by_status("running"), key=lambda r: r.slot)
    if include_running and running and state.checkpoint_round is not None:
        experts.update(_running_experts(run_dir, config, catalog, state, running))
    else:
        running = []
    chain = state.chain if use_chain and state.chain.get("status") == "done" else {}
    if chain:
        from jaxrl_hier.skills.chain import with_chain

        experts = with_chain(run_dir, chain, experts)
    # The manager was trained over the completed skills' experts, the chain's where it has them.
    manager = state.manager if use_chain and not running and state.manager.get("status") == "done" else {}
    return RunAgents(env, base_params, run_library(state, catalog), experts,
                     ComposedAgent(env, base_params, policy.activation, config.moe_dispatch), state.target,
                     tuple(r.name for r in running), dict(chain), dict(manager))


def _running_experts(run_dir: Path, config: Any, catalog: SkillLibrary, state: Any, running: list) -> dict:
    """name -> trainable expert of each running skill, from the checkpoint that matches the slots."""
    from jaxrl_hier.skills.trainer import SkillTrainer

    trainer = SkillTrainer(config, catalog)
    trainer.init(jax.random.key(0))  # the runner's structure, for the restore
    trainer.restore_checkpoint(Path(run_dir) / "checkpoints", state.checkpoint_round)
    return {r.name: trainer.expert(r.slot) for r in running}


def evaluate_run(run_dir: Path, config: Any, catalog: SkillLibrary, *, episodes: int, target: str | None = None,
                 max_steps: int | None = None, seed: int | None = None, gif_steps: int = 300,
                 include_running: bool = False, use_chain: bool = True, use_manager: bool = True) -> dict:
    """Evaluate the final agent of a run directory: its learned manager when it has one (`skills.manager`;
    not with a `target`, `include_running` or not `use_chain`), else the composed agent (its completed skills' experts, and with
    `include_running` its running ones as of the latest checkpoint, routed towards `target`,
    default the run's) and write its report; see `write_report`."""
    run = load_run(run_dir, config, catalog, include_running, use_chain)
    base = run.env.base
    common = dict(episodes=episodes, max_steps=max_steps or episode_limit(run.base_params),
                  seed=config.seed if seed is None else seed, gif_steps=gif_steps,
                  achievement_names=tuple(base.achievement_names),
                  achievement_rewards=tuple(getattr(base, "achievement_rewards", ())), running=run.running,
                  chain=run.chain, subdir=report_dir(run_dir, use_chain, use_manager and target is None).name)
    final = final_agent(run_dir, config, run, target, use_manager)
    managed = dict(manager={**run.manager, "primitives": config.manager.primitives},
                   labels=final.agent.labels) if final.managed else {}
    return write_report(Path(run_dir), final.agent, final.played, final.skills, list(run.experts), **managed, **common)


class FinalAgent(NamedTuple):
    agent: Any  # plays `played` (`evaluate`, `record`): a `ManagedAgent` or the run's `ComposedAgent`
    played: Any  # its `Managed` or `Composition`
    skills: list[str]  # the manager's skills, or the composed agent's plan to its target
    managed: bool
    kind: str  # in words, for logs and reports


def final_agent(run_dir: Path, config: Any, run: RunAgents, target: str | None = None,
                use_manager: bool = True) -> FinalAgent:
    """The agent `skills eval` plays: the run's learned manager when it has one (not with a `target`),
    else the composed agent routed towards `target` (default the run's)."""
    if run.manager and use_manager and target is None:
        agent, managed = load_managed(run_dir, config, run)
        skills = list(run.manager["skills"])
        return FinalAgent(agent, managed, skills, True, f"managed agent over {len(skills)} skills")
    aim = choose_target(run.library, list(run.experts), target or run.target)
    comp, plan = build_composition(run.env, run.library, run.experts, aim)
    return FinalAgent(run.agent, comp, plan, False, f"composed agent towards {aim}")


def load_managed(run_dir: Path, config: Any, run: RunAgents):
    """The run's learned manager (`run.manager`, done) over its experts: (`ManagedAgent`, `Managed`),
    watching every expert's skill."""
    from jaxrl_hier.skills.manager import ManagedAgent, ManagerTrainer, load_manager

    trainer = ManagerTrainer(config, run.env, run.base_params, run.library, run.experts, run.manager["skills"])
    agent = ManagedAgent(trainer)
    watch = run.env.conditions([run.library[s] for s in run.experts])
    return agent, agent.managed(trainer, load_manager(run_dir, trainer.params_like())["manager"], watch)


def report_dir(run_dir: Path, use_chain: bool = True, use_manager: bool = True) -> Path:
    """Where `evaluate_run` writes: RUN/eval for the run's final agent (the manager's when it has one,
    else the composed agent's after chain fine-tuning), RUN/eval_before_chain for the skills' own
    experts of a run whose chain is tuned, RUN/eval_composed for the composed agent of a run that
    has a manager."""
    from jaxrl_hier.skills.state import load_state

    state = load_state(Path(run_dir))
    if not use_chain and state.chain.get("status") == "done":
        return Path(run_dir) / BEFORE_CHAIN_DIR
    if not use_manager and state.manager.get("status") == "done":
        return Path(run_dir) / COMPOSED_DIR
    return Path(run_dir) / EVAL_DIR


def report_lines(report: dict) -> list[str]:
    """A few lines for the terminal: the figures of each mode and the rates of the routed skills."""
    agent = (f"managed agent over {len(report['manager']['skills'])} skills" if report.get("manager")
             else f"composed agent towards {report['target']}")
    lines = [f"{agent}: {report['episodes']} fresh-world episodes of up to {report['max_steps']} steps"]
    if report.get("running"):
        lines[0] += f" (still training, at their latest checkpoint: {', '.join(report['running'])})"
    if report.get("chain"):
        lines[0] += f"; experts after chain fine-tuning ({report['chain']['steps']:,} env steps)"
    for mode in ("greedy", "sampled"):
        r = report[mode]
        score = "n/a" if r["score_percent_of_max"] is None else f"{r['score_percent_of_max']:.1f}%"
        chain = ", ".join(f"{s} {r['skills'][s]:.2f}" for s in report["plan"])
        lines.append(f"  {mode}: return {r['mean_return']:.2f} (score {score} of max, length {r['mean_length']:.0f}); "
                     f"{chain}")
        if r.get("acting"):  # reports written before the shares were counted have none
            lines.append("    acting (share of steps): " + ", ".join(f"{k} {v:.0%}" for k, v in r["acting"].items()))
    return lines


__all__ = ["Composition", "ComposedAgent", "EpisodeStats", "build_composition", "choose_target", "episode_limit",
           "final_agent", "FinalAgent", "load_managed", "load_run", "RunAgents", "evaluate_run", "report_lines", "play_episodes", "summarize", "write_report",
           "read_report", "report_dir", "EVAL_DIR", "REPORT_FILE"]
