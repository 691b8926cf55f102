"""A copy of a finished generalist-and-manager run (`../run_seed*/` were made by `../graft.py`) that
keeps its skills and drops its manager stage (with `--generalist`, its generalist stage too), with
the given `manager` settings written into the copy's `config.yaml`. `skills resume OUT` then trains
the dropped stages again; with the generalist kept, the manager starts from the same parameters.

    python rerun_manager.py [--generalist] SRC OUT [key=value ...]
    python rerun_manager.py SRC OUT anneal_lr=true
"""
import json
import shutil
import sys
from pathlib import Path

import yaml

args = [a for a in sys.argv[1:] if a != '--generalist']
drop_generalist = len(args) < len(sys.argv) - 1
src, out = Path(args[0]), Path(args[1])
dropped = ['manager', 'eval', 'scheduler.lock*', '*.prev.json'] + (['generalist'] if drop_generalist else [])
shutil.copytree(src, out, ignore=shutil.ignore_patterns(*dropped))
state = json.load(open(out / 'scheduler_state.json'))
state['manager'] = {'status': 'running', 'skills': state['manager']['skills'], 'steps': 0, 'chunk': 0}
if drop_generalist:
    state['generalist'] = {}
json.dump(state, open(out / 'scheduler_state.json', 'w'), indent=1)
config = yaml.safe_load(open(out / 'config.yaml'))
for item in args[2:]:
    key, value = item.split('=', 1)
    config['manager'][key] = yaml.safe_load(value)
yaml.safe_dump(config, open(out / 'config.yaml', 'w'), sort_keys=False)
