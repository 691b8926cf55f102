"""The crash-safe skill scheduler: a DAG of skills trained in slots, state on disk after every step.

Loop (Python, between compiled rounds):
1. generate: ask the generator for skills while slots would otherwise go idle; pause while a
   proposal waits on skills still training (frontier blocking), resume when they complete; stop
   cleanly (keeping all work) if the generator is unavailable;
2. fail pending skills whose dependencies failed (skills that do not depend on them go on);
3. start ready skills (all dependencies completed) in free slots, with their dependencies' frozen
   experts;
4. train one round (`updates_per_round` PPO updates of every slot, one compiled program);
5. a skill completes when its success rate reaches `success_rate_threshold`: over its latest
   rounds holding at least `min_episodes` episodes in which its own expert took control (one round
   is enough when it has that many; a deep skill's episodes are long and fewer reach it; see
   `SkillEnv`), after at least `min_skill_timesteps` steps: its expert is saved and it
   is never trained again; an attempt fails when its budget runs out (`skill_timesteps`, or the
   smaller `max_timesteps` its proposal asked for) and is retried up to `max_retries` times;
6. checkpoint the slots, then write `scheduler_state.json` atomically.

After a crash, `resume` restores the slots from the checkpoint named in the state file and deletes
later checkpoints (the rounds after it are replayed, and Orbax never overwrites a step); skills
that started after that checkpoint start again, completed skills are loaded, never retrained.
In a multi-process JAX run every process runs this loop; only process 0 writes files and locks.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import jax

from jaxrl_hier.checkpointing.checkpoints import Checkpointer
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.logging.metrics import MetricsWriter
from jaxrl_hier.runs import is_primary
from jaxrl_hier.skills.generators import Generator, GeneratorUnavailable, ProposalContext, make_validator
from jaxrl_hier.skills.spec import Skill, SkillLibrary
from jaxrl_hier.skills.state import (RunLock, SchedulerState, SkillRecord, crash_point, load_state, run_library,
                                     save_state)

log = logging.getLogger("jaxrl_hier.skills")
CHAIN_KEY = 0x636861  # folded into the run's seed for the chain's initial key ("cha")
MANAGER_KEY = 0x6D616E  # the same for the manager's ("man")
GENERALIST_KEY = 0x67656E  # and the generalist's ("gen")


class Trainer(Protocol):
    """What the scheduler needs from a trainer (`SkillTrainer`, or a fake in tests)."""

    slots: int
    quantity_names: tuple[str, ...]

    def init(self, key: jax.Array) -> None: ...
    def start(self, slots: dict[int, str], library: SkillLibrary, experts: dict[str, Any], key: jax.Array) -> None: ...
    def train_round(self, active: list[int] | None = None, greedy_eval: bool = True) -> list: ...
    def expert(self, slot: int) -> Any: ...
    def set_restart_prob(self, slot: int, prob: float) -> None: ...  # kept in the slot's checkpoint
    # Through jaxrl_hier's Checkpointer under `directory` (resume prunes it with one), raising when
    # a step is not saved.
    def save_checkpoint(self, directory: Path, step: int, meta: dict) -> None: ...
    def restore_checkpoint(self, directory: Path, step: int) -> None: ...
    def save_expert(self, directory: Path, expert: Any, meta: dict) -> None: ...
    def load_expert(self, directory: Path) -> Any: ...


class Scheduler:
    def __init__(self, config: Any, output_dir: str | Path, trainer: Trainer, generator: Generator,
                 catalog: SkillLibrary, *, progress: Callable[[SchedulerState], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.dir = Path(output_dir)
        self.trainer = trainer
        self.generator = generator
        self.catalog = catalog
        self.progress = progress
        self.clock = clock
        self.primary = is_primary()  # process 0: the only one that writes files and holds the lock
        self.lock = RunLock(self.dir, config.stale_lock_s, stuck_after_s=config.stuck_after_s)
        self.experts: dict[str, Any] = {}
        self._writers: dict[str, MetricsWriter] = {}
        self.state: SchedulerState | None = None

    # ------------------------------------------------------------------ state
    @property
    def checkpoint_dir(self) -> Path:
        return self.dir / "checkpoints"

    def skill_dir(self, record: SkillRecord) -> Path:
        return self.dir / "skills" / record.dirname

    def _save(self) -> None:
        if self.primary:
            self.lock.check()  # taken over by another run: stop before writing over its state
        save_state(self.dir, self.state)

    def library(self) -> SkillLibrary:
        """Every proposed skill, as Skill objects (Python predicates taken from the catalog)."""
        return run_library(self.state, self.catalog)

    # ------------------------------------------------------------------ entry points
    def run(self, resume: bool = False, on_lock: Callable[[], None] | None = None) -> SchedulerState:
        """Train until nothing is left (or `max_rounds`). `on_lock` runs once the directory is
        locked, before anything is written (the CLI records resume overrides there)."""
        self._run_started = self.clock()  # max_wall_s counts from here: the first compilations included
        self._load_stage_modules()
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.primary:
            self.lock.acquire()
        try:
            if on_lock is not None and self.primary:
                on_lock()
            if resume:
                self.state = load_state(self.dir)
                self._restore()
            else:
                self.state = SchedulerState(target=self.config.target)
                self._save()
                self.trainer.init(jax.random.key(self.config.seed))
            self._loop()
            return self.state
        finally:
            for w in self._writers.values():
                w.close()
            if self.primary:
                self.lock.release()

    def _restore(self) -> None:
        """Load completed experts; put the running skills back into their slots."""
        for r in self.state.by_status("completed"):
            self.experts[r.name] = self.trainer.load_expert(self.skill_dir(r))
        self.trainer.init(jax.random.key(self.config.seed))
        step = self.state.checkpoint_round
        # A kill between a round's checkpoint and the state file that names it leaves a newer
        # step; the replayed round must be able to save that step again.
        ckpt = Checkpointer(self.checkpoint_dir, keep=None, asynchronous=False)
        try:
            dropped = ckpt.delete_newer_than(step)
        finally:
            ckpt.close()
        if dropped:
            log.info("deleted checkpoints %s, newer than the state's round %s: those rounds are replayed", dropped, step)
        if step is not None and self.state.by_status("running"):
            self.trainer.restore_checkpoint(self.checkpoint_dir, step)
        for r in self.state.by_status("running"):
            if step is None or r.started_round >= step:
                # Started after the checkpoint was taken: its slot holds something else; start again,
                # dropping the metrics rows of the lost attempt (its rounds are > started_round).
                r.status, r.slot, r.attempts = "pending", None, r.attempts - 1
                self._writer(r).truncate_after(r.started_round)
            else:
                self._writer(r).truncate_after(step)
        if self.state.generation == "stopped":
            # The generator was unavailable; resume tries it again (perhaps with a new endpoint).
            self.state.generation, self.state.generation_reason = "active", ""
        self._save()
        log.info("resumed %s at round %d", self.dir, self.state.round)

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        last_round_s = None  # the previous round's wall time: a far slower one is logged (a stall, or a new shape)
        while True:
            self._generate()
            self._fail_blocked()
            self._fill_slots()
            running = self.state.by_status("running")
            if not running:
                break
            if self.config.max_rounds and self.state.round >= self.config.max_rounds:
                # Running skills stay running: a resume with a larger max_rounds continues them.
                log.info("stopped at max_rounds=%d; resume with a larger max_rounds to go on", self.config.max_rounds)
                return
            if self.config.max_wall_s and self.clock() - self._run_started >= self.config.max_wall_s:
                log.info("stopped after max_wall_s=%.0f s at round %d; resume to go on", self.config.max_wall_s,
                         self.state.round)
                return
            t0 = self.clock()
            self.lock.doing(f"training round {self.state.round + 1} ({', '.join(r.name for r in running)})")
            # only the slots of running skills train: a finished skill's slot costs nothing until reused
            every = self.config.greedy_eval_every
            results = self.trainer.train_round(sorted(r.slot for r in running),
                                               greedy_eval=every > 0 and (self.state.round + 1) % every == 0)
            elapsed = self.clock() - t0
            self.state.round += 1
            if last_round_s is not None and elapsed > max(5 * last_round_s, 60.0):
                log.warning("round %d took %.0f s, %.1fx the previous round's %.1f s: a compiled call far slower "
                            "than its last timing (a new shape compiling, a loaded machine, or a stall)",
                            self.state.round, elapsed, elapsed / max(last_round_s, 1e-9), last_round_s)
            last_round_s = elapsed
            if self.primary:  # real progress for the lock's liveness; raises, before any write, if taken over
                self.lock.progress(self.state.round, f"trained round {self.state.round}",
                                   f"saving round {self.state.round}, then proposing and starting skills")
            for r in running:
                self._account(r, results[r.slot], elapsed)
            if self.state.by_status("running"):
                self.trainer.save_checkpoint(self.checkpoint_dir, self.state.round, {"round": self.state.round})
                self.state.checkpoint_round = self.state.round
                crash_point("round.checkpoint_saved")
            self._save()
            if self.progress:
                self.progress(self.state)
        if self.state.generation in ("active", "paused"):
            self.state.generation, self.state.generation_reason = "finished", "nothing left to train"
        self._save()
        if self.progress:
            self.progress(self.state)
        if self._chain():
            self._manage()

    def _load_stage_modules(self) -> None:
        """Import the stage modules now, not when each stage begins: a run of an hour then runs the
        code it started with, even if the package is edited meanwhile. Both when either stage is
        configured (the manager stage reads the chain's experts through `skills.chain`); runs
        without those stages skip the imports (the skills alone start faster)."""
        if self.config.chain_timesteps or self.config.manager.timesteps:
            from jaxrl_hier.skills import chain, manager  # noqa: F401

    # ------------------------------------------------------------------ chain fine-tuning
    def _chain_experts(self) -> dict[str, Any]:
        """The completed skills' experts, then each failed skill's last attempt (saved when it failed)."""
        from jaxrl_hier.skills.chain import failed_experts

        return {**self.experts, **failed_experts(self.dir, self.state, self.trainer.load_expert)}

    def _chain(self) -> bool:
        """Fine-tune the chain towards the target (config `chain_timesteps`, `skills.chain`); False when
        `max_wall_s` stopped it (the manager, which plays its experts, waits for a resume)."""
        from jaxrl_hier.skills.chain import CHAIN_DIR, ChainTuner, chain_target, save_chain
        from jaxrl_hier.skills.trainer import skill_env_and_policy

        c, chain = self.config, self.state.chain
        if not c.chain_timesteps or (chain.get("status") == "done" and chain["steps"] >= c.chain_timesteps):
            return True
        experts = self._chain_experts()
        if not experts:
            return True
        library = self.library()
        if not chain:
            target = chain_target(library, list(experts), c.target)
            chain.update(status="running", target=target, plan=[*library.closure(target), target], steps=0, chunk=0)
            self._save()
        env, base_params, _ = skill_env_and_policy(c, self.catalog)
        tuner = ChainTuner(c, env, base_params, library, experts, chain["target"])
        return self._run_stage("chain", chain, tuner, c.chain_timesteps, {"chain_target": chain["target"]},
                        lambda runner: save_chain(self.dir, tuner.plan, tuner.experts(runner),
                                                  {"target": chain["target"], "steps": chain["steps"]}),
                        CHAIN_DIR, CHAIN_KEY, f"towards '{chain['target']}' ({', '.join(chain['plan'])})")

    def _manage(self) -> None:
        """Train the learned manager over the completed skills (config section `manager`,
        `skills.manager`), after the chain: its experts are the chain's tuned ones where it has them.
        With `generalist_timesteps` the generalist stage (the skills closed) comes first, and the
        manager starts from its parameters."""
        from jaxrl_hier.skills.chain import with_chain
        from jaxrl_hier.skills.manager import (GENERALIST_DIR, MANAGER_DIR, ManagerTrainer, load_manager,
                                               manager_skills, save_manager)
        from jaxrl_hier.skills.trainer import skill_env_and_policy

        c, record = self.config, self.state.manager
        if not c.manager.timesteps or record.get("status") == "skipped" or (
                record.get("status") == "done" and record["steps"] >= c.manager.timesteps):
            return
        library = self.library()
        if not record:
            experts = with_chain(self.dir, self.state.chain, self.experts) if self.experts else {}
            names = manager_skills(library, c.manager.skills, experts)
            missing = [s for s in c.manager.named_skills if s not in names]
            if missing:
                log.warning("the manager leaves out %s: no expert for it or a skill it needs", ", ".join(missing))
            if not names:  # the run is over (the skills and the chain are done): say so in the state
                record.update(status="skipped", reason="none of its skills has completed")
                log.warning("no manager: none of its skills has completed")
                self._save()
                return
            record.update(status="running", skills=names, steps=0, chunk=0)
            self._save()
        experts = with_chain(self.dir, self.state.chain, self.experts)
        env, base_params, _ = skill_env_and_policy(c, self.catalog)
        if not self._generalist(env, base_params, library, experts, record):
            return
        trainer = ManagerTrainer(c, env, base_params, library, experts, record["skills"])
        if self.state.generalist:  # the manager starts from the generalist's parameters
            trainer.begin_from(load_manager(self.dir, trainer.generalist_like(), GENERALIST_DIR)["manager"])
        self._run_stage("manager", record, trainer, c.manager.timesteps,
                        {"manager_skills": ",".join(record["skills"])},
                        lambda runner: save_manager(self.dir, trainer.result(runner),
                                                    {"skills": record["skills"], "steps": record["steps"]}),
                        MANAGER_DIR, MANAGER_KEY, f"over {len(record['skills'])} skills ({', '.join(record['skills'])})")

    def _generalist(self, env: Any, base_params: Any, library: SkillLibrary, experts: dict,
                    manager: dict) -> bool:
        """The generalist stage (config `manager.generalist_timesteps`): the manager's network trained
        with its skills closed, saved under RUN/generalist/ for the manager to start from. False when
        `max_wall_s` stopped it. Once the manager stage has begun the generalist is not extended."""
        from jaxrl_hier.skills.manager import GENERALIST_DIR, ManagerTrainer, save_manager

        c, record = self.config, self.state.generalist
        total = c.manager.generalist_timesteps
        if not total and not record:
            return True
        if not record:
            record.update(status="running", steps=0, chunk=0)
            self._save()
        if record["status"] == "done" and (manager["steps"] or record["steps"] >= total):
            return True
        if c.manager.kickstart_from == "attempted":  # a failed skill's last attempt may teach
            # `experts` already holds the chain's tuned experts: add the failed skills' kept ones
            # (in completion order, then the failed) without reading the chain again
            experts = {**self._chain_experts(), **experts}
        trainer = ManagerTrainer(c, env, base_params, library, experts, manager["skills"], closed=True)
        if trainer.teacher and record.get("teacher") != trainer.teacher:  # for `skills status`
            record["teacher"] = trainer.teacher
            self._save()
        return self._run_stage("generalist", record, trainer, max(total, record["steps"]), {"generalist": True},
                               lambda runner: save_manager(self.dir, trainer.result(runner), {"steps": record["steps"]},
                                                           GENERALIST_DIR),
                               GENERALIST_DIR, GENERALIST_KEY,
                               f"(the manager's network, {len(manager['skills'])} skills closed, base actions only"
                               + (f", taught by {trainer.teacher}'s chain)" if trainer.teacher else ")"))

    def _run_stage(self, name: str, record: dict, tuner: Any, total: int, meta: dict, save_result: Callable,
                   dirname: str, seed_key: int, what: str) -> bool:
        """A PPO stage after the skills (chain fine-tuning, the manager) in chunks of
        `updates_per_round` updates: after each, the runner's checkpoint, then the state file that
        names it (a resume restores that chunk and deletes later ones, as for rounds). The result is
        saved before the state says done; a resume with a larger `total` goes on from the last chunk.
        False when `max_wall_s` stopped it."""
        if record["status"] == "done":
            record["status"] = "running"
            self._save()
        directory = self.dir / dirname
        ckpt = Checkpointer(directory / "checkpoints", keep=2, asynchronous=False)
        writer = MetricsWriter(directory, primary=self.primary)
        c = self.config
        try:
            runner = tuner.init(jax.random.fold_in(jax.random.key(c.seed), seed_key))
            ckpt.delete_newer_than(record["chunk"] or None)  # a chunk saved after the state file: redone
            if record["chunk"]:
                runner, _ = ckpt.restore(record["chunk"], runner, meta)
            writer.truncate_after(record["chunk"])
            log.info("%s %s from %d of %d env steps", name, what, record["steps"], total)
            while record["steps"] < total:
                if c.max_wall_s and self.clock() - self._run_started >= c.max_wall_s:
                    log.info("stopped after max_wall_s=%.0f s in the %s stage at %d env steps; resume to go on",
                             c.max_wall_s, name, record["steps"])
                    return False
                self.lock.doing(f"{name} chunk {record['chunk'] + 1}")
                runner, metrics, elapsed = tuner.train(runner)
                record["chunk"] += 1
                record["steps"] += tuner.steps_per_chunk
                if self.primary:
                    self.lock.progress(self.state.round, f"{name} chunk {record['chunk']}", f"saving the {name}")
                writer.write({**metrics, "update": record["chunk"], "env_steps": record["steps"], "wall_s": elapsed})
                ckpt.save(record["chunk"], runner, meta)
                crash_point(f"{name}.checkpoint_saved")
                self._save()
            save_result(runner)
            crash_point(f"{name}.result_saved")
            record["status"] = "done"
            self._save()
            log.info("%s stage done: %d env steps", name, record["steps"])
            return True
        finally:
            writer.close()
            ckpt.close()

    def _account(self, r: SkillRecord, res: Any, elapsed: float) -> None:
        c = self.config
        r.steps += res.steps
        r.total_steps += res.steps
        r.rounds += 1
        r.wall_s += elapsed
        if c.restart_prob > 0 and r.phase != "fresh":  # what the fresh-world episodes say so far
            r.fresh_window = _window(r.fresh_window, res._replace(success_rate=res.fresh_success_rate,
                                                                  episodes=res.fresh_episodes), c.min_episodes)
        if r.phase == "fresh":  # judged on the episodes that began in a fresh world only, once the
            # phase has run long enough that failed episodes (they last the time limit) have ended too
            counted = r.steps - r.phase_steps > c.fresh_min_timesteps
            res = res._replace(success_rate=res.fresh_success_rate, episodes=res.fresh_episodes if counted else 0)
        r.window = _window(r.window, res, c.min_episodes)
        r.success_rate, r.episodes = _window_rate(r.window)
        self._writer(r).write({"update": self.state.round, "attempt": r.attempts, "steps": r.steps,
                               "total_steps": r.total_steps, "success_rate": r.success_rate,
                               "episodes": r.episodes, "window_rounds": len(r.window),
                               "round_success_rate": res.success_rate, "round_episodes": res.episodes,
                               "episode_return": res.episode_return,
                               "episode_length": res.episode_length, "wall_s": r.wall_s,
                               "greedy_success_rate": getattr(res, "greedy_success_rate", None),
                               "chain_success_rate": getattr(res, "chain_success_rate", None),
                               "fresh_success_rate": getattr(res, "fresh_success_rate", None),
                               "fresh_episodes": getattr(res, "fresh_episodes", 0),
                               "phase": r.phase or "train"})
        threshold = c.fresh_success_rate_threshold if r.phase == "fresh" else c.success_rate_threshold
        passed = (r.success_rate is not None and r.episodes >= c.min_episodes and r.success_rate >= threshold)
        if passed and r.steps >= c.min_skill_timesteps and self._wants_fresh_phase(r):
            self._begin_fresh_phase(r)
        elif passed and r.steps >= c.min_skill_timesteps:
            self._warn_if_anchors_only(r)
            self._complete(r)
        elif r.steps >= self._budget(r):
            rate = "n/a" if r.success_rate is None else f"{r.success_rate:.2f}"
            short = r.success_rate is not None and r.success_rate >= threshold  # the rate, on too few episodes
            reason = (f"attempt {r.attempts}: success rate {rate}{' from fresh worlds' if r.phase else ''} "
                      + (f"over {r.episodes} episodes, fewer than min_episodes={c.min_episodes}," if short
                         else f"< {threshold}") + f" after {r.steps:,} steps")
            chain_tunes = self._chain_tunes(r)
            if r.attempts <= c.max_retries and not chain_tunes:
                log.warning("skill '%s' %s; retrying from scratch", r.name, reason)
                r.status, r.slot = "pending", None
            else:
                log.warning("skill '%s' failed: %s%s", r.name, reason,
                            "; not retried: chain fine-tuning trains it on from this expert" if chain_tunes else "")
                # Its last attempt's expert is kept: chain fine-tuning (skills.chain) may start from it.
                self.trainer.save_expert(self.skill_dir(r), self.trainer.expert(r.slot),
                                         {"skill": r.name, "id": r.id, "success_rate": r.success_rate,
                                          "steps": r.steps, "failed": True})
                r.status, r.slot, r.reason = "failed", None, reason
                self._close_writer(r)

    def _chain_tunes(self, r: SkillRecord) -> bool:
        """The target, when chain fine-tuning follows the skills: a retry from scratch would train it
        alone again, where the chain phase trains it on, from its last expert, on the states its
        chain hands it (on TechTree the target failed at every seed and the chain took it from
        0.00-0.02 to 0.79-0.87 diamonds; docs/skills.md)."""
        return bool(self.config.chain_timesteps) and r.name == self.state.target

    def _wants_fresh_phase(self, r: SkillRecord) -> bool:
        """A skill with dependencies that passed on mostly restarted episodes trains on from fresh
        worlds (config `fresh_success_rate_threshold`): restarts from anchors shared among the envs
        let it pass on a few states, while the composed agent meets it on the states its frozen
        chain hands it. With `fresh_phase: needed`, not a skill whose fresh-world episodes of the
        restart phase already pass that threshold."""
        c = self.config
        if not (c.fresh_success_rate_threshold > 0 and r.phase != "fresh" and bool(r.spec.get("requires"))
                and c.restart_prob > 0):
            return False
        rate, episodes = _window_rate(r.fresh_window)
        if c.fresh_phase == "needed" and episodes >= c.min_episodes and rate >= c.fresh_success_rate_threshold:
            log.info("skill '%s' passed with restarts and %.2f from fresh worlds (%d episodes): no fresh-world "
                     "phase needed", r.name, rate, episodes)
            return False
        return True

    def _warn_if_anchors_only(self, r: SkillRecord) -> None:
        """A skill with dependencies that passed with restarts and no fresh-world phase may have passed on
        its anchors alone (on Craftax-Classic a stone pickaxe's skill passed 0.85 there and made the
        pickaxe in 2% of fresh worlds): say so where its fresh-world episodes fall short."""
        c = self.config
        if not (c.restart_prob > 0 and c.fresh_success_rate_threshold == 0 and r.spec.get("requires")):
            return  # no restarts, or a fresh-world bar the config chose (fresh_phase: needed judged it)
        rate, episodes = _window_rate(r.fresh_window)
        if episodes >= c.min_episodes and rate < c.success_rate_threshold:
            log.warning("skill '%s' passed with restarts, but from fresh worlds its rate is %.2f (%d episodes): "
                        "the composed agent meets it there. Set fresh_success_rate_threshold > 0 to train it on "
                        "from fresh worlds.", r.name, rate, episodes)

    def _begin_fresh_phase(self, r: SkillRecord) -> None:
        self.trainer.set_restart_prob(r.slot, 0.0)
        r.phase, r.phase_steps, r.window, r.success_rate, r.episodes = "fresh", r.steps, [], None, 0
        log.info("skill '%s' passed %.2f with restarts after %d steps; restarts off, it now trains from fresh "
                 "worlds until %.2f", r.name, self.config.success_rate_threshold, r.steps,
                 self.config.fresh_success_rate_threshold)

    def _budget(self, r: SkillRecord) -> int:
        """Env steps per attempt: the skill's own `skill_budgets` entry or `skill_timesteps` (the ceiling
        the config pays for), or the proposal's `max_timesteps` when it asked for fewer, never below
        `min_skill_timesteps`."""
        c = self.config
        ceiling = c.skill_budgets.get(r.name, c.skill_timesteps)
        steps = ceiling if r.max_timesteps is None else min(r.max_timesteps, ceiling)
        return max(steps, c.min_skill_timesteps)

    def _complete(self, r: SkillRecord) -> None:
        expert = self.trainer.expert(r.slot)
        library = self.library()
        plan = library.closure(r.name)
        ids = {s.name: s.id for s in self.state.skills}
        # The global-to-local expert index map: which skill's expert sits at which row of the bank.
        index_map = [{"skill": d, "id": ids[d], "local": j} for j, d in enumerate(plan)]
        index_map.append({"skill": r.name, "id": r.id, "local": self.config.max_experts})
        meta = {"skill": r.name, "id": r.id, "success_rate": r.success_rate, "steps": r.steps}
        directory = self.skill_dir(r)
        self.trainer.save_expert(directory, expert, meta)
        if self.primary:
            atomic_write_json(directory / "spec.json", {"skill": r.spec, "plan": list(plan),
                                                        "expert_index": index_map, "success_rate": r.success_rate,
                                                        "steps": r.steps, "attempts": r.attempts})
        self.experts[r.name] = expert
        r.status, r.slot = "completed", None
        self._close_writer(r)
        log.info("skill '%s' completed: success rate %.2f after %d steps", r.name, r.success_rate, r.steps)

    def _fill_slots(self) -> None:
        busy = {r.slot for r in self.state.by_status("running")}
        free = [i for i in range(self.trainer.slots) if i not in busy]
        done = {r.name for r in self.state.by_status("completed")}
        starting: dict[int, str] = {}
        for r in self.state.by_status("pending"):
            if not free:
                break
            if all(d in done for d in r.spec.get("requires", [])):
                r.slot, r.status = free.pop(0), "running"
                r.attempts += 1
                r.steps, r.success_rate, r.started_round, r.window, r.phase = 0, None, self.state.round, [], ""
                r.phase_steps, r.fresh_window = 0, []
                starting[r.slot] = r.name
        if starting:
            seed = _start_key(self.config.seed, self.state.round + 1)
            names = ", ".join(starting.values())
            self.lock.doing(f"starting {names} (round {self.state.round})")
            self.trainer.start(starting, self.library(), self.experts, seed)
            if self.primary:
                self.lock.progress(self.state.round, f"started {names}", f"training round {self.state.round + 1}")
            self._save()
            log.info("started %s", ", ".join(f"{n} (slot {s})" for s, n in starting.items()))

    def _fail_blocked(self) -> None:
        changed = True
        while changed:
            changed = False
            failed = {r.name for r in self.state.by_status("failed")}
            for r in self.state.by_status("pending"):
                bad = [d for d in r.spec.get("requires", []) if d in failed]
                if bad:
                    r.status, r.reason, changed = "failed", f"dependency '{bad[0]}' failed", True
                    self._save()

    # ------------------------------------------------------------------ generation
    def _context(self) -> ProposalContext:
        skills = tuple({"name": r.name, "requires": list(r.spec.get("requires", [])),
                        "success": list(r.spec.get("success", [])), "status": r.status} for r in self.state.skills)
        return ProposalContext(self.state.target, self.config.env, skills, tuple(self.trainer.quantity_names))

    def _generate(self) -> None:
        s = self.state
        while s.generation in ("active", "paused"):
            done = {r.name for r in s.by_status("completed")}
            pending = s.by_status("pending")
            waiting = [r for r in pending if not all(d in done for d in r.spec.get("requires", []))]
            if waiting:
                if s.generation != "paused":
                    deps = sorted({d for r in waiting for d in r.spec.get("requires", []) if d not in done})
                    s.generation, s.generation_reason = "paused", f"'{waiting[0].name}' waits on {', '.join(deps)}"
                    log.info("generation paused: %s", s.generation_reason)
                    self._save()
                return
            free = self.trainer.slots - len(s.by_status("running"))
            if len(pending) >= free:
                return
            s.generation, s.generation_reason = "active", ""
            library = self.library()
            validate = make_validator(library, self.catalog, tuple(self.trainer.quantity_names),
                                      self.config.max_experts, self.config.max_conditions)
            asked: dict[str, Any] = {}

            def validate_and_keep_budget(data: dict) -> Skill:
                skill = validate(data)
                asked["max_timesteps"] = data.get("max_timesteps")  # None unless the proposal gave one
                return skill

            try:
                skill = self.generator.propose(self._context(), validate_and_keep_budget)
            except GeneratorUnavailable as err:
                s.generation, s.generation_reason = "stopped", str(err)
                log.error("skill generation stopped: %s (completed work is kept)", err)
                self._save()
                return
            if skill is None:
                s.generation, s.generation_reason = "finished", "the generator has nothing more to propose"
                self._save()
                return
            s.skills.append(SkillRecord(id=len(s.skills), name=skill.name, spec=skill.to_dict(),
                                        proposed_by=type(self.generator).__name__,
                                        max_timesteps=asked.get("max_timesteps")))
            log.info("proposed skill '%s' (requires %s)", skill.name, ", ".join(skill.requires) or "nothing")
            self._save()

    # ------------------------------------------------------------------ per-skill metrics
    def _writer(self, r: SkillRecord) -> MetricsWriter:
        if r.name not in self._writers:
            self._writers[r.name] = MetricsWriter(self.skill_dir(r), primary=self.primary)
        return self._writers[r.name]

    def _close_writer(self, r: SkillRecord) -> None:
        w = self._writers.pop(r.name, None)
        if w is not None:
            w.close()


@jax.jit
def _start_key(seed: int, n: int) -> jax.Array:
    """The key of the n-th round's skill starts: one compiled call, not two eager ops (with XLA:CPU in
    jaxlib 0.10.2 a start-up hang sat in an eager op; a skill start now dispatches only compiled programs)."""
    return jax.random.fold_in(jax.random.key(seed), n)


def _window_rate(window: list) -> tuple[float | None, int]:
    """A window's success rate (None without episodes) and its episodes."""
    successes, episodes = (sum(w[i] for w in window) for i in (0, 1))
    return (successes / episodes if episodes else None), int(episodes)


def _window(window: list, res: Any, min_episodes: int) -> list:
    """The round's [successes, episodes] appended, older rounds dropped while the rest still hold
    `min_episodes` episodes: the success rate is over the fewest latest rounds that have enough."""
    if res.episodes:
        window = [*window, [res.success_rate * res.episodes, res.episodes]]
    while len(window) > 1 and sum(w[1] for w in window[1:]) >= min_episodes:
        window = window[1:]
    return window
