"""Proximal policy optimisation with the whole training loop compiled: rollout, GAE, update.

Reads top to bottom like PureJaxRL's ``ppo.py``:

    train = make_train(config)      # build env, network, optimiser; nothing compiled yet
    runner = train.init(key)        # params, optimiser state, env states, RNG, counters
    runner, metrics = train.update(runner, num_updates)   # one compiled chunk of updates
    runner, metrics = train(key)    # or: the whole run as one program
    runner, record, seconds = train_chunk(train, runner, n)   # a chunk as one host record (the CLIs)

Layout. Every array in the runner state has a leading seed axis (``num_seeds`` independent runs
vmapped in one program). Environment arrays then have a shard axis: the ``num_envs`` envs are
split into ``env_shards`` vectorised groups, each with its own RNG stream and its own reset pool.
The shard axis is what ``jax.shard_map`` splits over the devices of a 1-D ``data`` mesh; each
device steps its groups, computes gradients on its share of every minibatch, and ``pmean``
averages them. Because the groups (not the devices) define the random streams, a run on one
device with ``env_shards=4`` computes the same numbers as a run on four devices.

Minibatches are device-invariant too: for every env, the ``num_steps`` samples are permuted with
a key folded from the env's *global* index, and minibatch k takes slice k of each env's
permutation. So every minibatch holds ``num_steps / num_minibatches`` random steps of every env,
and each device holds the same share of it.

Recurrent networks (``network: gru``, or any module with ``is_recurrent = True``, an
``initialize_carry(batch_shape)`` and ``__call__(hidden, obs [T, B, ...], reset bool[T, B]) ->
(hidden, pi, value)``, as `jaxrl_hier.networks.ActorCriticGRU`) carry a hidden state per env in
the runner state, zeroed when an episode ends (terminated or truncated).
Their minibatches keep whole sequences: they are split over envs, not time. Each env shard
permutes its envs with a key folded from the shard's global index, and minibatch k takes slice k
of every shard's permutation (``num_envs / num_minibatches`` whole trajectories in all); the
network is re-run over each trajectory from the hidden state the env had at the start of the
rollout, with the same resets.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_hier.algorithms.gae import gae
from jaxrl_hier.algorithms.ppo_config import PPOConfig
from jaxrl_hier.config import ConfigError
from jaxrl_hier.networks import make_network

DATA_AXIS = "data"
# The vmapped axes a rollout step runs under (seeds, env shards of a device): a network whose forward
# branches on its batch reduces the branch index over them (`jaxrl_hier.parallel`).
ROLLOUT_AXES = ("seed", "shard")


def resolve_devices(config: PPOConfig) -> tuple[int, int]:
    """(number of devices, number of env shards), checked against num_envs."""
    available = jax.device_count()  # every device of every host after jax.distributed.initialize()
    devices = config.num_devices or available
    if devices > available:
        raise ConfigError(f"num_devices={devices} but only {available} device(s) exist; use num_devices=0 for all.")
    shards = config.env_shards or devices
    if shards % devices:
        raise ConfigError(f"env_shards ({shards}) must be a multiple of the number of devices ({devices}).")
    if config.num_envs % shards:
        raise ConfigError(
            f"num_envs ({config.num_envs}) must be divisible by the number of devices/env shards ({shards})."
        )
    return devices, shards


class TrainState(struct.PyTreeNode):
    params: Any
    opt_state: Any


class RunnerState(struct.PyTreeNode):
    """Everything needed to continue a run exactly (leading axis: seeds)."""

    train_state: TrainState
    env_state: Any  # [seeds, shards, envs_per_shard, ...]
    obs: Any  # [seeds, shards, envs_per_shard, ...]
    env_params: Any  # [seeds, ...]
    extra_variables: Any  # non-trainable network variables (e.g. frozen experts), [seeds, ...]
    key: jax.Array  # [seeds, 2]
    update: jax.Array  # [seeds] int32: updates done
    hidden: Any = None  # recurrent networks: [seeds, shards, envs_per_shard, ...] per-env hidden state


class Transition(NamedTuple):
    obs: Any
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_value: jax.Array


def ppo_loss(log_prob, entropy, value, old_log_prob, old_value, advantages, targets, *, clip_eps: float,
             vf_coef: float, ent_coef: float, axis_name: str | None = None) -> tuple[jax.Array, dict]:
    """The clipped PPO objective of one minibatch: (total loss, metrics). All arrays share one shape
    and every mean runs over all their elements.

    Policy: -mean(min(r A, clip(r, 1 - eps, 1 + eps) A)) with r = exp(log_prob - old_log_prob) and A
    the advantages normalised to mean 0, std 1. Value: 0.5 mean(max((v - t)^2, (v_clip - t)^2)) with
    v_clip = old_value + clip(value - old_value, -eps, eps). Total: policy + vf_coef value - ent_coef
    entropy. Under shard_map pass `axis_name`: the normalisation then uses the statistics of the whole
    minibatch across devices, not this device's share (every device holds the same count).
    """
    value_clipped = old_value + (value - old_value).clip(-clip_eps, clip_eps)
    value_loss = 0.5 * jnp.maximum(jnp.square(value - targets), jnp.square(value_clipped - targets)).mean()
    ratio = jnp.exp(log_prob - old_log_prob)
    mean, mean_sq = advantages.mean(), jnp.square(advantages).mean()
    if axis_name is not None:
        mean, mean_sq = jax.lax.pmean(mean, axis_name), jax.lax.pmean(mean_sq, axis_name)
    std = jnp.sqrt(jnp.maximum(mean_sq - mean**2, 0.0))
    adv = (advantages - mean) / (std + 1e-8)
    actor_loss = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv).mean()
    entropy = entropy.mean()
    total = actor_loss + vf_coef * value_loss - ent_coef * entropy
    approx_kl = ((ratio - 1) - jnp.log(ratio)).mean()
    clip_frac = (jnp.abs(ratio - 1) > clip_eps).mean()
    return total, {"loss": total, "actor_loss": actor_loss, "value_loss": value_loss, "entropy": entropy,
                   "approx_kl": approx_kl, "clip_frac": clip_frac}


def _episode_metrics(info: dict, achievement_names: tuple[str, ...]) -> dict[str, jax.Array]:
    """Sums and counts of finished episodes in one rollout, to be averaged across shards/devices."""
    done = info["returned_episode"].astype(jnp.float32)
    out = {
        "episodes": done.sum(),
        "return_sum": (info["episode_return"] * done).sum(),
        "length_sum": (info["episode_length"] * done).sum(),
    }
    if achievement_names:
        out["achievement_sum"] = (info["achievements"].astype(jnp.float32) * done[..., None]).sum(
            axis=tuple(range(done.ndim))
        )
    return out


@dataclasses.dataclass
class PPO:
    """A compiled PPO trainer. Build with `make_train`."""

    config: PPOConfig
    env: Any
    env_params: Any
    network: nn.Module
    mesh: jax.sharding.Mesh
    num_shards: int
    achievement_names: tuple[str, ...]
    _compiled: dict = dataclasses.field(default_factory=dict, repr=False)  # num_updates -> program

    # ------------------------------------------------------------------ set-up
    @property
    def num_updates(self) -> int:
        return self.config.num_updates

    @property
    def envs_per_shard(self) -> int:
        return self.config.num_envs // self.num_shards

    def vec_env(self, env_params, sync_axes: tuple[str, ...] = (), share_axes: tuple[str, ...] = ()):
        from jaxrl_hier.envs import make_vec_env

        c = self.config
        # The rollout runs under vmap over seeds and shards: the reset branches reduce their
        # predicates over those axes so that they stay real branches, and a refill any seed needs
        # tops up every seed's pool (share_axes; see envs/vec.py).
        return make_vec_env(self.env, env_params, self.envs_per_shard, reset_mode=c.reset_mode,
                            reset_ratio=c.reset_ratio, sync_axes=sync_axes, share_axes=share_axes,
                            world_uses=c.world_uses)

    def learning_rate(self) -> float | optax.Schedule:
        """The rate, or its schedule over optimizer steps: constant for the first `anneal_start` of
        the updates, then linear to 0 at the last one."""
        c = self.config
        if not c.anneal_lr:
            return c.lr
        per_update = c.update_epochs * c.num_minibatches
        begin = int(c.anneal_start * self.num_updates) * per_update  # on an update's first step
        return optax.linear_schedule(c.lr, 0.0, self.num_updates * per_update - begin, transition_begin=begin)

    def optimizer(self) -> optax.GradientTransformation:
        c = self.config
        return optax.chain(optax.clip_by_global_norm(c.max_grad_norm), optax.adam(self.learning_rate(), eps=1e-5))

    @property
    def recurrent(self) -> bool:
        return bool(getattr(self.network, "is_recurrent", False))

    def apply(self, params, extra, obs):
        """Feed-forward networks: (pi, value) of a batch of observations."""
        return self.network.apply({"params": params, **extra}, obs)

    def _step_net(self, params, extra, hidden, obs):
        """One step of a batch of envs: (new hidden, pi, value); pi and value get a leading time axis
        of 1 for recurrent networks (hidden None for feed-forward ones)."""
        if not self.recurrent:
            return None, *self.apply(params, extra, obs)
        seq = jax.tree.map(lambda x: x[None], obs)
        reset = jnp.zeros((1, hidden.shape[0]), bool)  # the rollout zeroes finished envs' hidden itself
        return self.network.apply({"params": params, **extra}, hidden, seq, reset)

    def _act(self, params, extra, hidden, obs, key):
        """(new hidden, action, log_prob, value) of one step, each [n, ...]."""
        hidden, pi, value = self._step_net(params, extra, hidden, obs)
        action = pi.sample(seed=key)
        log_prob = pi.log_prob(action)
        if self.recurrent:
            action, log_prob, value = action[0], log_prob[0], value[0]
        return hidden, action, log_prob, value

    def _value(self, params, extra, hidden, obs):
        value = self._step_net(params, extra, hidden, obs)[2]
        return value[0] if self.recurrent else value

    def _init_one(self, key: jax.Array, extra: dict, env_params: Any = None, params: Any = None) -> RunnerState:
        """The runner state of one seed (no seed axis); `params`: start from these network params."""
        env_params = self.env_params if env_params is None else env_params
        key, k_net, k_env = jax.random.split(key, 3)
        vec = self.vec_env(env_params)
        shard_keys = jax.random.split(k_env, self.num_shards)
        obs, env_state = jax.vmap(vec.reset)(shard_keys)
        sample_obs = jax.tree.map(lambda x: x[0, :1], obs)
        hidden = None
        if self.recurrent:
            hidden = self.network.initialize_carry((self.num_shards, self.envs_per_shard))
            variables = self.network.init(k_net, hidden[0, :1], jax.tree.map(lambda x: x[None], sample_obs),
                                          jnp.zeros((1, 1), bool))
        else:
            variables = self.network.init(k_net, sample_obs)
        if params is None:
            params = variables["params"]
        elif jax.tree.structure(params) != jax.tree.structure(variables["params"]):
            raise ValueError("PPO.init: the given params do not match the network's parameter tree.")
        extra = {**{k: v for k, v in variables.items() if k != "params"}, **extra}
        opt_state = self.optimizer().init(params)
        runner = RunnerState(TrainState(params, opt_state), env_state, obs, env_params, extra, key, jnp.int32(0),
                             hidden)
        # Envs build some state from Python scalars (weakly typed); the updated state is strongly
        # typed, and jit caches on weak types, so make them strong now or chunk 2 recompiles.
        return jax.tree.map(lambda x: jax.lax.convert_element_type(x, jnp.asarray(x).dtype), runner)

    def init(self, key: jax.Array, extra_variables: dict | None = None, params: Any = None) -> RunnerState:
        """Initial state of `num_seeds` runs, laid out on the mesh (env arrays split over devices).
        `params` (one network's params, e.g. a policy pretrained by imitation) starts every seed from
        them instead of a fresh initialisation; the optimiser state starts fresh either way."""
        seed_keys = jax.random.split(key, self.config.num_seeds)
        init = jax.vmap(lambda k: self._init_one(k, extra_variables or {}, params=params))
        # Compiled with output shardings, so that each device (and each host, in a multi-host
        # run) only materialises its own env shards.
        out_shardings = self.shardings(jax.eval_shape(init, seed_keys))
        return jax.jit(init, out_shardings=out_shardings)(seed_keys)

    def shardings(self, runner: RunnerState) -> RunnerState:
        """Env state and obs split over the `data` axis on their shard axis (axis 1); rest replicated."""
        spec = self._specs(runner)
        return jax.tree.map(lambda s: NamedSharding(self.mesh, s), spec, is_leaf=lambda x: isinstance(x, P))

    def _specs(self, runner: RunnerState) -> RunnerState:
        # Full-rank specs: jit caches on the exact sharding, and the outputs of shard_map carry
        # full-rank specs, so short ones would recompile the first chunk after init.
        rep = jax.tree.map(lambda x: P(*[None] * x.ndim), runner)
        sharded = lambda tree: jax.tree.map(lambda x: P(None, DATA_AXIS, *[None] * (x.ndim - 2)), tree)  # noqa: E731
        return rep.replace(env_state=sharded(runner.env_state), obs=sharded(runner.obs), hidden=sharded(runner.hidden))

    # ------------------------------------------------------------------ one update (per device)
    def _acting_variables(self, extra: dict) -> dict:
        """The network's non-trainable variables as the rollout acts with them: a network with an
        `acting_variables(extra)` method lays them out there, once per rollout, outside the step loop
        (XLA does not hoist a loop-invariant relayout out of it, so the step would pay it each time)."""
        prepare = getattr(self.network, "acting_variables", None)
        return prepare(extra) if prepare is not None else extra

    def _with_loss_inputs(self, extra: dict, traj: Transition) -> Transition:
        """`traj` whose observations also hold what the loss reads from frozen variables: a network
        with a `loss_inputs(variables, obs) -> obs` method (a teacher's logits, say) computes it once
        per rollout, on the whole [T, n] batch, rather than once per epoch and minibatch in the loss.
        Feed-forward networks only: a recurrent one would need its hidden states."""
        loss_inputs = getattr(self.network, "loss_inputs", None)
        if loss_inputs is None or self.recurrent:
            return traj
        lead = traj.action.shape[:2]
        flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), traj.obs)
        obs = loss_inputs(extra, flat)
        if obs is flat:  # nothing added: the program stays as it was without the hook
            return traj
        return traj._replace(obs=jax.tree.map(lambda x: x.reshape(*lead, *x.shape[1:]), obs))

    def _rollout(self, runner: RunnerState, shard_index: jax.Array):
        """num_steps env steps of one env shard: trajectory [T, n, ...] and the new runner pieces."""
        c = self.config
        vec = self.vec_env(runner.env_params, sync_axes=ROLLOUT_AXES, share_axes=("seed",))
        params, extra = runner.train_state.params, self._acting_variables(runner.extra_variables)

        def final_value(hidden, final_obs, truncated):
            # Only truncated rows read V(final_obs) (in GAE), and truncations are rare: run the network
            # only on steps where some env truncates. The predicate is reduced over the vmapped
            # seed/shard axes, as the env's reset branches are, so the cond stays a real branch.
            def compute():
                return jnp.where(truncated, self._value(params, extra, hidden, final_obs), 0.0)

            return jax.lax.cond(vec.any_over_axes(truncated.any()), compute, lambda: jnp.zeros(truncated.shape, jnp.float32))

        def step(carry, _):
            env_state, obs, hidden, key = carry
            key, k_act, k_env = jax.random.split(key, 3)
            hidden, action, log_prob, value = self._act(params, extra, hidden, obs, k_act)
            next_obs, env_state, reward, terminated, truncated, info = vec.step(k_env, env_state, action)
            # A truncated episode bootstraps from the value of its last observation (seen with the
            # hidden state that followed its last step).
            t = Transition(obs, action, log_prob, value, reward, terminated, truncated,
                           final_value(hidden, info["final_obs"], truncated))
            if hidden is not None:  # a new episode starts from a fresh hidden state
                hidden = jnp.where((terminated | truncated)[:, None], self.network.initialize_carry(truncated.shape),
                                   hidden)
            return (env_state, next_obs, hidden, key), (t, _episode_metrics(info, self.achievement_names))

        key = jax.random.fold_in(runner.key, shard_index)
        carry = (runner.env_state, runner.obs, runner.hidden, key)
        (env_state, obs, hidden, _), (traj, ep) = jax.lax.scan(step, carry, None, c.num_steps)
        traj = self._with_loss_inputs(extra, traj)
        last_value = self._value(params, extra, hidden, obs)
        adv, targets = gae(traj.reward, traj.value, traj.terminated, traj.truncated, traj.final_value, last_value,
                           c.gamma, c.gae_lambda)
        return env_state, obs, hidden, traj, adv, targets, jax.tree.map(lambda x: x.sum(0), ep)

    def _evaluate(self, params, extra, traj: Transition, hidden0):
        """(action distribution, value) of the stored steps under `params`. Feed-forward: a flat batch.
        Recurrent: [T, B] sequences, re-run from the rollout's initial hidden state `hidden0` [B, ...],
        zeroed after every step that ended an episode, as in the rollout."""
        if not self.recurrent:
            pi, value = self.apply(params, extra, traj.obs)
        else:
            done = traj.terminated | traj.truncated
            reset = jnp.concatenate([jnp.zeros_like(done[:1]), done[:-1]], axis=0)
            _, pi, value = self.network.apply({"params": params, **extra}, hidden0, traj.obs, reset)
        return pi, value

    def _loss(self, params, extra, traj: Transition, adv, targets, hidden0=None):
        c = self.config
        pi, value = self._evaluate(params, extra, traj, hidden0)
        # A policy whose distribution prices its actions itself (`log_prob_and_penalty`: a per-row
        # penalty beside the log-prob, e.g. a KL of tuned experts to their frozen selves) adds it to
        # the loss; a plain distribution adds nothing.
        if hasattr(pi, "log_prob_and_penalty"):
            log_prob, penalty = pi.log_prob_and_penalty(traj.action)
        else:
            log_prob, penalty = pi.log_prob(traj.action), None
        total, metrics = ppo_loss(log_prob, pi.entropy(), value, traj.log_prob, traj.value, adv, targets,
                                  clip_eps=c.clip_eps, vf_coef=c.vf_coef, ent_coef=c.ent_coef, axis_name=DATA_AXIS)
        if penalty is None:
            return total, metrics
        penalty = penalty.mean()
        total = total + penalty
        return total, {**metrics, "loss": total, "penalty": penalty}

    def _minibatch_indices(self, k_epoch, shard_ids, global_env):
        """Per-epoch permutations: feed-forward, of each env's time steps keyed by its global index
        [shards, n, T]; recurrent, of each shard's envs keyed by the shard's global index [shards, n]."""
        c = self.config
        if self.recurrent:
            return jax.vmap(lambda s: jax.random.permutation(jax.random.fold_in(k_epoch, s), self.envs_per_shard))(
                shard_ids)
        return jax.vmap(jax.vmap(lambda e: jax.random.permutation(jax.random.fold_in(k_epoch, e), c.num_steps)))(
            global_env)

    def _take_minibatch(self, perms, k, traj, adv, targets, hidden0):
        """Minibatch k of this device's rollout (leaves [shards, T, n, ...]), as `_loss` arguments."""
        c = self.config
        if self.recurrent:  # whole trajectories of n / num_minibatches envs of every shard: [T, B, ...]
            size = self.envs_per_shard // c.num_minibatches
            idx = jax.lax.dynamic_slice_in_dim(perms, k * size, size, axis=1)  # [shards, size]

            def take_seq(x):  # [shards, T, n, ...] -> [T, shards * size, ...]
                picked = jnp.take_along_axis(x, idx.reshape((idx.shape[0], 1, size) + (1,) * (x.ndim - 3)), axis=2)
                return jnp.moveaxis(picked, 0, 1).reshape((x.shape[1], -1) + x.shape[3:])

            h0 = jax.tree.map(
                lambda h: jnp.take_along_axis(h, idx.reshape(idx.shape + (1,) * (h.ndim - 2)), axis=1).reshape(
                    (-1,) + h.shape[2:]), hidden0)
            return (*jax.tree.map(take_seq, (traj, adv, targets)), h0)

        mb_steps = c.num_steps // c.num_minibatches
        idx = jax.lax.dynamic_slice_in_dim(perms, k * mb_steps, mb_steps, axis=2)  # [shards, n, mb]

        def take(x):  # [shards, T, n, ...] -> [shards * mb * n, ...]
            x = jnp.moveaxis(x, 1, 2)  # [shards, n, T, ...]
            picked = jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 3)), axis=2)
            return picked.reshape((-1,) + x.shape[3:])

        return jax.tree.map(take, (traj, adv, targets))

    def _update_one(self, runner: RunnerState) -> tuple[RunnerState, dict]:
        """One PPO update of one seed, inside shard_map: env arrays are this device's shards."""
        c = self.config
        local_shards = jax.tree.leaves(runner.obs)[0].shape[0]
        device = jax.lax.axis_index(DATA_AXIS)
        shard_ids = device * local_shards + jnp.arange(local_shards)
        rollout = jax.vmap(self._rollout, in_axes=(RunnerState(None, 0, 0, None, None, None, None, 0), 0),
                           axis_name="shard")
        env_state, obs, hidden, traj, adv, targets, ep = rollout(runner, shard_ids)
        # traj leaves: [shards, T, n, ...]; runner.hidden: the hidden state at the rollout's start

        key, k_perm = jax.random.split(runner.key)
        n = self.envs_per_shard
        global_env = shard_ids[:, None] * n + jnp.arange(n)[None, :]  # [shards, n]
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)
        tx = self.optimizer()

        def mean_over_devices(tree):
            # On one device the mean is the tree itself; XLA:CPU still copies every leaf through an
            # all-reduce.
            return tree if jax.lax.axis_size(DATA_AXIS) == 1 else jax.lax.pmean(tree, DATA_AXIS)

        def epoch(train_state, epoch_index):
            perms = self._minibatch_indices(jax.random.fold_in(k_perm, epoch_index), shard_ids, global_env)

            def minibatch(train_state, k):
                mb = self._take_minibatch(perms, k, traj, adv, targets, runner.hidden)
                # Every shard holds the same number of samples, so pmean of local means is the global mean.
                (_, aux), grads = grad_fn(train_state.params, runner.extra_variables, *mb)
                grads, aux = mean_over_devices((grads, aux))
                updates, opt_state = tx.update(grads, train_state.opt_state, train_state.params)
                params = optax.apply_updates(train_state.params, updates)
                return TrainState(params, opt_state), aux

            return jax.lax.scan(minibatch, train_state, jnp.arange(c.num_minibatches))

        train_state, losses = jax.lax.scan(epoch, runner.train_state, jnp.arange(c.update_epochs))
        losses = jax.tree.map(jnp.mean, losses)
        ep = jax.lax.psum(jax.tree.map(lambda x: x.sum(0), ep), DATA_AXIS)
        runner = runner.replace(train_state=train_state, env_state=env_state, obs=obs, hidden=hidden, key=key,
                                update=runner.update + 1)
        return runner, {**losses, **ep}

    # ------------------------------------------------------------------ compiled entry points
    def _chunk(self, runner: RunnerState, num_updates: int) -> tuple[RunnerState, dict]:
        def body(r, _):
            return jax.vmap(self._update_one, axis_name="seed")(r)

        return jax.lax.scan(body, runner, None, num_updates)

    def _compiled_chunk(self, num_updates: int, runner: RunnerState):
        spec = self._specs(runner)
        metric_spec = P()  # psum/pmean made them equal on every device
        fn = jax.shard_map(lambda r: self._chunk(r, num_updates), mesh=self.mesh, in_specs=(spec,),
                           out_specs=(spec, metric_spec), check_vma=False)
        # Output shardings spelled out exactly as `init` spells them: jit caches on the exact
        # sharding objects, and shard_map's own normalised specs would recompile the second chunk.
        # No buffer donation: an asynchronous checkpoint may still be reading the previous state.
        return jax.jit(fn, out_shardings=(self.shardings(runner), NamedSharding(self.mesh, P())))

    def update(self, runner: RunnerState, num_updates: int) -> tuple[RunnerState, dict]:
        """Run `num_updates` PPO updates as one compiled program.

        Returns the new runner state and per-update metrics of shape [num_updates, num_seeds]:
        losses, and episode statistics (mean return, length, achievement success rates; NaN
        for an update in which no episode finished).
        """
        if num_updates not in self._compiled:
            self._compiled[num_updates] = self._compiled_chunk(num_updates, runner)
        runner, raw = self._compiled[num_updates](runner)
        return runner, summarize(raw)

    def __call__(self, key: jax.Array) -> tuple[RunnerState, dict]:
        """The whole run (`num_updates` updates) as one program."""
        return self.update(self.init(key), self.num_updates)


def summarize(raw: dict) -> dict:
    """Turn per-update sums and counts into means (NaN where no episode finished)."""
    out = {k: v for k, v in raw.items() if k not in ("episodes", "return_sum", "length_sum", "achievement_sum")}
    episodes = raw["episodes"]
    safe = jnp.where(episodes > 0, episodes, jnp.nan)
    out["episodes"] = episodes
    out["episode_return"] = raw["return_sum"] / safe
    out["episode_length"] = raw["length_sum"] / safe
    if "achievement_sum" in raw:
        out["achievements"] = raw["achievement_sum"] / safe[..., None]
    return out


def make_train(
    config: PPOConfig,
    *,
    env: Any = None,
    env_params: Any = None,
    network: nn.Module | None = None,
) -> PPO:
    """Build a PPO trainer for `config`. `env`/`network` override the ones the config names
    (the skills code passes a skill-wrapped env and a mixture-of-experts policy)."""
    from jaxrl_hier.envs import make

    config.validate()
    num_devices, num_shards = resolve_devices(config)
    if env is None:
        env, default_params = make(config.env)
        env_params = default_params if env_params is None else env_params
    elif env_params is None:
        env_params = env.default_params
    if network is not None and config.matmul_dtype != "float32":
        raise ConfigError(f"'matmul_dtype: {config.matmul_dtype}' sets the products of the network the config "
                          "names; the network passed in runs its own. Set matmul_dtype: float32.")
    if network is None:
        space = env.observation_space(env_params)
        space = space["obs"] if isinstance(space, dict) else space  # {"obs", "action_mask"} observations
        kind = config.network if config.network != "auto" else ("cnn" if len(space.shape) == 3 else "mlp")
        shape = tuple(space.shape)
        wants = {"mlp": 1, "gru": 1, "cnn": 3}.get(kind)  # the observation rank each network reads
        if wants is not None and len(shape) != wants:
            fix = "network: cnn (or auto)" if len(shape) == 3 else "network: mlp (or auto)"
            raise ConfigError(f"network '{kind}' reads observations of rank {wants}, but {config.env} gives shape "
                              f"{shape}. Set {fix}.")
        if kind != "mlp" and config.matmul_dtype != "float32":
            raise ConfigError(f"'matmul_dtype: {config.matmul_dtype}' applies to the MLP network only; {config.env} "
                              f"gets the '{kind}' network. Set matmul_dtype: float32.")
        network = make_network(kind, env.action_space(env_params).n, config.hidden_size, config.num_layers,
                               config.activation, config.rnn_hidden_size, config.matmul_dtype)
    # Checked again now that the network (maybe a caller's recurrent one) and the env shards are known.
    config.check_minibatches(bool(getattr(network, "is_recurrent", False)), num_shards)
    mesh = jax.make_mesh((num_devices,), (DATA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:num_devices])
    return PPO(config, env, env_params, network, mesh, num_shards, tuple(getattr(env, "achievement_names", ())))


def metrics_to_records(metrics: dict, achievement_names: tuple[str, ...], seed_index: int | None = None) -> list[dict]:
    """Per-update host records (means over seeds unless `seed_index` is given)."""
    host = jax.tree.map(np.asarray, metrics)
    num = host["loss"].shape[0]
    records = []
    for u in range(num):
        pick = (lambda x: x[u, seed_index]) if seed_index is not None else (lambda x: np.nanmean(x[u], axis=0))
        rec = {}
        for k, v in host.items():
            if k == "achievements":
                continue
            with np.errstate(all="ignore"):
                val = float(pick(v)) if not np.all(np.isnan(v[u])) else math.nan
            rec[k] = val
        if "achievements" in host:
            with np.errstate(all="ignore"):
                rates = pick(host["achievements"]) if not np.all(np.isnan(host["achievements"][u])) else None
            for i, name in enumerate(achievement_names):
                rec[f"achievement/{name}"] = float(rates[i]) if rates is not None else math.nan
        records.append(rec)
    return records


def train_chunk(trainer, runner, n: int) -> tuple[Any, dict, float]:
    """`n` PPO updates in one compiled call: (runner, one record for the chunk, seconds it took)."""
    tick = time.perf_counter()
    runner, metrics = trainer.update(runner, n)
    metrics = jax.block_until_ready(metrics)
    elapsed = time.perf_counter() - tick
    return runner, _merge_chunk(metrics_to_records(metrics, trainer.achievement_names)), elapsed


def _merge_chunk(all_records: list[dict]) -> dict:
    """One record per chunk: losses of the last update, episode statistics over the whole chunk
    (episodes are sparse per update, so averaging over the chunk is the less noisy figure)."""
    episodes = [r.get("episodes") or 0.0 for r in all_records]
    total = sum(episodes)
    out = dict(all_records[-1])
    for key in out:
        if key == "episode_return" or key == "episode_length" or key.startswith("achievement/"):
            vals = [(r[key], w) for r, w in zip(all_records, episodes) if w and not math.isnan(r[key])]
            out[key] = sum(v * w for v, w in vals) / total if total else math.nan
    out["episodes"] = total
    return out
