#!/usr/bin/env bash
# Compile time against run time of the skills program on a GPU, under three XLA settings, one
# process each (`benchmarks/skills/skills_compile.py`): XLA's defaults; LLVM module compilation split over
# the host's cores; no autotuning. Sized for a GPU machine held for a few minutes only (each process
# under its own time limit, every shape's figures written as soon as measured).
#
#   bash benchmarks/device/skills_compile_gpu.sh OUT
#
# OUT receives skills_compile_{default,llvm_parallel,autotune0}.json, skills_compile.{md,png},
# log.txt and versions.txt. CONFIG= picks another skills config, EXTRA= adds key=value overrides
# (a CPU check of this script: CONFIG=configs/skills_techtree.yaml EXTRA="ppo.num_envs=4 ...").
# Packages the GPU machine lacks travel as wheels in .whl/ (the device tool's README).
set -uo pipefail
out=$1
config=${CONFIG:-configs/skills_craftax_classic_gpu.yaml}
mkdir -p "$out"
source "$(dirname "$0")/setup.sh"  # wheels, versions.txt
rc=0
measure() {  # LABEL TIME_LIMIT_S XLA_FLAGS SHAPE...
  local label=$1 limit=$2 flags=$3
  shift 3
  # shellcheck disable=SC2086  # EXTRA is a list of overrides
  XLA_FLAGS="$flags" timeout "$limit" python3 benchmarks/skills/skills_compile.py ${EXTRA:-} --config "$config" \
    --out "$out" --label "$label" --repeats 1 --shapes "$@" 2>&1 | grep -v "cuda_timer.cc" | tee -a "$out/log.txt"
  local status=${PIPESTATUS[0]}
  echo "$label exit code $status" | tee -a "$out/log.txt"
  [ "$status" -eq 0 ] || rc=1
}
measure default 250 "" 1x0 1x2 1x12
measure llvm_parallel 170 "--xla_gpu_enable_llvm_module_compilation_parallelism=true" 1x0 1x2
measure autotune0 120 "--xla_gpu_autotune_level=0" 1x2
exit $rc
