"""A recurrent (GRU) actor-critic, in the structure of PureJaxRL's ``ppo_rnn.py``.

    hidden = net.initialize_carry((num_envs,))
    hidden, pi, value = net.apply(variables, hidden, obs, reset)   # obs [T, B, ...], reset bool[T, B]

The GRU is scanned over the leading time axis (``nn.scan`` over a ``GRUCell``); where
``reset[t]`` is True the hidden state is zeroed *before* step t reads ``obs[t]`` (a new episode
starts at t). The trainer re-runs the same scan over a whole stored trajectory, from the hidden
state it had at the start of the rollout, so training sees exactly the states acting saw.

Layout (as the Craftax PPO-RNN baseline): ``num_layers`` dense layers embed the observation, the
GRU follows, then separate actor and critic heads of one hidden layer each.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.networks.actor_critic import ACTIVATIONS, MLPTrunk, _dense, policy, split_obs
from jaxrl_hier.networks.init import orthogonal


class ScannedGRU(nn.Module):
    """A GRUCell scanned over time, with the hidden state zeroed where an episode starts."""

    features: int

    @functools.partial(nn.scan, variable_broadcast="params", in_axes=0, out_axes=0, split_rngs={"params": False})
    @nn.compact
    def __call__(self, hidden: jax.Array, x: tuple[jax.Array, jax.Array]):
        inputs, reset = x
        hidden = jnp.where(reset[..., None], jnp.zeros_like(hidden), hidden)
        # flax's own recurrent init, made safe under vmap (networks.init: a batched QR can deadlock XLA:CPU)
        hidden, out = nn.GRUCell(self.features, recurrent_kernel_init=orthogonal())(hidden, inputs)
        return hidden, out


class ActorCriticGRU(nn.Module):
    """Observation embedding -> GRU -> separate actor and critic heads."""

    num_actions: int
    hidden_size: int = 512
    num_layers: int = 1
    activation: str = "tanh"
    rnn_hidden_size: int = 512

    is_recurrent = True  # the trainer carries a hidden state per env and keeps whole sequences

    def initialize_carry(self, batch_shape: tuple[int, ...]) -> jax.Array:
        """The hidden state of a fresh episode (zeros, as the reset inside the scan)."""
        return jnp.zeros((*batch_shape, self.rnn_hidden_size), jnp.float32)

    @nn.compact
    def __call__(self, hidden: jax.Array, obs: Any, reset: jax.Array):
        x, mask = split_obs(obs)
        x = MLPTrunk(self.hidden_size, self.num_layers, self.activation)(x)
        hidden, y = ScannedGRU(self.rnn_hidden_size)(hidden, (x, reset))
        act = ACTIVATIONS[self.activation]
        logits = _dense(self.num_actions, 0.01)(act(_dense(self.hidden_size, np.sqrt(2))(y)))
        value = _dense(1, 1.0)(act(_dense(self.hidden_size, np.sqrt(2))(y)))
        return hidden, policy(logits, mask), jnp.squeeze(value, -1)
