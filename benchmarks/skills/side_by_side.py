"""Agents side by side per achievement, from committed results files: each column the mean over its
seeds, sampled (greedy), with the standard error of the score over two seeds or more.

    python benchmarks/skills/side_by_side.py --agent "managed agent" RUN0/eval/achievements.json ... \
        --agent "flat PPO" skills_vs_ppo.json:ppo ... [--achievements A B ...] [--out FILE.md]

A file is a report of `python -m jaxrl_hier.skills eval` (`achievements.json`), or a
`skills_vs_ppo.json` of `benchmarks/skills/skills_vs_ppo.py` with the agent after a colon (`ppo`,
`manager` or `skills`): each of its runs is one seed. Rows: the achievements that any agent reached
in any episode (or `--achievements`), then the score (% of the maximum return) and the seeds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxrl_hier.bench import fmt_mean_se, mean_se

MODES = ("sampled", "greedy")


def load_seeds(spec: str) -> list[dict]:
    """One record per seed: {"sampled": {...}, "greedy": {...}}, each with `achievements` (rates in
    [0, 1]) and `score_percent_of_max`."""
    path, _, agent = spec.partition(":")
    data = json.loads(Path(path).read_text())
    if "runs" in data:
        if agent not in ("ppo", "manager", "skills"):
            raise SystemExit(f"error: {spec}: name the agent of a skills_vs_ppo.json after a colon: "
                             f"{path}:ppo, {path}:manager or {path}:skills.")
        return [run[agent] for run in data["runs"]]
    if agent:
        raise SystemExit(f"error: {spec}: an achievements.json holds one agent; drop ':{agent}'.")
    return [data]


def table(agents: list[tuple[str, list[dict]]], achievements: list[str] | None = None) -> str:
    if achievements is None:  # every achievement some agent reached, in the reports' own order
        names = list(agents[0][1][0]["sampled"]["achievements"])
        achievements = [a for a in names if any(s[m]["achievements"].get(a, 0.0) > 0
                                                for _, seeds in agents for s in seeds for m in MODES)]
    lines = ["| sampled (greedy), % | " + " | ".join(label for label, _ in agents) + " |",
             "|---|" + "---:|" * len(agents)]
    for a in achievements:
        cells = []
        for _, seeds in agents:
            s, g = (mean_se([100 * seed[m]["achievements"][a] for seed in seeds])[0] for m in MODES)
            cells.append(f"{s:.1f} ({g:.1f})")
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    cells = []
    for _, seeds in agents:
        (s, s_se), (g, g_se) = (mean_se([seed[m]["score_percent_of_max"] for seed in seeds]) for m in MODES)
        spread = "" if s_se is None else f" ± {s_se:.1f}"  # one seed: no spread
        cells.append(f"**{s:.1f}**{spread} ({fmt_mean_se(g, g_se, pct=False)})")
    lines.append("| score, % of max | " + " | ".join(cells) + " |")
    lines.append("| seeds | " + " | ".join(str(len(seeds)) for _, seeds in agents) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", nargs="+", action="append", required=True, metavar=("LABEL", "FILE"),
                   help="a column: its label, then one file per seed (or a skills_vs_ppo.json:AGENT)")
    p.add_argument("--achievements", nargs="+", default=None, help="these rows only, in this order")
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = p.parse_args(argv)
    if any(len(a) < 2 for a in args.agent):
        p.error("each --agent takes a label and at least one file")
    agents = [(label, [seed for spec in files for seed in load_seeds(spec)]) for label, *files in args.agent]
    text = table(agents, args.achievements)
    print(text, end="")
    if args.out:
        from jaxrl_hier.io import atomic_write_text

        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
