#!/usr/bin/env bash
# Bottom-up skills against flat PPO on Craftax-Classic on a GPU, sized for a machine held for a few
# minutes only:
# `benchmarks/skills/skills_vs_ppo.py` with the GPU config (1024 envs per skill), the skills run stopped
# after WALL_S seconds (its config's max_wall_s, compilation included), flat PPO at the same env
# steps, both agents judged from the same fresh worlds; only the final agents are evaluated.
#
#   bash benchmarks/device/skills_vs_ppo_gpu.sh OUT WALL_S [key=value ...]
#
# OUT receives skills_vs_ppo.{json,md,png}, skills_run.tgz (the run directory without its
# checkpoints and experts), xla_cache.tgz (every program the run compiled: JAX's persistent
# cache, runs.compile_cache) and versions.txt. Packages the GPU machine lacks travel as wheels in
# .whl/ (the device tool's README); CONFIG= picks another skills config. XLA_CACHE_IN= names an
# xla_cache.tgz an earlier run of this script brought back (carried in an ignored folder): on the same kind of
# GPU and the same jax, the skills run, flat PPO and the evaluations load their programs instead of
# compiling them (about a minute each on an H200).
set -uo pipefail
out=$1 wall=$2
shift 2
config=${CONFIG:-configs/skills_craftax_classic_gpu.yaml}
mkdir -p "$out"
# Two JAX processes share the GPU (the skills run is a subprocess): each takes under half of it.
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.45
source "$(dirname "$0")/setup.sh"  # wheels, versions.txt
source "$(dirname "$0")/xla_cache.sh"  # JAX_COMPILATION_CACHE_DIR, XLA_CACHE_IN, xla_cache_out
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT  # what comes back is in $out
# POST_S: the time left after the skills run for flat PPO and the evaluations (H200: about 4 minutes)
timeout $((wall + ${POST_S:-330})) python3 benchmarks/skills/skills_vs_ppo.py --config "$config" --out "$work" --episodes 64 \
  --ppo-chunks 2 --no-curve --include-running "max_wall_s=$wall" greedy_eval_every=0 "$@"
rc=$?
cp "$work"/skills_vs_ppo.* "$out"/ 2>/dev/null
tar czf "$out/skills_run.tgz" --exclude=checkpoints --exclude=expert --exclude=xla_cache -C "$work" skills_seed0
xla_cache_out
echo "skills_vs_ppo exit code $rc"
exit $rc
