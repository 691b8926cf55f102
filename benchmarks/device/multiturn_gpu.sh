#!/usr/bin/env bash
# benchmarks/llm_rl/multiturn.py's training runs on a GPU machine held for a few minutes only: for each seed
# in turn, the group baseline then ArCHer (so a machine taken back early still leaves pairs from the
# same warm-start), each `python -m jaxrl_hier.train --config CONFIG seed=S advantage=A`, until WALL_S
# seconds have passed (a run cut by the wall stays resumable). All runs share one persistent XLA cache,
# since their programs have the same shapes.
#
#   bash benchmarks/device/multiturn_gpu.sh OUT WALL_S CONFIG [SEED ...]
#
# EXTRA= adds overrides to every run (a tiny size to check the script on a CPU).
# OUT receives multiturn_runs.tgz (DIR/<config>/<algorithm>/seed<S> without checkpoints, each run's
# log beside it) and versions.txt. Unpack it into DIR and summarise here without training:
# `python benchmarks/llm_rl/multiturn.py --out DIR --configs CONFIG --report-only`.
set -uo pipefail
out=$1 wall=$2 config=$3
shift 3
seeds=${*:-0 1 2}
source "$(dirname "$0")/setup.sh"  # wheels, versions.txt
source "$(dirname "$0")/xla_cache.sh"  # JAX_COMPILATION_CACHE_DIR, XLA_CACHE_IN, xla_cache_out
work=${WORK:-/tmp/multiturn}
name=$(basename "$config" .yaml)
end=$((SECONDS + wall))
for s in $seeds; do
  for a in group archer; do
    left=$((end - SECONDS))
    if [ "$left" -le 30 ]; then break 2; fi
    mkdir -p "$work/$name/$a"
    start=$SECONDS
    timeout "$left" python3 -m jaxrl_hier.train --config "$config" --output-dir "$work/$name/$a/seed$s" --no-progress \
      "seed=$s" "advantage=$a" ${EXTRA:-} > "$work/$name/$a/log_seed$s.txt" 2>&1
    echo "$name $a seed $s: exit $? in $((SECONDS - start)) s"
  done
done
tar czf "$out/multiturn_runs.tgz" --exclude=checkpoints --exclude=xla_cache -C "$work" .
ls -la "$out"
