"""Skill slots on 4 simulated CPU devices compute what they compute on one device (env shards), with
idle slots left out of the compiled round and plan-sized expert banks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import jax, numpy as np
    from jaxrl_hier.skills.config import skills_config_from_dict
    from jaxrl_hier.skills.library import techtree_library
    from jaxrl_hier.skills.trainer import SkillTrainer
    assert jax.device_count() == 4
    lib = techtree_library()

    def run(devices):
        c = skills_config_from_dict({"env": "TechTree-v0", "max_parallel_skills": 2, "updates_per_round": 2,
                                     "max_experts": 2, "max_conditions": 2,
                                     "ppo": {"num_envs": 32, "num_steps": 8, "num_minibatches": 4, "hidden_size": 32,
                                             "num_layers": 1, "env_shards": 4, "num_devices": devices}})
        t = SkillTrainer(c, lib)
        t.init(jax.random.key(0))
        t.start({0: "collect_wood"}, lib, {}, jax.random.key(1))
        r1 = t.train_round()
        t.start({1: "place_table"}, lib, {"collect_wood": t.expert(0)}, jax.random.key(2))  # swap a slot in
        r2 = t.train_round()
        return t, r1 + r2

    one, res1 = run(1)
    four, res4 = run(4)
    assert len(four.runner.obs["obs"].sharding.device_set) == 4
    for a, b in zip(jax.tree.leaves(one.runner.train_state.params), jax.tree.leaves(four.runner.train_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    for x, y in zip(res1, res4):
        assert x.episodes == y.episodes and (x.success_rate is None or abs(x.success_rate - y.success_rate) < 1e-5)
        assert x.greedy_episodes == y.greedy_episodes and x.greedy_success_rate == y.greedy_success_rate
    # Round 1: slot 1 idle, so it took no steps; the active slot was also evaluated greedily.
    assert res1[1].steps == 0 and res1[1].greedy_episodes == 0 and res1[0].greedy_episodes == 32
    assert res1[2].steps > 0 and res1[3].steps > 0
    print("EQUAL")
""")


@pytest.mark.slow
def test_skill_slots_on_four_devices_equal_one_device():
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"  # after the session's
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "EQUAL" in proc.stdout
