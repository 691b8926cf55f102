"""Episodes per second of multi-turn text games: one compiled loop over turns against a Python loop.

    python benchmarks/llm_rl/multiturn_rollout.py --out DIR [--games guess_number wordle twenty_questions maze] [--high 100]
        [--turns 8]
        [--batches 16 64 256] [--repeats 5]

The games (`tasks.text_games`): guess-the-number over 1..high, Wordle and Twenty Questions, each with
up to `turns` turns, played by the guided agent's actor: a tiny random Qwen2-shaped backbone in the shape of configs/guided_game.yaml
with a fresh LoRA adapter, sampling at temperature 1 (a random policy plays every turn, so the
games run to the turn limit: the loop's worst case). Two ways, the same agent, episodes and key:

- compiled (`turn_loop: compiled`, llm_rl.turns): one jitted program for the whole batch of games;
  the oracle's replies are computed from token ids in JAX; the host only replays the utterances
  afterwards for the episodes' records (timed with it);
- host (`turn_loop: host`): per turn, encode the states, one jitted sampling call, decode, the
  oracle in Python, as the guided trainer did before.

Both must play the same games (checked: every guess of every episode), so the figure compares loops,
not policies. Per batch size: compile time (the first call, apart), then the median and min of
`repeats` timed calls, and episodes/s from the median. Writes DIR/multiturn_rollout.json,
DIR/multiturn_rollout.md and DIR/multiturn_rollout.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def agents(game: str, high: int, turns: int, batch: int):
    """The compiled-loop and host-loop agents on one random backbone."""
    from jaxrl_hier.config import build_dataclass, read_yaml
    from jaxrl_hier.llm_rl.guided import make_env, make_train
    from jaxrl_hier.llm_rl.guided_config import GuidedConfig
    from jaxrl_hier.llm_rl.model_setup import build_policy
    from jaxrl_hier.tasks import build_char_tokenizer

    shipped = read_yaml(REPO / "configs" / "guided_game.yaml")
    cfg = build_dataclass(GuidedConfig, dict(
        env=game, game_high=high, game_max_turns=turns,
        max_new_tokens={"guess_number": len(str(high)) + 1, "wordle": 6, "twenty_questions": 8, "maze": 2}[game],
        model=shipped["model"], lora_rank=shipped["lora_rank"], critic="backbone", temperature=1.0,
        episodes_per_iteration=batch, replay_capacity=batch * turns))
    env = make_env(cfg)
    lm, tok = build_policy(cfg, build_char_tokenizer())
    compiled = make_train(dataclasses.replace(cfg, turn_loop="compiled"), env, lm, tok)
    host = make_train(dataclasses.replace(cfg, turn_loop="host"), env, lm, tok)
    return compiled, host


def timed(agent, state, episodes, key, repeats: int) -> dict:
    import jax

    def once():
        t0 = time.perf_counter()
        done, turns, _ = agent.rollout(state, list(episodes), key)
        jax.block_until_ready(turns[-1]["action"])
        return time.perf_counter() - t0, done

    first, done = once()
    runs = [once()[0] for _ in range(repeats)]
    median = statistics.median(runs)
    return {"first_call_s": first, "median_s": median, "min_s": min(runs), "runs_s": runs,
            "episodes_per_s": len(episodes) / median, "turns_played": sum(e.turn for e in done),
            "guesses": [e.guesses for e in done]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--games", nargs="+", default=["guess_number", "wordle"],
                        choices=["guess_number", "wordle", "twenty_questions", "maze"])
    parser.add_argument("--high", type=int, default=100)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if not 2 <= args.high <= 999 or not 1 <= args.turns <= 32 or min(args.batches) < 1 or args.repeats < 1:
        print("error: --high must be in [2, 999], --turns in [1, 32], --batches >= 1 and --repeats >= 1",
              file=sys.stderr)
        return 2

    import jax

    from jaxrl_hier.bench import device_info
    from jaxrl_hier.io import atomic_write_json, atomic_write_text

    rows = []
    for game, batch in [(g, b) for g in args.games for b in args.batches]:
        compiled, host = agents(game, args.high, args.turns, batch)
        state = compiled.init(jax.random.key(0))
        episodes = compiled.env.reset("train", batch, 0)
        key = jax.random.key(1)
        row = {"game": game, "batch": batch, "compiled": timed(compiled, state, episodes, key, args.repeats),
               "host": timed(host, state, episodes, key, args.repeats)}
        row["same_games"] = row["compiled"].pop("guesses") == row["host"].pop("guesses")
        row["speedup"] = row["compiled"]["episodes_per_s"] / row["host"]["episodes_per_s"]
        rows.append(row)
        print(f"{game}, batch {batch}: compiled {row['compiled']['episodes_per_s']:.1f} episodes/s "
              f"(first call {row['compiled']['first_call_s']:.1f} s), host {row['host']['episodes_per_s']:.1f} "
              f"(first call {row['host']['first_call_s']:.1f} s), {row['speedup']:.2f}x, same games: "
              f"{row['same_games']}", flush=True)
    lines = [f"Guess-the-number 1..{args.high} and Wordle, up to {args.turns} turns, a random tiny policy (median "
             f"of {args.repeats} calls after the first):", "",
             "| game | episodes per batch | compiled loop (episodes/s) | host loop (episodes/s) | speed-up | "
             "first call: compiled / host (s) | same games |", "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['game']} | {r['batch']} | {r['compiled']['episodes_per_s']:.1f} | {r['host']['episodes_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['compiled']['first_call_s']:.1f} / {r['host']['first_call_s']:.1f} | "
                     f"{r['same_games']} |")
    atomic_write_json(args.out / "multiturn_rollout.json", {"benchmark": "multiturn_rollout", **device_info(),
                                                            "high": args.high, "turns": args.turns,
                                                            "repeats": args.repeats, "rows": rows})
    atomic_write_text(args.out / "multiturn_rollout.md", "\n".join(lines) + "\n")
    plot(rows, args.out / "multiturn_rollout.png", args.high, args.turns)
    print("\n".join(lines))
    return 0 if all(r["same_games"] for r in rows) else 1


def plot(rows: list[dict], path: Path, high: int, turns: int) -> None:
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for game in dict.fromkeys(r["game"] for r in rows):
        mine = [r for r in rows if r["game"] == game]
        for name, style in (("compiled", "o-"), ("host", "s--")):
            ax.plot([r["batch"] for r in mine], [r[name]["episodes_per_s"] for r in mine], style,
                    label=f"{game}, {name} loop")
    ax.set(xscale="log", yscale="log", xlabel="episodes per batch", ylabel="episodes / s",
           title=f"up to {turns} turns (guess 1..{high})")
    ax.legend()
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
