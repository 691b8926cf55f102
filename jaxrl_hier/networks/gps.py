"""A GPS graph transformer actor-critic over search trees (the PGTS policy).

Input: an observation `{"obs": graph, "action_mask": bool[..., A]}` where `graph` holds, for a
tree of N node slots (`jaxrl_hier.search.env.SearchEnv.observation`):

    hidden  [..., N, H]  the generator's hidden state at each node's last token (the node feature)
    nodes   [..., N, F]  depth, reward-model score, is-current, is-final, is-root
    edges   [..., N, E]  features of the edge parent -> node (step log-likelihood, step length)
    parent  [..., N]     parent slot, -1 for the root and unused slots
    valid   [..., N]     slot holds a node
    globals [..., G]     budget used (nodes, tokens)

Each GPS layer (Rampasek et al. 2022, as in the PGTS paper) adds to the node states h
  - local message passing along the tree edges (GINE: relu(h_neighbour + W e_edge), summed over
    the parent and the children, then an MLP of (1 + eps) h + messages), and
  - global multi-head attention over the valid nodes,
each with a residual and layer norm, then a feed-forward block. The actor reads the current
node's state, the mean over the nodes and the globals, and gives masked actions the large finite
logit `MASKED_LOGIT`; the critic reads the same summary through its own MLP.

Nothing depends on the order of the node slots (the readout is a masked sum and a masked mean,
messages follow `parent` indices), so permuting the slots (and renumbering `parent`) leaves the
outputs unchanged.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.initializers import constant

from jaxrl_hier.networks.actor_critic import ACTIVATIONS, policy, split_obs
from jaxrl_hier.networks.init import orthogonal


def _dense(features: int, scale: float = np.sqrt(2)) -> nn.Dense:
    return nn.Dense(features, kernel_init=orthogonal(scale), bias_init=constant(0.0))


class GPSLayer(nn.Module):
    """One GPS layer on a batch of graphs: h [B, N, D], edges [B, N, E], parent [B, N], valid [B, N]."""

    dim: int
    num_heads: int = 4
    activation: str = "relu"

    @nn.compact
    def __call__(self, h, edges, parent, valid):
        act = ACTIVATIONS[self.activation]
        n = h.shape[-2]
        has_parent = (parent >= 0) & valid
        # adjacency: adj[b, i, j] = 1 when j is the parent of i (messages stay order-free: no slot order used)
        adj = ((parent[..., :, None] == jnp.arange(n)) & has_parent[..., :, None]).astype(h.dtype)
        e = _dense(self.dim)(edges)  # features of the edge into each node
        # GINE messages along each edge in both directions: parent -> child and child -> parent
        down = nn.relu(adj @ h + e) * has_parent[..., None]
        up = jnp.swapaxes(adj, -1, -2) @ (nn.relu(h + e) * has_parent[..., None])
        eps = self.param("eps", constant(0.0), ())
        local = _dense(self.dim)(act(_dense(self.dim)((1 + eps) * h + down + up)))
        local = nn.LayerNorm()(h + local)
        attn_mask = (valid[..., :, None] & valid[..., None, :])[..., None, :, :]  # [B, 1 (heads), N, N]
        glob = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, qkv_features=self.dim,
                                               out_features=self.dim)(h, h, mask=attn_mask)
        glob = nn.LayerNorm()(h + glob)
        x = local + glob
        x = nn.LayerNorm()(x + _dense(self.dim)(act(_dense(2 * self.dim)(x))))
        return x * valid[..., None]


class GPSActorCritic(nn.Module):
    """Actor and critic over a search tree; see the module docstring. Any leading batch dims."""

    num_actions: int
    hidden_size: int = 64
    num_layers: int = 2
    activation: str = "relu"
    num_heads: int = 4
    # Initial logit bias of the first (Expand) and last (Terminate) actions: with 0 the untrained
    # policy is uniform over the valid actions; a positive prior starts it near chain-of-thought
    # (keep expanding, stop at the answer), from where PPO learns when to branch or backtrack.
    prior: float = 0.0

    @nn.compact
    def __call__(self, obs):
        graph, mask = split_obs(obs)
        lead = graph["valid"].shape[:-1]
        g = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[len(lead):]), graph)
        valid = g["valid"]
        vf = valid[..., None].astype(jnp.float32)
        x = _dense(self.hidden_size)(g["hidden"]) + _dense(self.hidden_size)(g["nodes"])
        h = nn.LayerNorm()(x) * vf
        for _ in range(self.num_layers):
            h = GPSLayer(self.hidden_size, self.num_heads, self.activation)(h, g["edges"], g["parent"], valid)
        current = g["nodes"][..., 2:3]  # the is-current feature
        cur = jnp.sum(h * current, axis=-2)
        mean = jnp.sum(h * vf, axis=-2) / jnp.maximum(vf.sum(-2), 1.0)
        summary = jnp.concatenate([cur, mean, g["globals"]], axis=-1)
        summary = summary.reshape(lead + summary.shape[-1:])
        act = ACTIVATIONS[self.activation]
        # the actor also sees which actions are open (the official code encodes the mask too)
        actor_in = summary if mask is None else jnp.concatenate([summary, mask.astype(summary.dtype)], axis=-1)
        prior = self.prior

        def bias_init(key, shape, dtype=jnp.float32):
            return jnp.zeros(shape, dtype).at[0].set(prior).at[-1].set(prior)

        logits = nn.Dense(self.num_actions, kernel_init=orthogonal(0.01), bias_init=bias_init)(
            act(_dense(self.hidden_size)(actor_in)))
        value = _dense(1, 1.0)(act(_dense(self.hidden_size)(summary)))
        return policy(logits, mask), jnp.squeeze(value, -1)


__all__ = ["GPSActorCritic", "GPSLayer"]
