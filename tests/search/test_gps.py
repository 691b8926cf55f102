"""The GPS graph-transformer policy: invariant to the order of node slots, masks respected, and
selectable by the PPO config (`network: gps`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.algorithms.ppo import PPOConfig
from jaxrl_hier.config import ConfigError
from jaxrl_hier.networks import MASKED_LOGIT, GPSActorCritic, make_network

N, H, A = 7, 8, 6


def random_tree(key, num_nodes=5):
    """A random tree in slots 0..num_nodes-1 (root 0), the rest of the N slots empty."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    parent = np.full(N, -1, np.int32)
    rng = np.random.default_rng(0)
    for i in range(1, num_nodes):
        parent[i] = rng.integers(0, i)
    valid = np.arange(N) < num_nodes
    nodes = np.asarray(jax.random.normal(k2, (N, 5))) * valid[:, None]
    nodes[:, 2] = 0.0
    nodes[3, 2] = 1.0  # node 3 is current
    graph = {"hidden": np.asarray(jax.random.normal(k1, (N, H))) * valid[:, None], "nodes": nodes,
             "edges": np.asarray(jax.random.normal(k3, (N, 2))) * valid[:, None], "parent": parent, "valid": valid,
             "globals": np.asarray(jax.random.uniform(k4, (2,)))}
    return {"obs": graph, "action_mask": np.array([True, True, False, True, False, True])}


def permute(obs, perm):
    """Move slot i to slot perm[i] (and renumber parents)."""
    g = obs["obs"]
    inv = np.argsort(perm)
    out = {k: (v[inv] if k not in ("globals",) else v) for k, v in g.items()}
    out["parent"] = np.where(out["parent"] >= 0, perm[np.maximum(out["parent"], 0)], -1).astype(np.int32)
    return {"obs": out, "action_mask": obs["action_mask"]}


@pytest.fixture(scope="module")
def net():
    model = GPSActorCritic(A, hidden_size=16, num_layers=2)
    obs = random_tree(jax.random.key(0))
    params = model.init(jax.random.key(1), jax.tree.map(jnp.asarray, obs))
    return model, params, jax.jit(model.apply)


def test_invariant_to_node_order(net):
    model, params, apply = net
    obs = random_tree(jax.random.key(2))
    perm = np.array([3, 0, 6, 1, 5, 2, 4])
    pi, v = apply(params, obs)
    pi2, v2 = apply(params, permute(obs, perm))
    np.testing.assert_allclose(pi.logits, pi2.logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(v, v2, rtol=1e-4, atol=1e-5)
    # ... but not blind to the tree: rewiring one edge changes the outputs
    rewired = jax.tree.map(np.copy, obs)
    rewired["obs"]["parent"][4] = 3 if obs["obs"]["parent"][4] != 3 else 0
    _, v3 = apply(params, rewired)
    assert abs(float(v3) - float(v)) > 1e-6


def test_masked_actions_and_batches(net):
    model, params, apply = net
    obs = [random_tree(jax.random.key(i)) for i in range(3)]
    batch = jax.tree.map(lambda *x: np.stack(x), *obs)
    batch = jax.tree.map(lambda x: np.stack([x, x]), batch)  # [2, 3, ...] leading dims
    pi, v = apply(params, batch)
    assert v.shape == (2, 3) and pi.logits.shape == (2, 3, A)
    masked = ~batch["action_mask"]
    assert np.all(np.asarray(pi.logits)[masked] == MASKED_LOGIT)
    assert np.all(np.isfinite(np.asarray(pi.entropy())))
    assert not np.any(np.asarray(pi.sample(seed=jax.random.key(0)))[..., None] == np.flatnonzero(masked[0, 0]))
    pi1, v1 = apply(params, obs[1])
    np.testing.assert_allclose(v[1, 1], v1, rtol=1e-4, atol=1e-5)


def test_ppo_config_selects_gps():
    assert isinstance(make_network("gps", A, 32, 2, "relu"), GPSActorCritic)
    PPOConfig(network="gps", num_envs=4, num_steps=4, num_minibatches=2, total_timesteps=64).validate()
    with pytest.raises(ConfigError, match="gps"):
        PPOConfig(network="graph").validate()


def test_prior_starts_near_chain_of_thought():
    obs = jax.tree.map(jnp.asarray, random_tree(jax.random.key(3)))
    model = GPSActorCritic(A, hidden_size=16, num_layers=1, prior=2.0)
    params = model.init(jax.random.key(0), obs)
    probs = np.asarray(jax.nn.softmax(model.apply(params, obs)[0].logits))
    assert probs[0] > 0.4 and probs[0] > 5 * probs[1] and probs[0] > 5 * probs[3]  # Expand over Branch, Backtrack
    assert probs[2] < 1e-6 and probs[4] < 1e-6
