"""Actor-critic networks: output shapes and the pixel CNN."""

import jax
import jax.numpy as jnp
import pytest

from jaxrl_hier.networks import make_network


@pytest.mark.parametrize("kind, obs_shape", [("mlp", (5, 12)), ("cnn", (5, 33, 27, 3))])
def test_actor_critic_outputs(kind, obs_shape):
    net = make_network(kind, num_actions=7, hidden_size=32, num_layers=2, activation="tanh")
    obs = jax.random.uniform(jax.random.PRNGKey(0), obs_shape)
    params = net.init(jax.random.PRNGKey(1), obs)
    pi, value = net.apply(params, obs)
    assert pi.logits.shape == (5, 7) and value.shape == (5,)
    # The policy head starts near uniform (orthogonal init with scale 0.01).
    assert jnp.abs(pi.probs - 1 / 7).max() < 0.05
    # Different observations give different values: the trunk is wired to the input.
    assert jnp.unique(value).size == 5


def test_unknown_network():
    with pytest.raises(ValueError, match="unknown network 'rnn'"):
        make_network("rnn", 3, 8, 1, "tanh")
