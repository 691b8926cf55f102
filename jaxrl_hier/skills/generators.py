"""Skill generators: propose the next skill given the library so far and a target.

Every generator has `propose(context, validate) -> Skill | None`: `validate(dict)` turns a proposed
skill (name, requires, success conditions) into a `Skill` or raises `ValueError` with the reason
(unknown skill or quantity, a cycle, a duplicate); None means the target is covered.

- `TechTreePlanner` (the offline default) walks a known tech tree (a built-in library or the user's
  YAML) towards the target. It proposes a skill whose dependencies have all completed when there is
  one, so that free slots fill with independent work, and otherwise the next skill in dependency
  order (which then waits: the scheduler pauses generation until the skills it waits on complete).
- `OpenAIChatGenerator` and `LocalLLMGenerator` (`llm_generator.py`) ask an LLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from jaxrl_hier.skills.spec import Skill, SkillError, SkillLibrary


@dataclass(frozen=True)
class ProposalContext:
    target: str  # a skill name, or "all"
    env: str
    skills: tuple[dict, ...]  # {"name", "requires", "success", "status"} of every skill so far
    quantities: tuple[str, ...]  # the names a success condition may use


class GeneratorUnavailable(RuntimeError):
    """The generator cannot answer (endpoint unreachable, no valid answer): generation stops cleanly."""


class Generator(Protocol):
    def propose(self, context: ProposalContext, validate: Callable[[dict], Any]) -> Any | None: ...


class TechTreePlanner:
    """Proposes skills of a known tech tree in dependency order; see the module docstring."""

    def __init__(self, tree: SkillLibrary, also: tuple[str, ...] = ()):
        self.tree = tree
        # Skills proposed besides the target's chain (with their dependencies), after it: those the
        # learned manager will choose among (config `manager.skills`).
        self.also = tuple(also)

    def targets(self, target: str) -> tuple[str, ...]:
        if target == "all":
            return self.tree.topological_order()
        out: list[str] = []
        for name in (target, *self.also):
            if name not in self.tree:
                raise SkillError(f"'{name}' is not a skill of the planner's library ({', '.join(self.tree.names)}); "
                                 "set 'target' and 'manager.skills' to skills of it (or 'all').")
            out += [s for s in (*self.tree.closure(name), name) if s not in out]
        return tuple(out)

    def propose(self, context: ProposalContext, validate: Callable[[dict], Any]) -> Any | None:
        status = {s["name"]: s["status"] for s in context.skills}
        wanted = [n for n in self.targets(context.target) if n not in status]
        possible = [n for n in wanted if all(status.get(d) not in (None, "failed") for d in self.tree[n].requires)]
        if not possible:
            return None
        ready = [n for n in possible if all(status[d] == "completed" for d in self.tree[n].requires)]
        return validate(self.tree[(ready or possible)[0]].to_dict())


def make_validator(library: SkillLibrary, catalog: SkillLibrary, quantities: tuple[str, ...],
                   max_experts: int, max_conditions: int) -> Callable[[dict], Skill]:
    """A `validate` for generators: the proposal must name known skills and quantities, keep the
    graph acyclic, be new, and fit the compiled shapes (experts, conditions)."""

    def validate(data: dict) -> Skill:
        data = dict(data)
        # A per-attempt budget an LLM may ask for: kept by the scheduler (SkillRecord.max_timesteps),
        # not part of the skill itself.
        steps = data.pop("max_timesteps", None)
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise SkillError(f"'max_timesteps' must be a positive integer (env steps per attempt), got {steps!r}.")
        name = data.get("name")
        if isinstance(name, str) and name in catalog and catalog[name].to_dict() == data:
            skill = catalog[name]  # a catalog skill as it stands, Python predicate included
        else:
            skill = Skill.from_dict(data, source="proposal")
        if skill.name in library:
            raise SkillError(f"skill '{skill.name}' already exists; propose a new skill.")
        grown = library.add(skill, quantities)
        if len(grown.closure(skill.name)) > max_experts:
            raise SkillError(f"skill '{skill.name}' depends on {len(grown.closure(skill.name))} skills; at most "
                             f"{max_experts} (max_experts) fit.")
        if len(skill.conditions()) > max_conditions:
            raise SkillError(f"skill '{skill.name}' has {len(skill.conditions())} conditions; at most "
                             f"{max_conditions} (max_conditions).")
        return skill

    return validate
