"""A fast stand-in for `SkillTrainer` for the scheduler tests, and a planner that records what it
was asked. Success rates follow a script; the slots' state is checkpointed through the real
`Checkpointer` (Orbax, synchronous, keep=2, as `SkillTrainer` does), so a skipped or stale save
fails here the way it fails in a real run.

Also a small command line, so that tests can run a scheduler in a child process and kill it:
    python tests/skills/fake_skills_trainer.py OUTPUT_DIR [--resume] [key=value ...]
With BLOCK_ENV=N its N-th round blocks (the main thread parked, as in a hung XLA call) until the
file named by RELEASE_ENV exists, forever when that is unset (tests/skills/test_stuck_run.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

from jaxrl_hier.checkpointing.checkpoints import Checkpointer
from jaxrl_hier.config import parse_overrides
from jaxrl_hier.envs import make
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.skills.config import skills_config_from_dict
from jaxrl_hier.skills.generators import GeneratorUnavailable, TechTreePlanner
from jaxrl_hier.skills.library import techtree_library
from jaxrl_hier.skills.scheduler import Scheduler
from jaxrl_hier.skills.trainer import RoundResult, load_expert, quantities_for, save_expert, skill_env_and_policy

CHILD_LEARN_ROUNDS = 3  # the command line's trainer: skills run over several checkpoints
BLOCK_ENV = "FAKE_SKILLS_BLOCK_ROUND"
RELEASE_ENV = "FAKE_SKILLS_RELEASE_FILE"
QUANTITIES = tuple(quantities_for(make("TechTree-v0")[0], techtree_library()))


class Crash(Exception):
    pass


class FakeTrainer:
    """Success rate per round from a script; checkpoints through the real Checkpointer."""

    def __init__(self, slots=2, never=(), fail_first=(), crash_at=None, rates=None, learn_rounds=2, round_hook=None,
                 fresh_rates=None, restart_fresh_rates=None):
        self.slots, self.quantity_names = slots, QUANTITIES
        # name -> success rates, round by round, of its fresh-world phase (restart probability 0)
        self.fresh_rates = fresh_rates or {}
        # name -> the rate of its fresh-world episodes while restarts run (50 a round; none if unnamed)
        self.restart_fresh_rates = restart_fresh_rates or {}
        self.restart_probs: list[float] = [1.0] * slots  # 1.0: restarts as configured
        self.fresh_progress = [0] * slots  # rounds trained in the fresh-world phase
        self.restart_calls: list[tuple[str, float]] = []
        self.learn_rounds = learn_rounds  # a skill passes from its learn_rounds-th round on
        self.round_hook = round_hook  # called with the round number before each round (tests act there)
        self.never, self.fail_first, self.crash_at = set(never), set(fail_first), crash_at
        self.rates = rates or {}  # name -> success rate it stays at (overrides the script)
        self.slot_skill, self.progress = [None] * slots, [0] * slots
        self.starts: list[str] = []
        self.running_sets: list[tuple[str, ...]] = []
        self.greedy_evals: list[bool] = []  # train_round's greedy_eval flag, round by round
        self.rounds = 0
        self.restored: dict[str, int] = {}
        self._ckpt: Checkpointer | None = None

    def init(self, key):
        self.slot_skill, self.progress = [None] * self.slots, [0] * self.slots

    def start(self, slots, library, experts, key):
        for i, name in slots.items():
            missing = [d for d in library.closure(name) if d not in experts]
            assert not missing, f"{name} started without the experts of {missing}"
            self.slot_skill[i], self.progress[i], self.restart_probs[i] = name, 0, 1.0
            self.starts.append(name)

    def set_restart_prob(self, slot, prob):
        self.restart_probs[slot], self.fresh_progress[slot] = prob, 0
        self.restart_calls.append((self.slot_skill[slot], prob))

    def _rate(self, name, progress):
        if name in self.rates:
            return self.rates[name]
        if name in self.never or (name in self.fail_first and self.starts.count(name) == 1):
            return 0.1
        return 0.5 if progress < self.learn_rounds else 0.95

    def train_round(self, active=None, greedy_eval=True):
        self.rounds += 1
        self.greedy_evals.append(greedy_eval)
        if self.round_hook is not None:
            self.round_hook(self.rounds)
        if self.crash_at is not None and self.rounds == self.crash_at:
            raise Crash("simulated crash")
        self.running_sets.append(tuple(n for n in self.slot_skill if n))
        out = []
        for i, name in enumerate(self.slot_skill):
            self.progress[i] += 1
            result = RoundResult(self._rate(name, self.progress[i]) if name else None, 100, 1000, 1.0, 5.0)
            if name and self.restart_probs[i] == 0.0:  # the fresh-world phase: its own script
                script = self.fresh_rates.get(name, [0.95])
                rate = script[min(self.fresh_progress[i], len(script) - 1)]
                self.fresh_progress[i] += 1
                result = result._replace(fresh_success_rate=rate, fresh_episodes=50)
            elif name in self.restart_fresh_rates:
                result = result._replace(fresh_success_rate=self.restart_fresh_rates[name], fresh_episodes=50)
            out.append(result)
        return out

    def expert(self, slot):
        return {"skill": self.slot_skill[slot], "rounds": self.progress[slot]}

    def _checkpointer(self, directory):  # as SkillTrainer._checkpointer
        if self._ckpt is None or self._ckpt.directory != Path(directory).absolute():
            self._ckpt = Checkpointer(directory, keep=2, asynchronous=False)
        return self._ckpt

    def save_checkpoint(self, directory, step, meta):
        ckpt = self._checkpointer(directory)
        ckpt.save(step, {"progress": np.asarray(self.progress, np.int32)}, {**meta, "skills": self.slot_skill})
        ckpt.wait()

    def restore_checkpoint(self, directory, step):
        like = {"progress": np.zeros(self.slots, np.int32)}
        state, meta = self._checkpointer(directory).restore(step, like, {"round": step})
        self.slot_skill, self.progress = list(meta["skills"]), [int(p) for p in state["progress"]]
        self.restored = {n: p for n, p in zip(self.slot_skill, self.progress) if n}

    def save_expert(self, directory, expert, meta):
        if jax.process_index() == 0:  # as Orbax: in a multi-process run, process 0 writes
            atomic_write_json(Path(directory) / "expert.json", expert)

    def load_expert(self, directory):
        return json.loads((Path(directory) / "expert.json").read_text())


class RecordingPlanner(TechTreePlanner):
    def __init__(self, tree, fail_after=None, budgets=None):
        super().__init__(tree)
        self.contexts, self.fail_after = [], fail_after
        self.budgets = budgets or {}  # name -> max_timesteps the proposal asks for, as an LLM may

    def propose(self, context, validate):
        self.contexts.append(context)
        if self.fail_after is not None and len(self.contexts) > self.fail_after:
            raise GeneratorUnavailable("http://127.0.0.1:9/v1 unreachable after 4 retries")

        def with_budget(data):
            if data["name"] in self.budgets:
                data = {**data, "max_timesteps": self.budgets[data["name"]]}
            return validate(data)

        return super().propose(context, with_budget)


def config(**kw):
    values = dict(env="TechTree-v0", target="all", max_parallel_skills=2, skill_timesteps=3000, min_episodes=10,
                  max_retries=1, max_experts=8, max_conditions=2, success_rate_threshold=0.8)
    values.update(kw)
    return skills_config_from_dict(values)


def run(tmp_path, trainer, generator=None, resume=False, **kw):
    lib = techtree_library()
    sched = Scheduler(config(**kw), tmp_path, trainer, generator or RecordingPlanner(lib), lib)
    return sched.run(resume=resume)


def block_at(round_to_block: int, release: str | None):
    """A round hook that blocks round `round_to_block` until `release` exists (forever if None)."""

    def hook(n):
        if n == round_to_block:
            print(f"blocking round {n}", file=sys.stderr, flush=True)
            while release is None or not Path(release).exists():
                time.sleep(0.05)

    return hook


if __name__ == "__main__":
    out, *rest = sys.argv[1:]
    overrides = parse_overrides([a for a in rest if a != "--resume"])
    hook = block_at(int(os.environ[BLOCK_ENV]), os.environ.get(RELEASE_ENV)) if os.environ.get(BLOCK_ENV) else None
    state = run(Path(out), FakeTrainer(learn_rounds=CHILD_LEARN_ROUNDS, round_hook=hook), resume="--resume" in rest,
                **overrides)
    print(json.dumps({r.name: r.status for r in state.skills}))


class ExpertTrainer(FakeTrainer):
    """The fake trainer's scripted rates, with experts of the real policy's shapes saved for real."""

    def __init__(self, cfg, **kw):
        super().__init__(**kw)
        env, base_params, self.policy = skill_env_and_policy(cfg, techtree_library())
        self.obs_dim = int(np.prod(env.base.observation_space(base_params).shape))

    def expert(self, slot):
        seed = sum(map(ord, self.slot_skill[slot]))  # a different expert per skill, the same every run
        return jax.tree.map(np.asarray, self.policy.init_expert(jax.random.key(seed), self.obs_dim))

    def save_expert(self, directory, expert, meta):
        save_expert(directory, expert, meta)

    def load_expert(self, directory):
        return load_expert(directory, self.policy.expert_zeros(self.obs_dim))
