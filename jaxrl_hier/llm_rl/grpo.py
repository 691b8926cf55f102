"""Co-located GRPO, DAPO and Dr.GRPO: sampling and training read the same parameter arrays.

`make_train(config, lm, tokenizer, task) -> GRPO`. One step, top to bottom:

1. draw `prompts_per_step` problems from the task's train split (seeded by the step, so a resumed
   run draws the same ones) and left-pad them into a static [P, max_prompt_length] batch;
2. `rollout`: G = `num_generations` completions per prompt with the traceable sampling core, on
   the trainable arrays themselves (full parameters, or the frozen base plus a LoRA adapter); the
   sampler's log-probs are the old policy;
3. rewards (`llm_rl.rewards`): from token ids on the device (`jax_rewards`, the default) or with the
   task's Python rewards on the decoded text, DAPO's soft overlong penalty included;
4. group advantages (scaled by the group's or the batch's std, or not at all);
5. `update`: `num_iterations` optimiser steps over the batch, each accumulating gradients over
   micro-batches, with the clipped loss of `losses.policy_loss` and per-token weights of the
   chosen variant; KL to the reference (the adapter off, or a frozen copy for full fine-tuning)
   when beta > 0, the reference scored under the temperature alone (`_ref_logprobs`). A batch with
   no token in the loss (every group dropped) leaves the weights and optimiser state as they are.

Stages 2-5 are compiled programs and the parameter arrays never leave the device: `update` donates
the state, so the optimiser writes the new weights into the buffers the sampler reads next step
(tested by comparing buffer pointers). With `fused_step: true` and device rewards, 2-5 are one
program. DAPO's dynamic sampling needs the host between rollouts (drop groups whose rewards are all
equal, sample more prompts until the batch is full), so it runs rollout programs until enough
groups are kept, then one update.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm.jit_cache import JitCache
from jaxrl_hier.llm.lora import Lora
from jaxrl_hier.llm_rl import losses
from jaxrl_hier.llm_rl.config import ROUND_STRIDE, GRPOConfig
from jaxrl_hier.llm_rl.data import encode_prompts, fixed_batches, special_ids
from jaxrl_hier.llm_rl.microbatch import accumulate_gradients, split_rows
from jaxrl_hier.llm_rl.model_setup import commit_to_mesh, jit_keeping_layout
from jaxrl_hier.llm_rl.rewards import RewardSpec, make_reward_spec
from jaxrl_hier.tasks.jax_rewards import decode_completions
from jaxrl_hier.llm_rl.rollout import Rollout, completion_logprobs, policy_parts, sample_groups


class GRPOState(struct.PyTreeNode):
    trainable: Any  # full params, or a Lora adapter
    opt_state: Any
    key: jax.Array
    step: jax.Array


class UpdateBatch(NamedTuple):
    prompt_ids: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    old_logprobs: jax.Array
    loss_mask: jax.Array    # [B, N] completion tokens that take part in the loss
    advantages: jax.Array   # [B]
    row_valid: jax.Array    # [B] 0 for padding groups


def _mean_std(x: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and std over the valid rows, ignoring NaN ("not applicable") entries."""
    ok = valid.astype(bool) & ~jnp.isnan(x)
    n = jnp.maximum(ok.sum(), 1)
    mean = jnp.sum(jnp.where(ok, x, 0.0)) / n
    var = jnp.sum(jnp.where(ok, (x - mean) ** 2, 0.0)) / n
    return mean, jnp.sqrt(var)


class GRPO:
    """The trainer: holds the model, task and compiled stages; `init`, `step`, `evaluate`, `__call__`."""

    def __init__(self, config: GRPOConfig, lm: Any, tokenizer: Any, task: Any, *, base_params: Any = None,
                 lora: Lora | None = None, ref_params: Any = None, reward_fn: Any = None) -> None:
        self.config = c = config.resolved()
        if hasattr(lm, "with_remat"):  # the same arrays; only how the update's backward pass runs
            lm = lm.with_remat(c.remat)
        if c.unroll_decode is not None and hasattr(lm, "with_unroll_decode"):  # the same arrays again
            lm = lm.with_unroll_decode(c.unroll_decode)
        self.lm, self.tokenizer, self.task = lm, tokenizer, task
        # rows come in groups of G completions of one prompt (rollout.sample_groups, DAPO's kept groups);
        # a micro-batch that cut a group could not share its prompt (validate() refuses that config)
        whole_groups = (c.micro_batch_size or c.batch_size) % c.num_generations == 0
        self.group = c.num_generations if c.shared_prefix and whole_groups and hasattr(lm, "shared_prefix_hidden") else 1
        self.base_params = lm.params if base_params is None else base_params
        self.initial_lora = lora
        self.pad_id, _, self.eos_id = special_ids(tokenizer)
        self.rewards: RewardSpec = make_reward_spec(c, task, tokenizer, reward_fn)
        self.gen_lm = lm
        if c.placement == "split":
            self._split_devices()
        # Full fine-tuning trains the base arrays themselves (the update donates them), so the compiled
        # stages get no separate base argument; with LoRA the frozen base is passed alongside the adapter.
        self._base_arg = self.base_params if lora is not None else None
        # Full fine-tuning with beta > 0 needs a frozen reference: a copy, the one cost of that mode
        # (laid out for scoring: LanguageModel.frozen_copy). With LoRA the reference is the base with
        # the adapter off (no copy).
        self.ref_params = None
        if c.beta > 0 and lora is None:
            copy = lm.frozen_copy if hasattr(lm, "frozen_copy") else partial(jax.tree.map, jnp.copy)
            self.ref_params = ref_params if ref_params is not None else copy(self.base_params)
        schedule = optax.linear_schedule(0.0, c.learning_rate, max(c.warmup_steps, 1)) if c.warmup_steps else c.learning_rate
        self.optimizer = optax.chain(optax.clip_by_global_norm(c.max_grad_norm), optax.adamw(schedule, weight_decay=0.0))
        self._rollout = jax.jit(partial(self._rollout_impl, self.gen_lm))
        self._score = jax.jit(self._score_impl)
        self._update = self._fused = None  # compiled at first use, for the state's layout (jit_keeping_layout)
        self._make_batch = jax.jit(self._batch)
        self._metrics = jax.jit(self._reward_metrics)

    # ------------------------------------------------------------------ state
    def init(self, key: jax.Array) -> GRPOState:
        """The trainable tree (the base params themselves for full fine-tuning: no copy) and its optimiser state."""
        trainable = self.initial_lora if self.initial_lora is not None else self.base_params
        state = GRPOState(trainable=trainable, opt_state=self.optimizer.init(trainable), key=key,
                          step=jnp.zeros((), jnp.int32))
        return commit_to_mesh(state, getattr(self.lm, "mesh", None))

    def params_and_lora(self, state: GRPOState) -> tuple[Any, Lora | None]:
        return policy_parts(state.trainable, self._base_arg)

    # ------------------------------------------------------------------ compiled stages
    def _split_devices(self) -> None:
        """Server-style layout for comparison: the trainer keeps the second half of the devices, the
        sampler gets the first half and a copy of the weights every step (`_to_generator`)."""
        from jaxrl_hier.llm import LanguageModel, make_mesh, param_shardings

        devices = jax.devices()
        if len(devices) < 2 or len(devices) % 2:
            raise ConfigError(f"placement: split needs an even number of devices >= 2, found {len(devices)}.")
        half = len(devices) // 2
        self.train_mesh = make_mesh(data=1, fsdp=-1, tensor=1, devices=devices[half:])
        self.gen_mesh = make_mesh(data=1, fsdp=-1, tensor=1, devices=devices[:half])
        self.base_params = jax.device_put(self.base_params, param_shardings(self.base_params, self.train_mesh))
        if self.initial_lora is not None:
            self.initial_lora = jax.device_put(self.initial_lora, param_shardings(self.initial_lora, self.train_mesh))
        lm = self.lm
        self.lm = LanguageModel(lm.config, self.base_params, hf_config=lm.hf_config, tokenizer=lm.tokenizer,
                                mesh=self.train_mesh)
        self.gen_lm = LanguageModel(lm.config, self._to_generator(self.base_params), hf_config=lm.hf_config,
                                    tokenizer=lm.tokenizer, mesh=self.gen_mesh)

    def _to_generator(self, tree: Any) -> Any:
        """The per-step weight copy of the split layout (None passes through)."""
        from jaxrl_hier.llm import param_shardings

        return None if tree is None else jax.device_put(tree, param_shardings(tree, self.gen_mesh))

    def _to_trainer(self, tree: Any) -> Any:
        from jaxrl_hier.llm.sharding import batch_spec
        from jax.sharding import NamedSharding

        return jax.tree.map(lambda x: jax.device_put(x, NamedSharding(
            self.train_mesh, batch_spec(self.train_mesh, x.shape[0], x.ndim))), tree)

    def _rollout_impl(self, lm: Any, trainable: Any, base: Any, prompt_ids: jax.Array, prompt_mask: jax.Array,
                      key: jax.Array) -> Rollout:
        c = self.config
        params, lora = policy_parts(trainable, base)
        return sample_groups(lm, params, lora, prompt_ids, prompt_mask, key, num_generations=c.num_generations,
                             max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_k=c.top_k,
                             top_p=c.top_p, eos_id=self.eos_id, pad_id=self.pad_id,
                             suppress_tokens=c.suppress_tokens)

    def _score_impl(self, rollout: Rollout, answer_ids: jax.Array) -> tuple[jax.Array, dict]:
        """Rewards from token ids on the device: total [B] and the per-function parts."""
        answers = jnp.repeat(answer_ids, self.config.num_generations, axis=0)
        return self.rewards.jax_fn(rollout.tokens, rollout.mask, answers)

    def _batch(self, rollout: Rollout, total: jax.Array, row_valid: jax.Array | None) -> UpdateBatch:
        """Group advantages, overlong filtering (truncated completions out of the loss), and the loss mask."""
        c = self.config
        row_valid = jnp.ones_like(total) if row_valid is None else row_valid
        truncated = ~jnp.any((rollout.tokens == self.eos_id) & (rollout.mask > 0), axis=1)
        adv = losses.group_advantages(total, c.num_generations, c.scale_rewards, row_valid)
        loss_mask = rollout.mask.astype(jnp.float32) * row_valid[:, None]
        if c.overlong_filter:
            loss_mask = loss_mask * (~truncated)[:, None]
        return UpdateBatch(rollout.prompt_ids, rollout.prompt_mask, rollout.tokens, rollout.logprobs, loss_mask, adv,
                           row_valid.astype(jnp.float32))

    def _loss(self, trainable: Any, base: Any, mb: UpdateBatch, weights: jax.Array, ref_logp: jax.Array | None):
        c = self.config
        params, lora = policy_parts(trainable, base)
        logp, entropy = completion_logprobs(self.lm, params, lora, mb.prompt_ids, mb.prompt_mask, mb.tokens,
                                            mb.loss_mask > 0, temperature=c.temperature, top_k=c.top_k,
                                            top_p=c.top_p, suppress_tokens=c.suppress_tokens, return_entropy=True,
                                            group=self.group)
        parts = losses.policy_loss(logp, mb.old_logprobs, mb.advantages, weights, eps_low=c.eps_low,
                                   eps_high=c.eps_high, beta=c.beta, ref_logp=ref_logp, kl_estimator=c.kl_estimator)
        w = jax.lax.stop_gradient(weights)
        return parts.loss, (parts, jnp.sum(w * entropy), w.sum())

    def _ref_logprobs(self, base: Any, ref: Any, batch: UpdateBatch) -> jax.Array | None:
        """The reference's log-probs of the completions, under the temperature but no top-k/top-p.

        The policy's nucleus and the reference's differ, so scoring the reference through the
        sampler's filter gives -inf to every sampled token outside the reference's own top-k/top-p
        set, and the KL becomes +inf. Unfiltered, the reference gives every token a finite log-prob:
        the KL is that of the sampling distribution (the policy, filtered) to the reference model's
        tempered distribution, finite, and above 0 even before the first update when the filter cuts
        mass. `suppress_tokens` stay: a fixed set, the same for both models, that the sampler can
        never emit, so they cannot produce -inf; the KL then compares the two on the support the
        policy is confined to, instead of adding a constant for the reference's mass on tokens the
        policy can never take.
        """
        c = self.config
        if c.beta == 0:
            return None
        ref_params = ref if ref is not None else base  # LoRA: the base with the adapter off
        out = completion_logprobs(self.lm, ref_params, None, batch.prompt_ids, batch.prompt_mask, batch.tokens,
                                  batch.loss_mask > 0, temperature=c.temperature,
                                  suppress_tokens=c.suppress_tokens, group=self.group)
        return jax.lax.stop_gradient(out)

    def _update_impl(self, state: GRPOState, base: Any, ref: Any, batch: UpdateBatch) -> tuple[GRPOState, dict]:
        c = self.config
        weights = losses.token_weights(batch.loss_mask, c.loss_type, c.max_new_tokens, batch.row_valid)
        ref_logp = self._ref_logprobs(base, ref, batch)
        mb_size = c.micro_batch_size or c.batch_size
        mbs = split_rows((batch, weights, ref_logp), c.batch_size // mb_size)

        def micro_loss(trainable, xs):
            mb, w, r = xs
            loss, (parts, ent, wsum) = self._loss(trainable, base, mb, w, r)
            # means of a micro-batch count by its share of the batch's token weight
            return loss, (parts.loss, parts.pg_loss, parts.kl * wsum, parts.clip_frac * wsum, parts.ratio_mean * wsum,
                          ent, wsum)

        def apply(carry, grads):
            trainable, opt_state = carry
            updates, opt_state = self.optimizer.update(grads, opt_state, trainable)
            return optax.apply_updates(trainable, updates), opt_state

        # No token in the loss (dynamic sampling dropped every group, or every row was filtered): the
        # gradient is exactly 0, yet an AdamW step would still move the weights by its momentum.
        trains = weights.sum() > 0

        def iteration(carry, _):
            grads, stats = accumulate_gradients(micro_loss, carry[0], mbs)
            carry = jax.lax.cond(trains, apply, lambda carry, _: carry, carry, grads)
            return carry, (stats, optax.global_norm(grads))

        (trainable, opt_state), (stats, gnorm) = jax.lax.scan(iteration, (state.trainable, state.opt_state), None,
                                                               length=c.num_iterations)
        loss, pg, kl, clip, ratio, ent, wsum = (s[0] for s in stats)  # the first pass: ratio 1 on-policy
        wsum = jnp.maximum(wsum, 1e-12)
        metrics = {"loss": loss, "pg_loss": pg, "kl": kl / wsum, "clip_frac": clip / wsum, "ratio": ratio / wsum,
                   "entropy": ent / wsum, "grad_norm": gnorm[0], "update_skipped": 1.0 - trains.astype(jnp.float32)}
        new_state = state.replace(trainable=trainable, opt_state=opt_state, step=state.step + 1)
        return new_state, metrics

    def _fused_impl(self, state: GRPOState, base: Any, ref: Any, prompt_ids: jax.Array, prompt_mask: jax.Array,
                    answer_ids: jax.Array) -> tuple[GRPOState, dict, Rollout]:
        """Sampling, device rewards, advantages and the update as one program."""
        key, sub = jax.random.split(state.key)
        rollout = self._rollout_impl(self.lm, state.trainable, base, prompt_ids, prompt_mask, sub)
        total, parts = self._score_impl(rollout, answer_ids)
        batch = self._batch(rollout, total, None)
        state, metrics = self._update_impl(state.replace(key=key), base, ref, batch)
        return state, {**metrics, **self._reward_metrics(total, parts, rollout, batch)}, rollout

    def _reward_metrics(self, total: jax.Array, parts: dict, rollout: Rollout, batch: UpdateBatch) -> dict:
        valid = batch.row_valid
        out = {}
        out["reward"], out["reward_std"] = _mean_std(total, valid)
        for name, x in parts.items():
            out[f"reward/{name}"], out[f"reward/{name}_std"] = _mean_std(x, valid)
        lengths = rollout.mask.sum(axis=1).astype(jnp.float32)
        out["completion_length"], _ = _mean_std(lengths, valid)
        return out

    # ------------------------------------------------------------------ host orchestration
    def problems_for(self, step: int, round_: int = 0) -> list[Any]:
        """The train problems of a step (deterministic in seed, step and sampling round; distinct for
        every (step, round) since validate() keeps max_sampling_rounds below ROUND_STRIDE)."""
        seed = (self.config.seed * 1_000_003 + step * ROUND_STRIDE + round_) % (2**31)
        return self.task.problems("train", self.config.prompts_per_step, seed)

    def encode(self, problems: Sequence[Any]) -> tuple[jax.Array, jax.Array, jax.Array]:
        batch = encode_prompts(self.tokenizer, [p.prompt for p in problems], self.config.max_prompt_length)
        answers = self.rewards.encode_answers(problems)
        return jax.device_put(batch.ids), jax.device_put(batch.mask), jax.device_put(answers)

    def _host_rewards(self, problems: Sequence[Any], rollout: Rollout) -> tuple[jax.Array, dict]:
        c = self.config
        texts = decode_completions(self.tokenizer, rollout.tokens, rollout.mask)
        rep = [p for p in problems for _ in range(c.num_generations)]
        tokens, mask = jax.device_get((rollout.tokens, rollout.mask))
        before_eos = np.cumprod((mask != 0) & (tokens != self.eos_id), axis=1).sum(axis=1)
        total, parts = self.rewards.py_fn(rep, texts, before_eos)
        return jax.device_put(np.asarray(total, np.float32)), {k: jax.device_put(np.asarray(v, np.float32)) for k, v in parts.items()}

    def _sample_and_score(self, state: GRPOState, step: int, round_: int, key: jax.Array, problems: Any = None):
        problems = self.problems_for(step, round_) if problems is None else problems
        ids, mask, answers = self.encode(problems)
        t0 = time.perf_counter()
        if self.config.placement == "split":  # copy the weights to the generator, the rollout back
            trainable, base = self._to_generator(state.trainable), self._to_generator(self._base_arg)
            key = jax.device_put(key, jax.sharding.NamedSharding(self.gen_mesh, jax.sharding.PartitionSpec()))
            rollout = self._rollout(trainable, base, ids, mask, key)
            rollout, answers = self._to_trainer(rollout), self._to_trainer(answers)
        else:
            rollout = self._rollout(state.trainable, self._base_arg, ids, mask, key)
        rollout = jax.block_until_ready(rollout)
        t1 = time.perf_counter()
        if self.config.jax_rewards:
            total, parts = jax.block_until_ready(self._score(rollout, answers))
        else:
            total, parts = self._host_rewards(problems, rollout)
        return problems, rollout, total, parts, t1 - t0, time.perf_counter() - t1

    def step(self, state: GRPOState, problems: Sequence[Any] | None = None) -> tuple[GRPOState, dict, dict]:
        """One GRPO step; returns the new state, scalar metrics, and the rollout's problems/texts for logging.

        `problems` (prompts_per_step of them) replaces the step's draw from the task's train split."""
        c = self.config
        step = int(jax.device_get(state.step))
        if c.fused_step and c.jax_rewards and not c.dynamic_sampling:
            problems = self.problems_for(step) if problems is None else problems
            ids, mask, answers = self.encode(problems)
            t0 = time.perf_counter()
            if self._fused is None:
                self._fused = jit_keeping_layout(self._fused_impl, state, 2)
            state, metrics, rollout = self._fused(state, self._base_arg, self.ref_params, ids, mask, answers)
            metrics = jax.device_get(metrics)
            metrics["time/step"] = time.perf_counter() - t0
            metrics["groups_dropped"] = 0.0
            return state, self._finish(metrics, rollout, c.batch_size), {"problems": problems, "rollout": rollout}

        key, sub = jax.random.split(state.key)
        state = state.replace(key=key)
        gen_s = score_s = 0.0
        if not c.dynamic_sampling:
            problems, rollout, total, parts, g, s = self._sample_and_score(state, step, 0, sub, problems)
            gen_s, score_s = g, s
            row_valid = None  # every row real (made inside the compiled batch step)
            dropped = 0.0
        else:
            problems, rollout, total, parts, row_valid, dropped, gen_s, score_s = self._dynamic(state, step, sub)
        t = time.perf_counter()
        batch = self._make_batch(rollout, total, row_valid)
        score_s += time.perf_counter() - t
        t = time.perf_counter()
        if self._update is None:
            self._update = jit_keeping_layout(self._update_impl, state, 1)
        state, metrics = self._update(state, self._base_arg, self.ref_params, batch)
        metrics = jax.device_get(metrics)
        update_s = time.perf_counter() - t
        metrics.update(jax.device_get(self._metrics(total, parts, rollout, batch)))
        metrics.update({"time/generation": gen_s, "time/scoring": score_s, "time/update": update_s,
                        "time/step": gen_s + score_s + update_s, "groups_dropped": dropped})
        return state, self._finish(metrics, rollout, c.batch_size), {"problems": problems, "rollout": rollout}

    def _finish(self, metrics: dict, rollout: Rollout, rows: int) -> dict:
        out = {k: float(v) for k, v in jax.device_get(metrics).items()}
        tokens = float(jax.device_get(rollout.mask).sum())
        out["completion_tokens"] = tokens
        out["tokens_per_s"] = tokens / max(out["time/step"], 1e-9)
        if "reward/correct" in out:  # the unweighted 0/1 part (rewards.py): the share of correct completions
            out["accuracy"] = out["reward/correct"]
        return out

    def _dynamic(self, state: GRPOState, step: int, key: jax.Array):
        """DAPO dynamic sampling: keep groups whose rewards differ; sample more until P groups or the round limit."""
        c = self.config
        g = c.num_generations
        kept_probs: list[Any] = []
        kept: list[tuple] = []
        seen = dropped = 0
        gen_s = score_s = 0.0
        for round_ in range(c.max_sampling_rounds):
            key, sub = jax.random.split(key)
            problems, rollout, total, parts, gs, ss = self._sample_and_score(state, step, round_, sub)
            gen_s += gs
            score_s += ss
            host = jax.device_get((rollout, total, parts))
            r = host[1].reshape(-1, g)
            varied = np.ptp(r, axis=1) > 0
            seen += len(varied)
            dropped += int((~varied).sum())
            for i in np.nonzero(varied)[0]:
                if len(kept) < c.prompts_per_step:
                    sl = slice(i * g, (i + 1) * g)
                    kept.append((jax.tree.map(lambda x: x[sl], host[0]), host[1][sl],
                                 {k: v[sl] for k, v in host[2].items()}))
                    kept_probs.append(problems[i])
            if len(kept) >= c.prompts_per_step:
                break
        if not kept:  # every group was uniform: train on nothing this step (all rows padding)
            rollout_np, total_np, parts_np = host[0], host[1], host[2]
            valid = np.zeros(c.batch_size, np.float32)
            kept_probs = list(problems)
        else:
            missing = c.prompts_per_step - len(kept)
            # pad with copies of the first kept group, marked invalid: static shapes, no effect on the loss
            groups = kept + [kept[0]] * missing
            rollout_np = jax.tree.map(lambda *xs: np.concatenate(xs), *[k[0] for k in groups])
            total_np = np.concatenate([k[1] for k in groups])
            parts_np = {name: np.concatenate([k[2][name] for k in groups]) for name in groups[0][2]}
            valid = np.repeat(np.r_[np.ones(len(kept)), np.zeros(missing)], g).astype(np.float32)
            kept_probs = kept_probs + [kept_probs[0]] * missing
        rollout = Rollout(*(jax.device_put(x) for x in rollout_np))
        return (kept_probs, rollout, jnp.asarray(total_np), {k: jnp.asarray(v) for k, v in parts_np.items()},
                jnp.asarray(valid), dropped / max(seen, 1), gen_s, score_s)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, state: GRPOState, problems: Sequence[Any], batch_size: int = 128) -> dict:
        """Greedy accuracy on `problems` (held-out) of the state's policy."""
        params, lora = self.params_and_lora(state)
        return evaluate_policy(self.lm, params, lora, self.tokenizer, self.task, problems,
                               max_prompt_length=self.config.max_prompt_length,
                               max_new_tokens=self.config.max_new_tokens, batch_size=batch_size,
                               suppress_tokens=self.config.suppress_tokens)

    def __call__(self, key: jax.Array, on_step: Any = None) -> tuple[GRPOState, list[dict]]:
        """The whole run from `init(key)`; `on_step(state, metrics, samples)` is called after each step."""
        state = self.init(key)
        history = []
        for _ in range(self.config.total_steps):
            state, metrics, samples = self.step(state)
            history.append(metrics)
            if on_step is not None:
                on_step(state, metrics, samples)
        return state, history


_GREEDY = JitCache()


def _greedy_fn(lm: Any, max_new_tokens: int, eos_id: int, pad_id: int, suppress_tokens: tuple[int, ...]) -> Any:
    def build():
        from jaxrl_hier.llm.sampling import sample_tokens

        def fn(params, lora, ids, mask):
            return sample_tokens(lm, params, ids, mask, jax.random.key(0), max_new_tokens=max_new_tokens,
                                 temperature=1.0, top_k=None, top_p=None, eos_ids=(eos_id,), pad_token_id=pad_id,
                                 lora=lora, greedy=True, suppress_tokens=suppress_tokens)

        return fn

    return _GREEDY.get(lm, (max_new_tokens, eos_id, pad_id, suppress_tokens), build)


def evaluate_policy(lm: Any, params: Any, lora: Lora | None, tokenizer: Any, task: Any, problems: Sequence[Any], *,
                    max_prompt_length: int, max_new_tokens: int, batch_size: int = 128,
                    suppress_tokens: Sequence[int] = ()) -> dict:
    """Greedy-decoding accuracy and format rate of a policy on a list of problems (fixed batch shape).

    Pass the run's `suppress_tokens`: the policy never emits them while training, so evaluating
    without them would decode a different policy (the argmax may be a token training never samples)."""
    pad, _, eos = special_ids(tokenizer)
    fn = _greedy_fn(lm, max_new_tokens, eos, pad, tuple(suppress_tokens))  # sample_tokens checks the ids
    correct = formed = 0
    texts: list[str] = []
    prompts = [p.prompt for p in problems]
    batches = fixed_batches(batch_size, *encode_prompts(tokenizer, prompts, max_prompt_length)) if prompts else ()
    for start, n, (ids, mask) in batches:
        chunk = list(problems[start:start + n])
        out = fn(params, lora, jnp.asarray(ids), jnp.asarray(mask))
        done = decode_completions(tokenizer, out.tokens, out.mask)[:n]
        texts.extend(done)
        correct += sum(task.is_correct(p, t) for p, t in zip(chunk, done))
        formed += sum(task.is_well_formed(p, t) for p, t in zip(chunk, done))
    n = max(len(problems), 1)
    return {"accuracy": correct / n, "format": formed / n, "completions": texts}


def make_train(config: GRPOConfig, lm: Any, tokenizer: Any, task: Any, *, lora: Lora | None = None,
               ref_params: Any = None, reward_fn: Any = None) -> GRPO:
    """Build the trainer (nothing compiles until the first step).

    `reward_fn(problems, completion_texts) -> [B] floats` replaces the task's rewards (host path,
    `jax_rewards: false`), as TRL's reward functions do."""
    if lm.config.vocab_size < len(tokenizer):
        raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary is "
                          f"{lm.config.vocab_size}; use the tokenizer the model was trained with.")
    return GRPO(config, lm, tokenizer, task, lora=lora, ref_params=ref_params, reward_fn=reward_fn)


__all__ = ["GRPO", "GRPOState", "UpdateBatch", "make_train", "evaluate_policy"]
