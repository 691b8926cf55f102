"""benchmarks/skills/episode_ends.py's figures from a handful of made-up episodes, and its probes
against the names of Craftax's quantities (the skills' condition vocabulary)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.skills import episode_ends  # noqa: E402
from jaxrl_hier.skills.composition import EpisodeStats  # noqa: E402


def test_shares_and_first_steps_per_probe():
    names = [p[0] for p in episode_ends.PROBES]
    held = np.zeros((4, len(names)), bool)
    first = np.full((4, len(names)), -1)
    held[0, 1], first[0, 1] = True, 180  # drink ran out in episode 0, at step 180
    held[1, 0], first[1, 0] = True, 240  # food in episode 1
    held[:, 6], first[:, 6] = True, [150, 250, 100, 60]  # health fell to 3 in every episode
    stats = EpisodeStats(np.zeros((4, 22), bool), np.zeros(4), np.array([200, 260, 110, 70]), held, first,
                         np.zeros((4, 1), np.int32))
    out = episode_ends.summarise(stats, names)
    assert out["mean_length"] == 160.0
    assert out["no_need_at_0"] == 0.5  # episodes 2 and 3 ended with every need above 0: damage
    assert out["probes"]["drink at 0"] == {"share": 0.25, "mean_first_step": 180.0}
    assert out["probes"]["health <= 3"] == {"share": 1.0, "mean_first_step": 140.0}
    assert out["probes"]["energy at 0"] == {"share": 0.0, "mean_first_step": None}
    assert "ended_in_the_dark" not in out and out["median_length"] == 155.0


def test_episodes_that_end_in_craftax_classics_night():
    from jaxrl_hier.envs import make

    _, params = make("Craftax-Classic-Symbolic-v1")
    light = episode_ends.classic_light(params)
    np.testing.assert_allclose(light(np.array([0, 100, 148, 210, 272, 300])), [0.8, 0.93, 0.49, 0.0, 0.49, 0.8],
                               atol=0.006)
    names = [p[0] for p in episode_ends.PROBES]
    held, first = np.zeros((4, len(names)), bool), np.full((4, len(names)), -1)
    # steps 210 and 500 are in the dark, 100 in daylight; the last episode ran to the limit
    stats = EpisodeStats(np.zeros((4, 22), bool), np.zeros(4), np.array([210, 500, 100, 1000]), held, first,
                         np.zeros((4, 1), np.int32))
    out = episode_ends.summarise(stats, names, light, limit=1000, day_length=300)
    assert out["ended_in_the_dark"] == 2 / 3 and out["ended_on_day"] == {"1": 2 / 3, "2": 1 / 3, "3+": 0.0}


def test_probes_name_craftax_quantities():
    from jaxrl_hier.envs import make
    from jaxrl_hier.skills.quantities import env_quantities

    env, _ = make("Craftax-Classic-Symbolic-v1")
    known = env_quantities(env)
    assert all(q in known for _, q, _, _ in episode_ends.PROBES)
    assert [p[1] for p in episode_ends.PROBES[:3]] == ["food", "drink", "energy"]  # summarise reads these three
