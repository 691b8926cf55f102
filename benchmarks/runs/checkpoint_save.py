"""What a run's checkpoint costs: the same training states saved one Orbax array per leaf and packed
(one array per dtype, `jaxrl_hier.checkpointing`).

Every run saves its whole state synchronously between compiled chunks (a skills round, a chain or
manager chunk, a PPO chunk), so the save is wall time the run spends beside its training. The states
are the ones those runs save, built from packaged configs:

- `skills round`: a skills trainer's runner (`configs/skills_techtree.yaml`: every slot, its bank of
  frozen experts, env and optimiser states), saved after every round;
- `PPO (<config>)`: a PPO runner of `configs/ppo_techtree.yaml` and `configs/ppo_craftax_classic.yaml`,
  saved after every chunk of `python -m jaxrl_hier.train`.

For each, a save (started and finished, as the runs wait for it) and a restore into the state's own
structure, `--repeats` times in each layout, the median reported (the first restore of each is
checked against the state saved):

    python benchmarks/runs/checkpoint_save.py --out DIR [--repeats 7] [--states skills ppo_techtree ppo_classic]

Writes DIR/checkpoint_save.json, .md and .png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import jax
import numpy as np

from jaxrl_hier.bench import device_info
from jaxrl_hier.checkpointing import Checkpointer
from jaxrl_hier.io import atomic_write_json, atomic_write_text

LAYOUTS = {"one array per leaf": False, "packed": True}


def skills_state():
    from jaxrl_hier.config import load_config
    from jaxrl_hier.skills.cli import check_config
    from jaxrl_hier.skills.config import SkillsConfig
    from jaxrl_hier.skills.trainer import SkillTrainer

    config = load_config(SkillsConfig, "skills_techtree.yaml")
    trainer = SkillTrainer(config, check_config(config))
    trainer.init(jax.random.key(0))
    return trainer.runner


def ppo_state(name: str):
    from jaxrl_hier.algorithms.ppo import PPOConfig, make_train
    from jaxrl_hier.config import load_config

    return make_train(load_config(PPOConfig, name)).init(jax.random.key(0))


STATES = {"skills": ("skills round (skills_techtree.yaml)", skills_state),
          "ppo_techtree": ("PPO (ppo_techtree.yaml)", lambda: ppo_state("ppo_techtree.yaml")),
          "ppo_classic": ("PPO (ppo_craftax_classic.yaml)", lambda: ppo_state("ppo_craftax_classic.yaml"))}


def same(a, b) -> bool:
    """Equal arrays, PRNG keys compared by their key data."""
    data = (lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
    return bool(np.array_equal(np.asarray(data(a)), np.asarray(data(b))))


def time_layout(state, pack: bool, repeats: int, folder: Path) -> dict:
    """Median seconds of a whole save (Orbax's directory finalised) and of a restore into `state`."""
    ckpt = Checkpointer(folder, keep=2, asynchronous=False, pack=pack)
    saves, restores = [], []
    for step in range(1, repeats + 2):  # the first of each is not timed (Orbax's first-call set-up)
        t0 = time.perf_counter()
        ckpt.save(step, state, {})
        ckpt.wait()
        t1 = time.perf_counter()
        restored = jax.block_until_ready(ckpt.restore(step, state, {})[0])
        t2 = time.perf_counter()
        if step == 1 and not all(map(same, jax.tree.leaves(restored), jax.tree.leaves(state))):
            raise RuntimeError(f"the {'packed' if pack else 'per-leaf'} checkpoint restored another state than it saved")
        if step > 1:
            saves.append(t1 - t0)
            restores.append(t2 - t1)
    ckpt.close()
    return {"save_s": statistics.median(saves), "restore_s": statistics.median(restores)}


def markdown(result: dict) -> str:
    info = result["device"]
    lines = ["# Checkpoint save and restore, one array per leaf against packed", "",
             f"{info.get('cpu_model') or info['device']} ({info.get('cpu_flags', '')}), jax {info['jax']}, orbax {result['orbax']}; median of "
             f"{result['repeats']} synchronous saves (finished) and restores.", "",
             "| state | arrays | MB | save s, per leaf | save s, packed | x | restore s, per leaf | restore s, packed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["states"]:
        a, b = r["one array per leaf"], r["packed"]
        lines.append(f"| {r['label']} | {r['arrays']} | {r['bytes'] / 1e6:.1f} | {a['save_s']:.3f} | "
                     f"{b['save_s']:.3f} | {a['save_s'] / b['save_s']:.1f} | {a['restore_s']:.3f} | "
                     f"{b['restore_s']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    from jaxrl_hier.logging.plots import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(7, 3.5))
    labels = [r["label"] for r in result["states"]]
    for i, layout in enumerate(LAYOUTS):
        ax.barh([j + 0.4 * i for j in range(len(labels))], [r[layout]["save_s"] * 1e3 for r in result["states"]],
                height=0.4, label=layout)
    ax.set_yticks([j + 0.2 for j in range(len(labels))], labels)
    ax.set(xlabel="ms per save (median)", title="Checkpoint save")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    import orbax.checkpoint

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--states", nargs="+", default=list(STATES), choices=list(STATES))
    args = p.parse_args(argv)
    if args.repeats < 1:
        print("error: --repeats must be at least 1.", file=sys.stderr)
        return 2
    result = {"device": device_info(), "orbax": orbax.checkpoint.__version__, "repeats": args.repeats, "states": []}
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.states:
            label, build = STATES[key]
            state = build()
            leaves = jax.tree.leaves(state)
            row = {"state": key, "label": label, "arrays": len(leaves),
                   "bytes": sum(x.size * x.dtype.itemsize for x in leaves if hasattr(x, "dtype"))}
            for layout, pack in LAYOUTS.items():
                row[layout] = time_layout(state, pack, args.repeats, Path(tmp) / f"{key}_{pack}")
            result["states"].append(row)
            print(f"{label}: {row['arrays']} arrays; save {row['one array per leaf']['save_s']:.3f} s per leaf, "
                  f"{row['packed']['save_s']:.3f} s packed", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "checkpoint_save.json", result)
    atomic_write_text(args.out / "checkpoint_save.md", markdown(result))
    plot(result, args.out / "checkpoint_save.png")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
