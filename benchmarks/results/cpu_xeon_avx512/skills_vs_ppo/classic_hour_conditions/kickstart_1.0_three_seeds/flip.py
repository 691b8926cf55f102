"""flip.py RUN SKILL: in a copy of a run, mark a failed skill completed on its last attempt's expert
(the scheduler keeps it on disk), writing the spec.json its completion would have written."""
import json
import sys
from pathlib import Path

import yaml

from jaxrl_hier.skills.library import builtin_library

run, name = Path(sys.argv[1]), sys.argv[2]
state = json.load(open(run / 'scheduler_state.json'))
config = yaml.safe_load(open(run / 'config.yaml'))
ids = {r['name']: r['id'] for r in state['skills']}
r = next(r for r in state['skills'] if r['name'] == name)
assert r['status'] == 'failed' and (run / 'skills' / f"{r['id']:03d}_{name}" / 'expert').is_dir()
plan = builtin_library(config['library']).closure(name)
index = [{'skill': d, 'id': ids[d], 'local': j} for j, d in enumerate(plan)]
index.append({'skill': name, 'id': r['id'], 'local': config['max_experts']})
json.dump({'skill': r['spec'], 'plan': list(plan), 'expert_index': index, 'success_rate': r['success_rate'],
           'steps': r['steps'], 'attempts': r['attempts']},
          open(run / 'skills' / f"{r['id']:03d}_{name}" / 'spec.json', 'w'), indent=2)
r['status'], r['reason'] = 'completed', r['reason'] + ' (marked completed on this expert for a study)'
json.dump(state, open(run / 'scheduler_state.json', 'w'), indent=1)
print(name, plan, r['success_rate'])
