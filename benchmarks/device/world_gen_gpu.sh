#!/usr/bin/env bash
# Are fresh Craftax worlds generated in one batch right on the GPU it runs on, and what does each cost?
# (benchmarks/ppo/world_gen.py.) On XLA:CPU with jax 0.10.2 a vmapped batch of more than 8
# Craftax-Classic resets gave world i + 8 the terrain noise of world i, so jaxrl_hier.envs.reset_many
# generates worlds 8 at a time there and the whole batch at once elsewhere; this script checks that
# choice on a GPU: Craftax-Classic (1,024 worlds) and Craftax (256), blocks of 8 up to all at once.
# A minute or two of device time, most of it the reference worlds, one compiled call per key.
#
#   bash benchmarks/device/world_gen_gpu.sh OUT
#
# OUT receives classic/ and craftax/ (world_gen.{json,md,png}) and versions.txt; the same go to
# benchmarks/results/<gpu>/world_gen/ in the tree it runs in. The script exits 1 when reset_many
# gives any world other than its key's own (--check).
# Variables: PYTHON (python3), GPU_NAME (from nvidia-smi), RESULTS (benchmarks/results/<gpu>/world_gen),
# TINY=1 (Craftax-Classic only, 16 worlds, blocks 8 and 16: a CPU-sized smoke run), DRY_RUN=1 (print
# the commands, run nothing).
set -uo pipefail
out=${1:?usage: world_gen_gpu.sh OUT}
source "$(dirname "$0")/gpu_name.sh"  # $gpu
results=${RESULTS:-benchmarks/results/$gpu/world_gen}
py=${PYTHON:-python3}
if [ -n "${TINY:-}" ]; then
  runs=("classic --worlds 16 --blocks 8 16 --repeats 1")
else
  runs=("classic --worlds 1024 --blocks 8 64 256 1024" "craftax --env Craftax-Symbolic-v1 --worlds 256 --blocks 8 64 256")
fi
status=0
for run in "${runs[@]}"; do
  name=${run%% *}
  cmd="$py benchmarks/ppo/world_gen.py --out $out/$name --check ${run#* }"
  if [ -n "${DRY_RUN:-}" ]; then echo "$cmd"; continue; fi
  $cmd || status=1
done
if [ -n "${DRY_RUN:-}" ]; then echo "results: $results"; exit 0; fi
"$py" -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())" > "$out/versions.txt" 2>&1
mkdir -p "$results" && cp -r "$out"/. "$results"/
exit $status
