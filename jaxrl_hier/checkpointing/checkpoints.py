"""Orbax checkpoints of a whole training state, with metadata that guards against mismatches.

A checkpoint holds the pytree (params, optimiser state, RNG, env states, counters) and a JSON
``meta`` item (step, and the config keys that fix array shapes). Orbax writes each step into a
temporary directory and renames it when complete, so a crash mid-save leaves the previous
checkpoint intact; saves run asynchronously and their errors are surfaced at the next save or
at `close()`. Restores are checked against the expected metadata first, so a checkpoint from a
different env or network gives a message naming the directory and the mismatch instead of a
shape error deep inside Orbax.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be restored: missing, corrupt, incomplete, or mismatched."""


def abstract_like(tree: Any) -> Any:
    """Shape/dtype/sharding structs for `tree`, the target of a restore."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def _fill_empty(tree: Any) -> Any:
    """Orbax cannot save zero-size arrays (e.g. the unused reset pool of `reset_mode: auto`): each one
    is stored as a 1-element placeholder, and `restore` puts the target's own empty array back."""
    import numpy as np

    return jax.tree.map(lambda x: np.zeros((1,), x.dtype) if x.size == 0 else x, tree)


class Checkpointer:
    """Save and restore training states under `directory`, keeping the last `keep` steps."""

    def __init__(self, directory: str | Path, keep: int = 3, asynchronous: bool = True):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=asynchronous)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, meta: Mapping[str, Any]) -> None:
        """Start saving `state` at `step`; raises the error of a previous failed async save.

        Orbax saves nothing (and returns False) for a step not newer than the latest on disk; a
        caller that went on would later restore the old checkpoint under the new step's name, so
        that is a CheckpointError here. A resumed run first drops the steps after the one it
        resumes from (`delete_newer_than`)."""
        self.wait()
        args = ocp.args.Composite(state=ocp.args.StandardSave(_fill_empty(state)), meta=ocp.args.JsonSave(dict(meta, step=step)))
        saved = self.manager.save(step, args=args)
        if not saved:
            # The manager's list of steps may be out of date (another Checkpointer deleted some).
            self.manager.reload()
            saved = self.manager.save(step, args=args)
        if not saved:
            raise CheckpointError(
                f"checkpoint step {step} was not saved under {self.directory}: the latest step there is "
                f"{self.latest_step()}, and Orbax only saves newer steps. Delete the steps after the one the run "
                "resumed from, or use a new --output-dir.")

    def delete_newer_than(self, step: int | None) -> list[int]:
        """Delete every step after `step` (all of them for None) and return them: a resumed run
        replays from `step`, so later checkpoints belong to work that is being redone."""
        self.wait()
        self.manager.reload()  # another process may have written steps since this manager listed them
        newer = sorted(s for s in self.manager.all_steps() if step is None or s > step)
        for s in newer:
            self.manager.delete(s)
        return newer

    def wait(self) -> None:
        try:
            self.manager.wait_until_finished()
        except Exception as err:  # surface async failures with the directory named
            raise CheckpointError(f"saving a checkpoint under {self.directory} failed: {err}") from err

    def read_meta(self, step: int) -> dict:
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        except Exception as err:
            raise CheckpointError(
                f"checkpoint {self.directory}/{step} is corrupt or incomplete (cannot read its metadata: "
                f"{type(err).__name__}). Delete that step directory to fall back to an earlier one."
            ) from None
        return dict(out["meta"])

    def restore(self, step: int, target: Any, expect: Mapping[str, Any]) -> tuple[Any, dict]:
        """Restore `step` into the structure, shapes and shardings of `target`.

        `expect` holds metadata values that must match (env name, shapes); a difference raises
        CheckpointError naming the key, the saved value and the expected one.
        """
        meta = self.read_meta(step)
        for key, want in expect.items():
            have = meta.get(key)
            if have != want:
                raise CheckpointError(
                    f"checkpoint {self.directory}/{step} does not match this run: {key} is {have!r} in the "
                    f"checkpoint but {want!r} here. Resume with the checkpoint's config, or use a new --output-dir."
                )
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_like(_fill_empty(target)))))
        except Exception as err:
            raise CheckpointError(
                f"checkpoint {self.directory}/{step} could not be restored ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}). It is corrupt, incomplete, or from a different "
                "network shape; delete it to fall back to an earlier step, or use a new --output-dir."
            ) from None
        state = jax.tree.map(lambda restored, want: want if want.size == 0 else restored, out["state"], target)
        return state, meta

    def close(self) -> None:
        self.wait()
        self.manager.close()
