# Sourced by the device scripts beside it that carry compiled programs between GPU machines, with
# $out set (the folder that comes back).
# One persistent compilation cache for every JAX process of the script. XLA_CACHE_IN: an xla_cache.tgz
# an earlier run brought back (the same GPU kind and jax), whose programs load instead of compiling;
# `xla_cache_out` packs the cache into $out for the next run to carry back in. XLA_CACHE_DIR: where
# the cache lives on the machine that runs the script (default /tmp/xla_cache; a test of the scripts
# on a CPU gives each call its own empty one).
export JAX_COMPILATION_CACHE_DIR=${XLA_CACHE_DIR:-/tmp/xla_cache}
mkdir -p "$JAX_COMPILATION_CACHE_DIR"
if [ -n "${XLA_CACHE_IN:-}" ] && [ -f "$XLA_CACHE_IN" ]; then
  tar xzf "$XLA_CACHE_IN" -C "$JAX_COMPILATION_CACHE_DIR" && echo "xla cache in: $(ls "$JAX_COMPILATION_CACHE_DIR" | wc -l) entries"
fi
xla_cache_out() {
  tar czf "$out/xla_cache.tgz" -C "$JAX_COMPILATION_CACHE_DIR" . && echo "xla cache out: $(du -sh "$out/xla_cache.tgz")"
}
