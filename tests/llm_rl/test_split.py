"""Co-located and split (server-style) placements give the same GRPO numbers on 4 simulated CPU devices."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
import jax
import jaxrl_hier
from jaxrl_hier.llm_rl.config import GRPOConfig, ModelSection
from jaxrl_hier.llm_rl.grpo import make_train
from jaxrl_hier.llm_rl.model_setup import build_mesh, build_policy
from jaxrl_hier.tasks import build_char_tokenizer, make_task

assert len(jax.devices()) == 4
out = {}
for placement in ("colocated", "split"):
    cfg = GRPOConfig(task_operators="+", task_digits=1, task_steps=1,
                     model=ModelSection(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64),
                     max_prompt_length=6, max_new_tokens=6, prompts_per_step=4, num_generations=4, beta=0.04, learning_rate=1e-2,
                     reward_format=1.0, placement=placement)
    task = make_task("arithmetic", operators="+", digits=1, steps=1)
    lm, tok = build_policy(cfg, build_char_tokenizer(), mesh=build_mesh(cfg))
    trainer = make_train(cfg, lm, tok, task)
    state = trainer.init(jax.random.key(0))
    rows = []
    for _ in range(3):
        state, metrics, _ = trainer.step(state)
        rows.append({k: metrics[k] for k in ("reward", "loss", "kl", "entropy", "completion_length")})
    devices = {d.id for x in jax.tree.leaves(state.trainable) for d in x.devices()}
    out[placement] = {"rows": rows, "train_devices": sorted(devices)}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_split_equals_colocated_on_four_devices():
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"  # after the session's
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["colocated"]["train_devices"] == [0, 1, 2, 3]
    assert out["split"]["train_devices"] == [2, 3]  # the trainer's half; the sampler got copies on 0 and 1
    for a, b in zip(out["colocated"]["rows"], out["split"]["rows"]):
        for key, value in a.items():
            assert abs(value - b[key]) <= 1e-4 * max(1.0, abs(value)), (key, a, b)
