"""Wall-clock of training K independent skills at once (K slots vmapped in one compiled program)
against training them one after another (one slot, K times), for the same PPO updates per skill.

Skills: `wood_j` = "inventory.wood >= j" for j = 1..K (no dependencies, so any K of them may run
together; every supported env has the quantity). Per K:
- `one`: one skill alone, `--rounds` rounds of `--updates` PPO updates;
- `parallel`: K skills in K slots, the same rounds (so K times the env steps of `one`);
- `sequential`: the K skills one after another in a single slot (K x rounds);
- `idle` (K > 1): one skill in a K-slot trainer whose other K - 1 slots are idle (should cost `one`).
Compile time is recorded apart (first round of each program); a round includes the trainer's
greedy evaluation where it has one. On a GPU, K slots in one program should cost at most 1.5x one slot.

    python benchmarks/skills/skills_parallel.py --out benchmarks/results/cpu [--env TechTree-v0] [--k 1 2 4]

Writes `skills_parallel.json` and `skills_parallel.png`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import jax

from jaxrl_hier.bench import device_info
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.skills.config import skills_config_from_dict
from jaxrl_hier.skills.spec import Condition, Skill, SkillLibrary
from jaxrl_hier.skills.trainer import SkillTrainer


def wood_skills(k: int) -> SkillLibrary:
    return SkillLibrary(tuple(Skill(f"wood_{j}", (), (Condition("inventory.wood", ">=", float(j)),))
                              for j in range(1, k + 1)))


def trainer_for(args, slots: int, library: SkillLibrary) -> SkillTrainer:
    config = skills_config_from_dict({
        "env": args.env, "max_parallel_skills": slots, "updates_per_round": args.updates, "max_experts": 1,
        "max_conditions": 1, "ppo": {"num_envs": args.num_envs, "num_steps": args.num_steps,
                                     "num_minibatches": args.num_minibatches, "hidden_size": args.hidden,
                                     "num_layers": args.layers}})
    return SkillTrainer(config, library)


def timed_rounds(trainer: SkillTrainer, rounds: int) -> float:
    t0 = time.perf_counter()
    for _ in range(rounds):
        trainer.train_round()  # returns host numbers: blocks on the device
    return time.perf_counter() - t0


def run_k(args, k: int) -> dict:
    library = wood_skills(k)
    # parallel: K slots, one program
    par = trainer_for(args, k, library)
    par.init(jax.random.key(0))
    par.start({i: f"wood_{i + 1}" for i in range(k)}, library, {}, jax.random.key(1))
    t0 = time.perf_counter()
    par.train_round()  # compile + first round
    par_compile = time.perf_counter() - t0
    par_s = timed_rounds(par, args.rounds)
    # one slot: the first skill alone, then the others after it (sequential)
    seq = trainer_for(args, 1, library)
    seq.init(jax.random.key(0))
    seq.start({0: "wood_1"}, library, {}, jax.random.key(1))
    t0 = time.perf_counter()
    seq.train_round()
    seq_compile = time.perf_counter() - t0
    one_s = timed_rounds(seq, args.rounds)
    seq_s = one_s
    for j in range(2, k + 1):
        seq.start({0: f"wood_{j}"}, library, {}, jax.random.key(j))
        seq_s += timed_rounds(seq, args.rounds)
    steps = args.rounds * args.updates * args.num_envs * args.num_steps
    rec = {"k": k, "one_s": one_s, "parallel_s": par_s, "sequential_s": seq_s, "steps_per_skill": steps,
           "parallel_over_one": par_s / one_s, "sequential_over_parallel": seq_s / par_s,
           "compile_parallel_s": par_compile, "compile_one_s": seq_compile,
           "parallel_steps_per_s": k * steps / par_s, "one_steps_per_s": steps / one_s}
    if k > 1 and not args.no_idle:  # one skill, K - 1 idle slots
        idle = trainer_for(args, k, library)
        idle.init(jax.random.key(0))
        idle.start({0: "wood_1"}, library, {}, jax.random.key(1))
        idle.train_round()
        rec["idle_s"] = timed_rounds(idle, args.rounds)
        rec["idle_over_one"] = rec["idle_s"] / one_s
    print(f"K={k}: one {one_s:.2f} s, parallel {par_s:.2f} s ({rec['parallel_over_one']:.2f}x one), sequential "
          f"{seq_s:.2f} s (parallel is {rec['sequential_over_parallel']:.2f}x faster); compile {par_compile:.1f} s"
          + (f"; one skill with {k - 1} idle slots {rec['idle_s']:.2f} s" if "idle_s" in rec else ""), flush=True)
    return rec


def plot(records: list[dict], path: Path, title: str) -> None:
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()

    ks = [r["k"] for r in records]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ks, [r["sequential_s"] for r in records], "s-", label="K skills one after another")
    ax.plot(ks, [r["parallel_s"] for r in records], "o-", label="K skills at once (one program)")
    idle = [(r["k"], r["idle_s"]) for r in records if "idle_s" in r]
    if idle:
        ax.plot([k for k, _ in idle], [t for _, t in idle], "^--", label="1 skill, K - 1 idle slots")
    ax.plot(ks, [1.5 * r["one_s"] for r in records], "k:", label="1.5 x one skill")
    ax.set(xlabel="K independent skills", ylabel="seconds (same updates per skill)", title=title)
    ax.set_xticks(ks)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu"))
    p.add_argument("--env", default="TechTree-v0")
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--updates", type=int, default=10)
    p.add_argument("--num-envs", type=int, default=256)
    p.add_argument("--num-steps", type=int, default=16)
    p.add_argument("--num-minibatches", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--no-idle", action="store_true", help="skip the idle-slots measurement")
    args = p.parse_args(argv)
    if min(args.k) < 1:
        print("error: --k values must be >= 1", file=sys.stderr)
        return 2
    records = [run_k(args, k) for k in args.k]
    info = device_info() | {k: v for k, v in vars(args).items() if k != "out"}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "skills_parallel.json", {"info": info, "records": records})
    plot(records, args.out / "skills_parallel.png", f"{args.env} on {info['device']}")
    print(f"wrote {args.out / 'skills_parallel.json'} and skills_parallel.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
