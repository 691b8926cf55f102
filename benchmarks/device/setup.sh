# Sourced by the device scripts beside it, with $out set (the folder that comes back): installs the
# packages the GPU machine lacks from the wheels in .whl/ (the device tool's README), and writes
# $out/versions.txt (the GPU and its driver, JAX and its devices, the host's cores).
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  python3 -c "import jax, flax, optax, craftax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
  nproc; } | tee "$out/versions.txt"
