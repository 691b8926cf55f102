#!/bin/bash
# an_run.sh S : resume the branch, then its validation eval
S=$1; RUN=/work/runs/an_s$S
cd /work/exp14
echo "start $(date)"
PYTHONPATH=/work/exp14 python -m jaxrl_hier.skills resume $RUN --no-progress && echo "trained $(date)" && /work/runs/eval14.sh $RUN $S validation
echo "done $(date)"
