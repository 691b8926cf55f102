"""graft.py SKILLS_RUN OUT CONFIG [key=value ...]: a copy of a skills-only run (manager stages at 0)
with CONFIG's manager section (and the run's own seed) written into its config.yaml and the generalist
and manager records cleared, so that `skills resume OUT` trains both stages over its skills.
`target=NAME` sets the run's target (the kickstart teacher's) too."""
import json, shutil, sys
from pathlib import Path
import yaml

src, out, cfg = Path(sys.argv[1]), Path(sys.argv[2]), yaml.safe_load(open(sys.argv[3]))
shutil.copytree(src, out, ignore=shutil.ignore_patterns('manager', 'generalist', 'eval', 'scheduler.lock*', '*.prev.json'))
config = yaml.safe_load(open(out / 'config.yaml'))
config['manager'] = dict(cfg['manager'])
state = json.load(open(out / 'scheduler_state.json'))
for item in sys.argv[4:]:
    key, value = item.split('=', 1)
    if key == 'target':
        config['target'] = state['target'] = value
    else:
        config['manager'][key] = yaml.safe_load(value)
state['manager'], state['generalist'] = {}, {}
json.dump(state, open(out / 'scheduler_state.json', 'w'), indent=1)
yaml.safe_dump(config, open(out / 'config.yaml', 'w'), sort_keys=False)
