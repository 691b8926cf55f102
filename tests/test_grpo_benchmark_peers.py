"""benchmarks/llm_rl/grpo.py --check-peers: the verdict on arm / minimal-script pairs (on recorded numbers, no
peer is run), the workers' OMP_WAIT_POLICY and environment, the exit code, and the TRL arm asking for
the same work as TRL's minimal script (constructed, not trained)."""

import sys
from dataclasses import asdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.llm_rl import grpo as bench  # noqa: E402

# Round medians (s) recorded on the shared 2-core Xeon: the TRL arm with bf16 autocast left on by a
# stray comment (the bug --check-peers caught in this branch) against TRL's minimal script, 4 rounds.
SLOW_ARM = [2.219, 2.087, 2.100, 2.247]
MINIMAL = [1.113, 1.124, 1.092, 1.037]


def test_arm_twice_as_slow_as_its_minimal_script_fails():
    c = bench.peer_check(SLOW_ARM, MINIMAL)
    assert not c["ok"] and c["ratio"] == pytest.approx(1.95, abs=0.02)
    assert len(c["round_ratios"]) == 4 and min(c["round_ratios"]) > 1.8


def test_verdict_is_on_the_median_of_paired_ratios_with_a_10_percent_tolerance():
    # one bad round (the CPU's drift) does not fail a peer whose other pairs match
    c = bench.peer_check([1.0, 1.05, 1.6], [1.0, 1.0, 1.0])
    assert c["ok"] and c["ratio"] == pytest.approx(1.05)
    assert bench.peer_check([1.09], [1.0])["ok"] and not bench.peer_check([1.11], [1.0])["ok"]
    assert bench.peer_check([0.5], [1.0])["ok"]  # an arm faster than the plain script is fine
    assert not bench.peer_check([1.04], [1.0], tolerance=0.03)["ok"]
    with pytest.raises(ValueError):
        bench.peer_check([1.0, 1.0], [1.0])


def test_omp_wait_policy_follows_the_measured_load_unless_the_user_set_it():
    plain = {}
    assert bench.omp_wait_policy("auto", 0.02, plain) is None  # idle: torch's default (spin, then sleep)
    assert bench.omp_wait_policy("auto", 0.5, plain) == "PASSIVE"  # other jobs on the CPU
    assert bench.omp_wait_policy("auto", None, plain) == "PASSIVE"  # unknown load: the safe choice
    assert bench.omp_wait_policy("passive", 0.0, plain) == "PASSIVE"
    assert bench.omp_wait_policy("default", 1.0, plain) is None
    assert bench.omp_wait_policy("auto", 1.0, {"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"


def test_worker_env_keeps_peers_on_xla_defaults_and_sets_the_wait_policy(monkeypatch):
    monkeypatch.setattr(bench, "USER_ENV", {"PATH": "/bin", "OMP_WAIT_POLICY": "ACTIVE"})
    trl = bench.worker_env(2, "trl", "cpu", wait_policy=None)
    assert "OMP_WAIT_POLICY" not in trl and trl["OMP_NUM_THREADS"] == "2" and trl["PATH"] == "/bin"
    assert trl["JAXRL_HIER_KEEP_XLA_CPU_SCHEDULER"] == "1" and "XLA_FLAGS" not in trl
    assert bench.worker_env(2, "tunix", "cpu", "PASSIVE")["OMP_WAIT_POLICY"] == "PASSIVE"
    ours = bench.worker_env(2, "ours", "cpu", "PASSIVE")
    assert "JAXRL_HIER_KEEP_XLA_CPU_SCHEDULER" not in ours  # ours gets jaxrl_hier's flag from its import


def test_check_peers_needs_a_peer():
    assert bench.main(["--check-peers", "--systems", "ours", "--out", "/nonexistent-never-written"]) == 2


def test_a_failed_peer_check_exits_1_and_is_marked_in_the_table(monkeypatch, tmp_path):
    check = dict(system="trl", beta=0.0, minimal_runs=[], **bench.peer_check(SLOW_ARM, MINIMAL))
    result = dict(settings=asdict(bench.Settings()), records=[], speedups=[], rounds=4, steps=5, warmup=1,
                  device={"device": "cpu:cpu", "cpu_model": "Test CPU", "cpu_count": 2}, notes="",
                  model={"preset": "tiny"}, peer_check=[check])
    monkeypatch.setattr(bench, "run", lambda args: result)
    assert bench.main(["--systems", "ours", "--out", str(tmp_path)]) == 1
    md = (tmp_path / "grpo.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| trl | 0 | 2.1"))
    assert row.endswith("| 1.958 | 1.86-2.17 | **no** |") and "(Test CPU)" in md
    result["peer_check"] = [dict(check, **bench.peer_check(MINIMAL, MINIMAL))]
    assert bench.main(["--systems", "ours", "--out", str(tmp_path)]) == 0


def test_trl_arm_asks_for_the_work_of_trls_minimal_script(monkeypatch, tmp_path):
    """Both build their GRPOConfig; the fields that change the work must agree (bf16 autocast, the batch,
    the tokens, beta, the loss, recomputation, the forbidden tokens), and both use TRL's default optimiser."""
    trl = pytest.importorskip("trl")
    from benchmarks.llm_rl import grpo_minimal

    bench.make_checkpoint(tmp_path)
    seen = []

    class Built(Exception):
        pass

    def capture(self, *a, **kw):
        seen.append(kw["args"])
        raise Built

    monkeypatch.setattr(trl.GRPOTrainer, "__init__", capture)
    with pytest.raises(Built):
        bench.bench_trl(tmp_path, bench.PROMPTS, bench.RewardLog(), 0.04, 3, 1)
    with pytest.raises(Built):
        grpo_minimal.trl(str(tmp_path), 0.04, 3, 1, 2, bench.RewardLog())
    arm, minimal = seen
    for field in ("bf16", "fp16", "per_device_train_batch_size", "num_generations", "max_completion_length",
                  "beta", "loss_type", "gradient_checkpointing", "num_iterations", "steps_per_generation",
                  "temperature", "top_p", "top_k", "max_grad_norm", "learning_rate", "max_steps", "optim"):
        assert getattr(arm, field) == getattr(minimal, field), field
    assert arm.bf16 is False and arm.generation_kwargs == minimal.generation_kwargs
