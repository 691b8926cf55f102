"""Actor-critic networks: the Craftax baseline MLP and a small CNN for pixel observations.

Both return ``(distrax.Categorical, value)``. Actor and critic have separate trunks, as in the
Craftax baselines, with orthogonal initialisation (sqrt(2) hidden, 0.01 policy, 1.0 value).

Observations may be a dict ``{"obs": x, "action_mask": bool[..., num_actions]}``: the networks
read ``x`` and give masked actions a logit of ``MASKED_LOGIT``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.initializers import constant

from jaxrl_hier.networks.init import orthogonal
from jaxrl_hier.networks.precision import matmul_dot_general

ACTIVATIONS: dict[str, Callable] = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu}
# Large but finite: -inf would make the entropy (0 * -inf) and the log-ratio of PPO NaN.
MASKED_LOGIT = -1e9


def split_obs(obs: Any) -> tuple[Any, Any]:
    """(network input, action mask or None) of an observation that may be a dict."""
    if isinstance(obs, Mapping):
        return obs["obs"], obs.get("action_mask")
    return obs, None


def policy(logits: jax.Array, mask: Any) -> distrax.Categorical:
    """The categorical policy, with masked actions (mask False) pushed to MASKED_LOGIT."""
    if mask is not None:
        logits = jnp.where(mask, logits, MASKED_LOGIT)
    return distrax.Categorical(logits=logits)


def _dense(features: int, scale: float, matmul_dtype: str = "float32") -> nn.Dense:
    return nn.Dense(features, kernel_init=orthogonal(scale), bias_init=constant(0.0),
                    dot_general=matmul_dot_general(matmul_dtype))


class MLPTrunk(nn.Module):
    hidden_size: int
    num_layers: int
    activation: str
    matmul_dtype: str = "float32"  # the products' dtype (`networks.precision`); parameters stay float32

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        for _ in range(self.num_layers):
            x = act(_dense(self.hidden_size, np.sqrt(2), self.matmul_dtype)(x))
        return x


class ActorCriticMLP(nn.Module):
    """Separate actor and critic MLPs on a flat observation."""

    num_actions: int
    hidden_size: int = 512
    num_layers: int = 3
    activation: str = "tanh"
    matmul_dtype: str = "float32"

    @nn.compact
    def __call__(self, obs):
        x, mask = split_obs(obs)
        trunk = lambda: MLPTrunk(self.hidden_size, self.num_layers, self.activation, self.matmul_dtype)  # noqa: E731
        logits = _dense(self.num_actions, 0.01, self.matmul_dtype)(trunk()(x))
        value = _dense(1, 1.0, self.matmul_dtype)(trunk()(x))
        return policy(logits, mask), jnp.squeeze(value, -1)


class ActorCriticCNN(nn.Module):
    """A shared conv encoder for [H, W, C] pixel observations, then actor and critic heads."""

    num_actions: int
    hidden_size: int = 512
    channels: Sequence[int] = (32, 64, 64)
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs):
        act = ACTIVATIONS[self.activation]
        x, mask = split_obs(obs)
        for i, ch in enumerate(self.channels):
            x = act(nn.Conv(ch, (3, 3), strides=(2, 2) if i < 2 else (1, 1), kernel_init=orthogonal(np.sqrt(2)))(x))
        x = x.reshape(x.shape[:-3] + (-1,))
        x = act(_dense(self.hidden_size, np.sqrt(2))(x))
        logits = _dense(self.num_actions, 0.01)(act(_dense(self.hidden_size, np.sqrt(2))(x)))
        value = _dense(1, 1.0)(act(_dense(self.hidden_size, np.sqrt(2))(x)))
        return policy(logits, mask), jnp.squeeze(value, -1)
