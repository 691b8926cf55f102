"""The markdown table of `skills eval` reports beside flat PPO's figures from a skills_vs_ppo.json
on the same worlds (seed 0's run).

    python table.py FLAT_JSON LABEL=achievements.json [LABEL=achievements.json ...]
"""
import json
import sys

flat = json.load(open(sys.argv[1]))['runs'][0]
cols = [(label, json.load(open(path))) for label, path in (a.split('=', 1) for a in sys.argv[2:])]
keep = ['collect_wood', 'place_table', 'make_wood_pickaxe', 'collect_stone', 'make_stone_pickaxe', 'collect_coal',
        'collect_iron', 'place_furnace', 'make_stone_sword', 'collect_sapling', 'place_plant', 'collect_drink',
        'eat_cow', 'wake_up', 'make_wood_sword', 'place_stone', 'defeat_zombie', 'defeat_skeleton']
header = [label for label, _ in cols] + [f"flat PPO ({flat['ppo']['env_steps']:,} env steps)"]
data = [d for _, d in cols] + [flat['ppo']]
print('| | ' + ' | '.join(header) + ' |')
print('|---|' + '---:|' * len(header))
for n in keep:
    print(f'| {n} | ' + ' | '.join(f"{d['sampled']['achievements'][n] * 100:.1f} ({d['greedy']['achievements'][n] * 100:.1f})"
                                   for d in data) + ' |')
print('| score (% of max) | ' + ' | '.join(f"{d['sampled']['score_percent_of_max']:.1f} "
                                          f"({d['greedy']['score_percent_of_max']:.1f})" for d in data) + ' |')
print('| mean return, sampled | ' + ' | '.join(f"{d['sampled']['mean_return']:.2f} ± {d['sampled']['return_std_error']:.2f}"
                                              for d in data) + ' |')
print('| episode length | ' + ' | '.join(f"{d['sampled']['mean_length']:.0f} ({d['greedy']['mean_length']:.0f})"
                                        for d in data) + ' |')
