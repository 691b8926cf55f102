"""Atomic file writes: a crash never leaves a half-written state, config, metrics or model file.

`atomic_writer` is the one mechanism: every file the package writes goes through it (directly,
or through the `atomic_write_*` shorthands). `fsync_dir` makes a rename or a file creation
durable; `metrics.jsonl` appends use it when they create the file. `atomic_directory` does for a
whole directory (a branched run) what `atomic_writer` does for a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator


def fsync_dir(directory: str | Path) -> None:
    """fsync a directory, so that a rename or a new entry in it survives a power loss."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def atomic_writer(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file next to `path` for writing; on a clean exit fsync it, rename it over
    `path` and fsync the directory. On an error the temporary file is removed and `path` is untouched.

    >>> with atomic_writer("out/metrics.jsonl", "w") as f:
    ...     f.write("...")
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_writer mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600 files; these are ordinary outputs
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)  # make the rename itself durable


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """A temporary directory next to `path` to fill; on a clean exit every file in it is fsynced and
    it is renamed to `path`, which must not exist or be empty. On an error it is removed and `path`
    is untouched: a reader sees no directory or a whole one.

    >>> with atomic_directory("runs/copy") as tmp:
    ...     shutil.copytree("runs/run", tmp, dirs_exist_ok=True)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700 directories; this is an ordinary output
        yield tmp
        for root, _, files in os.walk(tmp):
            for name in files:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fsync_dir(root)
        os.rename(tmp, path)  # over an empty directory too; a non-empty one raises OSError
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_writer(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
