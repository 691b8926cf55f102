#!/usr/bin/env bash
# A skills run (skills, chain fine-tuning, the learned manager) carried across several short holds
# of a GPU machine: each call trains for WALL_S seconds and brings the whole run directory back, so
# the next call resumes it where it stopped (`skills resume`, the same numbers as an unbroken run).
#
#   bash benchmarks/device/skills_leases_gpu.sh OUT WALL_S [key=value ...]      # the first call
#   RUN_IN=carry/run.tgz XLA_CACHE_IN=carry/xla_cache.tgz \
#     bash benchmarks/device/skills_leases_gpu.sh OUT WALL_S                    # every later call
#
# OUT receives run.tgz (the run directory, checkpoints and experts included: what RUN_IN takes
# next time), xla_cache.tgz (every compiled program: the next call on the same GPU and jax loads
# them instead of compiling), status.txt (`skills status` after this call: each call's figures),
# versions.txt, and once the run has finished, skills_vs_ppo.{json,md,png}: the final agent (the
# manager's when the config has one) against flat PPO at the run's total env steps, from the same
# fresh worlds, with PPO_EPISODES episodes per mode. CONFIG= picks the skills config (default: the
# GPU Craftax-Classic one); key=value overrides apply to the first call only (a resume takes its
# config from the run directory). Carry run.tgz and xla_cache.tgz back in an ignored folder. The
# script runs on a CPU too (tests/test_skills_leases_script.py plays two calls at a tiny size).
set -uo pipefail
out=$1 wall=$2
shift 2
config=${CONFIG:-configs/skills_craftax_classic_gpu.yaml}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# Two JAX processes share the GPU at the end (the comparison runs the skills' evaluation and flat PPO
# in one process after the skills process has exited; keep the old split for the skills process).
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.45}
source "$(dirname "$0")/setup.sh"  # wheels, versions.txt
source "$(dirname "$0")/xla_cache.sh"  # JAX_COMPILATION_CACHE_DIR, XLA_CACHE_IN, xla_cache_out
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT  # what comes back is in $out
run="$work/run"
if [ -n "${RUN_IN:-}" ]; then
  tar xzf "$RUN_IN" -C "$work" || exit 1
  python3 -m jaxrl_hier.skills resume "$run" --no-progress "max_wall_s=$wall" eval_episodes=0
else
  python3 -m jaxrl_hier.skills run --config "$config" --output-dir "$run" --no-progress "max_wall_s=$wall" \
    eval_episodes=0 greedy_eval_every=0 "$@"
fi
rc=$?
python3 -m jaxrl_hier.skills status "$run" > "$out/status.txt" 2>&1
cat "$out/status.txt"
# Finished: generation over, nothing running, and every stage after the skills done (or off, or a
# manager skipped because none of its skills completed).
if python3 - "$run" <<'EOF'
import sys
from pathlib import Path

from jaxrl_hier.config import load_config
from jaxrl_hier.skills.config import SkillsConfig
from jaxrl_hier.skills.state import load_state

run = Path(sys.argv[1])
state = load_state(run)
config = load_config(SkillsConfig, run / "config.yaml", [])
done = (state.generation in ("finished", "stopped") and not state.by_status("running", "pending")
        and (not config.chain_timesteps or state.chain.get("status") == "done")
        and (not config.manager.timesteps or state.manager.get("status") in ("done", "skipped")))
sys.exit(0 if done else 1)
EOF
then
  echo "the run has finished: the final agent against flat PPO at the same env steps"
  python3 benchmarks/skills/skills_vs_ppo.py --config "$run/config.yaml" --skills-runs "$run" --out "$work/compare" \
    --episodes "${PPO_EPISODES:-64}" --ppo-chunks 2 --no-curve
  rc=$?
  cp "$work"/compare/skills_vs_ppo.* "$out"/ 2>/dev/null
fi
tar czf "$out/run.tgz" --exclude=xla_cache -C "$work" run && echo "run out: $(du -sh "$out/run.tgz")"
xla_cache_out
echo "exit code $rc"
exit $rc
