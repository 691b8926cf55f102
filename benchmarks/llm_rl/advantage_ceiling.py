"""What a perfect critic's advantage would tell the actor on guess-the-number: the ceiling for ArCHer.

    python benchmarks/llm_rl/advantage_ceiling.py --out DIR [--high 64] [--turns 7] [--games 3000] [--group 8]

Under the warm-start's rule (each guess uniform over the numbers still possible, `GuessNumberEnv`'s
`sft_problems`), the secret is uniform over the interval the replies leave, so the exact values of
that policy follow by dynamic programming over (low, high, turns left): V*(s) and Q*(s, a) for every
guess a, and the advantage A*(s, a) = Q*(s, a) - V*(s) that a perfect critic of the warm-start would
give. Playing `--games` secrets `--group` times each (the trainer's groups), every utterance's observed
return-to-go G is set beside them:

- the returns' variance, and the squared error of V*(s) and of Q*(s, a) against G: the floor any
  critic's `v_return_mse` / `q_return_mse` can reach (the rest is the secret's and the future's luck);
- the variance of A* itself: how much an utterance changes the expected return;
- the correlation of A* with the observed advantage (G against its group's mean at the same turn, as
  the trainer's `advantage_agreement`; and G - V*(s)): what that diagnostic would read for a perfect
  critic.

Writes DIR/advantage_ceiling.json and .md. Pure Python, a few seconds.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def rule_values(turns: int):
    """(V, Q) of the uniform-guess rule: V(lo, hi, t) and Q(lo, hi, t, guess), t turns left, the secret
    uniform on [lo, hi]; reward 0 for the hit (the game ends), -1 for a miss, the game over after t turns."""

    @functools.lru_cache(maxsize=None)
    def value(lo: int, hi: int, t: int) -> float:
        if t == 0:
            return 0.0
        return sum(q(lo, hi, t, g) for g in range(lo, hi + 1)) / (hi - lo + 1)

    @functools.lru_cache(maxsize=None)
    def q(lo: int, hi: int, t: int, g: int) -> float:
        if not lo <= g <= hi:  # no information: the same interval, one turn fewer
            return -1.0 + value(lo, hi, t - 1)
        n, out = hi - lo + 1, 0.0
        if g > lo:
            out += (g - lo) / n * (-1.0 + value(lo, g - 1, t - 1))
        if g < hi:
            out += (hi - g) / n * (-1.0 + value(g + 1, hi, t - 1))
        return out

    assert turns >= 1
    return value, q


def play_groups(high: int, turns: int, games: int, group: int, seed: int) -> list[dict]:
    """Per utterance of `games` secrets each played `group` times by the rule: V*, A*, the observed
    return-to-go G and G against the mean of its group's plays still on at that turn."""
    value, q = rule_values(turns)
    rng, rows = random.Random(seed), []
    for _ in range(games):
        secret = rng.randint(1, high)
        plays = []
        for _ in range(group):
            lo, hi, play = 1, high, []
            for t in range(turns, 0, -1):
                g = rng.randint(lo, hi)
                v = value(lo, hi, t)
                play.append({"v": v, "a": q(lo, hi, t, g) - v, "r": 0.0 if g == secret else -1.0})
                if g == secret:
                    break
                lo, hi = (g + 1, hi) if g < secret else (lo, g - 1)
            ret = 0.0
            for row in reversed(play):
                ret += row["r"]
                row["g"] = ret
            plays.append(play)
        for k in range(turns):
            live = [p[k] for p in plays if len(p) > k]
            mean = sum(r["g"] for r in live) / max(len(live), 1)
            for r in live:
                rows.append({**r, "group_adv": r["g"] - mean})
    return rows


def ceiling(high: int, turns: int, games: int, group: int, seed: int) -> dict:
    value, _ = rule_values(turns)
    rows = play_groups(high, turns, games, group, seed)
    g = [r["g"] for r in rows]
    a = [r["a"] for r in rows]
    return {"high": high, "turns": turns, "games": games, "group": group, "seed": seed, "utterances": len(rows),
            "start_value": value(1, high, turns),
            "return_var": statistics.pvariance(g),
            "v_star_return_mse": statistics.fmean((r["g"] - r["v"]) ** 2 for r in rows),
            "q_star_return_mse": statistics.fmean((r["g"] - r["v"] - r["a"]) ** 2 for r in rows),
            "advantage_var": statistics.pvariance(a),
            "agreement_group": statistics.correlation(a, [r["group_adv"] for r in rows]),
            "agreement_v": statistics.correlation(a, [r["g"] - r["v"] for r in rows])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--high", type=int, default=64)
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--games", type=int, default=3000)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 2 <= args.high <= 999 or not 1 <= args.turns <= 32 or args.games < 1 or args.group < 2:
        print("error: --high must be in [2, 999], --turns in [1, 32], --games >= 1 and --group >= 2", file=sys.stderr)
        return 2
    from jaxrl_hier.io import atomic_write_json, atomic_write_text

    res = ceiling(args.high, args.turns, args.games, args.group, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "advantage_ceiling.json", {"benchmark": "advantage_ceiling", **res})
    md = "\n".join([
        f"A perfect critic of the warm-start's rule on guess 1..{args.high} ({args.turns} turns), over {res['utterances']:,} "
        f"utterances of {args.games} secrets x {args.group} plays:", "",
        "| return variance | V* vs return: MSE | Q* vs return: MSE | variance of A* = Q* - V* | "
        "corr(A*, G - group mean) | corr(A*, G - V*) |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {res['return_var']:.3f} | {res['v_star_return_mse']:.3f} | {res['q_star_return_mse']:.3f} | "
        f"{res['advantage_var']:.4f} | {res['agreement_group']:.3f} | {res['agreement_v']:.3f} |", ""])
    atomic_write_text(args.out / "advantage_ceiling.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
