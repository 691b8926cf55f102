#!/usr/bin/env bash
# Our PPO against Craftax_Baselines' ppo.py on one GPU, in the same process at equal work
# (benchmarks/ppo/ppo_vs_peer.py): Craftax-Symbolic-v1 and Craftax-Classic-Symbolic-v1 at 1,024, 4,096
# and 16,384 envs, the Craftax-1B settings (64 steps, 8 minibatches, 4 epochs, width 512), 20
# updates per timed call after a warm-up call, compile times apart. Every point's programs compile
# at once on the host's spare cores (COMPILE_WORKERS). Measured on an H200 (2026-11-28): 13 programs
# compiled in 311 s with 13 threads (116 s for one alone); Craftax-Symbolic at 4,096 envs took about
# 80 s to run (both systems and env-only, warm-up calls included), at 16,384 envs ours and env-only
# about 150 s. The whole sweep does not fit in a machine held for 15 minutes: pick POINTS (below).
#
#   bash benchmarks/device/ppo_peer_gpu.sh OUT                      # both envs (over 10 minutes: split it)
#   ENVS=Craftax-Symbolic-v1 bash benchmarks/device/ppo_peer_gpu.sh OUT
#   ENVS=Craftax-Classic-Symbolic-v1 bash benchmarks/device/ppo_peer_gpu.sh OUT   # adds to the first's JSON
#
# OUT receives ppo_vs_peer.{json,md,png}, versions.txt and with XLA_CACHE_OUT=1 xla_cache.tgz; the same files go to
# benchmarks/results/<gpu>/ppo_peer/ in the tree it runs in (gpu: h100, h200, ... from nvidia-smi).
# A call appends to the ppo_vs_peer.json already in that folder (copy the first call's files
# there before the second call: the working tree travels).
#
# What the GPU machine lacks travels with the tree, in ignored folders named in the call's carry:
# - PEER_DIR (default .peer/Craftax_Baselines): a checkout of github.com/MichaelTMatthews/Craftax_Baselines
#   (`echo /.peer/ >> .git/info/exclude`, then clone or `git archive` it there; never committed).
# - .whl/: wheels of craftax==1.6.1 (and pygame, its import), distrax, tfp-nightly and whatever else
#   `python3 -c "import craftax, distrax"` misses there; benchmarks/device/setup.sh installs them.
# - XLA_CACHE_IN: an xla_cache.tgz an earlier run brought back (same GPU kind and jax): programs load
#   instead of compiling.
# For a machine held 15 minutes instead (the most wanted points first, our env stepping alone beside
# each, no new point after DEADLINE_S seconds):
#
#   POINTS="Craftax-Symbolic-v1:4096 Craftax-Classic-Symbolic-v1:4096 Craftax-Symbolic-v1:16384" \
#     ENV_ONLY=1 DEADLINE_S=400 bash benchmarks/device/ppo_peer_gpu.sh OUT
#
# Variables: ENVS, NUM_ENVS ("1024 4096 16384"), POINTS ("ENV:N ...", overrides ENVS x NUM_ENVS),
# ENV_ONLY=1 (env stepping alone beside each point), DEADLINE_S, PEER_COMMIT (where PEER_DIR is no
# git checkout), XLA_CACHE_OUT=1 (pack the compiled programs into OUT), NUM_STEPS (64), UPDATES (20), WIDTH (512),
# COMPILE_WORKERS (12), REPEATS (1), GPU_NAME (from nvidia-smi), RESULTS (benchmarks/results/<gpu>/ppo_peer),
# PYTHON (python3), CHECK=1 (exit 1 when ours is slower), MATMUL_DTYPE (bfloat16: our MLP's products in bf16,
# float32 parameters; its results default to benchmarks/results/<gpu>/ppo_peer_bfloat16),
# TINY=1 (16 envs x 16 steps, 2 updates, width 64: a CPU-sized smoke run), DRY_RUN=1 (print the
# commands, run nothing).
set -uo pipefail
out=${1:?usage: ppo_peer_gpu.sh OUT}
envs=${ENVS:-Craftax-Symbolic-v1 Craftax-Classic-Symbolic-v1}
peer=${PEER_DIR:-.peer/Craftax_Baselines}
if [ -n "${TINY:-}" ]; then
  sizes=${NUM_ENVS:-16} steps=${NUM_STEPS:-16} updates=${UPDATES:-2} width=${WIDTH:-64}
else
  sizes=${NUM_ENVS:-1024 4096 16384} steps=${NUM_STEPS:-64} updates=${UPDATES:-20} width=${WIDTH:-512}
fi
source "$(dirname "$0")/gpu_name.sh"  # $gpu
results=${RESULTS:-benchmarks/results/$gpu/ppo_peer${MATMUL_DTYPE:+_$MATMUL_DTYPE}}
if [ -n "${POINTS:-}" ]; then where=(--points $POINTS); else where=(--envs $envs --num-envs $sizes); fi
cmd=("${PYTHON:-python3}" benchmarks/ppo/ppo_vs_peer.py --peer-dir "$peer" --out "$out" "${where[@]}"
     --num-steps "$steps" --updates "$updates" --width "$width" --repeats "${REPEATS:-1}"
     --compile-workers "${COMPILE_WORKERS:-12}" --append ${CHECK:+--check} ${ENV_ONLY:+--env-only}
     ${DEADLINE_S:+--deadline-s "$DEADLINE_S"} ${PEER_COMMIT:+--peer-commit "$PEER_COMMIT"}
     ${MATMUL_DTYPE:+--matmul-dtype "$MATMUL_DTYPE"})
if [ -n "${DRY_RUN:-}" ]; then
  echo "results: $results"
  echo "${cmd[*]}"
  exit 0
fi
mkdir -p "$out" "$results"
[ -f "$peer/ppo.py" ] || { echo "no Craftax_Baselines checkout at $peer (PEER_DIR)"; exit 2; }
source "$(dirname "$0")/setup.sh"  # wheels, versions.txt
source "$(dirname "$0")/xla_cache.sh"  # JAX_COMPILATION_CACHE_DIR, XLA_CACHE_IN, xla_cache_out
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD  # jaxrl_hier from this tree
[ -f "$results/ppo_vs_peer.json" ] && cp "$results/ppo_vs_peer.json" "$out/"
"${cmd[@]}"
rc=$?
cp "$out"/ppo_vs_peer.* "$results"/ 2>/dev/null
[ -n "${XLA_CACHE_OUT:-}" ] && xla_cache_out
echo "ppo_vs_peer exit code $rc; results in $out and $results"
exit $rc
