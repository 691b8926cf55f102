"""ArCHer's utterance-level double critic: Q1, Q2 on (state, utterance), V1, V2 on the state.

Two feature sources, picked by `kind`:

- "encoder" (ArCHer's layout): a small RoBERTa (`jaxrl_hier.llm.EncoderModel`) owned by the critic
  encodes the state and the utterance separately (masked mean of its hidden states); Q_i is an MLP
  on [state; utterance] features, V_i an MLP on the state's. The encoder trains with the heads.
- "backbone": value heads on the policies' frozen backbone: the state's feature is the decoder's
  final hidden state at the state's last token, the utterance's at the last token of state +
  utterance. Only the heads train; the backbone arrays are the policies' own (no copy).

The target critic is a second parameter tree of the same structure. `critic_step` does one
optimiser step on the regression losses and then moves the target towards the new parameters with
`optax.incremental_update` (Polyak, tau) inside the same compiled function:

    Q_i(s, a) -> r + gamma (1 - done) V_target_i(s')      V_i(s) -> Q_target_i(s, a'),  a' ~ pi(.|s)

each head towards its own target head (no min in the targets), MSE summed, as ArCHer.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrl_hier.llm.decoder import default_positions
from jaxrl_hier.llm.heads import gather_last, value_head_apply, value_head_init

HEADS = ("q1", "q2", "v1", "v2")


def mlp_init(key: jax.Array, fan_in: int, hidden: int) -> dict:
    """dense(fan_in -> hidden) -> relu -> value head (hidden -> 1)."""
    k1, k2 = jax.random.split(key)
    return {"dense": {"kernel": jax.random.normal(k1, (fan_in, hidden), jnp.float32) * fan_in**-0.5,
                      "bias": jnp.zeros((hidden,), jnp.float32)},
            "out": value_head_init(k2, hidden)}


def mlp_apply(p: dict, x: jax.Array) -> jax.Array:
    h = jax.nn.relu(x.astype(jnp.float32) @ p["dense"]["kernel"] + p["dense"]["bias"])
    return value_head_apply(p["out"], h)


def masked_mean(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    m = mask.astype(jnp.float32)[..., None]
    return jnp.sum(hidden.astype(jnp.float32) * m, axis=1) / jnp.maximum(m.sum(axis=1), 1.0)


class CriticOut(NamedTuple):
    q1: jax.Array
    q2: jax.Array
    v1: jax.Array
    v2: jax.Array


class DoubleCritic:
    """Feature extraction and the four heads; pure functions of (params, token arrays[, backbone])."""

    def __init__(self, kind: Literal["encoder", "backbone"], *, encoder: Any = None, lm: Any = None,
                 mlp_hidden: int = 64) -> None:
        self.kind, self.encoder, self.lm, self.mlp_hidden = kind, encoder, lm, mlp_hidden
        if kind == "encoder" and encoder is None:
            raise ValueError("kind='encoder' needs an EncoderModel")
        if kind == "backbone" and lm is None:
            raise ValueError("kind='backbone' needs the policies' LanguageModel")
        self.feature_size = (encoder if kind == "encoder" else lm).config.hidden_size

    def init(self, key: jax.Array) -> dict:
        keys = jax.random.split(key, 4)
        h = self.feature_size
        params = {name: mlp_init(k, 2 * h if name[0] == "q" else h, self.mlp_hidden)
                  for name, k in zip(HEADS, keys)}
        if self.kind == "encoder":
            params["encoder"] = self.encoder.params
        return params

    def state_features(self, params: dict, state: jax.Array, state_mask: jax.Array, backbone: Any = None) -> jax.Array:
        if self.kind == "encoder":
            hidden, _ = self.encoder.forward(params["encoder"], state, state_mask)
            return masked_mean(hidden, state_mask)
        hidden = self.lm.hidden_states(backbone, state, state_mask, positions=default_positions(state_mask))
        return jax.lax.stop_gradient(gather_last(hidden, state_mask).astype(jnp.float32))

    def action_features(self, params: dict, state: jax.Array, state_mask: jax.Array, action: jax.Array,
                        action_mask: jax.Array, backbone: Any = None) -> jax.Array:
        if self.kind == "encoder":
            hidden, _ = self.encoder.forward(params["encoder"], action, action_mask)
            return masked_mean(hidden, action_mask)
        ids = jnp.concatenate([state, action], axis=1)
        mask = jnp.concatenate([state_mask, action_mask.astype(state_mask.dtype)], axis=1)
        hidden = self.lm.hidden_states(backbone, ids, mask, positions=default_positions(mask))
        return jax.lax.stop_gradient(gather_last(hidden, mask).astype(jnp.float32))

    def values(self, params: dict, state: jax.Array, state_mask: jax.Array, backbone: Any = None
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(V1, V2, state features)."""
        f = self.state_features(params, state, state_mask, backbone)
        return mlp_apply(params["v1"], f), mlp_apply(params["v2"], f), f

    def qs(self, params: dict, state_feat: jax.Array, state: jax.Array, state_mask: jax.Array, action: jax.Array,
           action_mask: jax.Array, backbone: Any = None) -> tuple[jax.Array, jax.Array]:
        a = self.action_features(params, state, state_mask, action, action_mask, backbone)
        x = jnp.concatenate([state_feat, a], axis=-1)
        return mlp_apply(params["q1"], x), mlp_apply(params["q2"], x)

    def __call__(self, params: dict, state: jax.Array, state_mask: jax.Array, action: jax.Array,
                 action_mask: jax.Array, backbone: Any = None) -> CriticOut:
        v1, v2, f = self.values(params, state, state_mask, backbone)
        q1, q2 = self.qs(params, f, state, state_mask, action, action_mask, backbone)
        return CriticOut(q1, q2, v1, v2)

    def advantage(self, params: dict, state: jax.Array, state_mask: jax.Array, action: jax.Array,
                  action_mask: jax.Array, backbone: Any = None) -> tuple[jax.Array, CriticOut]:
        """ArCHer's advantage min(Q1, Q2)(s, a) - min(V1, V2)(s), and the four values."""
        out = self(params, state, state_mask, action, action_mask, backbone)
        return jnp.minimum(out.q1, out.q2) - jnp.minimum(out.v1, out.v2), out


class CriticState(struct.PyTreeNode):
    params: Any
    target: Any
    opt_state: Any


def init_critic_state(critic: DoubleCritic, optimizer: optax.GradientTransformation, key: jax.Array) -> CriticState:
    """Parameters, a target tree equal to them (its own arrays), and the optimiser state."""
    params = critic.init(key)
    return CriticState(params, jax.tree.map(jnp.copy, params), optimizer.init(params))


def critic_targets(reward: jax.Array, done: jax.Array, gamma: float, target_v_next: tuple[jax.Array, jax.Array],
                   target_q_pi: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, ...]:
    """(y_q1, y_q2, y_v1, y_v2): Q_i towards r + gamma (1 - done) V_target_i(s'), V_i towards Q_target_i(s, a')."""
    not_done = 1.0 - done.astype(jnp.float32)
    y_q1 = reward + gamma * not_done * target_v_next[0]
    y_q2 = reward + gamma * not_done * target_v_next[1]
    return tuple(jax.lax.stop_gradient(y) for y in (y_q1, y_q2, target_q_pi[0], target_q_pi[1]))


def critic_loss(critic: DoubleCritic, params: dict, target: dict, batch: Any, pi_action: jax.Array,
                pi_action_mask: jax.Array, gamma: float, backbone: Any = None) -> tuple[jax.Array, dict]:
    """Summed MSE of the four heads against their targets (batch: replay.Transitions)."""
    tv1n, tv2n, _ = critic.values(target, batch.next_state, batch.next_mask, backbone)
    _, _, tf = critic.values(target, batch.state, batch.state_mask, backbone)
    tq1pi, tq2pi = critic.qs(target, tf, batch.state, batch.state_mask, pi_action, pi_action_mask, backbone)
    ys = critic_targets(batch.reward, batch.done, gamma, (tv1n, tv2n), (tq1pi, tq2pi))
    out = critic(params, batch.state, batch.state_mask, batch.action, batch.action_mask, backbone)
    losses = [jnp.mean((pred - y) ** 2) for pred, y in zip(out, ys)]
    metrics = {"critic/q1_loss": losses[0], "critic/q2_loss": losses[1], "critic/v1_loss": losses[2],
               "critic/v2_loss": losses[3], "critic/q_mean": jnp.mean(jnp.minimum(out.q1, out.q2)),
               "critic/v_mean": jnp.mean(jnp.minimum(out.v1, out.v2)), "critic/target_mean": jnp.mean(ys[0])}
    return sum(losses), metrics


def critic_step(critic: DoubleCritic, optimizer: optax.GradientTransformation, tau: float, gamma: float,
                state: CriticState, batch: Any, pi_action: jax.Array, pi_action_mask: jax.Array,
                backbone: Any = None) -> tuple[CriticState, dict]:
    """One optimiser step on the critic loss, then the Polyak target update (traceable: call inside jit)."""
    (loss, metrics), grads = jax.value_and_grad(
        lambda p: critic_loss(critic, p, state.target, batch, pi_action, pi_action_mask, gamma, backbone),
        has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    target = optax.incremental_update(params, state.target, step_size=tau)
    return CriticState(params, target, opt_state), {"critic/loss": loss, "critic/grad_norm": optax.tree.norm(grads),
                                                    **metrics}


__all__ = ["DoubleCritic", "CriticOut", "CriticState", "init_critic_state", "critic_targets", "critic_loss",
           "critic_step", "mlp_init", "mlp_apply", "masked_mean", "HEADS"]
