# Sourced by the device scripts beside it: $gpu, the short lower-case name of the machine's first GPU
# (h100, h200, ... from nvidia-smi; GPU_NAME overrides it; cpu where there is none), which names the
# folder benchmarks/results/<gpu>/ their results go to.
gpu=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
  | sed -E 's/^NVIDIA //; s/ .*//' | tr 'A-Z' 'a-z')}
gpu=${gpu:-cpu}
