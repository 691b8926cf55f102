"""Flat PPO's figures over its seeds from several skills_vs_ppo.json files (each run's `ppo` record):
per achievement and score, each seed's sampled (greedy) figure, then the mean ± standard error.

    python seeds.py JSON [JSON ...]
"""
import json
import statistics
import sys

KEEP = ['make_stone_pickaxe', 'collect_coal', 'collect_iron', 'place_furnace', 'make_stone_sword', 'eat_cow',
        'collect_drink', 'wake_up', 'defeat_zombie']
runs = [(run['seed'], run['ppo']) for path in sys.argv[1:] for run in json.load(open(path))['runs']]


def cell(values):
    mean = statistics.mean(values)
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return f"{mean:.1f} ± {se:.1f}"


def row(name, get, has=lambda p: True):
    """`has(p)`: the record holds this row (seed 0's run was not played from validation worlds)."""
    per = [f"{get(p, 'sampled'):.1f} ({get(p, 'greedy'):.1f})" if has(p) else "not played" for _, p in runs]
    both = [cell([get(p, m) for _, p in runs if has(p)]) for m in ('sampled', 'greedy')]
    print(f"| {name} | " + " | ".join(per) + f" | **{both[0]}** ({both[1]}) |")


print("| % of episodes, sampled (greedy) | " + " | ".join(f"seed {s}" for s, _ in runs) + " | mean ± s.e. |")
print("|---|" + "---:|" * (len(runs) + 1))
for n in KEEP:
    row(n, lambda p, m, n=n: 100 * p[m]['achievements'][n])
row("score, test worlds (% of max)", lambda p, m: p[m]['score_percent_of_max'])
row("score, validation worlds", lambda p, m: p['validation'][m]['score_percent_of_max'], lambda p: 'validation' in p)
print("| env steps | " + " | ".join(f"{p['env_steps']:,}" for _, p in runs) + " | |")
