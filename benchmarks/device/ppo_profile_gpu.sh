#!/usr/bin/env bash
# Where our PPO update's time goes on one GPU (benchmarks/ppo/ppo_vs_peer.py --profile): env stepping
# and resets, the rollout's policy forward, GAE, the epochs' gathers, forward+backward and optimiser,
# and the whole update, at the Craftax-1B settings (64 steps, 8 minibatches, 4 epochs, width 512):
# Craftax-Symbolic-v1 at 1,024, 4,096 and 16,384 envs and Craftax-Classic-Symbolic-v1 at 4,096, then
# the speed levers (bf16 matrix products, one flat optimiser vector) at 4,096 Craftax-Symbolic envs.
#
#   bash benchmarks/device/ppo_profile_gpu.sh OUT
#
# Each point is its own process: all compile at once on the host's cores and take turns on the GPU
# through one lock file (--turn-lock), so no two timed calls share it. Nothing is preallocated and
# each process is capped at the share of GPU memory its arrays need; the 16,384-env point (its
# rollout's observations alone are 35 GB) uses the device only once the others have finished
# (--gate), its programs compiled by then. On one H200 (2026-11-28) the call took 416 s: the
# Craftax-Symbolic env program and whole update compiled in about 125 s each with all five
# processes compiling, and the 16,384-env point ran out of GPU memory at its minibatch gathers
# (the rollout's observations and their minibatch copy, 35 and 32 GB, side by side).
#
# OUT receives ppo_profile.{json,md} (one column per point), ppo_levers.{json,md}, the per-point
# logs and versions.txt; the same files go to benchmarks/results/<gpu>/ppo_profile/. Packages the
# GPU machine lacks travel as wheels in .whl/ (benchmarks/device/setup.sh).
# Variables: JOB_TIMEOUT_S (each process's limit, default 450), TINY=1 (CartPole at 8, 12, 16 and
# 32 envs, width 8: a CPU-sized smoke run of the same plumbing, about 3.5 minutes on a 2-core AMD
# EPYC), GPU_NAME, RESULTS.
set -uo pipefail
out=${1:?usage: ppo_profile_gpu.sh OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/gpu_name.sh"  # $gpu
results=${RESULTS:-benchmarks/results/$gpu/ppo_profile}
source "$(dirname "$0")/setup.sh"  # wheels, versions.txt
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
lock="$out/turn.lock"
limit=${JOB_TIMEOUT_S:-450}
if [ -n "${TINY:-}" ]; then
  sym=CartPole-v1 classic=CartPole-v1 small=8 mid=16 large=32 cmid=12
  settings=(--num-steps 8 --minibatches 2 --epochs 1 --width 8 --updates 2 --profile-warmup 16)
else
  sym=Craftax-Symbolic-v1 classic=Craftax-Classic-Symbolic-v1 small=1024 mid=4096 large=16384 cmid=4096
  settings=(--num-steps 64 --minibatches 8 --epochs 4 --width 512 --updates 2 --lr 2e-4)
fi
# one point: ENV N MEMORY_FRACTION MODE(profile|levers) [ARGS...]; the smaller points hold the gate
# shared while they run, the largest waits for it (--gate) once its programs are compiled
gate="$out/gate.lock"
point() {
  local env=$1 n=$2 fraction=$3 mode=$4 tag="$4_$1_$2"
  shift 4
  XLA_PYTHON_CLIENT_MEM_FRACTION=$fraction timeout "$limit" python3 benchmarks/ppo/ppo_vs_peer.py "--$mode" \
    --envs "$env" --num-envs "$n" "${settings[@]}" --turn-lock "$lock" --out "$out/$tag" "$@" > "$out/$tag.log" 2>&1
  echo "$tag exit code $?"
}
shared() { flock -s "$gate" bash -c "$(declare -f point); $(declare -p settings lock out limit); point $*"; }
shared "$sym" "$mid" 0.3 profile &
shared "$sym" "$small" 0.1 profile &
shared "$classic" "$cmid" 0.1 profile &
shared "$sym" "$mid" 0.25 levers &
sleep 5  # the shared holds are taken before the largest point asks for the gate
point "$sym" "$large" 0.9 profile --gate "$gate" &
wait
merge=()
for n in "$small" "$mid" "$large"; do
  f="$out/profile_${sym}_$n/ppo_profile.json"
  [ -f "$f" ] && merge+=("$f")
done
f="$out/profile_${classic}_$cmid/ppo_profile.json"
[ -f "$f" ] && merge+=("$f")
rc=1
if [ ${#merge[@]} -gt 0 ]; then
  python3 benchmarks/ppo/ppo_vs_peer.py --merge-profiles "${merge[@]}" --out "$out" && rc=0
fi
cp "$out/levers_${sym}_$mid"/ppo_levers.* "$out"/ 2>/dev/null
mkdir -p "$results" && cp "$out"/ppo_profile.* "$out"/ppo_levers.* "$out"/*.log "$out"/versions.txt "$results"/ 2>/dev/null
cat "$out"/ppo_profile.md "$out"/ppo_levers.md 2>/dev/null
echo "ppo_profile exit code $rc; results in $out and $results"
exit $rc
