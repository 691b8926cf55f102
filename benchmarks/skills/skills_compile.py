"""Compile time against run time of the skills program, per shape.

A skills run compiles one PPO program per (number of running skills, frozen-expert bank rows)
(`skills.trainer`); on the GPU each of those cost about a minute on one H200 (docs/skills.md, "On a
GPU"), so over an hour of the Craftax-Classic tree 6 to 10 of them would spend 6 to 10 minutes. This
script measures, in one process, each shape's round program as the trainer builds it: the time to
trace, lower and compile it, and the time of a round once compiled, so that settings that cut
compilation (XLA flags, the persistent compilation cache with its per-fusion autotuning cache, fewer
bank shapes) can be compared with what they cost in run time. Shapes are compiled in the order given,
so a cache's effect shows on the later ones.

    python benchmarks/skills/skills_compile.py --config configs/skills_craftax_classic_gpu.yaml \
        --shapes 1x0 1x2 1x12 --label default --out DIR [key=value ...]

`AxR`: A running skills, a bank of R frozen experts (0: a skill with no dependencies, no routing).
Each slot holds the library's skill with the longest plan of at most R experts (random experts:
compilation and run time do not depend on the weights). Writes `DIR/skills_compile_LABEL.json`; then
`DIR/skills_compile.md` and `.png` over every such JSON in DIR. XLA flags and the cache directory
come from the environment (`XLA_FLAGS`, `JAX_COMPILATION_CACHE_DIR`) and are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import jax

from jaxrl_hier.bench import device_info, time_compiled
from jaxrl_hier.config import ConfigError, load_config, parse_overrides, read_yaml
from jaxrl_hier.io import atomic_write_json, atomic_write_text
from jaxrl_hier.logging.plots import pyplot, save_figure
from jaxrl_hier.skills.cli import check_config
from jaxrl_hier.skills.config import SkillsConfig
from jaxrl_hier.skills.trainer import SkillTrainer


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a skills config (configs/skills_*.yaml)")
    p.add_argument("--shapes", nargs="+", default=["1x0", "1x2"], help="AxR: A running skills, R bank rows")
    p.add_argument("--label", default="default", help="this process's settings, as the table and plot name them")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=2, help="timed rounds per shape after the first")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the skills config (ppo.KEY=VALUE: of its ppo section)")
    return p.parse_args(argv)


def merged_overrides(path: str, overrides: list[str]) -> dict:
    """`key=value` overrides, with `ppo.KEY=VALUE` merged into the config's ppo section (a plain
    `ppo=...` would replace the whole section)."""
    values = parse_overrides(overrides)
    ppo = {k.split(".", 1)[1]: values.pop(k) for k in list(values) if k.startswith("ppo.")}
    if ppo:
        values["ppo"] = {**read_yaml(path).get("ppo", {}), **values.get("ppo", {}), **ppo}
    return values


def parse_shape(text: str, max_parallel: int, max_experts: int) -> tuple[int, int]:
    try:
        active, rows = (int(x) for x in text.lower().split("x"))
    except ValueError:
        sys.exit(f"error: shape '{text}' is not AxR (A running skills, R bank rows), e.g. 1x2")
    if not 1 <= active <= max_parallel or not 0 <= rows <= max_experts:
        sys.exit(f"error: shape '{text}' needs 1 <= A <= max_parallel_skills ({max_parallel}) and "
                 f"0 <= R <= max_experts ({max_experts}); change the shape or override the config")
    return active, rows


def skill_for_rows(library, rows: int) -> str:
    """The skill with the longest plan of at most `rows` frozen experts (none: rows 0)."""
    return max((n for n in library.names if len(library.closure(n)) <= rows), key=lambda n: len(library.closure(n)))


def measure_shape(trainer: SkillTrainer, library, active: int, rows: int, key: jax.Array, repeats: int) -> dict:
    skill = skill_for_rows(library, rows)
    plan = library.closure(skill)
    keys = jax.random.split(key, len(plan) + 1)
    experts = {d: trainer.policy.init_expert(k, trainer._obs_dim) for d, k in zip(plan, keys)}
    trainer.init(keys[-1])
    trainer.start({i: skill for i in range(active)}, library, experts, keys[-1])
    sub = trainer._select(trainer.runner, jax.numpy.arange(active, dtype=jax.numpy.int32), rows)
    sub = jax.device_put(sub, trainer.ppo.shardings(sub))
    updates = trainer.config.updates_per_round
    compile_s, run_s = time_compiled(trainer.ppo._compiled_chunk(updates, sub), sub, repeats=repeats)
    steps = active * updates * trainer.steps_per_update
    return {"shape": f"{active}x{rows}", "active_skills": active, "bank_rows": rows, "skill": skill,
            "plan_len": len(plan), "compile_s": compile_s, "round_s": run_s, "round_env_steps": steps,
            "env_steps_per_s": steps / run_s}


def write_report(out: Path) -> None:
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("skills_compile_*.json"))]
    if not runs:
        return
    lines = [f"device: {runs[0]['device']['device']}, jax {runs[0]['device']['jax']}", "",
             "| settings | shape | skill (plan) | compile (s) | round (s) | env steps/s |", "|---|---|---|---:|---:|---:|"]
    for r in runs:
        for s in r["shapes"]:
            lines.append(f"| {r['label']} | {s['shape']} | {s['skill']} ({s['plan_len']}) | {s['compile_s']:.1f} | "
                         f"{s['round_s']:.2f} | {s['env_steps_per_s']:,.0f} |")
    lines += ["", "settings: " + "; ".join(f"{r['label']}: XLA_FLAGS={r['xla_flags']!r}, cache={r['compilation_cache_dir']!r}"
                                            for r in runs)]
    atomic_write_text(out / "skills_compile.md", "\n".join(lines) + "\n")
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    shapes = sorted({s["shape"] for r in runs for s in r["shapes"]}, key=lambda t: tuple(map(int, t.split("x"))))
    width = 0.8 / len(runs)
    for i, r in enumerate(runs):
        by = {s["shape"]: s for s in r["shapes"]}
        xs = [j + i * width for j, sh in enumerate(shapes) if sh in by]
        for ax, field in zip(axes, ("compile_s", "round_s")):
            ax.bar(xs, [by[sh][field] for sh in shapes if sh in by], width, label=r["label"])
    for ax, title in zip(axes, ("compile (s), in the order compiled", "one round once compiled (s)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes)
        ax.set_xlabel("running skills x bank rows")
        ax.set_title(title)
    axes[0].legend()
    fig.suptitle(f"skills program per shape, {runs[0]['device']['device']}")
    fig.tight_layout()
    save_figure(fig, out / "skills_compile.png")


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        config = load_config(SkillsConfig, args.config, merged_overrides(args.config, args.overrides))
        library = check_config(config)
    except ConfigError as err:
        sys.exit(f"error: {err}")
    shapes = [parse_shape(s, config.max_parallel_skills, config.max_experts) for s in args.shapes]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    trainer = SkillTrainer(config, library)
    record = {"label": args.label, "config": args.config, "overrides": args.overrides, "device": device_info(),
              "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "compilation_cache_dir": jax.config.jax_compilation_cache_dir,
              "xla_caches": jax.config.jax_persistent_cache_enable_xla_caches,
              "num_envs": config.ppo_config().num_envs, "updates_per_round": config.updates_per_round,
              "setup_s": time.perf_counter() - t0, "shapes": []}
    path = args.out / f"skills_compile_{args.label}.json"
    for i, (active, rows) in enumerate(shapes):
        row = measure_shape(trainer, library, active, rows, jax.random.key(i), args.repeats)
        print(f"{args.label} {row['shape']} ({row['skill']}): compile {row['compile_s']:.1f} s, "
              f"round {row['round_s']:.2f} s, {row['env_steps_per_s']:,.0f} env steps/s", flush=True)
        record["shapes"].append(row)
        atomic_write_json(path, record)  # after each shape: a run cut short keeps what it measured
    write_report(args.out)


if __name__ == "__main__":
    main()
