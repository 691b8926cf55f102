"""The learned manager: a policy over the completed skills, trained with PPO on the base env's reward.

The composed agent (`skills.composed`) routes one fixed chain towards one target. The manager
instead chooses, among every completed skill of the run (config section `manager`), which skill
acts next, and learns that choice from the base env's own reward (on Craftax every achievement and
the health terms), so the agent can also eat, drink and sleep between the steps of its chain.

Design: options (Sutton, Precup and Singh 1999) with frozen experts.
- An option is a completed skill S. It may start where S's success conditions do not hold (its
  initiation set); it acts by routing S's closure exactly as the composed agent routes a chain
  towards S (`skills.env.route`: the first dependency still to be done acts, then S's own expert),
  so an option resumes wherever its chain stands; it ends when S's conditions hold, after
  `option_steps` base steps (the cap, so a stuck option hands control back), or with the episode.
  Where no option may start (every skill holds), every option may.
- The manager is trained at the base step rate as an ordinary PPO agent of a `ManagerEnv`, whose
  state carries the running option. Between options the action mask is the initiation set; while
  an option runs the mask holds that option alone, so the manager's log-probability there is 0 and
  those steps carry no policy gradient: only decisions are learned, and with the per-step discount
  a decision's return is the option's rewards discounted over its duration, sum_i gamma^i r_i, plus
  gamma^k times the value where the next decision falls (the semi-MDP return over an option of k
  steps). Its value function sees the running option too, so GAE's bootstraps inside an option
  are the values of the augmented state.
- The experts are frozen (a `experts` variable collection, never seen by the optimiser): the
  manager's PPO update runs the manager's network only. With `tune_experts` the parameters also hold
  a copy of the bank that acts and trains on the base reward where the manager calls it, held near
  the frozen bank by a KL penalty (`TunedOptionPolicy`). An expert acts inside the sampled
  action: the manager's distribution (`OptionPolicy`) samples the option, reads the bank row of
  the expert that option routes to (`rows`, computed by the env from the live state), and samples
  that expert's base action through the mixture's gather dispatch; the env receives both as one
  integer, option * A + base action.
- With `primitives` the manager may also act itself: each base action is one more choice, an
  option of one step (the options framework counts primitive actions as options), sampled from
  the manager's own distribution and so trained on the base reward like flat PPO's policy. Where a
  skill is missing or weak (no eat_cow expert, a pickaxe skill that fails), the manager can still
  take the achievement step by step; where a skill is good, one decision buys many steps.
  A choice c < K is skill c; a choice c >= K is base action c - K, encoded as c * A + (c - K).
- With `generalist_timesteps` (and `primitives`) the manager first trains with every skill closed:
  its own base actions alone, flat PPO on the base reward in the manager's own network, so the
  generalist learns the survival and off-chain achievements from shared experience, as flat PPO
  does, rather than each from a skill of its own. The manager stage then starts from those
  parameters with the skills open: a residual generalist that calls a skill where one pays. The
  network's inputs are the same in both stages (the initiation set of the open manager), so the
  hand-over changes only which choices the logits may take.
- With `features` the network also reads, for more skills of the library, whether each one's
  success conditions do not hold yet (on Craftax: the achievements still to unlock). Craftax's
  observation shows the inventory but not which achievements the episode has had, while its reward
  pays each achievement once: these inputs tell the value and the policy which rewards are left.
- With `restart_prob` (restarts, as a deep skill's training has them, `skills.env`) the generalist
  and manager stages keep, per env, the state where `restart_from`'s success conditions (by default
  the run's target) first held in a fresh-world episode, and start a finished episode there with
  that probability (between options, its time step and achievements as they were), an env without
  one borrowing another's (`envs.vec`). A flat agent that seldom reaches a deep state practises
  little of what follows it; the library's conditions say which states are deep. Evaluation always
  starts from fresh worlds.

`ManagerTrainer` builds the PPO program; the scheduler runs it after chain fine-tuning, in chunks of
`updates_per_round` updates, checkpointed like every stage, and saves the manager under
`RUN/manager/`. `ManagedAgent` plays the result from fresh worlds for `skills eval`.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import distrax
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_hier.algorithms.ppo import ROLLOUT_AXES
from jaxrl_hier.envs.base import Environment
from jaxrl_hier.envs.spaces import Discrete
from jaxrl_hier.networks.actor_critic import ACTIVATIONS
from jaxrl_hier.logging.episode_gif import record_episode
from jaxrl_hier.skills.chain import chain_target
from jaxrl_hier.skills.composition import EpisodeStats, choose_target, play_episodes
from jaxrl_hier.skills.env import Conditions, capture_anchor, conditions_hold, route
from jaxrl_hier.skills.moe import init_mlp, mixture_apply_active, mixture_for, mlp_apply, stack_experts
from jaxrl_hier.skills.ppo_stage import PPOStage
from jaxrl_hier.skills.spec import Condition, Skill, SkillError, SkillLibrary
from jaxrl_hier.skills.trainer import load_expert, save_expert

MANAGER_DIR = "manager"
GENERALIST_DIR = "generalist"  # the manager pre-trained with the skills closed (`generalist_timesteps`)
MASKED = -1e9  # the logit of an option that may not start: finite, so entropies stay finite


@struct.dataclass
class Options:
    """One row per option (a completed skill): what ends it and how it routes its closure."""

    success: Conditions  # [K, C]: the skill's success conditions (termination; initiation where they fail)
    plan: Conditions  # [K, E, C]: its dependencies' conditions, dependencies first (`skills.env.route`)
    plan_len: jax.Array  # int32[K]: number of dependencies
    needs: jax.Array  # bool[K, E + 1, E] (`skills.env.route`)
    rows: jax.Array  # int32[K, E + 1]: bank row of each plan position; position plan_len is the skill itself


@struct.dataclass
class ManagerParams:
    base: Any
    options: Options
    option_steps: jax.Array  # int32: an option ends after this many base steps
    features: Conditions | None = None  # [F, C]: success conditions the network reads (`features`), if any
    anchor: Conditions | None = None  # [C]: the success conditions whose first state restarts keep, if any
    teacher: Options | None = None  # one row: the generalist's teacher (`manager.kickstart`), if any
    teach_when: Conditions | None = None  # [C]: where else the teacher teaches (`manager.kickstart_when`), if any


@struct.dataclass
class ManagerState:
    base: Any
    option: jax.Array  # int32: the running option, -1 between options
    steps: jax.Array  # int32: base steps the running option has taken
    # With restarts only (else None): this episode began from an anchor; the anchor's conditions have
    # held in it; the base state and observation where they first held in the latest fresh-world
    # episode, and whether there is one (`skills.env.capture_anchor`).
    restarted: Any = None
    passed: Any = None
    anchor: Any = None
    anchor_obs: Any = None
    has_anchor: Any = None


def option_bank_names(library: SkillLibrary, names: Sequence[str]) -> list[str]:
    """The experts the options need: each option's closure and the skill itself, each once."""
    out: list[str] = []
    for name in names:
        for skill in (*library.closure(name), name):
            if skill not in out:
                out.append(skill)
    return out


def build_options(skill_env: Any, library: SkillLibrary, names: Sequence[str], bank_names: Sequence[str]) -> Options:
    """Host arrays of the options `names` over the expert bank `bank_names` (`option_bank_names`)."""
    if not names:
        raise SkillError("the manager has no skills to choose from.")
    rows = []
    params = [skill_env.skill_params(library, n) for n in names]
    for name, p in zip(names, params):
        plan = list(library.closure(name))
        own = bank_names.index(name)
        rows.append([bank_names.index(d) for d in plan] + [own] * (skill_env.max_experts + 1 - len(plan)))
    stack = lambda *xs: np.stack([np.asarray(x) for x in xs])  # noqa: E731
    return Options(success=jax.tree.map(stack, *[p.success for p in params]),
                   plan=jax.tree.map(stack, *[p.plan for p in params]),
                   plan_len=np.array([p.plan_len for p in params], np.int32),
                   needs=np.stack([p.needs for p in params]), rows=np.array(rows, np.int32))


def feature_skills(library: SkillLibrary, wanted: Sequence[str]) -> list[str]:
    """The skills whose conditions the manager reads (config `manager.features`; "all": the library's)."""
    return list(library.names) if tuple(wanted) == ("all",) else [library[s].name for s in wanted]


def build_features(skill_env: Any, library: SkillLibrary, names: Sequence[str]) -> Conditions | None:
    """Host [F, C] success conditions of the feature skills `names`; None for none."""
    return skill_env.conditions([library[n] for n in names]) if names else None


def each_holds(q: jax.Array, conditions: Conditions) -> jax.Array:
    """bool[K]: each row of the [K, C] `conditions` holds for the quantity vector `q`."""
    return jax.vmap(conditions_hold, in_axes=(None, 0))(q, conditions)


def option_holds(q: jax.Array, options: Options) -> jax.Array:
    """bool[K]: each option's skill conditions hold for the quantity vector `q`."""
    return each_holds(q, options.success)


def acting_rows(q: jax.Array, options: Options) -> jax.Array:
    """int32[K]: the bank row of the expert each option would run now (its route, `skills.env.route`)."""
    position = jax.vmap(route, in_axes=(None, 0, 0, 0))(q, options.plan, options.plan_len, options.needs)
    return jnp.take_along_axis(options.rows, position[:, None], axis=1)[:, 0]


class ManagerEnv(Environment):
    """The base env under options; an action is choice * A + base action (see the module docstring).
    With `primitives` the choices are the K skills and then the A base actions, each a one-step option.
    `closed`: no skill may be chosen (the generalist stage); the observation's `choices`, which the
    manager's network reads, still show what the open manager could choose."""

    def __init__(self, skill_env: Any, num_actions: int, primitives: bool = False, closed: bool = False,
                 restart_prob: float = 0.0):
        if closed and not primitives:
            raise SkillError("a manager with its skills closed needs its base actions (primitives).")
        if not 0.0 <= restart_prob < 1.0:
            raise SkillError(f"restart_prob must lie in [0, 1), got {restart_prob}.")
        self.restart_prob = float(restart_prob)
        # VecEnv asks `restart` before handing out fresh worlds (see Environment.restart).
        self.restart = self._restart if restart_prob > 0 else None
        self.skill_env, self.base = skill_env, skill_env.base
        self.num_actions, self.primitives, self.closed = int(num_actions), bool(primitives), bool(closed)
        self.name = f"Manager({self.base.name})"
        self.achievement_names = tuple(getattr(self.base, "achievement_names", ()))

    def _observe(self, base_obs: Any, base_state: Any, option: jax.Array, params: ManagerParams) -> dict:
        q = self.skill_env.quantities(base_state)
        pending = ~option_holds(q, params.options)
        free = jnp.where(pending.any(), pending, True)  # every skill holds: any option may run
        rows = acting_rows(q, params.options)
        if self.primitives:  # every base action may always be taken; it has no expert row
            free = jnp.concatenate([free, jnp.ones(self.num_actions, bool)])
            rows = jnp.concatenate([rows, jnp.zeros(self.num_actions, rows.dtype)])
        running = option >= 0  # only a skill runs past its first step
        mask = jnp.where(running, jnp.arange(free.shape[0]) == option, free)
        allowed = mask & (jnp.arange(free.shape[0]) >= params.options.plan_len.shape[0]) if self.closed else mask
        obs = {"obs": base_obs, "action_mask": allowed, "choices": mask, "rows": rows, "running": running}
        if params.features is not None:  # the skills still to do, as inputs
            obs["features"] = ~each_holds(q, params.features)
        if params.teacher is not None:  # the teacher's expert now, and whether it teaches here
            obs["teacher_row"] = acting_rows(q, params.teacher)[0]
            teaching = ~option_holds(q, params.teacher)[0]  # its skill is still to do
            if params.teach_when is not None:
                teaching &= conditions_hold(q, params.teach_when)
            obs["teaching"] = teaching
        return obs

    def reset(self, key: jax.Array, params: ManagerParams):
        base_obs, base_state = self.base.reset(key, params.base)
        option = jnp.int32(-1)
        state = ManagerState(base_state, option, jnp.int32(0))
        if self.restart is not None:
            passed = conditions_hold(self.skill_env.quantities(base_state), params.anchor)
            state = state.replace(restarted=jnp.bool_(False), passed=passed, anchor=base_state, anchor_obs=base_obs,
                                  has_anchor=jnp.bool_(False))
        return self._observe(base_obs, base_state, option, params), state

    def step(self, key: jax.Array, state: ManagerState, action: jax.Array, params: ManagerParams):
        option, base_action = action // self.num_actions, action % self.num_actions
        base_obs, base_state, reward, terminated, truncated, info = self.base.step(key, state.base, base_action,
                                                                                   params.base)
        steps = jnp.where(state.option == option, state.steps, 0) + 1
        q = self.skill_env.quantities(base_state)
        num_skills = params.options.plan_len.shape[0]
        skill = jnp.minimum(option, num_skills - 1)  # a primitive choice reads some row; it ends anyway
        holds = conditions_hold(q, jax.tree.map(lambda x: x[skill], params.options.success))
        ends = holds | (option >= num_skills) | (steps >= params.option_steps) | terminated | truncated
        option = jnp.where(ends, -1, option).astype(jnp.int32)
        new = state.replace(base=base_state, option=option, steps=jnp.where(ends, 0, steps).astype(jnp.int32))
        if self.restart is not None:
            # the first state of a fresh-world episode where the anchor's conditions hold
            passed = conditions_hold(q, params.anchor)
            capture = passed & ~state.passed & ~state.restarted
            new = new.replace(passed=state.passed | passed, **capture_anchor(capture, base_state, base_obs, state))
        return self._observe(base_obs, base_state, option, params), new, reward, terminated, truncated, info

    def _restart(self, key: jax.Array, final: ManagerState, params: ManagerParams):
        """(obs, state, valid, want): the next episode from `final`'s anchor, between options (valid if
        it has one), wanted with probability `restart_prob` (`envs.vec`; the module docstring)."""
        want = jax.random.uniform(key) < self.restart_prob
        option = jnp.int32(-1)
        state = final.replace(base=final.anchor, option=option, steps=jnp.int32(0), restarted=jnp.bool_(True),
                              passed=jnp.bool_(True))
        return self._observe(final.anchor_obs, final.anchor, option, params), state, final.has_anchor, want

    def observation_space(self, params: ManagerParams):
        return self.base.observation_space(params.base)

    def num_choices(self, params: ManagerParams) -> int:
        return int(params.options.plan_len.shape[0]) + (self.num_actions if self.primitives else 0)

    def action_space(self, params: ManagerParams):
        return Discrete(self.num_choices(params) * self.num_actions)

    def achievements(self, state: ManagerState) -> jax.Array:
        return self.base.achievements(state.base)

    def render(self, state: ManagerState, params: ManagerParams) -> jax.Array:
        return self.base.render(state.base, params.base)


def masked_kl(where: jax.Array, log_p: jax.Array, log_q: jax.Array) -> jax.Array:
    """[N]: KL(p || q) of each row's log-probabilities [N, A] where `where`, else 0."""
    return jnp.where(where, (jnp.exp(log_p) * (log_p - log_q)).sum(-1), 0.0)


class OptionPolicy:
    """The manager's distribution over its choices with the chosen skill's expert inside `sample`.
    `log_prob` and `entropy` are the manager's alone: the expert is part of the option's dynamics.
    Choices from `num_skills` on are the manager's own base actions (`primitives`)."""

    def __init__(self, logits: jax.Array, rows: jax.Array,
                 expert_logits: Callable[[jax.Array, jax.Array], jax.Array] | None,
                 num_actions: int, num_skills: int, greedy_experts: bool = False):
        self.logits, self.rows, self.expert_logits = logits, rows, expert_logits
        self.num_actions, self.num_skills, self.greedy_experts = num_actions, num_skills, greedy_experts
        self.manager = distrax.Categorical(logits=logits)

    def _with_expert(self, option: jax.Array, key: jax.Array | None) -> jax.Array:
        own = option - self.num_skills  # the base action of a primitive choice
        if self.expert_logits is None:  # skills closed: every choice is a base action
            base = own
        else:
            row = jnp.take_along_axis(self.rows, option[:, None], axis=1)[:, 0]
            logits = self.expert_logits(row, option < self.num_skills)  # experts run on skill rows only
            base = jnp.argmax(logits, axis=-1) if key is None else jax.random.categorical(key, logits)
            base = jnp.where(option >= self.num_skills, own, base)
        return (option * self.num_actions + base).astype(jnp.int32)

    def sample(self, seed: jax.Array) -> jax.Array:
        k_option, k_expert = jax.random.split(seed)
        return self._with_expert(self.manager.sample(seed=k_option), None if self.greedy_experts else k_expert)

    def mode(self) -> jax.Array:
        """The manager's likeliest option, its expert's likeliest action."""
        return self._with_expert(jnp.argmax(self.logits, axis=-1), None)

    def log_prob(self, action: jax.Array) -> jax.Array:
        return self.manager.log_prob(action // self.num_actions)

    def entropy(self) -> jax.Array:
        return self.manager.entropy()


class TunedOptionPolicy(OptionPolicy):
    """`OptionPolicy` whose experts train with the manager (`manager.tune_experts`): the log-probability
    of an action is the manager's of its choice plus, on a step a skill acts, its expert's of the base
    action taken, so PPO's ratio and gradient cover both; `log_prob_and_penalty` adds each such step's
    KL of the expert to its frozen self (`reference_logits`), weighted by `expert_kl`. The entropy
    bonus stays the manager's: the KL is what holds the experts."""

    def __init__(self, logits: jax.Array, rows: jax.Array, expert_logits: Callable, reference_logits: Callable,
                 expert_kl: float, num_actions: int, num_skills: int):
        super().__init__(logits, rows, expert_logits, num_actions, num_skills)
        self.reference_logits, self.expert_kl = reference_logits, expert_kl

    def _tuned(self, action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """(choice, whether a skill acts, its bank row, the acting expert's log-probs [N, A]), each row."""
        option = action // self.num_actions
        skill = option < self.num_skills
        row = jnp.take_along_axis(self.rows, option[:, None], axis=1)[:, 0]
        return option, skill, row, jax.nn.log_softmax(self.expert_logits(row, skill), axis=-1)

    def _log_prob(self, action: jax.Array, option: jax.Array, skill: jax.Array, tuned: jax.Array) -> jax.Array:
        """The manager's log-prob of the choice plus, where a skill acts, its expert's of the base action."""
        base = (action % self.num_actions)[:, None]
        return self.manager.log_prob(option) + jnp.where(skill, jnp.take_along_axis(tuned, base, axis=1)[:, 0], 0.0)

    def _kl(self, skill: jax.Array, row: jax.Array, tuned: jax.Array) -> jax.Array:
        """Each row's KL of its acting expert to that expert's frozen self (0 where the manager acts)."""
        frozen = jax.nn.log_softmax(jax.lax.stop_gradient(self.reference_logits(row, skill)), axis=-1)
        return masked_kl(skill, tuned, frozen)

    def log_prob(self, action: jax.Array) -> jax.Array:
        # the rollout's call: the frozen experts' reference is not needed here
        option, skill, _, tuned = self._tuned(action)
        return self._log_prob(action, option, skill, tuned)

    def kl(self, action: jax.Array) -> jax.Array:
        """[N]: each step's KL of its acting expert to that expert's frozen self (0 where the manager acts)."""
        _, skill, row, tuned = self._tuned(action)
        return self._kl(skill, row, tuned)

    def log_prob_and_penalty(self, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        option, skill, row, tuned = self._tuned(action)
        return self._log_prob(action, option, skill, tuned), self.expert_kl * self._kl(skill, row, tuned)


class KickstartPolicy(OptionPolicy):
    """The generalist's distribution (skills closed) with a teacher: `log_prob_and_penalty` adds, on
    each step where the teacher teaches (`open_`: its skill does not hold yet, and `kickstart_when`
    does), `weight` times the KL from the
    expert its chain routes to (`teacher_logits`, as the composed agent would act) to the generalist's
    policy over base actions (`manager.kickstart`)."""

    def __init__(self, logits: jax.Array, rows: jax.Array, open_: jax.Array, teacher_logits: Callable[[], jax.Array],
                 weight: jax.Array, num_actions: int, num_skills: int):
        # teacher_logits: () -> [N, A], run only where the KL is priced (the loss, not the rollout)
        super().__init__(logits, rows, None, num_actions, num_skills)
        self.open, self.teacher_logits, self.weight = open_, teacher_logits, weight

    def kl(self) -> jax.Array:
        """[N]: the teacher's KL to the generalist's base-action policy where its skill is to do, else 0."""
        student = jax.nn.log_softmax(self.logits[:, self.num_skills:], axis=-1)
        teacher = jax.nn.log_softmax(jax.lax.stop_gradient(self.teacher_logits()), axis=-1)
        return masked_kl(self.open, teacher, student)

    def log_prob_and_penalty(self, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        return self.log_prob(action), self.weight * self.kl()


class ManagerPolicy:
    """Manager actor and critic MLPs over [observation, open choices, running]; the frozen expert bank
    in the `experts` variable collection. Duck-types a Flax module for `algorithms.ppo`. `closed`: the
    skills are closed (`ManagerEnv`), so no expert acts. `tune`: the parameters also hold a copy
    of the bank (`params["experts"]`) that acts and trains, the frozen bank its KL reference
    (`TunedOptionPolicy`); a parameter tree with such a copy acts through it whatever `tune` says.
    `teacher`: with `closed`, the env's teacher (`ManagerParams.teacher`) teaches the generalist
    (`KickstartPolicy`), with the weight in the `kickstart` variable collection."""

    def __init__(self, bank: Any, num_skills: int, num_choices: int, num_actions: int, hidden_size: int,
                 num_layers: int, activation: str, dispatch: str = "gather", greedy_experts: bool = False,
                 closed: bool = False, sync_axes: tuple[str, ...] = (), tune: bool = False, expert_kl: float = 0.0,
                 teacher: bool = False):
        # num_choices: `ManagerEnv.num_choices`, the skills and, with `primitives`, the base actions
        self.bank, self.num_skills, self.num_choices, self.num_actions = bank, num_skills, num_choices, num_actions
        self.hidden_size, self.num_layers, self.activation = hidden_size, num_layers, activation
        self.dispatch, self.greedy_experts, self.closed = dispatch, greedy_experts, closed
        self.sync_axes = sync_axes  # the mapped axes it acts under (`skills.moe.mixture_apply_active`)
        if tune and (closed or greedy_experts):
            raise SkillError("tuned experts need the skills open and sampled experts (greedy_experts: false).")
        self.tune, self.expert_kl = tune, float(expert_kl)
        if teacher and not closed:
            raise SkillError("a teacher teaches the generalist: it needs the skills closed.")
        self.teacher = bool(teacher)

    @staticmethod
    def _inputs(obs: dict) -> tuple[jax.Array, jax.Array]:
        """(the flat observation [N, O] the experts read, the networks' input [N, D]: that observation,
        the open choices, running, and `features` if the env gives them)."""
        x = obs["obs"].reshape(obs["obs"].shape[0], -1).astype(jnp.float32)
        extra = [obs["choices"], obs["running"][:, None]] + ([obs["features"]] if "features" in obs else [])
        return x, jnp.concatenate([x, *(e.astype(x.dtype) for e in extra)], axis=-1)

    def loss_inputs(self, extra: dict, obs: dict) -> dict:
        """`obs` with the teacher's logits (`teacher_logits`, [N, A]) where the generalist has a teacher,
        else as it is. PPO calls this once per rollout (`PPO._with_loss_inputs`): the teacher is frozen,
        so its logits serve every epoch, where the loss would run its expert on every minibatch. Once
        the weight is 0 (`kickstart_timesteps` past) the expert runs on no row: the logits are 0, and
        the loss prices them at 0."""
        if not (self.closed and self.teacher):
            return obs
        expert = self._experts(extra["experts"]["actor"], self._inputs(obs)[0])
        priced = obs["teaching"] & (extra["kickstart"]["weight"] > 0)
        return {**obs, "teacher_logits": expert(obs["teacher_row"], priced)}

    def _experts(self, bank: Any, x: jax.Array) -> Callable[[jax.Array, jax.Array], jax.Array]:
        """(rows, active) -> logits [N, A]: row i through bank row rows[i] where active[i], else 0."""
        return partial(mixture_apply_active, bank, x, act=ACTIVATIONS[self.activation], mix=mixture_for(self.dispatch),
                       sync_axes=self.sync_axes)

    def init(self, key: jax.Array, obs: dict) -> dict:
        din = int(jax.eval_shape(self._inputs, obs)[1].shape[-1])
        k_actor, k_critic = jax.random.split(key)
        hidden = [self.hidden_size] * self.num_layers
        bank = jax.tree.map(jnp.asarray, self.bank)
        params = {"actor": init_mlp(k_actor, [din, *hidden, self.num_choices], 0.01),
                  "critic": init_mlp(k_critic, [din, *hidden, 1], 1.0)}
        variables = {"params": {**params, "experts": bank} if self.tune else params, "experts": {"actor": bank}}
        if self.teacher:  # the trainer sets the weight chunk by chunk (ManagerTrainer.train)
            variables["kickstart"] = {"weight": jnp.float32(0.0)}
        return variables

    def apply(self, variables: dict, obs: dict):
        act = ACTIVATIONS[self.activation]
        params, frozen = variables["params"], variables["experts"]["actor"]
        x, features = self._inputs(obs)
        logits = jnp.where(obs["action_mask"], mlp_apply(params["actor"], features, act), MASKED)
        value = mlp_apply(params["critic"], features, act)[:, 0]
        # the experts run only when an action is sampled or priced, on the rows whose choice is a skill
        experts = partial(self._experts, x=x)

        if self.closed and self.teacher:  # no expert acts; the teacher's logits are the loss's (`loss_inputs`)
            def teacher_logits() -> jax.Array:
                if "teacher_logits" in obs:
                    return obs["teacher_logits"]
                return experts(frozen)(obs["teacher_row"], obs["teaching"])

            return KickstartPolicy(logits, obs["rows"], obs["teaching"], teacher_logits,
                                   variables["kickstart"]["weight"], self.num_actions, self.num_skills), value
        if self.closed:  # no expert ever runs
            return OptionPolicy(logits, obs["rows"], None, self.num_actions, self.num_skills), value

        acting = experts(params.get("experts", frozen))
        if self.tune:
            return TunedOptionPolicy(logits, obs["rows"], acting, experts(frozen), self.expert_kl,
                                     self.num_actions, self.num_skills), value
        return OptionPolicy(logits, obs["rows"], acting, self.num_actions, self.num_skills, self.greedy_experts), value


def with_skill_prior(policy: ManagerPolicy, params: dict, extra: dict, obs: dict, prior: float) -> dict:
    """`params` (leading seed axis of 1) with the skills' output bias set so that, in the states `obs`
    (the runner's first observations), the skills take about `prior` of the choice probability in all.
    The bias b is one number for every skill: log sum_a exp(base logit a), averaged over the states,
    plus log(prior / ((1 - prior) K)), so a state at that average gives each skill exp(b) against the
    base actions' total. The skills' kernel columns are untouched: masked all through the generalist
    stage, they are still at their initialisation's small scale."""
    K = policy.num_skills
    batch = jax.tree.map(lambda x: x[0].reshape(-1, *x.shape[3:]), obs)
    one = jax.tree.map(lambda x: x[0], params)
    logits = policy.apply({"params": one, **jax.tree.map(lambda x: x[0], extra)}, batch)[0].logits
    base = jax.nn.logsumexp(logits[:, K:], axis=-1).mean()
    bias = base + jnp.log(prior / ((1.0 - prior) * K))
    actor = list(params["actor"])
    actor[-1] = {**actor[-1], "bias": actor[-1]["bias"].at[:, :K].set(bias)}
    return {**params, "actor": actor}


def teach_when(skill_env: Any, conditions: Sequence[Condition]) -> Conditions | None:
    """Host [C] conditions where the teacher teaches (`manager.kickstart_when`); None for none."""
    if not conditions:
        return None
    where = Skill("kickstart_when", success=tuple(conditions))
    return jax.tree.map(lambda x: x[0], skill_env.conditions([where]))


def kickstart_teacher(library: SkillLibrary, names: Sequence[str], experts: dict, target: str,
                      kickstart_from: str = "completed") -> str:
    """The skill whose chain teaches the generalist (`manager.kickstart`). "completed": the composed
    agent's choice among the options `names` (the target, or where its skill failed the deepest option
    towards it). "attempted": the same choice among every skill whose chain has experts in `experts`,
    which then holds each failed skill's last attempt too (`skills.chain.failed_experts`)."""
    if kickstart_from == "attempted":
        return chain_target(library, list(experts), target)
    return choose_target(library, list(names), target)


def manager_skills(library: SkillLibrary, wanted: Sequence[str], experts: dict) -> list[str]:
    """The options of a run: `wanted` ("all": every skill with an expert, in library order) among the
    skills that have an expert for themselves and their whole closure."""
    usable = [s for s in library.names if s in experts and all(d in experts for d in library.closure(s))]
    return usable if tuple(wanted) == ("all",) else [s for s in wanted if s in usable]


class ManagerTrainer(PPOStage):
    """PPO over a `ManagerEnv` whose options are `names`; `experts` maps skill -> expert (`skills.moe` trees).
    `closed`: the generalist stage (skills closed), taught with `manager.kickstart` by the chain of
    `kickstart_teacher(..., experts, ...)`, whose experts join the bank; `start`: parameters to begin
    from (the generalist's, `result(...)["manager"]`) instead of a fresh initialisation; `ppo`: the
    stage's PPO settings where they are not `config.manager_ppo_config(closed)` (an ablation's
    schedule, say)."""

    def __init__(self, config: Any, skill_env: Any, base_params: Any, library: SkillLibrary, experts: dict,
                 names: Sequence[str], closed: bool = False, start: Any = None, ppo: Any = None):
        self.names, self.start = list(names), None
        self.kickstart = config.manager.kickstart if closed else 0.0
        self.teacher = kickstart_teacher(library, self.names, experts, config.target,
                                         config.manager.kickstart_from) if self.kickstart else None
        # the options' experts, then the teacher's where it is not an option (the bank's rows are
        # the experts' order, so the options' rows are the same with or without it)
        self.bank_names = option_bank_names(library, self.names + ([self.teacher] if self.teacher else []))
        options = build_options(skill_env, library, self.names, self.bank_names)
        teacher = build_options(skill_env, library, [self.teacher], self.bank_names) if self.teacher else None
        ppo = ppo or config.manager_ppo_config(closed)
        num_actions = int(skill_env.base.action_space(base_params).n)
        env = ManagerEnv(skill_env, num_actions, config.manager.primitives, closed, config.manager.restart_prob)
        self.features = feature_skills(library, config.manager.features)
        restart_from = config.manager_restart_from  # "": fresh worlds only (restart_prob 0)
        anchor = jax.tree.map(lambda x: x[0], skill_env.conditions([library[restart_from]])) if restart_from else None
        params = ManagerParams(base_params, options, np.int32(config.manager.option_steps),
                               build_features(skill_env, library, self.features), anchor, teacher,
                               teach_when(skill_env, config.manager.teach_conditions) if teacher else None)
        tune = config.manager.tune_experts and not closed
        bank = stack_experts([experts[s]["actor"] for s in self.bank_names])
        policy = ManagerPolicy(bank, len(self.names), env.num_choices(params), num_actions, ppo.hidden_size,
                               ppo.num_layers, ppo.activation, config.manager.dispatch, config.manager.greedy_experts,
                               closed, ROLLOUT_AXES, tune, config.manager.expert_kl, teacher is not None)
        super().__init__(config, ppo, env, params, policy)
        if start is not None:
            self.begin_from(start)

    def begin_from(self, params: dict) -> None:
        """Start the stage from `params` (the generalist's, `generalist_like`) instead of a fresh
        initialisation; with tuned experts, the bank as the skills trained it joins them."""
        self.start = {**params, "experts": jax.tree.map(np.asarray, self.policy.bank)} if self.policy.tune else params

    def init(self, key: jax.Array) -> Any:
        # From `start` PPO.init lays the parameters out on the mesh like the rest of the runner (jit
        # caches on the exact sharding); the optimiser's state is fresh either way.
        runner = self.ppo.init(key, params=self.start)
        prior = self.config.manager.skill_prior
        if self.start is None or not prior or self.env.closed:
            return runner
        params = with_skill_prior(self.policy, runner.train_state.params, runner.extra_variables, runner.obs, prior)
        runner = runner.replace(train_state=runner.train_state.replace(params=params))
        # the prior's update runs outside PPO's program: put back on PPO's layout, or the stage's
        # program would compile again for its second chunk (on Craftax 100 s)
        return jax.device_put(runner, self.ppo.shardings(runner))

    def kickstart_weight(self, runner: Any) -> float:
        """The teacher's weight for the runner's next chunk: `manager.kickstart` falling linearly to 0
        over `manager.kickstart_timesteps` env steps (0: the generalist stage's), from the updates the
        runner has done."""
        done = int(jax.device_get(runner.update)[0]) * self.config.steps_per_update
        return self.kickstart * max(0.0, 1.0 - done / self.kickstart_span)

    @property
    def kickstart_span(self) -> int:
        """Env steps over which the teacher's weight falls to 0: `manager.kickstart_timesteps`, or the
        whole generalist stage."""
        m = self.config.manager
        return m.kickstart_timesteps or m.generalist_timesteps

    def train(self, runner: Any) -> tuple[Any, dict, float]:
        if self.kickstart:  # set outside the program: a new weight recompiles nothing
            weight = jnp.full((1,), self.kickstart_weight(runner), jnp.float32)
            extra = {**runner.extra_variables, "kickstart": {"weight": weight}}
            runner = jax.device_put(runner.replace(extra_variables=extra), self.ppo.shardings(runner))
        return super().train(runner)

    def params_like(self) -> dict:
        """Host zeros shaped as the manager's parameters (the restore target of a saved manager)."""
        obs = jax.eval_shape(lambda k: self.env.reset(k, self.params)[0], jax.random.key(0))
        batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((1, *x.shape), x.dtype), obs)
        shapes = jax.eval_shape(lambda k, o: self.policy.init(k, o)["params"], jax.random.key(0), batch)
        return {"manager": jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes)}

    def generalist_like(self) -> dict:
        """`params_like` of the generalist this stage starts from: the manager's network alone."""
        like = self.params_like()
        return {"manager": {k: v for k, v in like["manager"].items() if k != "experts"}}

    def result(self, runner: Any) -> dict:
        """The manager's own parameters (host arrays), for `save_manager`."""
        return {"manager": jax.tree.map(lambda x: np.asarray(x[0]), runner.train_state.params)}


def save_manager(run_dir: Path, params: dict, meta: dict, dirname: str = MANAGER_DIR) -> None:
    """The trained manager under RUN/manager/expert (the generalist: RUN/generalist/expert), one Orbax
    checkpoint, finalised atomically."""
    save_expert(Path(run_dir) / dirname, params, meta)


def load_manager(run_dir: Path, like: dict, dirname: str = MANAGER_DIR) -> dict:
    return load_expert(Path(run_dir) / dirname, like)


@struct.dataclass
class Managed:
    """What `ManagedAgent` plays: the env params with the options, the manager's parameters and the
    expert bank, and the conditions the report watches."""

    params: ManagerParams
    variables: dict  # {"params": manager actor and critic, "experts": {"actor": bank}}
    watch: Conditions  # [W, C]


class ManagedAgent:
    """Plays a trained manager over its experts from fresh worlds; the same interface as
    `skills.composed.ComposedAgent` (`evaluate`, `episode_frames`), so `write_report` serves both."""

    def __init__(self, trainer: ManagerTrainer):
        self.env, self.policy = trainer.env, trainer.policy
        self.skill_env = trainer.env.skill_env
        self.bank_names, self.num_skills = trainer.bank_names, len(trainer.names)
        self.labels = [f"{o} ({e})" for o in trainer.names for e in trainer.bank_names] + ["manager (base action)"]
        self._evaluate = jax.jit(self._play, static_argnums=(2, 3, 4))

    def managed(self, trainer: ManagerTrainer, manager_params: dict, watch: Conditions) -> Managed:
        variables = {"params": manager_params, "experts": {"actor": self.policy.bank}}
        return jax.tree.map(jnp.asarray, Managed(trainer.params, variables, watch))

    def actions(self, managed: Managed, obs: dict, key: jax.Array, greedy: bool) -> tuple[jax.Array, jax.Array]:
        """(actions [N] for `ManagerEnv`, label index [N]: option * bank size + acting bank row, or the
        last label where the manager took a base action itself)."""
        pi, _ = self.policy.apply(managed.variables, obs)
        action = pi.mode() if greedy else pi.sample(seed=key)
        option = action // self.env.num_actions
        row = jnp.take_along_axis(obs["rows"], option[:, None], axis=1)[:, 0]
        label = jnp.where(option >= self.num_skills, len(self.labels) - 1, option * len(self.bank_names) + row)
        return action, label

    def act(self, managed: Managed, obs: dict, state: ManagerState, key: jax.Array,
            greedy: bool) -> tuple[jax.Array, jax.Array]:
        """`actions` as the played episodes take them (`play_episodes`, `record_episode`): a subclass
        that acts on the state too overrides this one."""
        return self.actions(managed, obs, key, greedy)

    def held(self, managed: Managed, state: ManagerState) -> jax.Array:
        return jax.vmap(lambda s: conditions_hold(self.skill_env.quantities(s), managed.watch))(state.base)

    def _play(self, managed: Managed, key: jax.Array, episodes: int, max_steps: int, greedy: bool) -> EpisodeStats:
        def act(obs, state, k):
            return self.act(managed, obs, state, k, greedy)

        return play_episodes(self.env, managed.params, act, lambda state: self.held(managed, state), key, episodes,
                             max_steps, len(self.labels))

    def evaluate(self, managed: Managed, key: jax.Array, episodes: int, max_steps: int, greedy: bool) -> EpisodeStats:
        return jax.tree.map(np.asarray, self._evaluate(managed, key, episodes, max_steps, greedy))

    def episode_frames(self, managed: Managed, key: jax.Array, max_steps: int, greedy: bool):
        """One episode's frames, label index ([T], into `labels`) and achievements, cut at its end."""
        return record_episode(self.env, managed.params,
                              lambda obs, state, k: self.act(managed, obs, state, k, greedy), key, max_steps)


__all__ = ["GENERALIST_DIR", "MANAGER_DIR", "Managed", "ManagedAgent", "ManagerEnv", "ManagerParams", "ManagerPolicy",
           "ManagerState", "ManagerTrainer", "OptionPolicy", "Options", "acting_rows", "build_features", "build_options", "each_holds",
           "feature_skills", "kickstart_teacher", "load_manager", "manager_skills", "option_bank_names", "option_holds", "save_manager",
           "with_skill_prior"]
