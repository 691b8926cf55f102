"""benchmarks/ppo/ppo_vs_peer.py without a Craftax_Baselines checkout or the network: a fake peer directory
written here (a `ppo.py` exposing `make_train(config)` as the real one does, importing a module beside
it and `wandb`) runs through the same plumbing, against our PPO on CartPole at a tiny size: loading by
path, the config dict, compile-ahead timing, records, table, plot and the --check exit code. And
benchmarks/device/ppo_peer_gpu.sh's dry run: the commands it would run on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.ppo import ppo_vs_peer as bench  # noqa: E402
from jaxrl_hier.bench import VECTOR_FLAGS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

FAKE_PPO = textwrap.dedent('''
    import jax
    import jax.numpy as jnp
    import wandb  # the real ppo.py imports it at the top
    from wrappers import work  # resolved in the peer's own directory

    CONFIGS = []

    def make_train(config):
        config["NUM_UPDATES"] = config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"]
        CONFIGS.append(dict(config))

        def train(rng):
            x = jax.random.normal(rng, (config["NUM_ENVS"], config["LAYER_SIZE"]))
            return {"runner_state": work(x, config["NUM_UPDATES"])}

        return train
''')


def fake_peer(tmp_path: Path, repeats_of_work: int) -> Path:
    peer = tmp_path / f"peer{repeats_of_work}"
    peer.mkdir()
    (peer / "ppo.py").write_text(FAKE_PPO)
    (peer / "wrappers.py").write_text(textwrap.dedent(f'''
        import jax

        def work(x, updates):
            return jax.lax.fori_loop(0, updates * {repeats_of_work}, lambda i, y: jax.numpy.tanh(y * 1.0001), x)
    '''))
    return peer


def test_fast_peer_fails_the_check_and_everything_is_recorded(tmp_path):
    """A peer that does almost nothing beats our PPO: --check exits 1; the JSON, table and plot hold
    both systems with the device, versions, compile times and the ratio."""
    peer = fake_peer(tmp_path, 1)
    out = tmp_path / "out"
    code = bench.main(["--peer-dir", str(peer), "--out", str(out), "--points", "CartPole-v1:8", "--env-only",
                       "--num-steps", "8", "--minibatches", "2", "--epochs", "1", "--width", "8", "--updates", "3",
                       "--check", "--date", "2026-11-27", "--peer-commit", "abc123",
                       # the best of three calls per side: one call of a few milliseconds, descheduled on
                       # two busy cores (the suite runs two workers), once timed env stepping alone slower
                       # than the whole loop
                       "--repeats", "3", "--matmul-dtype", "bfloat16"])
    assert code == 1
    result = json.loads((out / "ppo_vs_peer.json").read_text())
    assert {r["system"] for r in result["records"]} == {bench.OURS, bench.PEER, bench.ENV_ONLY}
    for r in result["records"]:
        assert r["steps"] == 8 * 8 * 3 and r["fps"] > 0 and r["compile_s"] > 0 and r["run_s"] > 0
        assert r["fps_per_env"] == r["fps"] / 8
    ours = next(r for r in result["records"] if r["system"] == bench.OURS)
    assert ours["episodes_timed"] >= 0
    (pair,) = result["pairs"]
    assert pair["ratio"] < 1 and pair["ratio"] == pair["ours_fps"] / pair["peer_fps"]
    # Env stepping alone over the same 8 x 24 steps: faster than the whole loop, episodes ended.
    env_only = next(r for r in result["records"] if r["system"] == bench.ENV_ONLY)
    assert env_only["steps"] == 8 * 8 * 3 and env_only["episodes_timed"] > 0 and env_only["reset"] == "pool 1/16"
    assert pair["of_env_only"] == pair["ours_fps"] / env_only["fps"] < 1
    assert result["device"]["jax"] and result["device"]["cpu_model"] and "xla_flags" in result["device"]
    assert result["peer_commit"] == "abc123" and result["settings"]["updates"] == 3
    table = (out / "ppo_vs_peer.md").read_text()
    assert "| CartPole-v1 | 8 |" in table and "abc123" in table and "2026-11-27" in table and "Env-only" in table
    # Ours ran its products in bf16 (the peer's are its own, float32), and both say so.
    assert result["settings"]["matmul_dtype"] == ours["matmul_dtype"] == "bfloat16"
    assert "matrix products in bfloat16 (parameters float32)" in table
    # the vector extensions name the processor where the model name alone does not ("AMD EPYC")
    flags = result["device"]["cpu_flags"]
    assert set(flags.split()) <= set(VECTOR_FLAGS) and (not flags or f"with {flags}" in table)
    assert (out / "ppo_vs_peer.png").stat().st_size > 1000
    # The peer's make_train got its own script's config: our sizes, logging off, 3 updates.
    module = bench.load_peer(peer)
    assert "wrappers" not in sys.modules  # the peer's modules shadow nothing afterwards
    config = bench.peer_config("CartPole-v1", 8, result["settings"])
    assert config["DEBUG"] is False and config["USE_WANDB"] is False and config["USE_OPTIMISTIC_RESETS"] is True
    module.make_train(config)
    assert module.CONFIGS[-1]["NUM_UPDATES"] == 3 and module.CONFIGS[-1]["LAYER_SIZE"] == 8


class FakeSide:
    """A built side that returns at once (the sweep's bookkeeping without compiling anything)."""

    compile_s = 0.5

    def __init__(self, system):
        self.system = system

    def __call__(self):
        return 0

    def episodes(self, out):
        return None


def test_a_failed_point_is_recorded_and_the_sweep_goes_on(monkeypatch, tmp_path):
    """The peer fails to build at one point (out of memory on a GPU, say): that point's records say
    which side failed and why, the points before and after it are timed, in the order given, each
    with the systems it names; a point past the deadline is skipped."""
    def make_side(system, env, n, s, module):
        if system == bench.PEER and n == 16:
            raise MemoryError("RESOURCE_EXHAUSTED: out of memory")
        return FakeSide(system)

    monkeypatch.setattr(bench, "make_side", make_side)
    monkeypatch.setattr(bench, "load_peer", lambda d: None)
    out = tmp_path / "out"
    assert bench.main(["--peer-dir", str(tmp_path), "--out", str(out), "--points", "E:8", "E:16", "F:4:ours+env_only",
                       "--compile-workers", "2", "--peer-commit", "x"]) == 0
    result = json.loads((out / "ppo_vs_peer.json").read_text())
    assert [(p["env"], p["num_envs"]) for p in result["pairs"]] == [("E", 8), ("F", 4)]
    assert "ratio" in result["pairs"][0] and "ratio" not in result["pairs"][1] and "of_env_only" in result["pairs"][1]
    assert {r["system"] for r in result["records"] if r["env"] == "F"} == {bench.OURS, bench.ENV_ONLY}
    failed = {r["system"]: r["error"] for r in result["records"] if r["num_envs"] == 16}
    assert "out of memory" in failed[bench.PEER] and failed[bench.OURS] == "not timed: craftax_baselines failed"
    assert "| E | 16 | failed (" in (out / "ppo_vs_peer.md").read_text()
    assert bench.main(["--peer-dir", str(tmp_path), "--out", str(tmp_path / "late"), "--points", "E:8",
                       "--deadline-s", "-1", "--peer-commit", "x"]) == 0
    assert json.loads((tmp_path / "late" / "ppo_vs_peer.json").read_text())["records"] == []
    for bad in ("Craftax-Symbolic-v1", "Craftax-Symbolic-v1:4096:ours+flat"):
        try:
            bench.parse_points([bad], (bench.OURS,))
        except SystemExit as e:
            assert "ENV:N" in str(e) and bad in str(e)
        else:
            raise AssertionError(f"the point '{bad}' was accepted")


def test_check_passes_only_when_ours_is_faster_everywhere():
    pairs = [{"env": "A", "num_envs": 8, "ours_fps": 120.0, "peer_fps": 100.0, "ratio": 1.2},
             {"env": "B", "num_envs": 8, "ours_fps": 90.0, "peer_fps": 100.0, "ratio": 0.9}]
    assert bench.check(pairs[:1]) == []
    assert len(bench.check(pairs)) == 1 and "B at 8 envs" in bench.check(pairs)[0]
    assert len(bench.check(pairs[:1], threshold=1.5)) == 1


def test_missing_peer_checkout_is_an_error(tmp_path):
    try:
        bench.load_peer(tmp_path)
    except SystemExit as e:
        assert "no ppo.py" in str(e)
    else:
        raise AssertionError("load_peer accepted a folder without ppo.py")


def test_gpu_script_dry_run(tmp_path):
    """The device script's commands, without running them: both envs, the three sizes, the GPU's
    folder, the peer checkout and the compile threads; TINY=1 shrinks the sweep to a CPU-sized one."""
    env = {**os.environ, "DRY_RUN": "1", "PEER_DIR": str(tmp_path / "peer"), "GPU_NAME": "h200"}
    out = subprocess.run(["bash", str(ROOT / "benchmarks/device/ppo_peer_gpu.sh"), str(tmp_path / "o")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "benchmarks/ppo/ppo_vs_peer.py" in text and "--num-envs 1024 4096 16384" in text
    assert "Craftax-Symbolic-v1" in text and "Craftax-Classic-Symbolic-v1" in text
    assert "benchmarks/results/h200/ppo_peer" in text and f"--peer-dir {tmp_path / 'peer'}" in text
    assert "--num-steps 64" in text and "--updates 20" in text and "--compile-workers" in text
    tiny = subprocess.run(["bash", str(ROOT / "benchmarks/device/ppo_peer_gpu.sh"), str(tmp_path / "o")],
                          capture_output=True, text=True, env={**env, "TINY": "1"}, cwd=ROOT, timeout=60)
    assert tiny.returncode == 0 and "--num-envs 16 " in tiny.stdout and "--updates 2 " in tiny.stdout
    assert "--matmul-dtype" not in text
    bf16 = subprocess.run(["bash", str(ROOT / "benchmarks/device/ppo_peer_gpu.sh"), str(tmp_path / "o")],
                          capture_output=True, text=True, env={**env, "MATMUL_DTYPE": "bfloat16"}, cwd=ROOT, timeout=60)
    assert bf16.returncode == 0 and "--matmul-dtype bfloat16" in bf16.stdout
    assert "benchmarks/results/h200/ppo_peer_bfloat16" in bf16.stdout


def test_fps_ppo_point_is_the_same_measurement(monkeypatch, tmp_path):
    """benchmarks/ppo/fps.py's PPO point goes through ppo_vs_peer.run_point (20 updates by default, the
    peer beside it with --peer-dir) and keeps fps.json's record fields."""
    from benchmarks.ppo import fps

    seen = {}

    def fake_run_point(env, n, s, module, order, **_):
        seen.update(env=env, n=n, s=s, order=order, module=module)
        return [{"system": system, "fps": 100.0 + i, "compile_s": 1.0, "run_s": 2.0, "steps": n * s["num_steps"] * s["updates"],
                 "episodes_timed": None} for i, system in enumerate(order)]

    monkeypatch.setattr(bench, "run_point", fake_run_point)
    monkeypatch.setattr(bench, "load_peer", lambda d: "peer module")
    recs = fps.ppo("Craftax-Symbolic-v1", 256, 16, 20, "pool", 512, peer_dir=tmp_path)
    assert seen["s"]["updates"] == 20 and seen["order"] == (bench.OURS, bench.PEER) and seen["module"] == "peer module"
    assert [r["mode"] for r in recs] == ["vectorized", "craftax_baselines"]
    assert all(r["workload"] == "ppo" and r["steps"] == 256 * 16 * 20 and r["updates"] == 20 for r in recs)
    assert [r["mode"] for r in fps.ppo("CartPole-v1", 8, 8, 20, "pool", 8)] == ["vectorized"]


def _fake_profile(env: str, num_envs: int, env_ms: float) -> dict:
    pieces = [{"piece": name, "s_per_update": ms / 1e3, "share_of_sum": ms / (env_ms + 10.0)}
              for name, ms in (("env stepping and resets (random actions)", env_ms), ("forward + backward (epochs)", 10.0))]
    return {"env": env, "num_envs": num_envs, "num_steps": 64, "num_minibatches": 8, "update_epochs": 4, "width": 512,
            "pieces": pieces, "sum_s": (env_ms + 10.0) / 1e3, "whole_update_s": env_ms / 1e3,
            "whole_fps": num_envs * 64 / (env_ms / 1e3), "compile_s": {}}


def test_profiles_of_several_processes_merge_into_one_table(tmp_path):
    """benchmarks/device/ppo_profile_gpu.sh profiles each point in a process of its own, then merges
    their JSON files: one column per point, in the order given, envs and sizes named."""
    files = []
    for i, (env, n, ms) in enumerate((("Craftax-Symbolic-v1", 1024, 300.0), ("Craftax-Classic-Symbolic-v1", 4096, 200.0))):
        files.append(tmp_path / f"p{i}.json")
        files[-1].write_text(json.dumps({"profiles": [_fake_profile(env, n, ms)], "warmup_steps": 400, "date": "d",
                                         "device": {"device": "gpu:test"}}))
    assert bench.main(["--merge-profiles", *map(str, files), "--out", str(tmp_path / "out")]) == 0
    table = (tmp_path / "out" / "ppo_profile.md").read_text()
    assert "Craftax-Symbolic-v1, 1,024 envs" in table.splitlines()[0]
    assert table.splitlines()[0].index("1,024") < table.splitlines()[0].index("Classic")
    assert "| env stepping and resets (random actions) | 300.0 | 97% | 200.0 | 95% |" in table
    merged = json.loads((tmp_path / "out" / "ppo_profile.json").read_text())
    assert [p["num_envs"] for p in merged["profiles"]] == [1024, 4096]


def test_turn_lock_and_gate_exclude_other_holders(tmp_path):
    """The profiling processes' locks: a held turn keeps every other holder out until it ends, and
    the gate waits for the shared holders to leave."""
    import fcntl
    import threading

    path = tmp_path / "turn.lock"
    with bench.turn_lock(path)():
        with open(path, "a") as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(path, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the turn ended
    gate = tmp_path / "gate.lock"
    shared = open(gate, "a")
    fcntl.flock(shared, fcntl.LOCK_SH)
    passed = threading.Event()
    waiter = threading.Thread(target=lambda: (bench.wait_for(gate), passed.set()))
    waiter.start()
    assert not passed.wait(0.3)  # a smaller point still runs
    shared.close()
    assert passed.wait(10)
    waiter.join()
