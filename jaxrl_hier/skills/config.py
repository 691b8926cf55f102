"""The skills run config: a frozen dataclass loaded from YAML (`configs/skills_*.yaml`), validated
at load so that a bad value stops the run before anything compiles."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxrl_hier.config import ConfigError, build_dataclass, load_config
from jaxrl_hier.skills.spec import Condition

CONFIG_FILE = "config.yaml"  # a skills run directory's config, written by `run`

GENERATORS = ("planner", "openai", "local_llm")
# The skills that may teach the generalist (`manager.kickstart_from`).
KICKSTART_FROM = ("completed", "attempted")


def _check_skill_list(key: str, names: tuple[str, ...]) -> None:
    """A list of skill names or "all" alone, each name once (the manager's `skills` and `features`)."""
    if "all" in names and len(names) > 1:
        raise ConfigError(f"'{key}' mixes \"all\" with names ({', '.join(names)}): give one or the other.")
    if len(set(names)) != len(names):
        raise ConfigError(f"'{key}' names a skill twice: {', '.join(names)}.")


def _named(names: tuple[str, ...]) -> tuple[str, ...]:
    """The skills a list names: none for "all"."""
    return () if names == ("all",) else names


@dataclass(frozen=True)
class ManagerConfig:
    """The learned manager over the completed skills (skills.manager), trained after the skills and the
    chain fine-tuning with the skills' PPO settings on the base env's own reward."""

    timesteps: int = 0  # env steps of the manager stage (0: no manager)
    # The skills it chooses among: "all" (every completed skill), or a list, which the planner then
    # also proposes and the scheduler trains (with their dependencies) besides the target's chain.
    skills: tuple[str, ...] = ("all",)
    # An option ends when its skill's conditions hold, with the episode, or after this many base steps:
    # a stuck option (no cow in sight) hands control back to the manager.
    option_steps: int = 64
    lr: float = 3e-4
    update_epochs: int = 0  # 0: the ppo section's
    ent_coef: float = 0.01
    dispatch: str = "gather"  # how the experts' rows are evaluated inside an option (skills.moe)
    greedy_experts: bool = False  # experts act greedily inside options (the manager still samples)
    # The manager may also take each base action itself, a one-step option trained on the base reward:
    # it covers what no skill does (a failed eat_cow) besides choosing skills.
    primitives: bool = False
    # With primitives: env steps of a generalist stage before the manager's, with every skill closed
    # (flat PPO on the base reward in the manager's network); the manager then starts from it with
    # the skills open (skills.manager). 0: the manager starts fresh. Counted in the run's env steps.
    generalist_timesteps: int = 0
    # The manager stage's rate falls linearly to 0 over its `timesteps`, as flat PPO's does over its
    # run; the generalist's stays constant (the manager continues from it). False: constant throughout.
    anneal_lr: bool = False
    # With a generalist: the skills' share of the manager's first choices. Their logits were masked
    # through the generalist stage, so they start beside its sharpened base actions and are seldom
    # sampled; a prior p sets the skills' output bias so that they take about p of the probability
    # in the states the manager stage starts from. 0: as initialised (logits near 0).
    skill_prior: float = 0.0
    # Skills of the library whose success conditions the manager's network also reads, one input each
    # (1 while the condition does not hold yet), beside the open choices: "all" (every skill of the
    # library), or a list. A skill named here needs no expert; the features only say how far the
    # episode has come along the library's tree. (): the choices alone.
    features: tuple[str, ...] = ()
    # Restarts of the generalist and manager stages (skills.manager, "Restarts"): the state where
    # `restart_from`'s success conditions first held in a fresh-world episode is kept, and a finished
    # episode starts from it with probability `restart_prob`, so the agent practises what follows a
    # deep step it seldom reaches. "": the run's target. 0: fresh worlds only (evaluation always is).
    restart_prob: float = 0.0
    restart_from: str = ""
    # The manager stage also trains the experts its options run, on the base reward in the states
    # where it calls them, each held near its frozen self by a KL penalty of this weight
    # (skills.manager, "Tuned experts"). False: the experts stay frozen.
    tune_experts: bool = False
    expert_kl: float = 0.1
    # With a generalist: the skills teach it (kickstarting, Schmitt et al. 2018). On the steps where the
    # run's target does not hold yet, its loss adds this weight times the KL from the target's chain
    # (the expert the composed agent's routing picks, as the target's option would act; where the
    # target's skill failed, the deepest skill towards it that `kickstart_from` allows) to the generalist's base-action
    # policy; the weight falls linearly to 0 over the generalist stage, so the generalist ends on the
    # base reward alone. 0: no teacher.
    kickstart: float = 0.0
    # The env steps over which the teacher's weight falls to 0; the rest of the generalist stage
    # trains on the base reward alone (where a teacher crowds out eating and drinking, the stage
    # has time to win them back). 0: the whole generalist stage.
    kickstart_timesteps: int = 0
    # Which skills may teach: "completed" (the manager's options), or "attempted", where a skill that
    # failed (most often its fresh-world bar) teaches from its last attempt's expert, which the
    # scheduler keeps, as chain fine-tuning starts from it. The teacher is then the deepest skill
    # towards the target whose chain has experts, whether or not it is an option.
    kickstart_from: str = "completed"
    # Where the teacher teaches, besides its target still to do: conditions on the env's named
    # quantities (as skills write theirs, e.g. "drink >= 3"), all of which must hold. The chain's
    # experts never eat, drink or sleep, so where a need runs low the generalist learns from the base
    # reward alone. (): wherever the target is still to do.
    kickstart_when: tuple[str, ...] = ()

    def validate(self) -> None:
        if self.timesteps < 0:
            raise ConfigError(f"'timesteps' must be >= 0 (0: no manager), got {self.timesteps}.")
        if not self.skills:
            raise ConfigError("'skills' is empty: list the skills the manager chooses among, or write \"all\" for "
                              "every completed skill.")
        for key in ("skills", "features"):
            _check_skill_list(key, getattr(self, key))
        if self.option_steps <= 0:
            raise ConfigError(f"'option_steps' must be positive, got {self.option_steps}.")
        if self.lr <= 0:
            raise ConfigError(f"'lr' must be positive, got {self.lr}.")
        if self.update_epochs < 0:
            raise ConfigError(f"'update_epochs' must be >= 0 (0: the ppo section's), got {self.update_epochs}.")
        if self.ent_coef < 0:
            raise ConfigError(f"'ent_coef' must be >= 0, got {self.ent_coef}.")
        if self.generalist_timesteps < 0:
            raise ConfigError(f"'generalist_timesteps' must be >= 0 (0: no generalist stage), got "
                              f"{self.generalist_timesteps}.")
        if self.generalist_timesteps and not self.primitives:
            raise ConfigError("'generalist_timesteps' needs 'primitives: true': the generalist is the manager's own "
                              "base actions.")
        if not 0.0 <= self.skill_prior < 1.0:
            raise ConfigError(f"'skill_prior' must be in [0, 1) (the skills' share of the first choices), got "
                              f"{self.skill_prior}.")
        if self.kickstart < 0:
            raise ConfigError(f"'kickstart' must be >= 0 (0: no teacher), got {self.kickstart}.")
        if self.kickstart and not self.generalist_timesteps:
            raise ConfigError("'kickstart' needs 'generalist_timesteps': the skills teach the generalist stage.")
        if self.kickstart_timesteps and not self.kickstart:
            raise ConfigError("'kickstart_timesteps' sets how long the teacher teaches, but 'kickstart' is 0 (no "
                              "teacher): set kickstart > 0 or drop kickstart_timesteps.")
        if self.kickstart_from not in KICKSTART_FROM:
            raise ConfigError(f"'kickstart_from' must be one of {', '.join(KICKSTART_FROM)}, got "
                              f"'{self.kickstart_from}'.")
        if self.kickstart_from != "completed" and not self.kickstart:
            raise ConfigError(f"'kickstart_from: {self.kickstart_from}' picks the teacher, but 'kickstart' is 0 (no "
                              "teacher): set kickstart > 0 or drop kickstart_from.")
        if self.kickstart_when and not self.kickstart:
            raise ConfigError("'kickstart_when' says where the teacher teaches, but 'kickstart' is 0 (no teacher): "
                              "set kickstart > 0 or drop kickstart_when.")
        self.teach_conditions  # each parses, or one clear error
        if not 0 <= self.kickstart_timesteps <= self.generalist_timesteps:
            raise ConfigError(f"'kickstart_timesteps' must lie in [0, generalist_timesteps] (0: the whole generalist "
                              f"stage), got {self.kickstart_timesteps} with generalist_timesteps "
                              f"{self.generalist_timesteps}.")
        if self.skill_prior and not self.generalist_timesteps:
            raise ConfigError("'skill_prior' needs 'generalist_timesteps': it sets where the skills start beside a "
                              "trained generalist.")
        if self.dispatch not in ("gather", "mask"):
            raise ConfigError(f"'dispatch' must be 'gather' or 'mask', got '{self.dispatch}'.")
        if not 0.0 <= self.restart_prob < 1.0:
            raise ConfigError(f"'restart_prob' must lie in [0, 1) (0: fresh worlds only), got {self.restart_prob}.")
        if self.expert_kl < 0:
            raise ConfigError(f"'expert_kl' must be >= 0 (0: no penalty), got {self.expert_kl}.")
        if self.tune_experts and self.greedy_experts:
            raise ConfigError("'tune_experts' trains the experts' sampled actions: set 'greedy_experts: false'.")

    @property
    def teach_conditions(self) -> tuple[Condition, ...]:
        """`kickstart_when`, parsed."""
        try:
            return tuple(Condition.parse(c) for c in self.kickstart_when)
        except ConfigError as err:
            raise ConfigError(f"'kickstart_when': {err}") from None

    @property
    def named_skills(self) -> tuple[str, ...]:
        """The skills the config names (none for "all")."""
        return _named(self.skills)

    @property
    def named_features(self) -> tuple[str, ...]:
        """The feature skills the config names (none for "all")."""
        return _named(self.features)


@dataclass(frozen=True)
class SkillsConfig:
    env: str = "Craftax-Classic-Symbolic-v1"
    # Fields of the base env's params to override, e.g. {max_steps: 300} for TechTree: a deep skill's
    # frozen dependencies use up much of an episode's time limit before its own expert acts.
    env_params: dict = field(default_factory=dict)
    library: str = ""  # built-in library name or a YAML file of skills; "" = the env's built-in one
    target: str = "collect_diamond"  # a skill name, or "all" (every skill of the library)
    generator: str = "planner"  # planner (offline) | openai (chat-completions endpoint) | local_llm
    llm_base_url: str = ""  # openai: e.g. http://127.0.0.1:8000/v1
    llm_model: str = ""
    llm_api_key_env: str = "OPENAI_API_KEY"  # the variable that holds the key (never the key itself)
    llm_timeout_s: float = 60.0
    llm_max_retries: int = 4
    llm_path: str = ""  # local_llm: a local Hugging Face directory
    max_parallel_skills: int = 3
    success_rate_threshold: float = 0.8
    min_episodes: int = 64  # reached episodes (pooled over the attempt's latest rounds) before a rate counts
    max_retries: int = 1
    skill_timesteps: int = 5_000_000  # budget of env steps per attempt of one skill
    # Per-skill budgets per attempt that replace skill_timesteps for the skills named ({eat_cow: 400000}):
    # a cheap skill the manager needs should not be able to spend a deep skill's budget failing.
    skill_budgets: dict = field(default_factory=dict)
    min_skill_timesteps: int = 0  # train at least this long before completing: a frozen expert that
    # barely passes the threshold caps every skill built on it, so let it improve first
    updates_per_round: int = 10  # PPO updates per compiled chunk; the scheduler acts between rounds
    max_experts: int = 12  # frozen dependency experts a skill can hold
    max_conditions: int = 4
    # Start this share of a skill's episodes where its own expert took control in an earlier episode,
    # not in a fresh world (see skills.env): a deep skill's own expert then gets most of the steps,
    # not its frozen dependencies. 0: always a fresh world.
    restart_prob: float = 0.0
    # Truncate a skill's training episode this many steps after its own expert first took control
    # (0: no cap, the base env's time limit): a stuck attempt then costs the cap, not the rest of the
    # episode (skills.env). The composed agent is not capped.
    max_attempt_steps: int = 0
    # Skill episodes each fresh world starts (the `ppo` section's `world_uses` for the skill slots
    # only; `reset_mode: pool`): a root skill's episodes end within a few steps, so generating Craftax
    # worlds is most of its rounds' time, and a world served to several episodes cuts it (envs/vec.py).
    # The generalist, manager and chain stages, and flat PPO beside them, keep the `ppo` section's.
    skill_world_uses: int = 1
    # With restarts: once a skill with dependencies passes `success_rate_threshold` (most of its
    # episodes restarted from anchors), its restarts stop and it trains on from fresh worlds only,
    # completing when its rate on the fresh-world episodes its own expert reached passes this
    # threshold (the states its frozen chain really hands it; skills.scheduler). 0: no such phase.
    fresh_success_rate_threshold: float = 0.0
    # Env steps of the fresh-world phase before its rate counts. A failed episode lasts the base env's
    # time limit and a success ends sooner; the failures that end in a round began a time limit
    # earlier, and those begun from anchors before the phase are not counted. So until every env has
    # run about two time limits into the phase, the ended episodes are mostly the quick successes
    # (TechTree: 1.00 one round into the phase for a skill whose steady rate was 0.77-0.82).
    # About num_envs x 2 x the time limit.
    fresh_min_timesteps: int = 0
    # Which skills run the fresh-world phase: "always" every skill with dependencies; "needed" only
    # one whose fresh-world episodes of the restart phase (about 1 - restart_prob of them, over the
    # latest rounds holding `min_episodes`) are below `fresh_success_rate_threshold` when it passes
    # with restarts, or too few to judge. On Craftax-Classic with restarts the chain's first skills
    # already pass from fresh worlds and the phase cost them 369k env steps (docs/skills.md).
    fresh_phase: str = "always"
    moe_dispatch: str = "gather"  # gather (only the routed expert runs) | mask (every expert, Flow-RL)
    # The frozen-expert bank a round trains with (skills.trainer): "fit" cuts it to the longest running
    # plan rounded up to a power of two (least arithmetic; a compile per new size), "max" keeps all
    # max_experts rows (one program per number of running skills). On one H200 a compile took 58-59 s
    # whatever the shape and the 12-row bank's round 2% longer than the 2-row one's
    # (benchmarks/results/h200/skills_compile/): "max" for the GPU.
    bank_shapes: str = "fit"
    max_rounds: int = 0  # stop after this many rounds in all (0: no limit); resume with a larger one goes on
    # Stop before the next round once this process has run this many seconds (0: no limit): a run
    # sized by wall time ("an hour on one H200"). Running skills stay running, as with max_rounds, and
    # `resume` gives the resumed process a budget of its own.
    max_wall_s: float = 0.0
    seed: int = 0
    stale_lock_s: float = 900.0  # a lock from another host whose heartbeat is older than this is stale
    # No progress (a skill start or a finished round) for this long: the run is stuck, its lock is
    # marked so and `resume` may take it over even while the process lives (skills.state). 0: off.
    stuck_after_s: float = 3600.0
    # The composed agent (skills.composed) at the end of the run: the completed skills' experts routed
    # towards the target, played greedy and sampled from this many fresh worlds (0: not evaluated).
    eval_episodes: int = 64
    eval_gif_steps: int = 300  # steps of the evaluation episode drawn to eval/episode.gif
    # The greedy evaluation logged beside each round's training rate (`greedy_success_rate`) steps
    # as many envs for as many steps as the round's rollouts: on Craftax it costs about as much env
    # time as the rollouts. Run it every this many rounds (0: never); it changes no training number.
    greedy_eval_every: int = 1
    # Chain fine-tuning (skills.chain), after the skills: the experts of the chain towards the target
    # (for "all", the deepest skill whose chain has experts, a failed skill's last attempt included)
    # trained together from fresh worlds on the chain's progress for this many env steps (0: off).
    chain_timesteps: int = 0
    chain_lr: float = 3e-4
    # PPO epochs per chain update (0: the ppo section's). On TechTree 2 epochs instead of 4 halve the
    # chain's time (1.2-1.3 s a chunk against 2.13 s) but lower the diamond on validation worlds from
    # 0.83 to 0.79 (mean of seeds 0-2; docs/skills.md, "Chain fine-tuning"), so the config keeps 4.
    chain_update_epochs: int = 0
    # The chain's expert dispatch. Every expert trains there, so `mask` pays every expert's backward
    # pass on every row; `gather` runs only the routed one. On a 2-core Intel Xeon @ 2.80GHz a
    # TechTree chunk of 8 experts took 2.12 s with gather, 2.57 s with mask, while in the skill rounds
    # (one trainable expert, vmapped slots) mask is the faster (benchmarks/skills/skills_chain_speed.py,
    # skills_compile.py).
    chain_moe_dispatch: str = "gather"
    # The learned manager (skills.manager), after the chain fine-tuning: a section of its own.
    manager: ManagerConfig = field(default_factory=ManagerConfig)
    ppo: dict = field(default_factory=dict)  # PPOConfig fields (num_envs, lr, hidden_size, ...)

    def validate(self) -> None:
        if self.generator not in GENERATORS:
            raise ConfigError(f"'generator' must be one of {list(GENERATORS)}, got '{self.generator}'.")
        if self.generator == "openai" and not (self.llm_base_url and self.llm_model):
            raise ConfigError("generator 'openai' needs 'llm_base_url' (e.g. http://127.0.0.1:8000/v1) and "
                              "'llm_model'.")
        if self.generator == "local_llm" and not self.llm_path:
            raise ConfigError("generator 'local_llm' needs 'llm_path', a local Hugging Face model directory.")
        for name in ("max_parallel_skills", "skill_timesteps", "updates_per_round", "max_experts",
                     "max_conditions", "min_episodes", "skill_world_uses"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"'{name}' must be positive, got {getattr(self, name)}.")
        if len(self.manager.kickstart_when) > self.max_conditions:
            raise ConfigError(f"'manager.kickstart_when' has {len(self.manager.kickstart_when)} conditions but "
                              f"max_conditions is {self.max_conditions}: raise max_conditions or give fewer.")
        for name, steps in self.skill_budgets.items():
            if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
                raise ConfigError(f"'skill_budgets.{name}' must be a positive integer (env steps per attempt), got "
                                  f"{steps!r}.")
        if not 0 <= self.min_skill_timesteps <= self.skill_timesteps:
            raise ConfigError(f"'min_skill_timesteps' must lie in [0, skill_timesteps], got {self.min_skill_timesteps}.")
        if self.max_attempt_steps < 0:
            raise ConfigError(f"'max_attempt_steps' must be >= 0 (0: no cap), got {self.max_attempt_steps}.")
        if not 0.0 <= self.restart_prob < 1.0:
            raise ConfigError(f"'restart_prob' must lie in [0, 1) (0: no restarts), got {self.restart_prob}.")
        if self.greedy_eval_every < 0:
            raise ConfigError(f"'greedy_eval_every' must be >= 0 (0: no greedy evaluation), got {self.greedy_eval_every}.")
        if self.eval_episodes < 0 or self.eval_gif_steps < 0:
            raise ConfigError(f"'eval_episodes' and 'eval_gif_steps' must be >= 0 (0: none), got "
                              f"{self.eval_episodes} and {self.eval_gif_steps}.")
        if not 0.0 <= self.fresh_success_rate_threshold <= 1.0:
            raise ConfigError(f"'fresh_success_rate_threshold' must lie in [0, 1] (0: no fresh-world phase), got "
                              f"{self.fresh_success_rate_threshold}.")
        if self.fresh_min_timesteps < 0:
            raise ConfigError(f"'fresh_min_timesteps' must be >= 0, got {self.fresh_min_timesteps}.")
        if self.fresh_success_rate_threshold > 0 and self.restart_prob == 0:
            raise ConfigError("'fresh_success_rate_threshold' ends a skill's restarts, but 'restart_prob' is 0 (no "
                              "restarts): every episode is already a fresh-world one. Set restart_prob > 0 or the "
                              "threshold to 0.")
        if self.fresh_phase not in ("always", "needed"):
            raise ConfigError(f"'fresh_phase' must be 'always' or 'needed', got '{self.fresh_phase}'.")
        if self.fresh_phase == "needed" and self.fresh_success_rate_threshold == 0:
            raise ConfigError("'fresh_phase: needed' chooses which skills run the fresh-world phase, but "
                              "'fresh_success_rate_threshold' is 0 (no phase). Set the threshold > 0 or remove "
                              "fresh_phase.")
        if self.chain_timesteps < 0:
            raise ConfigError(f"'chain_timesteps' must be >= 0 (0: no chain fine-tuning), got {self.chain_timesteps}.")
        if self.chain_lr <= 0:
            raise ConfigError(f"'chain_lr' must be positive, got {self.chain_lr}.")
        if self.chain_update_epochs < 0:
            raise ConfigError(f"'chain_update_epochs' must be >= 0 (0: the ppo section's), got "
                              f"{self.chain_update_epochs}.")
        if self.max_rounds < 0:
            raise ConfigError(f"'max_rounds' must be >= 0 (0: no limit), got {self.max_rounds}.")
        if self.max_wall_s < 0:
            raise ConfigError(f"'max_wall_s' must be >= 0 (0: no limit), got {self.max_wall_s}.")
        if self.stale_lock_s <= 0:
            raise ConfigError(f"'stale_lock_s' must be positive, got {self.stale_lock_s}.")
        if self.stuck_after_s < 0:
            raise ConfigError(f"'stuck_after_s' must be >= 0 (0: never judged stuck), got {self.stuck_after_s}.")
        if self.max_retries < 0:
            raise ConfigError(f"'max_retries' must be >= 0, got {self.max_retries}.")
        if not 0.0 < self.success_rate_threshold <= 1.0:
            raise ConfigError(f"'success_rate_threshold' must lie in (0, 1], got {self.success_rate_threshold}.")
        if self.bank_shapes not in ("fit", "max"):
            raise ConfigError(f"'bank_shapes' must be 'fit' or 'max', got '{self.bank_shapes}'.")
        for key in ("moe_dispatch", "chain_moe_dispatch"):
            if getattr(self, key) not in ("gather", "mask"):
                raise ConfigError(f"'{key}' must be 'gather' or 'mask', got '{getattr(self, key)}'.")
        if self.manager.restart_prob and not self.manager.restart_from and self.target == "all":
            raise ConfigError("'manager.restart_prob' restarts from the run's target, but 'target' is \"all\": name the "
                              "skill to restart from in 'manager.restart_from'.")
        reset_mode = self.ppo_config().reset_mode  # validates the ppo section
        if self.skill_world_uses > 1 and reset_mode != "pool":
            raise ConfigError(f"'skill_world_uses: {self.skill_world_uses}' needs 'ppo.reset_mode: pool' (got "
                              f"'{reset_mode}'): only the pool serves a world more than once.")
        if self.env_params:
            self.make_env()  # unknown fields: ConfigError naming them

    def make_env(self):
        """(base env, its params with `env_params` applied)."""
        from jaxrl_hier.envs import make

        return make(self.env, **self.env_params)

    def skill_ppo_config(self):
        """The PPOConfig of every skill slot: `ppo_config()` with `skill_world_uses` (checked with the
        section's `reset_mode` in `validate`)."""
        return dataclasses.replace(self.ppo_config(), world_uses=self.skill_world_uses)

    def ppo_config(self):
        """The skills' PPOConfig (env and seeds set from this config), the base of every stage's:
        `skill_ppo_config`, `chain_ppo_config`, `manager_ppo_config`."""
        from jaxrl_hier.algorithms.ppo import PPOConfig

        reserved = {"env", "num_seeds", "total_timesteps", "anneal_lr", "seed"}
        clash = reserved & set(self.ppo)
        if clash:
            raise ConfigError(f"'ppo.{sorted(clash)[0]}' is set by the skills config (env, max_parallel_skills, "
                              "skill_timesteps, seed); remove it from the ppo section.")
        if self.ppo.get("matmul_dtype", "float32") != "float32":
            # The experts, chain and manager are networks of their own (skills.moe); only flat PPO
            # beside them would take the setting, and the comparison would no longer be like for like.
            raise ConfigError(f"'ppo.matmul_dtype: {self.ppo['matmul_dtype']}' is for PPO's own MLP; the skills' "
                              "experts run float32 products. Remove it from the ppo section.")
        values: dict[str, Any] = {"eval_gif": False, **self.ppo, "env": self.env,
                                  "num_seeds": self.max_parallel_skills, "anneal_lr": False, "seed": self.seed}
        steps = values.get("num_envs", PPOConfig.num_envs) * values.get("num_steps", PPOConfig.num_steps)
        values["total_timesteps"] = max(self.skill_timesteps, steps)
        return build_dataclass(PPOConfig, values, source="skills config section 'ppo'")

    def chain_ppo_config(self):
        """The chain fine-tuning's PPOConfig (skills.chain): the skills' PPO settings, one seed, at
        `chain_lr` and `chain_update_epochs`, for `chain_timesteps` env steps."""
        ppo = self.ppo_config()
        return dataclasses.replace(ppo, num_seeds=1, lr=self.chain_lr,
                                   update_epochs=self.chain_update_epochs or ppo.update_epochs,
                                   total_timesteps=max(self.chain_timesteps, ppo.num_envs * ppo.num_steps))

    def manager_ppo_config(self, closed: bool = False):
        """The manager stage's PPOConfig (skills.manager): the skills' PPO settings, one seed, with the
        manager section's rate, epochs and entropy bonus. `closed`: the generalist stage's, whose rate
        is constant, so the number of its steps does not change its program."""
        ppo, m = self.ppo_config(), self.manager
        return dataclasses.replace(ppo, num_seeds=1, lr=m.lr, update_epochs=m.update_epochs or ppo.update_epochs,
                                   ent_coef=m.ent_coef, anneal_lr=m.anneal_lr and not closed,
                                   total_timesteps=max(m.timesteps, ppo.num_envs * ppo.num_steps))

    @property
    def manager_restart_from(self) -> str:
        """The skill whose success states the generalist and manager stages restart from ("": none)."""
        return (self.manager.restart_from or self.target) if self.manager.restart_prob else ""

    @property
    def steps_per_update(self) -> int:
        c = self.ppo_config()
        return c.num_envs * c.num_steps


def skills_config_from_dict(values: dict[str, Any], source: str = "config") -> SkillsConfig:
    return build_dataclass(SkillsConfig, values, source=source)


def replace(config: SkillsConfig, **changes: Any) -> SkillsConfig:
    out = dataclasses.replace(config, **changes)
    out.validate()
    return out


def saved_config(out: Path, overrides: list[str] | None = None) -> SkillsConfig:
    """The config a skills run directory was started with (its config.yaml), `overrides` applied."""
    if not (out / CONFIG_FILE).is_file():
        raise ConfigError(f"{out / CONFIG_FILE} is missing; it is written by `run`. Is {out} a skills run directory?")
    return load_config(SkillsConfig, out / CONFIG_FILE, overrides or [])
