"""Where a skills round's time goes, against flat PPO with the same `ppo` section: a profile by parts.

    python benchmarks/skills/skills_speed.py --config configs/skills_craftax_classic.yaml --out DIR \\
        [--skills collect_wood make_wood_pickaxe make_stone_pickaxe] [--rounds 3] [--together] [key=value ...]

Each part is compiled ahead and timed apart from its compile (best of `--repeats` steady calls), all
in one process, so the ratios come from the same machine state:

- `round`: `updates_per_round` PPO updates as the scheduler trains them (`SkillTrainer.train_round`
  without its greedy evaluation, the slots' selection and merge included) for flat PPO on the base
  env, for each listed skill alone in a slot, and with `--together` for all of them at once (one
  slot each): env steps/s, the median of `--rounds` rounds after a first
  (compiling) one.
- `env`: the vectorised env alone with random actions over one round's steps (pool resets as in
  training, the worlds carried from call to call): the base env against the skill env of each
  skill (its conditions, routing to the dependency that acts, restarts from anchors). With
  `--env-only` this part alone, at the config's `ppo.num_envs` (`ppo.num_envs=N` to change it).
- `act`: one rollout step's forward and sample over `num_envs` rows: flat PPO's network against the
  skill's mixture (rows routed over the dependencies' experts and the new one).
- `grad`: one minibatch's gradient of a PPO-like loss (log-prob of taken actions, entropy, value):
  flat PPO's network; the skill's policy as it is trained (the new expert's log-probs, 0 on the rows a
  frozen expert acts on: `skills.moe.ExpertMixture`); and the routed mixture's log-probs, which
  have the same gradient and cost what the update paid before.
- `eval` (with `--together`): the greedy evaluation a round adds every `greedy_eval_every` rounds.
- `trace` (with `--trace`): flat PPO's and each skill's round program under JAX's profiler, op by op
  (`jaxrl_hier.bench.op_profile`): the costliest ops per round with their shapes and the JAX
  operations they came from.

The dependencies' experts are random weights: a step's cost does not depend on the weights (the
mixture's blocks are sized statically, whatever the routing), only on how often dependencies hold,
which changes a skill env's restarts and resets a little, and on how many rows the frozen experts act
on (they run on those rows only, `skills.moe.mixture_apply_active`). Random dependencies rarely hold,
and `act` spreads its rows over every expert of the plan, so here the frozen experts act on most rows:
more than in a trained run, whose rounds (`skills_vs_ppo.py --throughput RUN`) give the rate training
sees; `--experts-from RUN` takes a run's trained experts instead. Writes DIR/skills_speed.json and
DIR/skills_speed.md after every part (`complete` says whether every part ran); on a 2-core CPU at
the Craftax-Classic config most of the time is compiling (about 20 programs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import distrax
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.bench import device_info, op_profile, random_rollout, time_compiled, timed_chained
from jaxrl_hier.config import ConfigError, load_config, resolve_config
from jaxrl_hier.envs import reset_many
from jaxrl_hier.io import atomic_write_json, atomic_write_text
from jaxrl_hier.skills.cli import check_config
from jaxrl_hier.skills.config import SkillsConfig
from jaxrl_hier.skills.state import load_state
from jaxrl_hier.skills.trainer import SkillTrainer, bank_rows


def random_experts(trainer: SkillTrainer, names: set[str], key: jax.Array) -> dict:
    return {n: jax.tree.map(np.asarray, trainer.policy.init_expert(jax.random.fold_in(key, i), trainer._obs_dim))
            for i, n in enumerate(sorted(names))}


def trained_experts(trainer: SkillTrainer, run_dir: Path, names: set[str]) -> dict:
    """The experts a skills run completed, for `names` (each must have completed there)."""
    done = {r.name: r for r in load_state(run_dir).by_status("completed")}
    missing = sorted(names - set(done))
    if missing:
        raise ConfigError(f"--experts-from {run_dir}: {', '.join(missing)} did not complete there; name skills "
                          f"whose dependencies it completed ({', '.join(sorted(done)) or 'none'}).")
    return {n: jax.tree.map(np.asarray, trainer.load_expert(run_dir / "skills" / done[n].dirname)) for n in names}


def time_rounds(train_round, rounds: int, steps_per_round: int) -> dict:
    """A first (compiling) round, then the median of `rounds` more."""
    tick = time.perf_counter()
    train_round()
    first = time.perf_counter() - tick
    times = []
    for _ in range(rounds):
        tick = time.perf_counter()
        train_round()
        times.append(time.perf_counter() - tick)
    median = statistics.median(times)
    return {"first_round_s": first, "round_s": median, "steps": steps_per_round, "steps_per_s": steps_per_round / median}


def flat_trainer(config: SkillsConfig):
    """Flat PPO on the base env with the skills' `ppo` section (built, not compiled)."""
    import dataclasses

    from jaxrl_hier.algorithms.ppo import make_train

    base, base_params = config.make_env()
    # One seed, as `skills_vs_ppo.py` trains flat PPO (the skills config's own PPOConfig has one seed
    # per slot).
    return make_train(dataclasses.replace(config.ppo_config(), num_seeds=1), env=base, env_params=base_params)


def flat_round(config: SkillsConfig, rounds: int) -> tuple[dict, object, object]:
    ppo = flat_trainer(config)
    state = {"runner": ppo.init(jax.random.key(config.seed))}

    def one():
        state["runner"], metrics = ppo.update(state["runner"], config.updates_per_round)
        jax.block_until_ready(metrics)

    steps = config.updates_per_round * ppo.config.num_envs * ppo.config.num_steps
    return time_rounds(one, rounds, steps), ppo, state["runner"]


def traced_update(ppo, runner, updates: int, calls: int = 2) -> list[dict]:
    """The ops of `updates` PPO updates (the round's program, which a timed round compiled), from
    `runner`: `jaxrl_hier.bench.op_profile` over `calls` calls. The op names come from compiling the
    same program once more for its text (jit keeps no text of what it compiled): a second compile."""
    hlo = ppo._compiled[updates].lower(runner).compile().as_text()  # the same program: the same op names
    state = {"runner": runner}

    def run() -> None:
        state["runner"], metrics = ppo.update(state["runner"], updates)
        jax.block_until_ready(metrics)

    return op_profile(run, calls, hlo)


def skill_trace(trainer: SkillTrainer, name: str) -> list[dict]:
    """`traced_update` of slot 0's skill `name`, its runner cut as `SkillTrainer.train_round` cuts it."""
    c = trainer.config
    plan_len = int(np.asarray(trainer.runner.extra_variables["experts"]["plan_len"])[0])
    sub = trainer._select(trainer.runner, jnp.asarray([0], jnp.int32), bank_rows(plan_len, c.max_experts, c.bank_shapes))
    return traced_update(trainer.ppo, jax.device_put(sub, trainer.ppo.shardings(sub)), c.updates_per_round)


def skills_round(trainer: SkillTrainer, library, names: list[str], experts: dict, rounds: int, seed: int) -> dict:
    trainer.init(jax.random.key(seed))
    trainer.start(dict(enumerate(names)), library, experts, jax.random.key(seed + 1))
    steps = trainer.config.updates_per_round * trainer.steps_per_update * len(names)
    return time_rounds(lambda: trainer.train_round(greedy_eval=False), rounds, steps)


def env_steps(vec, actions: int, steps: int, repeats: int) -> dict:
    """Random actions through `vec` for `steps` steps a call (`jaxrl_hier.bench.random_rollout`, as
    `benchmarks/ppo/fps.py` steps envs), each call going on from the worlds the last one left: one
    un-timed call first, so the timed ones pay the resets of the episodes that end in them, as a
    training round does, not a reset of every env."""
    _, vstate = jax.jit(vec.reset)(jax.random.key(0))
    compile_s, run_s, episodes = timed_chained(jax.jit(random_rollout(vec, actions, steps)), jax.random.key(1),
                                               vstate, 1, repeats)
    return {"compile_s": compile_s, "run_s": run_s, "steps_per_s": steps * vec.num_envs / run_s,
            "episodes_timed": episodes}


def policy_parts(trainer: SkillTrainer, flat_ppo, flat_runner, library, name: str, experts: dict, repeats: int,
                 key: jax.Array) -> dict:
    """`act` and `grad` of flat PPO's network and of `name`'s skill policy, on the skill env's observations."""
    c = trainer.config.ppo_config()
    params_env, extra = trainer._slot_inputs(library, name, experts)
    plan_len = int(extra["experts"]["plan_len"])
    rows = bank_rows(plan_len, trainer.config.max_experts, trainer.config.bank_shapes)
    extra = {"experts": {"actor": jax.tree.map(lambda w: jnp.asarray(w[:rows]), extra["experts"]["actor"]),
                         "plan_len": jnp.int32(plan_len)}}
    variables = trainer.policy.init(key, jax.tree.map(lambda x: x[None], trainer.env.reset(key, params_env)[0]))
    params = variables["params"]
    flat_params = jax.tree.map(lambda x: x[0], flat_runner.train_state.params)  # seed axis of 1

    def observations(n: int, k: jax.Array) -> dict:
        obs, _ = reset_many(trainer.env, params_env, jax.random.split(k, n))
        # Rows spread over every expert of the plan and the new one, as a deep skill's rollout has them.
        return {**obs, "expert": jax.random.randint(k, (n,), 0, plan_len + 1).astype(obs["expert"].dtype)}

    act_obs = observations(c.num_envs, key)
    batch = c.num_envs * c.num_steps // c.num_minibatches
    grad_obs = observations(batch, jax.random.fold_in(key, 1))
    actions = jax.random.randint(key, (batch,), 0, int(trainer.env.action_space(params_env).n))

    def act_skill(p, obs, k):
        pi, value = trainer.policy.apply({"params": p, **extra}, obs)
        action = pi.sample(seed=k)
        return action, pi.log_prob(action), value

    def act_flat(p, obs, k):
        pi, value = flat_ppo.apply(p, {}, obs["obs"])
        action = pi.sample(seed=k)
        return action, pi.log_prob(action), value

    def loss_of(pi, value):
        return (pi.log_prob(actions).mean() + 0.01 * pi.entropy().mean() + jnp.square(value).mean())

    def grad_skill(p, obs):
        return jax.grad(lambda p: loss_of(*trainer.policy.apply({"params": p, **extra}, obs)))(p)

    def grad_routed(p, obs):
        def loss(p):
            pi, value = trainer.policy.apply({"params": p, **extra}, obs)
            return loss_of(distrax.Categorical(logits=pi.logits), value)

        return jax.grad(loss)(p)

    def grad_flat(p, obs):
        return jax.grad(lambda p: loss_of(*flat_ppo.apply(p, {}, obs["obs"])))(p)

    out = {"plan_len": plan_len, "bank_rows": rows}
    for part, fn, args in (("act_flat", act_flat, (flat_params, act_obs, key)),
                           ("act_skill", act_skill, (params, act_obs, key)),
                           ("grad_flat", grad_flat, (flat_params, grad_obs)),
                           ("grad_skill", grad_skill, (params, grad_obs)),
                           ("grad_routed", grad_routed, (params, grad_obs))):
        compile_s, run_s = time_compiled(fn, *args, repeats=repeats)
        out[part] = {"compile_s": compile_s, "run_s": run_s}
    return out


def eval_part(trainer: SkillTrainer, repeats: int) -> dict:
    runner = trainer.runner
    args = (runner.train_state.params, runner.extra_variables, runner.env_params, runner.key)
    # The trainer's own jitted evaluation; its horizon is a static argument, so it is bound here.
    compile_s, run_s = time_compiled(lambda *a: trainer._eval(*a, trainer.eval_steps), *args, repeats=repeats)
    return {"compile_s": compile_s, "run_s": run_s, "every": trainer.config.greedy_eval_every}


def round_env_steps(trainer: SkillTrainer, vec, repeats: int) -> dict:
    """`env_steps` of `vec` over one round's steps, with the base env's actions."""
    config = trainer.config
    num_actions = int(trainer.env.base.action_space(trainer.base_params).n)
    return env_steps(vec, num_actions, config.updates_per_round * config.ppo_config().num_steps, repeats)


def skill_vec(trainer: SkillTrainer, library, name: str):
    """The vectorised env `name`'s rounds train on (its conditions, routing and restarts)."""
    return trainer.ppo.vec_env(trainer.env.params_for(trainer.base_params, library, name))


def env_only(config: SkillsConfig, trainer: SkillTrainer, library, args, result: dict, save) -> int:
    """The `env` part alone: the base env and each listed skill's env at the config's `num_envs`."""
    result["num_envs"] = config.ppo_config().num_envs
    base = flat_trainer(config).vec_env(trainer.base_params)
    result["env_only"]["base"] = round_env_steps(trainer, base, args.repeats)
    save(f"base env alone, {result['num_envs']} envs: {result['env_only']['base']['steps_per_s']:,.0f} env steps/s")
    for name in args.skills:
        result["env_only"][name] = round_env_steps(trainer, skill_vec(trainer, library, name), args.repeats)
        save(f"{name} env alone: {result['env_only'][name]['steps_per_s']:,.0f} env steps/s")
    result["complete"] = True
    save(markdown(result))
    return 0


def markdown(result: dict) -> str:
    info, flat = result["device"], result["round"].get("flat PPO")
    lines = [f"# Skills round profile: {result['env']}", "",
             f"{info.get('cpu_model') or info['device']}, jax {info['jax']}; config `{result['config']}` "
             f"({' '.join(result['overrides']) or 'as shipped'})"
             + ("." if result["complete"] else "; cut short: the parts measured before it stopped.")
             + (" The envs alone, random actions." if result.get("num_envs")
                else f" Dependencies: the experts of `{result['experts_from']}`." if result.get("experts_from")
                else " Dependencies: random experts."), ""]
    if flat is not None:
        lines += ["| program | env steps/s | x flat PPO | round s | first round s |", "|---|---:|---:|---:|---:|"]
    for name, r in result["round"].items():
        lines.append(f"| {name} | {r['steps_per_s']:,.0f} | {r['steps_per_s'] / flat['steps_per_s']:.2f} | "
                     f"{r['round_s']:.2f} | {r['first_round_s']:.1f} |")
    if "base" in result["env_only"]:
        envs = f" ({result['num_envs']} envs)" if result.get("num_envs") else ""
        lines += ["", f"| env alone{envs} | env steps/s | x base env |", "|---|---:|---:|"]
        base = result["env_only"]["base"]["steps_per_s"]
        for name, r in result["env_only"].items():
            lines.append(f"| {name} | {r['steps_per_s']:,.0f} | {r['steps_per_s'] / base:.2f} |")
    if result["policy"]:
        lines += ["", "| skill (plan length, bank rows) | act ms: flat / skill | grad ms: flat / skill as trained / routed |",
                  "|---|---:|---:|"]
    for name, r in result["policy"].items():
        ms = {k: 1e3 * v["run_s"] for k, v in r.items() if isinstance(v, dict)}
        lines.append(f"| {name} ({r['plan_len']}, {r['bank_rows']}) | {ms['act_flat']:.2f} / {ms['act_skill']:.2f} | "
                     f"{ms['grad_flat']:.2f} / {ms['grad_skill']:.2f} / {ms['grad_routed']:.2f} |")
    if result.get("eval"):
        e = result["eval"]
        lines += ["", f"Greedy evaluation of every slot: {e['run_s']:.2f} s, every {e['every']} rounds "
                      f"(compile {e['compile_s']:.1f} s)."]
    for name, ops in result.get("trace", {}).items():
        lines += ["", f"Ops of {name}'s round program (`--trace`; own ms per round, runs per round, the JAX "
                      "operation; fusions name none):", "",
                  "| op | ms | runs | shape | from |", "|---|---:|---:|---|---|"]
        for o in ops[:15]:
            lines.append(f"| {o['op']} | {o['ms_per_call']:.1f} | {o['runs_per_call']:.0f} | {(o['shape'] or '')[:40]} | "
                         f"{(o['op_name'] or '')[-70:]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/skills_craftax_classic.yaml")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--skills", nargs="+", default=["collect_wood", "make_wood_pickaxe", "make_stone_pickaxe"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--together", action="store_true",
                   help="also time the listed skills in one round (one slot each) and the greedy evaluation")
    p.add_argument("--trace", action="store_true",
                   help="also profile flat PPO's and each skill's round program op by op (jax.profiler)")
    p.add_argument("--env-only", action="store_true",
                   help="time only the envs alone (the base env and each listed skill's), no policy or round")
    p.add_argument("--experts-from", type=Path, metavar="RUN",
                   help="the dependencies' experts of a skills run (its completed skills) rather than random "
                        "weights, so that each expert acts on as many rows as in training")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the skills config")
    args = p.parse_args(argv)
    try:
        config = load_config(SkillsConfig, resolve_config(args.config), args.overrides)
        catalog = check_config(config)
        unknown = [s for s in args.skills if s not in catalog]
        if unknown:
            raise ConfigError(f"--skills names {', '.join(unknown)}, not in the library '{config.library}'.")
        if args.together and len(args.skills) > config.max_parallel_skills:
            raise ConfigError(f"--together with {len(args.skills)} skills; the config runs "
                              f"{config.max_parallel_skills} at once: raise max_parallel_skills=N or name fewer.")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    library = catalog  # a fresh run's skills are the catalog's
    trainer = SkillTrainer(config, catalog)
    names = set().union(*(library.closure(s) for s in args.skills))
    try:
        experts = (trained_experts(trainer, args.experts_from, names) if args.experts_from
                   else random_experts(trainer, names, jax.random.key(config.seed)))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = {"config": str(args.config), "overrides": args.overrides, "env": config.env, "device": device_info(),
              "experts_from": str(args.experts_from) if args.experts_from else None,
              "updates_per_round": config.updates_per_round, "skills": args.skills, "complete": False,
              "round": {}, "env_only": {}, "policy": {}}
    args.out.mkdir(parents=True, exist_ok=True)

    def save(line: str) -> None:  # after every part: a run cut short keeps what it measured
        print(line, flush=True)
        atomic_write_json(args.out / "skills_speed.json", result)
        atomic_write_text(args.out / "skills_speed.md", markdown(result))

    if args.env_only:
        return env_only(config, trainer, library, args, result, save)
    flat, flat_ppo, flat_runner = flat_round(config, args.rounds)
    result["round"]["flat PPO"] = flat
    if args.trace:
        result["trace"] = {"flat PPO": traced_update(flat_ppo, flat_runner, config.updates_per_round)}
    save(f"flat PPO: {flat['steps_per_s']:,.0f} env steps/s")
    result["env_only"]["base"] = round_env_steps(trainer, flat_ppo.vec_env(trainer.base_params), args.repeats)
    save(f"base env alone: {result['env_only']['base']['steps_per_s']:,.0f} env steps/s")
    for name in args.skills:
        result["round"][name] = skills_round(trainer, library, [name], experts, args.rounds, config.seed)
        if args.trace:
            result["trace"][name] = skill_trace(trainer, name)
        result["env_only"][name] = round_env_steps(trainer, skill_vec(trainer, library, name), args.repeats)
        result["policy"][name] = policy_parts(trainer, flat_ppo, flat_runner, library, name, experts, args.repeats,
                                              jax.random.key(config.seed))
        ms = {k: round(v["run_s"] * 1e3, 2) for k, v in result["policy"][name].items() if isinstance(v, dict)}
        save(f"{name}: round {result['round'][name]['steps_per_s']:,.0f} env steps/s, env alone "
             f"{result['env_only'][name]['steps_per_s']:,.0f}; policy ms {ms}")
    if args.together and len(args.skills) > 1:
        label = " + ".join(args.skills)
        result["round"][label] = skills_round(trainer, library, list(args.skills), experts, args.rounds, config.seed)
        result["eval"] = eval_part(trainer, args.repeats)
        save(f"{label}: {result['round'][label]['steps_per_s']:,.0f} env steps/s")
    result["complete"] = True
    save(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
