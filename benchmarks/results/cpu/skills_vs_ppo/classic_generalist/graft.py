"""A copy of a finished run of the earlier Classic config (`run_classic_seed0/` in ../classic_manager)
that keeps the first five skills it trained (the chain to the stone pickaxe, exactly what the
current config trains first), drops its other skills, its chain fine-tuning and its manager, and
sets the current config's target, chain and manager settings, with SEED for the generalist and
manager stages. `skills resume OUT` then runs those two stages.

    python graft.py SRC OUT SEED
"""
import json
import shutil
import sys
from pathlib import Path

import yaml

src, out, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
keep = ['collect_wood', 'place_table', 'make_wood_pickaxe', 'collect_stone', 'make_stone_pickaxe']
out.mkdir()
shutil.copytree(src / 'xla_cache', out / 'xla_cache')
s = json.load(open(src / 'scheduler_state.json'))
s['skills'] = [r for r in s['skills'] if r['name'] in keep]
for r in s['skills']:
    name = f"{r['id']:03d}_{r['name']}"
    shutil.copytree(src / 'skills' / name, out / 'skills' / name)
s.update(chain={}, manager={}, target='make_stone_pickaxe', checkpoint_round=None,
         generation_reason='nothing left to train')
json.dump(s, open(out / 'scheduler_state.json', 'w'), indent=1)
c = yaml.safe_load(open(src / 'config.yaml'))
c.update(target='make_stone_pickaxe', chain_timesteps=0, skill_budgets={}, eval_episodes=0, seed=seed)
c['manager'].update(skills=keep, primitives=True, generalist_timesteps=120 * 40960, timesteps=44 * 40960,
                    option_steps=16)
yaml.safe_dump(c, open(out / 'config.yaml', 'w'), sort_keys=False)
