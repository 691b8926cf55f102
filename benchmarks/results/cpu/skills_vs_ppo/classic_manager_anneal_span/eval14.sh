#!/bin/bash
# eval.sh RUN S KIND : KIND validation (64 worlds, key 1000+S) or test (128 worlds, key 2000+S)
cd /work/exp14
RUN=$1; S=$2; KIND=$3
if [ "$KIND" = validation ]; then SEED=$((1000+S)); EP=64; else SEED=$((2000+S)); EP=128; fi
PYTHONPATH=/work/exp14 python -m jaxrl_hier.skills eval $RUN --seed $SEED --episodes $EP && mv $RUN/eval $RUN/$KIND
