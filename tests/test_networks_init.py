"""networks.init.orthogonal: jax's orthogonal initializer, bit for bit, without batched LAPACK
calls under vmap (a batched QR can deadlock XLA:CPU in jaxlib 0.10.2; see the module)."""

import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.networks import make_network
from jaxrl_hier.networks.init import orthogonal

ROOT = Path(__file__).resolve().parent.parent


def _lapack_batch_dims(init) -> list[int]:
    """num_batch_dims of every LAPACK call in the vmapped, jitted init's lowering."""
    lowered = jax.jit(jax.vmap(lambda k: init(k, (6, 4), jnp.float32))).lower(jax.random.split(jax.random.key(0), 3))
    return [int(n) for n in re.findall(r'custom_call @lapack_\w+\(.*num_batch_dims = "(\d+)"', lowered.as_text())]


def test_vmapped_init_makes_only_unbatched_lapack_calls():
    assert _lapack_batch_dims(jax.nn.initializers.orthogonal(1.0)) == [1, 1]  # what the check detects
    assert _lapack_batch_dims(orthogonal(1.0)) == [0, 0]  # geqrf and orgqr, one matrix each


@pytest.mark.parametrize("shape, scale", [((7, 5), np.sqrt(2)), ((5, 7), 0.01), ((3, 3, 4, 6), 1.0)])
def test_same_parameters_as_jax_initializer_alone_and_vmapped(shape, scale):
    ours, theirs = orthogonal(scale), jax.nn.initializers.orthogonal(scale)
    key = jax.random.key(3)
    assert np.array_equal(ours(key, shape), theirs(key, shape))
    keys = jax.random.split(key, 4)
    batched = jax.jit(jax.vmap(lambda k: ours(k, shape)))(keys)
    assert batched.shape == (4, *shape)
    assert np.array_equal(batched, jax.jit(jax.vmap(lambda k: theirs(k, shape)))(keys))
    # orthogonal columns (rows when there are more columns), scaled
    m = np.asarray(batched[0]).reshape(-1, shape[-1])
    gram = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
    np.testing.assert_allclose(gram, scale**2 * np.eye(len(gram)), atol=1e-5)


def test_networks_and_experts_use_it():
    # MLP and GRU actor-critics: vmapped init (as over seeds) lowers to unbatched LAPACK calls only
    for kind in ("mlp", "gru"):
        net = make_network(kind, num_actions=3, hidden_size=8, num_layers=2, activation="tanh")
        obs = jnp.zeros((2, 5)) if kind == "mlp" else jnp.zeros((1, 2, 5))  # GRU: [time, envs, features]
        args = (net.initialize_carry((2,)), obs, jnp.zeros((1, 2), bool)) if kind == "gru" else (obs,)
        text = jax.jit(jax.vmap(lambda k: net.init(k, *args))).lower(jax.random.split(jax.random.key(0), 3)).as_text()
        dims = re.findall(r'custom_call @lapack_\w+\(.*num_batch_dims = "(\d+)"', text)
        assert dims and set(dims) == {"0"}, (kind, dims)


def test_many_concurrent_vmapped_inits_finish():
    # Four layers vmapped over three slots, 200 calls, in a child with a timeout: the pattern with
    # which jax's initializer deadlocked a loaded 2-core CPU (benchmarks/ppo/start_loop.py --entry
    # qr_vmap_jax repeats it). The lowering test above is the deterministic guard; this one runs it.
    code = ("import jax, jax.numpy as jnp, jaxrl_hier\n"
            "from jaxrl_hier.networks.init import orthogonal\n"
            "one = lambda k: [orthogonal()(x, (64, 64)) for x in jax.random.split(k, 4)]\n"
            "f = jax.jit(lambda k: jax.vmap(one)(jax.random.split(k, 3)))\n"
            "for i in range(200):\n    jax.block_until_ready(f(jax.random.key(i)))\nprint('done')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-2000:]
