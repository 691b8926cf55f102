"""Multi-process training through the CLI: two processes with two CPU devices each
(`jax.distributed.initialize` on 127.0.0.1, gloo collectives) give the metrics of one process
with four devices, only process 0 writes the run's files, and a run killed on both processes
resumes across both from its Orbax checkpoint."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from value_checks import assert_close_or_both_none

ROOT = Path(__file__).resolve().parent.parent
# 4 env shards (one per device in both layouts), 40 updates in chunks of 2, a checkpoint every 10.
ARGS = ["--no-progress", "env=CartPole-v1", "num_envs=8", "num_steps=8", "num_minibatches=2", "update_epochs=1",
        "hidden_size=16", "num_layers=1", "reset_mode=pool", "reset_ratio=4", "log_every=2",
        "checkpoint_every=10", "keep_checkpoints=2", f"total_timesteps={8 * 8 * 40}"]
VOLATILE = {"fps", "time_s"}  # wall-clock figures
TIMEOUT = 600  # seconds per phase: compiles crawl when the CPU is shared


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(devices: int, **extra: str) -> dict:
    # The session's flags (tests/conftest.py: no backend optimisation) plus the device count.
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags, **extra)
    for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        if var not in extra:
            env.pop(var, None)
    return env


def launch(out: Path, logs: Path, *, processes: int, extra: tuple[str, ...] = ()) -> list:
    """Start the CLI in `processes` processes (2 devices each when distributed, else 4 devices);
    stderr goes to files under `logs` (a pipe nobody reads could fill up and block a process)."""
    cmd = [sys.executable, "-m", "jaxrl_hier.train", "--output-dir", str(out), *ARGS, *extra]
    logs.mkdir(exist_ok=True)
    if processes == 1:
        runs = [(cmd, env_for(4))]
    else:
        port = str(free_port())
        runs = [([*cmd, "--distributed"], env_for(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                                                  JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(i)))
                for i in range(processes)]
    procs = []
    for i, (argv, env) in enumerate(runs):
        with open(logs / f"{out.name}-{'-'.join(extra) or 'run'}-{i}.log", "w") as err:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        proc.log = Path(err.name)
        procs.append(proc)
    return procs


def finish(procs: list) -> list[str]:
    """Wait for every process (killing all of them on a timeout); their stderr."""
    deadline = time.time() + TIMEOUT
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        kill(procs)
    return [p.log.read_text() for p in procs]


def kill(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()


def records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in VOLATILE} for line in lines]


def assert_same_metrics(got: list[dict], want: list[dict]) -> None:
    assert [r["update"] for r in got] == [r["update"] for r in want]
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        assert a["episodes"] == b["episodes"] and a["env_steps"] == b["env_steps"], (a, b)
        for k in a:
            # gloo's all-reduce sums in another order than the in-process one: float rounding only.
            assert_close_or_both_none(a[k], b[k], rel=1e-4, abs=1e-6, context=(k, a, b))


@pytest.mark.slow
def test_two_processes_match_four_devices_and_resume_after_kill(tmp_path):
    single, multi = tmp_path / "one", tmp_path / "two"
    logs = tmp_path / "logs"
    reference = launch(single, logs, processes=1)
    procs = launch(multi, logs, processes=2)
    try:
        # Kill both processes once the checkpoint of update 10 is complete (Orbax renames it into place).
        deadline = time.time() + TIMEOUT
        while not (multi / "checkpoints" / "10").is_dir() and time.time() < deadline:
            assert all(p.poll() is None for p in procs), [p.log.read_text()[-3000:] for p in procs]
            time.sleep(0.02)
        assert (multi / "checkpoints" / "10").is_dir(), f"no checkpoint after {TIMEOUT}s"
        kill(procs)
        assert [p.returncode for p in procs] == [-signal.SIGKILL] * 2, "the run finished before it was killed"
        ref_err = finish(reference)
        assert reference[0].returncode == 0, ref_err[0][-3000:]
    finally:
        kill(procs + reference)
    assert len(records(multi)) < 20  # it was stopped partway

    procs = launch(multi, logs, processes=2, extra=("--resume",))
    errs = finish(procs)
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for e in errs]
    assert "resumed" in errs[0] and "resumed" not in errs[1]  # status lines come from process 0 only
    assert_same_metrics(records(multi), records(single))
    assert (multi / "learning_curve.png").stat().st_size > 1000
    assert sorted(p.name for p in (multi / "checkpoints").iterdir() if p.name.isdigit()) == ["30", "40"]


def test_from_primary_gives_every_process_the_value_of_process_0():
    """ResumableRun.first_row_due decides from metrics.jsonl, which process 0 alone reads, whether to
    run the step-0 evaluation; every process must take that branch alike, as the evaluation may be
    collective. Process 1 gets process 0's value, whatever its own."""
    code = ("import jax; from jaxrl_hier.runs import from_primary, init_distributed; init_distributed(); "
            "print(from_primary(jax.process_index() == 0), from_primary(jax.process_index() == 1))")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=env_for(1, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                                                     JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i)))
             for i in range(2)]
    try:
        printed = [p.communicate(timeout=TIMEOUT)[0].splitlines()[-1] for p in procs]  # after gloo's own lines
    finally:
        kill(procs)
    assert printed == ["True False", "True False"]
