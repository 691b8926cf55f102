"""Mixture-of-experts actor-critic for skills: frozen dependency experts plus one trainable expert.

Experts are MLPs held as lists of `{"kernel", "bias"}` layers and stacked on a leading expert axis.
Each env row is routed to one expert (`idx`). Two ways to evaluate the routed experts:

- `mixture_apply_gather` (default): rows are sorted by expert into blocks of `block_size` rows that
  each belong to a single expert (each expert's group padded to whole blocks), and a loop over the
  blocks multiplies each by its own expert's weights. The arithmetic is that of at most 1.5
  experts whatever their number (padding adds at most `num_experts * (block_size - 1)` rows, and the
  block size keeps that under half the batch); wall time still grows with the number of experts,
  since the blocks get smaller (`benchmarks/skills/moe.py`: on a 2-core CPU, 1024 rows, 5.5 ms for 1 expert,
  55 ms for 32, against 235 ms for the mask).
- `mixture_apply_mask`: every expert on every row, then a one-hot pick: what Flow-RL does, kept as
  the baseline (compute grows linearly with the number of experts). `benchmarks/skills/moe.py` times both.

`MoEPolicy` duck-types a Flax module (`init`, `apply`) for `algorithms.ppo`. Its `params` hold only
the new expert (actor and critic), so the optimiser never sees the frozen experts; those sit in the
`experts` variable collection (the PPO runner's `extra_variables`), one bank per skill slot. The
bank's rows are read from its shape, so a caller may pass a bank cut to the plans in use (the skills
trainer does: no rows, and no routing, for skills without dependencies). The frozen experts run only
on the rows they act on (`mixture_apply_active`); the new expert's rows take its own dense pass. The
critic is always the new expert's: it estimates the return of *this* skill's reward on every state,
including the states where a dependency's expert is acting. The routed mixture runs only where an
action is drawn (the rollout, evaluation); the update's log-probs and entropy are the new expert's, a
dense MLP (`ExpertMixture`).

With `greedy_frozen=True` frozen experts act greedily (their argmax action, as a one-hot
distribution), so their exploration noise does not multiply down a chain of skills. It is off by
default: in the full TechTree run with greedy frozen experts, `collect_stone` (three frozen
experts) stayed at 0.00 training success for 256k steps (not isolated further; a deterministic
policy can loop where its sampled version gets out). Their rows carry no gradient either way.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

import distrax
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.networks.actor_critic import ACTIVATIONS
from jaxrl_hier.networks.init import orthogonal
from jaxrl_hier.parallel import max_over_axes

Layers = list  # [{"kernel": [din, dout], "bias": [dout]}, ...] (stacked: a leading expert axis)


def init_mlp(key: jax.Array, sizes: list[int], out_scale: float) -> Layers:
    """Orthogonal init as in the Craftax baseline: sqrt(2) on hidden layers, `out_scale` on the last."""
    keys = jax.random.split(key, len(sizes) - 1)
    layers = []
    for i, (k, din, dout) in enumerate(zip(keys, sizes[:-1], sizes[1:])):
        scale = out_scale if i == len(sizes) - 2 else math.sqrt(2)
        layers.append({"kernel": orthogonal(scale)(k, (din, dout), jnp.float32),
                       "bias": jnp.zeros((dout,), jnp.float32)})
    return layers


def mlp_apply(layers: Layers, x: jax.Array, act: Callable) -> jax.Array:
    for i, layer in enumerate(layers):
        x = x @ layer["kernel"] + layer["bias"]
        if i < len(layers) - 1:
            x = act(x)
    return x


def mixture_apply_mask(bank: Layers, x: jax.Array, idx: jax.Array, act: Callable,
                       first_kernel: jax.Array | None = None) -> jax.Array:
    """Every expert on every row, then pick row i's expert idx[i] (the Flow-RL baseline).
    `first_kernel`: the bank's first-layer kernels already side by side, [din, G * dout]
    (`side_by_side`), the layout of the product of every expert's first layer at once."""
    if first_kernel is None:
        every = jax.vmap(lambda layers: mlp_apply(layers, x, act))(bank)  # [G, B, out]
    else:
        experts, dout = bank[0]["bias"].shape
        every = (x @ first_kernel).reshape(x.shape[0], experts, dout).transpose(1, 0, 2) + bank[0]["bias"][:, None]
        if len(bank) > 1:  # the hidden layers' activation, then the later layers expert by expert
            every = jax.vmap(lambda layers, h: mlp_apply(layers, act(h), act))(bank[1:], every)
    return jnp.take_along_axis(every, idx[None, :, None], axis=0)[0]


def side_by_side(kernel: jax.Array) -> jax.Array:
    """[G, din, dout] kernels as one [din, G * dout] matrix (`mixture_apply_mask`'s `first_kernel`)."""
    return kernel.transpose(1, 0, 2).reshape(kernel.shape[1], -1)


def default_block_size(rows: int, experts: int) -> int:
    """Rows per block so that padding (< experts * block rows) stays under half the batch."""
    return max(1, rows // (2 * experts))


def sort_into_blocks(idx: jax.Array, num_experts: int, block_size: int) -> tuple[jax.Array, jax.Array, int]:
    """Rows grouped by expert into blocks of `block_size` rows that each belong to one expert (each
    expert's group padded to whole blocks): (slot: int32[rows], row i's place in the blocked layout;
    block_expert: int32[num_blocks], each block's expert; num_blocks, a static upper bound). Trailing
    empty blocks get the last expert; their rows are never read back.

    The bound: an expert with c rows fills ceil(c / bs) <= (c + bs - 1) / bs blocks, so all of them
    together at most (rows + num_experts (bs - 1)) / bs, and, a count of blocks being whole, its
    floor (one block fewer than its ceiling where that is not whole: for 256 rows, 8 experts and
    blocks of 32, 15 blocks instead of 16)."""
    rows, bs = idx.shape[0], block_size
    num_blocks = (rows + num_experts * (bs - 1)) // bs
    idx = idx.astype(jnp.int32)
    counts = jnp.bincount(idx, length=num_experts)
    padded = -(-counts // bs) * bs
    padded_end = jnp.cumsum(padded)
    order = jnp.argsort(idx, stable=True)
    first_row = jnp.cumsum(counts) - counts  # where each expert's rows start in sorted order
    sorted_idx = idx[order]
    slot_sorted = padded_end[sorted_idx] - padded[sorted_idx] + jnp.arange(rows) - first_row[sorted_idx]
    slot = jnp.zeros(rows, jnp.int32).at[order].set(slot_sorted.astype(jnp.int32))
    block_expert = jnp.minimum(jnp.searchsorted(padded_end, jnp.arange(num_blocks) * bs, side="right"),
                               num_experts - 1)
    return slot, block_expert, num_blocks


def mixture_apply_gather(bank: Layers, x: jax.Array, idx: jax.Array, act: Callable,
                         block_size: int | None = None, batched: bool = False) -> jax.Array:
    """Row i through expert idx[i] only, as block-wise grouped matmuls; see the module docstring.

    `batched=False` (acting): a loop over the blocks, each reading its expert's weights in place.
    `batched=True` (training every expert, `skills.chain`): every block at once, through a copy of
    each block's expert weights (`expert_matmul`). Differentiated, the loop adds each block's weight
    gradient into a gradient the size of the whole bank, once per block; the batched form writes each
    block's once and sums them by expert (`benchmarks/skills/moe.py`'s `bank grad` times both)."""
    rows, num_experts = x.shape[0], bank[0]["kernel"].shape[0]
    if num_experts == 1:  # nothing to route
        return mlp_apply(jax.tree.map(lambda w: w[0], bank), x, act)
    bs = block_size or default_block_size(rows, num_experts)
    slot, block_expert, num_blocks = sort_into_blocks(idx, num_experts, bs)
    # Each slot reads its row (a gather costs less than scattering the rows into a zeroed layout); a
    # padding slot reads row 0, and its output is never read back (nor, differentiated, its gradient).
    source = jnp.zeros(num_blocks * bs, jnp.int32).at[slot].set(jnp.arange(rows, dtype=jnp.int32))
    h = x[source].reshape(num_blocks, bs, -1)
    if batched:
        for i, layer in enumerate(bank):
            h = expert_matmul(h, layer["kernel"], block_expert) + layer["bias"][block_expert][:, None]
            if i < len(bank) - 1:
                h = act(h)
        return h.reshape(num_blocks * bs, -1)[slot]

    # One block at a time (lax.map is a loop): each block reads its expert's weights in place. A
    # batched einsum over blocks would first copy a [num_blocks, din, dout] weight gather, which
    # costs more than the matmuls themselves once there are more than a few experts.
    def block(args):
        hb, e = args
        for i, layer in enumerate(bank):
            hb = hb @ layer["kernel"][e] + layer["bias"][e]
            if i < len(bank) - 1:
                hb = act(hb)
        return hb

    h = jax.lax.map(block, (h, block_expert))
    return h.reshape(num_blocks * bs, -1)[slot]


@jax.custom_vjp
def expert_matmul(h: jax.Array, bank: jax.Array, block_expert: jax.Array) -> jax.Array:
    """Each block of rows times its expert's kernel: h [blocks, rows, din], bank [experts, din, dout],
    block_expert int[blocks] in ascending order (`sort_into_blocks`) -> [blocks, rows, dout].

    Its gradient is written out rather than derived: the kernel's gradient as one batched product per
    block in the bank's own layout, summed into the bank by sorted expert index. Derived, XLA:CPU laid
    the block gradients out transposed and copied them back before scattering them into a zeroed
    bank. With the tight block bound and rows gathered into place (`mixture_apply_gather`), a TechTree
    chain chunk (8 experts, minibatches of 256 rows) took 0.90-0.92 s against 1.01-1.04 s, the numbers
    the same to the bit (a 2-core Intel Xeon with AVX-512, jax 0.10.2, 2026-11-30; `skills.chain`,
    docs/results.md)."""
    return jnp.einsum("bri,bio->bro", h, bank[block_expert])


def _expert_matmul_fwd(h, bank, block_expert):
    return expert_matmul(h, bank, block_expert), (h, bank, block_expert)


def _expert_matmul_bwd(res, g):
    h, bank, block_expert = res
    dh = jnp.einsum("bro,bio->bri", g, bank[block_expert])  # dropped by XLA for the first layer's input
    per_block = jnp.einsum("bri,bro->bio", h, g)
    dbank = jax.ops.segment_sum(per_block, block_expert, bank.shape[0], indices_are_sorted=True)
    return dh, dbank, None


expert_matmul.defvjp(_expert_matmul_fwd, _expert_matmul_bwd)


def mixture_for(dispatch: str, block_size: int | None = None, first_kernel: jax.Array | None = None) -> Callable:
    """The mixture function of a dispatch name: `mixture_apply_gather` (with `block_size`) or
    `mixture_apply_mask` (with `first_kernel` where `MoEPolicy.acting_variables` laid it out)."""
    if dispatch == "gather":
        return partial(mixture_apply_gather, block_size=block_size) if block_size else mixture_apply_gather
    if dispatch == "mask":
        return mixture_apply_mask if first_kernel is None else partial(mixture_apply_mask, first_kernel=first_kernel)
    raise ValueError(f"unknown MoE dispatch '{dispatch}': use 'gather' or 'mask'.")


def mixture_apply_active(bank: Layers, x: jax.Array, idx: jax.Array, active: jax.Array, act: Callable,
                         mix: Callable = mixture_apply_gather, sync_axes: tuple[str, ...] = ()) -> jax.Array:
    """Row i through expert idx[i] where `active[i]`; the other rows are 0 (their idx is never read).

    Where few rows are active (the rows a frozen dependency acts on while the new expert acts on the
    rest; the rows whose manager chose a skill rather than a base action) the mixture runs on those
    rows alone: they move to the front and the mixture runs on the first of a few fixed row counts
    (1/8, 1/4, 1/2 of the batch) that holds them, or on every row when none does. The count is a
    `lax.switch` branch, its index reduced over the mapped axes `sync_axes` so that it stays a real
    branch under a trainer's vmap (every instance runs the size the fullest one needs). `mix` is the
    dispatch that runs the routed rows (`mixture_apply_gather` or `mixture_apply_mask`). A skill's acting
    forward at TechTree's shapes (64 rows, 1190 inputs, 8 frozen experts 64 wide, `mask`), frozen
    experts on 4 of its rows: 0.30 ms against 0.92 ms for every expert on every row; at full Craftax's
    (256 rows, 8268 inputs, 3 experts 256 wide, `gather`) on 16 rows: 9.8 against 37.3 ms (a 2-core
    AMD EPYC with AVX-512, `benchmarks/skills/moe.py --active`)."""
    rows, experts = x.shape[0], bank[0]["kernel"].shape[0]
    out_dim = bank[-1]["kernel"].shape[-1]
    safe = jnp.clip(idx, 0, experts - 1).astype(jnp.int32)  # inactive rows may hold any index
    sizes = sorted({0} | {c for c in (-(-rows // d) for d in (8, 4, 2)) if c < rows})
    order = jnp.argsort(~active, stable=True)  # active rows first, in row order

    def on_first(k: int) -> Callable[[], jax.Array]:
        def run() -> jax.Array:
            out = jnp.zeros((rows, out_dim), x.dtype)
            if k == 0:
                return out
            take = order[:k]  # the active rows, then inactive ones up to k
            return out.at[take].set(jnp.where(active[take, None], mix(bank, x[take], safe[take], act), 0.0))
        return run

    count = max_over_axes(active.sum(), sync_axes)
    branch = jnp.searchsorted(jnp.asarray(sizes), count)  # the first size that holds them; past the end: all
    every = lambda: jnp.where(active[:, None], mix(bank, x, safe, act), 0.0)  # noqa: E731
    return jax.lax.switch(branch, [on_first(k) for k in sizes] + [every])


def stack_experts(experts: list[Layers]) -> Layers:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *experts)


class MoEPolicy:
    """Dependency-gated mixture of experts; obs is `{"obs": x, "expert": plan position}` (skills.env)."""

    def __init__(self, num_actions: int, hidden_size: int, num_layers: int, activation: str, max_experts: int,
                 dispatch: str = "gather", block_size: int | None = None, greedy_frozen: bool = False,
                 sync_axes: tuple[str, ...] = ()):
        mixture_for(dispatch)  # an unknown dispatch is refused here, not when first traced
        self.num_actions, self.hidden_size, self.num_layers = num_actions, hidden_size, num_layers
        self.activation, self.max_experts = activation, max_experts
        self.dispatch, self.block_size, self.greedy_frozen = dispatch, block_size, greedy_frozen
        # The mapped axes the policy acts under (a trainer's seed and shard vmaps): the frozen
        # experts run on the rows they act on, a branch that stays real only if reduced over them.
        self.sync_axes = sync_axes

    def expert_sizes(self, obs_dim: int, out: int) -> list[int]:
        return [obs_dim] + [self.hidden_size] * self.num_layers + [out]

    def init_expert(self, key: jax.Array, obs_dim: int) -> dict:
        k_actor, k_critic = jax.random.split(key)
        return {"actor": init_mlp(k_actor, self.expert_sizes(obs_dim, self.num_actions), 0.01),
                "critic": init_mlp(k_critic, self.expert_sizes(obs_dim, 1), 1.0)}

    def expert_zeros(self, obs_dim: int) -> dict:
        """An expert's tree as host zeros (numpy), from its shapes alone: traced, never run, so no
        JAX op is dispatched (bank padding rows, restore targets of saved experts)."""
        shapes = jax.eval_shape(lambda key: self.init_expert(key, obs_dim), jax.random.key(0))
        return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)

    def acting_variables(self, extra: dict) -> dict:
        """`extra` with, under `mask`, the frozen bank's first-layer kernels side by side
        (`experts.first_kernel`, for `mixture_for`): the rollout (`algorithms.ppo`) computes them once,
        where the product of every expert's first layer would otherwise re-lay the bank out on every
        step (for an 8-row TechTree bank, 8 to 28 ms of a 0.46 to 0.74 s round of 160 steps in two
        traces, `skills_speed.py --trace`)."""
        bank = extra["experts"]["actor"]
        if self.dispatch != "mask" or not bank[0]["kernel"].shape[0]:
            return extra
        first = side_by_side(jax.lax.stop_gradient(bank[0]["kernel"]))
        return {**extra, "experts": {**extra["experts"], "first_kernel": first}}

    def init(self, key: jax.Array, obs: dict) -> dict:
        obs_dim = int(np.prod(obs["obs"].shape[1:]))
        expert = self.init_expert(key, obs_dim)
        bank = jax.tree.map(lambda w: jnp.zeros((self.max_experts,) + w.shape, w.dtype), expert["actor"])
        return {"params": expert, "experts": {"actor": bank, "plan_len": jnp.int32(0)}}

    def apply(self, variables: dict, obs: dict):
        act = ACTIVATIONS[self.activation]
        params, frozen = variables["params"], variables["experts"]
        x = obs["obs"].reshape(obs["obs"].shape[0], -1).astype(jnp.float32)
        # Local expert index: plan position j < plan_len -> frozen bank row j; else the new expert,
        # which sits after the bank (row `rows`: the bank may be cut shorter than max_experts).
        rows = frozen["actor"][0]["kernel"].shape[0]
        is_frozen = obs["expert"] < frozen["plan_len"]
        local = jnp.where(is_frozen, obs["expert"], rows)

        new_logits = mlp_apply(params["actor"], x, act)

        def acting_logits() -> jax.Array:  # traced only where an action is drawn (the rollout, evaluation)
            if not rows:  # no dependencies: the new expert acts everywhere
                return new_logits
            # The new expert's rows are `new_logits` already; the frozen experts run on their own rows.
            mix = mixture_for(self.dispatch, self.block_size, frozen.get("first_kernel"))
            routed = mixture_apply_active(jax.lax.stop_gradient(frozen["actor"]), x, local, is_frozen, act, mix,
                                          self.sync_axes)
            if self.greedy_frozen:
                routed = greedy_logits(routed)
            return jnp.where(is_frozen[:, None], routed, new_logits)

        value = mlp_apply(params["critic"], x, act)[:, 0]
        return ExpertMixture(new_logits, is_frozen, acting_logits), value


class ExpertMixture:
    """The action distribution of a skill's rows: `sample` and `mode` act through every row's routed
    expert (the mixture, computed only when an action is drawn), while `log_prob` and `entropy` are
    the new expert's, 0 on rows a frozen expert acts on.

    A frozen row's log-prob carries no gradient, so its PPO ratio is 1 whatever it is stored as; with
    0 in both the rollout and the update, the loss's gradient is the mixture's exactly, and the
    update (four epochs of forward and backward) runs one dense MLP instead of the routed blocks
    (`benchmarks/skills/moe.py`: the routed gradient costs 2.3-2.9x the dense one for 2 to 8 experts;
    `benchmarks/skills/skills_speed.py`: 31.8 ms against 18.3 ms for a Craftax-Classic minibatch). The
    logged entropy and approximate KL then average over the new expert's rows, with 0 elsewhere."""

    def __init__(self, new_logits: jax.Array, frozen: jax.Array, acting_logits: Callable[[], jax.Array]):
        self.new = distrax.Categorical(logits=new_logits)
        self.frozen, self._acting_logits = frozen, acting_logits

    @property
    def logits(self) -> jax.Array:
        """Every row's acting logits (its routed expert's), normalised as `distrax.Categorical` gives them."""
        return jax.nn.log_softmax(self._acting_logits(), axis=-1)

    def sample(self, seed: jax.Array) -> jax.Array:
        return distrax.Categorical(logits=self.logits).sample(seed=seed)

    def mode(self) -> jax.Array:
        return jnp.argmax(self.logits, axis=-1)

    def log_prob(self, action: jax.Array) -> jax.Array:
        return jnp.where(self.frozen, 0.0, self.new.log_prob(action))

    def entropy(self) -> jax.Array:
        return jnp.where(self.frozen, 0.0, self.new.entropy())


def greedy_logits(logits: jax.Array) -> jax.Array:
    """Logits of the one-hot distribution on the argmax (finite, so log-probs and entropy stay 0, not NaN)."""
    best = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=logits.dtype)
    return jax.lax.stop_gradient((best - 1.0) * 1e9)
