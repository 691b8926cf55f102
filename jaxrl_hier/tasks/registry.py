"""The task registry: `make_task(name, **kwargs)` and `task_from_config(config)`. It sits above the
task modules (each imports `tasks.base`), so no task module imports it."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_hier.config import ConfigError, closest
from jaxrl_hier.tasks.arithmetic import ArithmeticTask
from jaxrl_hier.tasks.base import Task
from jaxrl_hier.tasks.countdown import CountdownTask
from jaxrl_hier.tasks.gsm8k import GSM8KTask


def make_task(name: str, **kwargs: Any) -> Task:
    """A task by name: "arithmetic", "countdown" or "gsm8k" (gsm8k needs path=...).

    Unknown names and bad keyword arguments raise ConfigError naming the problem and the fix.
    """
    registry = {"arithmetic": ArithmeticTask, "countdown": CountdownTask, "gsm8k": GSM8KTask}
    if name not in registry:
        raise ConfigError(f"unknown task '{name}'.{closest(str(name), list(registry))} "
                          f"Known tasks: {', '.join(registry)}.")
    cls = registry[name]
    fields = [f for f in dataclasses.fields(cls) if f.init]
    known = sorted(f.name for f in fields)
    for key in kwargs:
        if key not in known:
            raise ConfigError(f"unknown option '{key}' for task '{name}'.{closest(key, known)} "
                              f"Known options: {', '.join(known)}.")
    missing = [f.name for f in fields if f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and f.name not in kwargs]
    if missing:
        raise ConfigError(f"task '{name}' needs {', '.join(k + '=...' for k in missing)} "
                          f"(for gsm8k: a JSONL file of question/answer lines).")
    return cls(**kwargs)


def task_from_config(config: Any, *, worked: bool | None = None) -> Task:
    """The task a run config names through its `task*` keys (GRPO, the guided agent, PGTS): `task`,
    and for arithmetic `task_operators`, `task_digits`, `task_steps` and `task_worked` (or `worked`,
    for a pipeline that always needs worked solutions), for gsm8k `task_path`."""
    name = config.task
    kwargs: dict[str, Any] = {}
    if name == "arithmetic":
        kwargs = dict(operators=config.task_operators, digits=config.task_digits, steps=config.task_steps,
                      worked=getattr(config, "task_worked", False) if worked is None else worked)
    elif name == "gsm8k":
        kwargs = dict(path=config.task_path)
    return make_task(name, **kwargs)
