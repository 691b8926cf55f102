"""The manager stage's env steps/s against the generalist's and flat PPO's, on a finished skills run.

    python benchmarks/skills/manager_speed.py RUN --out DIR [--chunks 2]

The generalist is the manager's own network trained with its skills closed, so the two stages differ
only in what the skills' experts cost when the manager chooses a skill (`skills.manager`). Both are
built from RUN as the scheduler builds them (its config, its completed skills with the chain's tuned
experts, the manager's skills) and start from RUN's trained parameters (`RUN/manager`,
`RUN/generalist`), so that the manager chooses its skills as often as it did at the end of training.
Each stage compiles its chunk program (`updates_per_round` PPO updates) on a first call, then
`--chunks` more chunks are timed. Flat PPO on the base env with the run's `ppo` section runs as many
chunks in the same process (`skills_speed.flat_round`), the yardstick of both stages. A generalist
with a teacher (`manager.kickstart`) is timed twice: while the teacher teaches (its expert runs once
per rollout) and past `kickstart_timesteps`, where its weight is 0 and its expert runs on no row. A
run without a generalist stage (TechTree's) times its manager alone against flat PPO. Writes
DIR/manager_speed.json and DIR/manager_speed.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import jaxrl_hier  # noqa: E402,F401  (sets XLA flags before JAX starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.skills.skills_speed import flat_round, time_rounds  # noqa: E402

from jaxrl_hier.bench import device_info  # noqa: E402
from jaxrl_hier.config import ConfigError  # noqa: E402
from jaxrl_hier.io import atomic_write_json, atomic_write_text  # noqa: E402
from jaxrl_hier.skills.cli import check_config  # noqa: E402
from jaxrl_hier.skills.config import saved_config  # noqa: E402
from jaxrl_hier.skills.composed import load_run  # noqa: E402
from jaxrl_hier.skills.manager import GENERALIST_DIR, MANAGER_DIR, ManagerTrainer, load_manager  # noqa: E402
from jaxrl_hier.skills.state import load_state  # noqa: E402


def time_stage(trainer: ManagerTrainer, params: dict, chunks: int, seed: int, untaught: bool = False) -> dict:
    """A first (compiling) chunk from `params`, then the median of `chunks` more (`skills_speed.time_rounds`).
    `untaught`: the runner starts where the teacher's weight has fallen to 0."""
    runner = trainer.ppo.init(jax.random.key(seed), params=params)
    if untaught:
        past = -(-trainer.kickstart_span // trainer.config.steps_per_update)
        runner = runner.replace(update=jnp.full_like(runner.update, past))
        runner = jax.device_put(runner, trainer.ppo.shardings(runner))
        assert trainer.kickstart_weight(runner) == 0.0
    state = {"runner": runner}

    def one() -> None:  # `train` returns the chunk's metrics on the host: the chunk has finished
        state["runner"] = trainer.train(state["runner"])[0]

    return as_stage(time_rounds(one, chunks, trainer.steps_per_chunk))


def as_stage(t: dict) -> dict:
    """`time_rounds`' figures under the stage's names."""
    return {"first_chunk_s": t["first_round_s"], "chunk_s": t["round_s"], "steps": t["steps"],
            "steps_per_s": t["steps_per_s"]}


def markdown(result: dict) -> str:
    info, gen, flat = result["device"], result.get("generalist"), result["flat_ppo"]
    labels = {"generalist": "generalist", "generalist_past_teacher": "generalist, teacher's weight 0", "manager": "manager"}
    rows = [(label, result[stage]) for stage, label in labels.items() if stage in result]
    rows.append(("flat PPO", flat))

    def ratio(r: dict, of: dict | None) -> str:
        return f"{r['steps_per_s'] / of['steps_per_s']:.2f}" if of else ""

    return "\n".join([
        f"# Manager against generalist: {result['env']}", "",
        f"{info.get('cpu_model') or info['device']}, jax {info['jax']}; run `{result['run']}`, manager over "
        f"{', '.join(result['skills'])}.", "",
        "| stage | env steps/s | x generalist | x flat PPO | chunk s | first chunk s |", "|---|---:|---:|---:|---:|---:|",
        *(f"| {stage} | {r['steps_per_s']:,.0f} | {ratio(r, gen)} | {ratio(r, flat)} | {r['chunk_s']:.3f} | "
          f"{r['first_chunk_s']:.1f} |" for stage, r in rows), ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a skills run whose manager and generalist stages are done")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--chunks", type=int, default=2, help="chunks timed after the compiling one")
    args = p.parse_args(argv)
    try:
        if args.chunks < 1:
            raise ConfigError("--chunks must be at least 1.")
        state = load_state(args.run)
        if state.manager.get("status") != "done" or state.generalist.get("status") not in (None, "done"):
            raise ConfigError(f"{args.run} has no finished manager stage (or its generalist stage is not done): "
                              "run `python -m jaxrl_hier.skills resume` on it to the end first.")
        config = saved_config(args.run)
        catalog = check_config(config)
        agents = load_run(args.run, config, catalog)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    names = state.manager["skills"]
    result = {"run": str(args.run), "env": config.env, "skills": names, "device": device_info()}
    stages = [("generalist", True, GENERALIST_DIR)] if state.generalist else []
    for stage, closed, dirname in [*stages, ("manager", False, MANAGER_DIR)]:
        trainer = ManagerTrainer(config, agents.env, agents.base_params, agents.library, agents.experts, names,
                                 closed=closed)
        params = load_manager(args.run, trainer.params_like(), dirname)["manager"]
        timed = [(stage, False)] + ([("generalist_past_teacher", True)] if closed and trainer.kickstart else [])
        for name, untaught in timed:
            result[name] = time_stage(trainer, params, args.chunks, config.seed, untaught)
            print(f"{name}: {result[name]['steps_per_s']:,.0f} env steps/s "
                  f"(first chunk {result[name]['first_chunk_s']:.1f} s)", flush=True)
    result["flat_ppo"] = as_stage(flat_round(config, args.chunks)[0])
    print(f"flat PPO: {result['flat_ppo']['steps_per_s']:,.0f} env steps/s "
          f"(first chunk {result['flat_ppo']['first_chunk_s']:.1f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "manager_speed.json", result)
    atomic_write_text(args.out / "manager_speed.md", markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
