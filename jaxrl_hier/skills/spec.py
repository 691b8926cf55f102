"""Skills and skill libraries: names, dependencies, success conditions; validated as a DAG.

A skill's success is a conjunction of conditions on named state quantities
(`inventory.wood >= 3`, `achievement.place_table == 1`, see `quantities.py`), or a Python
predicate `state -> bool` written in JAX. Conditions are data (an index, an operator and a
threshold per row), so skills proposed while a run is going (by the planner or an LLM) do not
change the compiled program; a Python predicate becomes one more named quantity.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from jaxrl_hier.config import ConfigError, closest

OPS = (">=", "<=", "==", ">", "<", "!=")
_CONDITION = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(>=|<=|==|!=|>|<)\s*(-?\d+(?:\.\d+)?)\s*$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class SkillError(ConfigError):
    """An invalid skill or library: unknown dependency or quantity, a cycle, a malformed condition."""


@dataclass(frozen=True)
class Condition:
    quantity: str
    op: str
    value: float

    @staticmethod
    def parse(text: str) -> "Condition":
        match = _CONDITION.match(str(text))
        if match is None:
            raise SkillError(f"condition {text!r} is not '<quantity> <op> <number>' with op one of {', '.join(OPS)} "
                             "(e.g. 'inventory.wood >= 3').")
        return Condition(match.group(1), match.group(2), float(match.group(3)))

    def __str__(self) -> str:
        value = int(self.value) if self.value == int(self.value) else self.value
        return f"{self.quantity} {self.op} {value}"


@dataclass(frozen=True)
class Skill:
    """One skill. `success` conditions are all required; `predicate` (optional, JAX) is ANDed in."""

    name: str
    requires: tuple[str, ...] = ()
    success: tuple[Condition, ...] = ()
    predicate: Callable[[Any], Any] | None = field(default=None, compare=False)
    description: str = ""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise SkillError(f"skill name {self.name!r} must be snake_case (letters, digits, '_', starting "
                             "with a letter).")
        if not self.success and self.predicate is None:
            raise SkillError(f"skill '{self.name}' has no success condition: give 'success' conditions or a predicate.")
        if self.name in self.requires:
            raise SkillError(f"skill '{self.name}' requires itself.")

    @property
    def predicate_quantity(self) -> str:
        """The name under which a Python predicate joins the quantity table."""
        return f"predicate.{self.name}"

    def conditions(self) -> tuple[Condition, ...]:
        extra = (Condition(self.predicate_quantity, "==", 1.0),) if self.predicate is not None else ()
        return self.success + extra

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "requires": list(self.requires),
                               "success": [str(c) for c in self.success]}
        if self.description:
            out["description"] = self.description
        if self.predicate is not None:
            out["predicate"] = f"{getattr(self.predicate, '__module__', '?')}.{getattr(self.predicate, '__qualname__', '?')}"
        return out

    @staticmethod
    def from_dict(data: Mapping[str, Any], *, source: str = "skill") -> "Skill":
        if not isinstance(data, Mapping):
            raise SkillError(f"{source}: a skill must be a mapping with name, requires, success; got {data!r}.")
        known = {"name", "requires", "success", "description", "predicate"}
        unknown = set(data) - known
        if unknown:
            key = sorted(unknown)[0]
            raise SkillError(f"{source}: unknown skill key '{key}'.{closest(key, sorted(known))} "
                             f"Known keys: {', '.join(sorted(known))}.")
        if "name" not in data:
            raise SkillError(f"{source}: a skill needs a 'name'.")
        if "predicate" in data:
            raise SkillError(f"{source}: skill '{data['name']}' names a Python predicate; those are defined in "
                             "Python (Skill(predicate=...)), not loaded from YAML. Use 'success' conditions instead.")
        success = data.get("success", [])
        if isinstance(success, str):
            success = [success]
        requires = data.get("requires", []) or []
        if isinstance(requires, str):
            requires = [requires]
        return Skill(name=str(data["name"]), requires=tuple(str(r) for r in requires),
                     success=tuple(Condition.parse(c) for c in success),
                     description=str(data.get("description", "")))


@dataclass(frozen=True)
class SkillLibrary:
    """An ordered, validated set of skills whose dependencies form a DAG."""

    skills: tuple[Skill, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for skill in self.skills:
            if skill.name in seen:
                raise SkillError(f"skill '{skill.name}' is defined twice; skill names must be unique.")
            seen.add(skill.name)
        for skill in self.skills:
            for dep in skill.requires:
                if dep not in seen:
                    raise SkillError(f"skill '{skill.name}' requires unknown skill '{dep}'.{closest(dep, sorted(seen))} "
                                     f"Known skills: {', '.join(sorted(seen)) or 'none'}.")
        self.topological_order()  # raises on a cycle

    # ------------------------------------------------------------------ queries
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.skills)

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def __getitem__(self, name: str) -> Skill:
        for s in self.skills:
            if s.name == name:
                return s
        raise SkillError(f"unknown skill '{name}'.{closest(name, self.names)} Known skills: {', '.join(self.names)}.")

    def __len__(self) -> int:
        return len(self.skills)

    def topological_order(self) -> tuple[str, ...]:
        """Names with every skill after its dependencies (library order breaks ties)."""
        deps = {s.name: s.requires for s in self.skills}
        state: dict[str, int] = {}  # 1 = on the current path, 2 = done
        order: list[str] = []

        def visit(name: str, path: tuple[str, ...]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                cycle = path[path.index(name):] + (name,)
                raise SkillError(f"skill dependencies form a cycle: {' -> '.join(cycle)}. Remove one of these "
                                 "requirements.")
            state[name] = 1
            for dep in deps[name]:
                visit(dep, path + (name,))
            state[name] = 2
            order.append(name)

        for s in self.skills:
            visit(s.name, ())
        return tuple(order)

    def closure(self, name: str) -> tuple[str, ...]:
        """All skills `name` depends on, transitively, in topological order (without `name`)."""
        needed: set[str] = set()
        stack = list(self[name].requires)
        while stack:
            dep = stack.pop()
            if dep not in needed:
                needed.add(dep)
                stack.extend(self[dep].requires)
        return tuple(n for n in self.topological_order() if n in needed)

    # ------------------------------------------------------------------ building
    def add(self, skill: Skill, quantities: Iterable[str] | None = None) -> "SkillLibrary":
        """A new library with `skill` appended, validated (and its quantities checked if given)."""
        if quantities is not None:
            check_quantities(skill, quantities)
        return SkillLibrary(self.skills + (skill,))

    def subset(self, names: Iterable[str]) -> "SkillLibrary":
        keep = set(names)
        return SkillLibrary(tuple(s for s in self.skills if s.name in keep))

    def check_quantities(self, quantities: Iterable[str]) -> None:
        for skill in self.skills:
            check_quantities(skill, quantities)

    def predicate_skills(self) -> tuple[Skill, ...]:
        return tuple(s for s in self.skills if s.predicate is not None)

    def to_list(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.skills]


def check_quantities(skill: Skill, quantities: Iterable[str]) -> None:
    check_conditions(f"skill '{skill.name}'", skill.success, quantities)


def check_conditions(owner: str, conditions: Iterable[Condition], quantities: Iterable[str]) -> None:
    """Every condition reads a known quantity, else one error naming `owner` (where they were written)."""
    known = set(quantities)
    for cond in conditions:
        if cond.quantity not in known:
            raise SkillError(f"{owner}: unknown quantity '{cond.quantity}' in condition "
                             f"'{cond}'.{closest(cond.quantity, sorted(known))} Known quantities: "
                             f"{', '.join(sorted(known))}.")


def load_skills_yaml(path: str | Path) -> SkillLibrary:
    """A library from a YAML file: a list of skills, or a mapping with a `skills:` list."""
    from jaxrl_hier.config import read_yaml_document

    path = Path(path)
    try:
        data = read_yaml_document(path, "skill file", "Give a YAML list of skills (name, requires, success).")
    except ConfigError as err:
        raise SkillError(str(err)) from None
    if isinstance(data, Mapping):
        data = data.get("skills")
    if not isinstance(data, list):
        raise SkillError(f"skill file {path} must hold a list of skills (or a mapping with a 'skills' list).")
    return SkillLibrary(tuple(Skill.from_dict(d, source=f"{path}[{i}]") for i, d in enumerate(data)))


__all__ = ["OPS", "Condition", "Skill", "SkillError", "SkillLibrary", "check_quantities", "load_skills_yaml"]
