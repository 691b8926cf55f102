"""`make_network`: the network a config names. It sits above the network modules (the recurrent and
graph networks build on `networks.actor_critic`), so none of them imports it."""

from __future__ import annotations

import flax.linen as nn

from jaxrl_hier.networks.actor_critic import ActorCriticCNN, ActorCriticMLP
from jaxrl_hier.networks.gps import GPSActorCritic
from jaxrl_hier.networks.recurrent import ActorCriticGRU


def make_network(kind: str, num_actions: int, hidden_size: int, num_layers: int, activation: str,
                 rnn_hidden_size: int = 0, matmul_dtype: str = "float32") -> nn.Module:
    """The network named by a config: 'mlp' for flat observations, 'cnn' for pixels, 'gru' for a
    recurrent actor-critic (GRU of `rnn_hidden_size` units, 0: `hidden_size`), 'gps' for the graph
    transformer over search trees (`jaxrl_hier.networks.gps`, `num_layers` GPS layers).
    `matmul_dtype` 'bfloat16' (the MLP only) runs its products in bf16 (`networks.precision`)."""
    if matmul_dtype != "float32" and kind != "mlp":
        raise ValueError(f"matmul dtype '{matmul_dtype}' is for the 'mlp' network only, not '{kind}'.")
    if kind == "mlp":
        return ActorCriticMLP(num_actions, hidden_size, num_layers, activation, matmul_dtype)
    if kind == "cnn":
        return ActorCriticCNN(num_actions, hidden_size, activation="relu" if activation == "tanh" else activation)
    if kind == "gru":
        return ActorCriticGRU(num_actions, hidden_size, num_layers, activation, rnn_hidden_size or hidden_size)
    if kind == "gps":
        return GPSActorCritic(num_actions, hidden_size, num_layers, activation)
    raise ValueError(f"unknown network '{kind}': use 'mlp', 'cnn', 'gru' or 'gps'.")
