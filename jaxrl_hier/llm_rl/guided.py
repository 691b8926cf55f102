"""The guided agent: utterance-level actor-critic (ArCHer) over turn-based text environments.

`make_train(config, env, lm, tokenizer) -> GuidedAgent`; `agent(key)` runs the whole schedule, and
the CLI (`guided_cli.py`) drives `init` / `iteration` / `evaluate` with logging and checkpoints.

Roles on one backbone. The actor and the guidance model are two LoRA adapters on one frozen
backbone; the reference policy of the KL term is that backbone with the adapters off, so no model
is copied. A separate guidance model (`guidance_model_path`) gets its own backbone and adapter. The
critic (`llm_rl.critic`) is ArCHer's double critic, on its own small RoBERTa or on the frozen
backbone's hidden states, with a target tree that is Polyak-averaged inside the compiled critic step.

One iteration, top to bottom:

1. Episodes. `episodes_per_iteration` episodes of the environment (drawn from the seed and the
   iteration, so a resumed run draws the same ones). Turn by turn, the states of the whole batch are
   encoded into one static [B, S] array and the speaking role's adapter samples every utterance in
   one call of the sampling core: a two-turn episode (answer, hint, answer) costs three generation
   calls per batch, not three per problem. The environment (host Python: the answer checker, the
   game's oracle) turns the utterances into rewards and the next states. An environment with a JAX
   form (guess-the-number: `tasks.text_games_jax`) plays the whole batch as one compiled loop over
   turns instead (`turn_loop`, `llm_rl.turns`), with the same arrays out.
2. Replay. Every utterance of a live episode is a transition (state, utterance, reward, next
   state, done, role) written into the on-device replay buffer (`llm_rl.replay`).
3. Critic. `critic_steps` steps in one compiled scan: sample a batch uniformly from the buffer,
   sample a' ~ pi(.|s) with the role that speaks in s, regress Q_i(s, a) to r + gamma (1 - done)
   V_target_i(s') and V_i(s) to Q_target_i(s, a'), Polyak-update the target after every step.
4. Policy (after `warmup_iterations` critic-only iterations). `actor_steps` steps in one compiled
   scan over this iteration's utterances (on-policy), each accumulating gradients over micro-batches
   of `actor_micro_batch_size` episodes' utterances: the advantage min(Q1, Q2)(s, a) -
   min(V1, V2)(s) from the updated critic (or, with `advantage: return`, the episode's observed
   return from the utterance on minus min(V1, V2)(s)), a token-level policy gradient on the utterance's log-probs
   (each utterance weighted equally, its tokens averaged), optional PPO clipping of the ratio to the
   sampler's policy, and beta x KL to the reference; the actor learns from its turns, the guidance
   model from its hints, both against the same critic.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm.jit_cache import JitCache
from jaxrl_hier.llm.lora import LoraConfig, init_lora
from jaxrl_hier.llm.sampling import sample_tokens
from jaxrl_hier.llm_rl import losses
from jaxrl_hier.llm_rl.critic import CriticState, DoubleCritic, critic_step, init_critic_state
from jaxrl_hier.llm_rl.data import encode_prompts, special_ids
from jaxrl_hier.llm_rl.guided_config import GuidedConfig
from jaxrl_hier.llm_rl.microbatch import accumulate_gradients, split_rows
from jaxrl_hier.llm_rl.model_setup import commit_to_mesh
from jaxrl_hier.llm_rl.replay import ReplayBuffer, Transitions, init_replay, insert, sample
from jaxrl_hier.llm_rl.rollout import completion_logprobs
from jaxrl_hier.llm_rl.turns import check_state_len, compiled_rollout, switch_roles
from jaxrl_hier.tasks.jax_rewards import decode_completions
from jaxrl_hier.tasks.text_games import ACTOR, GUIDANCE
from jaxrl_hier.tasks.text_games_jax import jax_form


class GuidedState(struct.PyTreeNode):
    policy: dict          # role -> Lora adapter
    policy_opt: Any
    critic: CriticState
    replay: ReplayBuffer
    key: jax.Array
    step: jax.Array       # iterations done


class RoleBatch(NamedTuple):
    """One role's utterances of an iteration: [R, S] states, [R, N] utterances, [R] flags."""

    state: jax.Array
    state_mask: jax.Array
    action: jax.Array
    action_mask: jax.Array
    logprobs: jax.Array  # under the sampler: the old policy of a clipped update
    valid: jax.Array     # 1 for utterances of live episodes
    ret: jax.Array       # the episode's observed (discounted) return from this utterance on


class Role(NamedTuple):
    name: str
    lm: Any
    base: Any  # the frozen backbone arrays this role's adapter rides on


def state_length(config: GuidedConfig, env: Any) -> int:
    """S, the static token length of every state (BOS included): the env's bound for prompts and utterances
    of the config's lengths (the games' states hold neither)."""
    return 1 + env.max_state_chars(config.max_prompt_length - 1, config.max_new_tokens - 1)


class WarmStartTask:
    """The environment's supervised examples in the task interface `llm_rl.sft.SFT` reads."""

    def __init__(self, env: Any) -> None:
        self.env, self.name = env, f"{env.name}:warm_start"

    def problems(self, split: str, n: int, seed: int) -> list[Any]:
        return self.env.sft_problems(split, n, seed)

    def is_correct(self, problem: Any, completion: str) -> bool:
        return self.env.sft_correct(problem, completion)

    def is_well_formed(self, problem: Any, completion: str) -> bool:
        return self.env.sft_well_formed(problem, completion)


class GuidedAgent:
    """Holds the roles, critic, environment and compiled stages; `init`, `iteration`, `evaluate`, `__call__`."""

    def __init__(self, config: GuidedConfig, env: Any, lm: Any, tokenizer: Any, *, guidance_lm: Any = None,
                 critic_encoder: Any = None) -> None:
        self.config = c = config
        self.env, self.tokenizer = env, tokenizer
        self.pad_id, _, self.eos_id = special_ids(tokenizer)
        # every special token but EOS is never sampled (and scored the same way)
        self.suppress = tuple(sorted(set(int(i) for i in tokenizer.all_special_ids) - {self.eos_id}))
        self.S, self.N = state_length(c, env), c.max_new_tokens
        turns = [env.speaker(t) for t in range(env.max_turns)]
        self.role_names = tuple(r for r in (ACTOR, GUIDANCE) if r in turns)
        self.turn_roles = turns
        self.roles = {ACTOR: Role(ACTOR, lm, lm.params)}
        if GUIDANCE in self.role_names:
            g = guidance_lm if guidance_lm is not None else lm
            self.roles[GUIDANCE] = Role(GUIDANCE, g, g.params)
        self.trained = tuple(r for r in self.role_names if r == ACTOR or c.train_guidance)
        B = c.episodes_per_iteration
        if c.replay_capacity < B * env.max_turns:
            raise ConfigError(f"replay_capacity={c.replay_capacity} is smaller than one iteration's utterances "
                              f"(episodes_per_iteration x {env.max_turns} turns = {B * env.max_turns}); raise it.")
        for role in self.roles.values():
            need = self.S + self.N
            if role.lm.config.max_position_embeddings < need:
                raise ConfigError(f"the {role.name} model has {role.lm.config.max_position_embeddings} positions but "
                                  f"states ({self.S}) + utterances ({self.N}) need {need}.")
        if c.critic == "encoder":
            if critic_encoder is None:
                critic_encoder = build_critic_encoder(c, tokenizer, self.S + self.N)
            self.critic = DoubleCritic("encoder", encoder=critic_encoder, mlp_hidden=c.critic_mlp_hidden)
        else:
            self.critic = DoubleCritic("backbone", lm=lm, mlp_hidden=c.critic_mlp_hidden)
        self.policy_opt = optax.chain(optax.clip_by_global_norm(c.max_grad_norm), optax.adam(c.learning_rate))
        self.critic_opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(c.critic_learning_rate))
        self._gen = JitCache()
        self.jax_env = None if c.turn_loop == "host" else jax_form(env, tokenizer, lm.config.vocab_size)
        if c.turn_loop == "compiled" and self.jax_env is None:
            raise ConfigError(f"turn_loop: compiled: {env.name} has no JAX form with this tokenizer (it writes "
                              "letters in merged tokens); use turn_loop: auto or host.")
        if self.jax_env is not None:
            check_state_len(self.jax_env, self.S)
            self._turn_loop = {greedy: jax.jit(functools.partial(compiled_rollout(self.jax_env, self._turn_sampler(),
                                                                                  self.S), greedy=greedy))
                               for greedy in (False, True)}
        self._insert = jax.jit(insert, donate_argnums=(0,))
        self._critic_update = jax.jit(self._critic_impl, donate_argnums=(0,))
        self._actor_update = jax.jit(self._actor_impl, donate_argnums=(0,))

    # ------------------------------------------------------------------ state
    def init(self, key: jax.Array) -> GuidedState:
        c = self.config
        lc = LoraConfig(rank=c.lora_rank, alpha=c.lora_alpha, target_modules=tuple(c.lora_targets))
        policy = {name: init_lora(self.roles[name].lm.config, lc, jax.random.key(c.seed + 1 + i))
                  for i, name in enumerate(self.role_names)}
        critic = init_critic_state(self.critic, self.critic_opt, jax.random.key(c.seed + 7))
        replay = init_replay(c.replay_capacity, self.S, self.N)
        state = GuidedState(policy, self.policy_opt.init(policy), critic, replay, key, jnp.zeros((), jnp.int32))
        # committed to the backbone's mesh, as the compiled steps return it: otherwise the second
        # iteration's inputs differ in sharding from the first's and every stage compiles twice
        return commit_to_mesh(state, getattr(self.roles[ACTOR].lm, "mesh", None))

    def bases(self) -> dict:
        return {name: self.roles[name].base for name in self.role_names}

    # ------------------------------------------------------------------ generation
    def _generator(self, lm: Any, greedy: bool) -> Any:
        """One jitted sampling program per (backbone, greedy); jit caches the batch shapes."""
        def build():
            c = self.config

            def fn(lora, base, ids, mask, rng):
                return sample_tokens(lm, base, ids, mask, rng, max_new_tokens=self.N, temperature=c.temperature,
                                     eos_ids=(self.eos_id,), pad_token_id=self.pad_id, lora=lora, greedy=greedy,
                                     suppress_tokens=self.suppress)

            return fn

        return self._gen.get(lm, greedy, build)

    def _turn_sampler(self) -> Any:
        """`sample(turn, (policy, bases), ids, mask, rng, greedy)` for the compiled turn loop: the speaker's
        adapter through the host loop's own generator (`_generator`), inlined into the loop's program."""

        def role(name: str) -> Any:
            def sample(roles, ids, mask, rng, greedy):
                policy, bases = roles
                return self._generator(self.roles[name].lm, greedy)(policy[name], bases[name], ids, mask, rng)

            return sample

        return switch_roles(tuple(self.role_names.index(r) for r in self.turn_roles),
                            tuple(role(name) for name in self.role_names))

    def _sample_pi(self, policy: dict, bases: dict, state: jax.Array, state_mask: jax.Array, role: jax.Array,
                   key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """a' ~ pi(.|s) for a batch of states, each from the role that speaks in it (traceable)."""
        tokens = mask = None
        for i, name in enumerate(self.role_names):
            r = self.roles[name]
            out = sample_tokens(r.lm, bases[name], state, state_mask, jax.random.fold_in(key, i),
                                max_new_tokens=self.N, temperature=self.config.temperature, eos_ids=(self.eos_id,),
                                pad_token_id=self.pad_id, lora=policy[name], suppress_tokens=self.suppress)
            if tokens is None:
                tokens, mask = out.tokens, out.mask
            else:
                pick = (role == i)[:, None]
                tokens, mask = jnp.where(pick, out.tokens, tokens), jnp.where(pick, out.mask, mask)
        return tokens, mask

    def encode_states(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        b = encode_prompts(self.tokenizer, list(texts), self.S)
        return b.ids, b.mask

    def rollout(self, state: GuidedState, episodes: list, key: jax.Array | None, greedy: bool = False
                ) -> tuple[list, list[dict], dict]:
        """Play a batch of episodes to the end, one generation call per turn for the whole batch.

        Returns the finished episodes, per turn the arrays of its utterances (state, action,
        logprobs, reward, next state, done, valid), and the seconds each turn's generation took
        (`time/turns` for the whole compiled loop, where the env has a JAX form)."""
        if self.jax_env is not None:
            return self._compiled_rollout(state, episodes, key, greedy)
        env, bases = self.env, self.bases()
        turns, times = [], {}
        for t in range(env.max_turns):
            alive = np.array([not ep.done for ep in episodes])
            if not alive.any():
                break
            name = self.turn_roles[t]
            role = self.roles[name]
            ids, mask = self.encode_states([env.observation(ep) for ep in episodes])
            t0 = time.perf_counter()
            rng = jax.random.fold_in(key, t) if key is not None else jax.random.key(0)
            out = self._generator(role.lm, greedy)(state.policy[name], bases[name], ids, mask, rng)
            out = jax.device_get(out)
            times[f"time/turn{t + 1}_{name}"] = time.perf_counter() - t0
            texts = decode_completions(self.tokenizer, out.tokens, out.mask)
            rewards = np.zeros(len(episodes), np.float32)
            dones = np.ones(len(episodes), np.float32)
            for i, ep in enumerate(episodes):
                if alive[i]:
                    episodes[i], rewards[i], d = env.step(ep, texts[i])
                    dones[i] = float(d)
            nxt = [env.observation(ep) if not ep.done else None for ep in episodes]
            nids, nmask = ids.copy(), mask.copy()  # a finished episode's next state is never read (done = 1)
            live_next = [i for i, x in enumerate(nxt) if x is not None]
            if live_next:
                li, lm_ = self.encode_states([nxt[i] for i in live_next])
                nids[live_next], nmask[live_next] = li, lm_
            turns.append({"role": self.role_names.index(name), "role_name": name, "state": ids, "state_mask": mask,
                          "action": np.asarray(out.tokens), "action_mask": np.asarray(out.mask),
                          "logprobs": np.asarray(out.logprobs), "reward": rewards, "next_state": nids,
                          "next_mask": nmask, "done": dones, "valid": alive.astype(np.float32)})
        return episodes, turns, times

    def _compiled_rollout(self, state: GuidedState, episodes: list, key: jax.Array | None, greedy: bool
                          ) -> tuple[list, list[dict], dict]:
        """`rollout` as one compiled loop over turns (llm_rl.turns). The host environment then replays the
        decoded utterances, for the episodes' summary and records, and must agree with the JAX one."""
        t0 = time.perf_counter()
        env_state, ids, mask = self.jax_env.initial(episodes)
        rng = key if key is not None else jax.random.key(0)
        _, out = self._turn_loop[greedy]((state.policy, self.bases()), env_state, ids, mask, rng)
        out = jax.device_get(out)
        times = {"time/turns": time.perf_counter() - t0}
        turns = []
        for t in range(self.env.max_turns):
            texts = decode_completions(self.tokenizer, out.action[t], out.action_mask[t])
            for i, ep in enumerate(episodes):
                if out.valid[t][i]:
                    episodes[i], r, d = self.env.step(ep, texts[i])
                    if r != out.reward[t][i] or float(d) != out.done[t][i]:
                        raise ConfigError(f"the compiled turn loop and the host {self.env.name} disagree at turn "
                                          f"{t + 1} on {texts[i]!r} (reward {out.reward[t][i]} vs {r}): with this tokenizer the "
                                          "JAX form does not read or render turns as the host does; use "
                                          "turn_loop: host.")
            name = self.turn_roles[t]
            turns.append({"role": self.role_names.index(name), "role_name": name,
                          **{k: np.asarray(getattr(out, k)[t]) for k in out._fields}})
        return episodes, turns, times

    def transitions(self, turns: list[dict]) -> tuple[Transitions, np.ndarray]:
        """All turns' utterances as one static block of max_turns x B rows (unplayed turns invalid)."""
        B = self.config.episodes_per_iteration
        cat = lambda k: np.concatenate([t[k] for t in turns])  # noqa: E731
        pad = (self.env.max_turns - len(turns)) * B
        role = np.concatenate([np.full(B, t["role"], np.int32) for t in turns])

        def padded(x):
            return np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)]) if pad else x

        tr = Transitions(*(padded(cat(k)) for k in ("state", "state_mask", "action", "action_mask", "reward",
                                                     "next_state", "next_mask", "done")), padded(role))
        return tr, padded(cat("valid"))

    def role_batches(self, turns: list[dict]) -> dict[str, RoleBatch]:
        """Per trained role, its utterances of every turn it speaks, as a static block (unplayed turns invalid)."""
        B = self.config.episodes_per_iteration
        returns = returns_to_go(turns, self.config.gamma)
        out = {}
        for name in self.trained:
            slots = [t for t in range(self.env.max_turns) if self.turn_roles[t] == name]
            parts = []
            for t in slots:
                if t < len(turns):
                    d = turns[t]
                    parts.append((d["state"], d["state_mask"], d["action"], d["action_mask"], d["logprobs"],
                                  d["valid"], returns[t]))
                else:
                    parts.append((np.full((B, self.S), self.pad_id, np.int32), np.zeros((B, self.S), np.int32),
                                  np.zeros((B, self.N), np.int32), np.zeros((B, self.N), np.int32),
                                  np.zeros((B, self.N), np.float32), np.zeros(B, np.float32), np.zeros(B, np.float32)))
            out[name] = RoleBatch(*(np.concatenate([p[i] for p in parts]) for i in range(len(RoleBatch._fields))))
        return out

    # ------------------------------------------------------------------ compiled updates
    def _critic_impl(self, state: GuidedState, bases: dict) -> tuple[GuidedState, dict]:
        """`critic_steps` critic steps (sample, a' ~ pi, regress, Polyak) as one scan."""
        c = self.config
        backbone = bases[ACTOR] if c.critic == "backbone" else None

        def one(carry, key):
            cstate = carry
            k1, k2 = jax.random.split(key)
            batch = sample(state.replay, k1, c.critic_batch_size)
            pi_a, pi_m = self._sample_pi(state.policy, bases, batch.state, batch.state_mask, batch.role, k2)
            return critic_step(self.critic, self.critic_opt, c.tau, c.gamma, cstate, batch, pi_a, pi_m, backbone)

        key, sub = jax.random.split(state.key)
        cstate, metrics = jax.lax.scan(one, state.critic, jax.random.split(sub, c.critic_steps))
        return state.replace(critic=cstate, key=key), jax.tree.map(jnp.mean, metrics)

    def _policy_inputs(self, state: GuidedState, bases: dict, batches: dict) -> tuple[dict, dict]:
        """Per trained role: its utterances with the critic's advantage and the token weights of the
        whole batch, cut into micro-batches of `actor_micro_batch_size` episodes' utterances."""
        c = self.config
        backbone = bases[ACTOR] if c.critic == "backbone" else None
        num_micro = c.episodes_per_iteration // c.actor_micro_batch_size if c.actor_micro_batch_size else 1
        micro, metrics = {}, {}
        for name, b in batches.items():
            adv, out = self.critic.advantage(state.critic.params, b.state, b.state_mask, b.action, b.action_mask,
                                             backbone)
            v = b.valid
            metrics.update({f"{name}/{k}": x for k, x in critic_diagnostics(out, b.ret, v, c.group_size).items()})
            if c.advantage == "return":  # the observed return, with the critic's V(s) as its baseline
                adv = b.ret - jnp.minimum(out.v1, out.v2)
            elif c.advantage == "group":  # the observed return against the other plays of the same problem
                adv = b.ret - group_mean(b.ret, v, c.group_size)
            n = jnp.maximum(v.sum(), 1.0)
            mean = jnp.sum(adv * v) / n
            std = jnp.sqrt(jnp.sum(((adv - mean) ** 2) * v) / n)
            metrics[f"{name}/advantage"] = mean
            metrics[f"{name}/advantage_std"] = std
            metrics[f"{name}/q"] = jnp.sum(jnp.minimum(out.q1, out.q2) * v) / n
            if c.normalize_advantages:
                adv = (adv - mean) / (std + 1e-6)
            adv = jax.lax.stop_gradient(adv * v)
            loss_mask = b.action_mask.astype(jnp.float32) * v[:, None]
            weights = losses.token_weights(loss_mask, "grpo", self.N, v)
            micro[name] = split_rows((b, adv, weights, loss_mask), num_micro)
        return micro, metrics

    def _role_loss(self, name: str, bases: dict, adapter: Any, mb: tuple) -> tuple[jax.Array, dict]:
        """One micro-batch of a role's utterances: the clipped policy loss (+ beta KL to the reference)."""
        c = self.config
        b, adv, weights, loss_mask = mb
        role, scored = self.roles[name], loss_mask > 0
        kw = dict(temperature=c.temperature, suppress_tokens=self.suppress)
        ref = None
        if c.beta > 0:  # the reference: the same backbone with the adapter off, no copy
            ref = jax.lax.stop_gradient(completion_logprobs(role.lm, bases[name], None, b.state, b.state_mask,
                                                            b.action, scored, **kw))
        logp = completion_logprobs(role.lm, bases[name], adapter, b.state, b.state_mask, b.action, scored, **kw)
        eps = c.clip_eps if c.clip_eps > 0 else 1e9  # no clipping: the plain (importance-weighted) gradient
        parts = losses.policy_loss(logp, b.logprobs, adv, weights, eps_low=eps, eps_high=eps, beta=c.beta,
                                   ref_logp=ref, kl_estimator=c.kl_estimator)
        w = jax.lax.stop_gradient(weights).sum()  # a micro-batch's means count by its share of the weight
        return parts.loss, {"loss": parts.loss, "pg_loss": parts.pg_loss, "kl": parts.kl * w,
                            "clip_frac": parts.clip_frac * w, "ratio": parts.ratio_mean * w, "weight": w}

    def _policy_grads(self, policy: dict, bases: dict, micro: dict) -> tuple[dict, jax.Array, dict]:
        """The policy's gradient, accumulated over each role's micro-batches, its loss and statistics."""
        grads = jax.tree.map(jnp.zeros_like, policy)  # roles that do not train get zero gradients
        stats, total = {}, jnp.zeros((), jnp.float32)
        for name, mbs in micro.items():
            grads[name], s = accumulate_gradients(functools.partial(self._role_loss, name, bases), policy[name], mbs)
            w = jnp.maximum(s["weight"], 1e-12)
            total = total + s["loss"]
            stats.update({f"{name}/pg_loss": s["pg_loss"], f"{name}/kl": s["kl"] / w,
                          f"{name}/clip_frac": s["clip_frac"] / w, f"{name}/ratio": s["ratio"] / w})
        return grads, total, stats

    def _actor_impl(self, state: GuidedState, bases: dict, batches: dict) -> tuple[GuidedState, dict]:
        """`actor_steps` policy-gradient steps of the trained roles on this iteration's utterances."""
        micro, metrics = self._policy_inputs(state, bases, batches)

        def one(carry, _):
            policy, opt_state = carry
            grads, loss, stats = self._policy_grads(policy, bases, micro)
            updates, opt_state = self.policy_opt.update(grads, opt_state, policy)
            return (optax.apply_updates(policy, updates), opt_state), {"policy/loss": loss,
                                                                      "policy/grad_norm": optax.tree.norm(grads),
                                                                      **stats}

        (policy, opt_state), stats = jax.lax.scan(one, (state.policy, state.policy_opt), None,
                                                  length=self.config.actor_steps)
        metrics.update(jax.tree.map(lambda x: x[0], stats))  # the first step: ratio 1, on-policy
        return state.replace(policy=policy, policy_opt=opt_state), metrics

    # ------------------------------------------------------------------ host orchestration
    def episodes_for(self, step: int) -> list:
        """The iteration's episodes: episodes_per_iteration / group_size problems, each played group_size
        times (adjacent), drawn from the seed and the iteration."""
        c = self.config
        seed = (c.seed * 1_000_003 + step * 97) % (2**31)
        first = self.env.reset("train", c.episodes_per_iteration // c.group_size, seed)
        return [dataclasses.replace(ep) for ep in first for _ in range(c.group_size)]

    def iteration(self, state: GuidedState) -> tuple[GuidedState, dict, list]:
        """One iteration (module docstring); returns the new state, scalar metrics and the played episodes."""
        c = self.config
        step = int(jax.device_get(state.step))
        key, sub = jax.random.split(state.key)
        state = state.replace(key=key)
        t0 = time.perf_counter()
        episodes, turns, times = self.rollout(state, self.episodes_for(step), sub)
        times["time/episodes"] = time.perf_counter() - t0
        tr, valid = self.transitions(turns)
        t = time.perf_counter()
        state = state.replace(replay=self._insert(state.replay, tr, valid))
        state, critic_metrics = self._critic_update(state, self.bases())
        critic_metrics = jax.device_get(critic_metrics)
        times["time/critic"] = time.perf_counter() - t
        metrics: dict[str, float] = {f"train/{k}": float(v) for k, v in self.env.summarize(episodes).items()}
        metrics.update({k: float(v) for k, v in critic_metrics.items()})
        if step >= c.warmup_iterations and c.actor_steps > 0:
            t = time.perf_counter()
            state, actor_metrics = self._actor_update(state, self.bases(), self.role_batches(turns))
            metrics.update({k: float(v) for k, v in jax.device_get(actor_metrics).items()})
            times["time/policy"] = time.perf_counter() - t
        state = state.replace(step=state.step + 1)
        metrics.update(times)
        metrics["replay_size"] = float(jax.device_get(state.replay.size))
        metrics["time/iteration"] = time.perf_counter() - t0
        return state, metrics, episodes

    def evaluate(self, state: GuidedState, episodes: list) -> tuple[dict, list]:
        """Greedy episodes (every role decodes greedily) and the environment's summary of them."""
        done, _, _ = self.rollout(state, episodes, None, greedy=True)
        return self.env.summarize(done), done

    def __call__(self, key: jax.Array, on_iteration: Any = None) -> tuple[GuidedState, list[dict]]:
        """The whole schedule from `init(key)`; `on_iteration(state, metrics, episodes)` after each."""
        state = self.init(key)
        history = []
        for _ in range(self.config.iterations):
            state, metrics, episodes = self.iteration(state)
            history.append(metrics)
            if on_iteration is not None:
                on_iteration(state, metrics, episodes)
        return state, history


def weighted_corr(x: jax.Array, y: jax.Array, w: jax.Array) -> jax.Array:
    """Pearson's correlation of x and y over the rows weighted by w (0 where either is constant)."""
    n = jnp.maximum(w.sum(), 1.0)
    dx, dy = x - jnp.sum(x * w) / n, y - jnp.sum(y * w) / n
    cov, vx, vy = (jnp.sum(a * b * w) / n for a, b in ((dx, dy), (dx, dx), (dy, dy)))
    return jnp.where((vx > 0) & (vy > 0), cov / jnp.sqrt(jnp.maximum(vx * vy, 1e-30)), 0.0)


def critic_diagnostics(out: Any, ret: jax.Array, valid: jax.Array, group_size: int) -> dict[str, jax.Array]:
    """How well the critic knows this iteration's utterances, whichever advantage trains the actor:
    `v_return_mse`, min(V1, V2)(s) against the observed return-to-go (Monte Carlo), and `q_return_mse`,
    min(Q1, Q2)(s, a) against the same returns, beside `return_var`, what predicting the mean return would
    score (a Q that knows what an utterance changes fits the returns better than V, which sees only the
    state); `advantage_agreement`, the correlation of the critic's advantage min(Q1, Q2) - min(V1, V2)
    with the observed one (the return-to-go against its group's mean, or the batch's mean with groups of one)."""
    n = jnp.maximum(valid.sum(), 1.0)
    v, q = jnp.minimum(out.v1, out.v2), jnp.minimum(out.q1, out.q2)
    baseline = group_mean(ret, valid, group_size) if group_size > 1 else jnp.sum(ret * valid) / n
    return {"v_return_mse": jnp.sum((v - ret) ** 2 * valid) / n, "q_return_mse": jnp.sum((q - ret) ** 2 * valid) / n,
            "return_var": jnp.sum((ret - jnp.sum(ret * valid) / n) ** 2 * valid) / n,
            "advantage_agreement": weighted_corr(q - v, ret - baseline, valid)}


def group_mean(x: jax.Array, valid: jax.Array, group_size: int) -> jax.Array:
    """Each row's mean of `x` over the valid rows of its group (`group_size` adjacent rows)."""
    g, w = x.reshape(-1, group_size), valid.reshape(-1, group_size)
    mean = jnp.sum(g * w, axis=1, keepdims=True) / jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1.0)
    return jnp.broadcast_to(mean, g.shape).reshape(x.shape)


def returns_to_go(turns: list[dict], gamma: float) -> list[np.ndarray]:
    """Per played turn, each episode's observed return from that turn on, G_t = r_t + gamma (1 - done_t)
    G_t+1 (0 for rows of episodes that had already ended); `turns` as `GuidedAgent.rollout` returns them."""
    g = np.zeros_like(turns[-1]["reward"])
    out = []
    for d in reversed(turns):
        g = (d["reward"] + gamma * (1.0 - d["done"]) * g) * d["valid"]
        out.append(g)
    return out[::-1]


def build_critic_encoder(config: GuidedConfig, tokenizer: Any, max_len: int) -> Any:
    """The critic's small RoBERTa over the policies' tokenizer, initialised at random."""
    from transformers import RobertaConfig

    from jaxrl_hier.llm import EncoderModel

    hf = RobertaConfig(vocab_size=len(tokenizer), hidden_size=config.critic_hidden_size,
                       num_hidden_layers=config.critic_layers, num_attention_heads=config.critic_heads,
                       intermediate_size=config.critic_intermediate_size, max_position_embeddings=max_len + 4,
                       pad_token_id=special_ids(tokenizer)[0], type_vocab_size=1)
    return EncoderModel.random(hf, jax.random.key(config.seed + 11))


def env_class(name: str) -> type:
    """The environment class of a config's `env` (its METRICS say what reports show)."""
    from jaxrl_hier.tasks.text_games import GuessNumberEnv, MazeEnv, TwentyQuestionsEnv, TwoTurnEnv, WordleEnv
    from jaxrl_hier.tasks.tool_use import CalculatorEnv

    return {"two_turn": TwoTurnEnv, "guess_number": GuessNumberEnv, "wordle": WordleEnv,
            "twenty_questions": TwentyQuestionsEnv, "maze": MazeEnv, "calculator": CalculatorEnv}[name]


def make_env(config: GuidedConfig) -> Any:
    """The environment a config names (task options checked by `jaxrl_hier.tasks.make_task`)."""
    from jaxrl_hier.tasks import task_from_config

    cls = env_class(config.env)
    if config.env == "guess_number":
        return cls(high=config.game_high, max_turns=config.game_max_turns)
    if config.env in ("wordle", "twenty_questions", "maze"):
        return cls(max_turns=config.game_max_turns)
    if config.env == "calculator":
        from jaxrl_hier.tasks.tool_use import CALL

        return cls(task_from_config(config), max_calls=config.tool_max_calls,
                   call_chars=max(config.max_new_tokens - 1 - len(CALL), 1), direct_fraction=config.tool_direct_fraction)
    return cls(task_from_config(config), wrong_fraction=config.hint_wrong_fraction, max_offset=config.hint_max_offset,
               hint_kind=config.hint_kind, shaped=config.reward_shaping)


def make_train(config: GuidedConfig, env: Any, lm: Any, tokenizer: Any, *, guidance_lm: Any = None,
               critic_encoder: Any = None) -> GuidedAgent:
    """Build the agent (nothing compiles until the first iteration)."""
    for name, model in (("policy", lm), ("guidance", guidance_lm)):
        if model is not None and model.config.vocab_size < len(tokenizer):
            raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the {name} model's vocabulary is "
                              f"{model.config.vocab_size}; use the tokenizer the model was trained with.")
    return GuidedAgent(config, env, lm, tokenizer, guidance_lm=guidance_lm, critic_encoder=critic_encoder)


__all__ = ["GuidedAgent", "GuidedState", "RoleBatch", "WarmStartTask", "make_train", "make_env", "env_class", "state_length",
           "returns_to_go", "group_mean", "critic_diagnostics", "weighted_corr",
           "build_critic_encoder"]
