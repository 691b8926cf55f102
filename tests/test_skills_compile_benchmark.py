"""benchmarks/skills/skills_compile.py without compiling anything: its shapes and overrides are checked
before the trainer is built (exit with a message naming the fix), each shape gets the skill whose
plan fills its bank, and the report reads every settings' JSON in the folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.skills import skills_compile as bench  # noqa: E402
from jaxrl_hier.skills.library import craftax_classic_library  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_shapes_overrides_and_skills_for_each_bank():
    assert bench.parse_shape("3x12", 3, 12) == (3, 12)
    for bad in ("4x2", "1x13", "two"):
        with pytest.raises(SystemExit, match="AxR|max_parallel_skills"):
            bench.parse_shape(bad, 3, 12)
    # ppo.KEY merges into the config's ppo section (ppo= alone would replace it)
    merged = bench.merged_overrides(str(ROOT / "configs/skills_craftax_classic_gpu.yaml"),
                                    ["ppo.num_envs=4", "max_experts=2"])
    assert merged["max_experts"] == 2 and merged["ppo"]["num_envs"] == 4 and merged["ppo"]["hidden_size"] == 512
    lib = craftax_classic_library()
    picks = {rows: bench.skill_for_rows(lib, rows) for rows in (0, 1, 2, 12)}
    assert [len(lib.closure(picks[r])) for r in (0, 1, 2, 12)] == [0, 1, 2, 9]


def test_report_tables_every_settings_file(tmp_path):
    for label, compile_s in (("default", 58.9), ("autotune0", 42.7)):
        shape = {"shape": "1x2", "skill": "make_wood_pickaxe", "plan_len": 2, "compile_s": compile_s,
                 "round_s": 4.8, "env_steps_per_s": 136000.0}
        (tmp_path / f"skills_compile_{label}.json").write_text(json.dumps(
            {"label": label, "device": {"device": "gpu:H200", "jax": "0.11.2"}, "xla_flags": "",
             "compilation_cache_dir": None, "shapes": [shape]}))
    bench.write_report(tmp_path)
    table = (tmp_path / "skills_compile.md").read_text()
    assert "| default | 1x2 | make_wood_pickaxe (2) | 58.9 |" in table and "| autotune0 | 1x2" in table
    assert (tmp_path / "skills_compile.png").stat().st_size > 0


def test_skills_speed_refuses_bad_skills_before_compiling(tmp_path, capsys):
    """benchmarks/skills/skills_speed.py: unknown skills, or more --together than the config runs at once, exit 2
    with a message naming the fix, before any program is built or the output folder is made."""
    from benchmarks.skills import skills_speed

    config = str(ROOT / "configs/skills_techtree.yaml")
    assert skills_speed.main(["--config", config, "--out", str(tmp_path / "o"), "--skills", "collect_wod"]) == 2
    assert "collect_wod" in capsys.readouterr().err
    many = ["collect_wood", "place_table", "make_wood_pickaxe", "collect_stone"]
    assert skills_speed.main(["--config", config, "--out", str(tmp_path / "o"), "--skills", *many, "--together"]) == 2
    assert "max_parallel_skills" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_skills_speed_report_reads_a_cut_short_run():
    from benchmarks.skills import skills_speed

    result = {"env": "Craftax-Classic-Symbolic-v1", "config": "c.yaml", "overrides": [], "complete": False,
              "device": {"device": "cpu:cpu", "cpu_model": "AMD EPYC", "jax": "0.10.2"},
              "round": {"flat PPO": {"steps_per_s": 1000.0, "round_s": 4.0, "first_round_s": 60.0}},
              "env_only": {}, "policy": {}}
    text = skills_speed.markdown(result)
    assert "cut short" in text and "| flat PPO | 1,000 | 1.00 |" in text and "env alone" not in text


def test_skills_vs_ppo_table_puts_a_manager_variant_beside_the_others():
    from benchmarks.skills import skills_vs_ppo

    def agent(rate: float, score: float) -> dict:
        mode = {"achievements": {"collect_wood": rate}, "mean_return": 2.0 * rate, "score_percent_of_max": score}
        return {"greedy": mode, "sampled": mode, "env_steps": 100, "curve": []}

    run = {"seed": 0, "skills": {**agent(0.5, 10.0), "target": "collect_wood", "completed": ["collect_wood"],
                                 "wall_s": 5.0, "steps_per_s": 20.0, "median_round_steps_per_s": 25.0},
           "manager": agent(0.6, 20.0), "variant": agent(0.9, 30.0), "ppo": {**agent(0.7, 25.0), "wall_s": 4.0}}
    results = {"seeds": [0], "episodes": 4, "max_steps": 10, "runs": [run], "variant_label": "manager + base actions"}
    text = skills_vs_ppo.table(results, ["collect_wood"])
    header = text.splitlines()[2]
    assert header.index("skills + manager (greedy)") < header.index("manager + base actions (greedy)") < header.index(
        "flat PPO (greedy)")
    assert "| score (% of max) | 10.0 | 10.0 | 20.0 | 20.0 | 30.0 | 30.0 | 25.0 | 25.0 |" in text
    # a flat-PPO-only control (--ppo-budget): one agent, no skills rows
    alone = skills_vs_ppo.table({**results, "runs": [{"seed": 0, "ppo": run["ppo"]}]}, ["collect_wood"])
    assert "| score (% of max) | 25.0 | 25.0 |" in alone and "skills run" not in alone and "composed" not in alone


def test_skills_vs_ppo_seeds_share_one_compilation_cache(monkeypatch, tmp_path):
    """Each seed's skills run is a process of its own: it gets the benchmark's cache directory, so the
    seeds after the first load the programs the first compiled."""
    from types import SimpleNamespace

    from benchmarks.skills import skills_vs_ppo
    from jaxrl_hier.runs import use_compilation_cache

    cache = use_compilation_cache(tmp_path)  # what main() sets up (the suite's own directory wins)
    seen = {}

    def fake_run(cmd, **kw):
        seen.update(cmd=cmd, env=kw["env"])
        return SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(skills_vs_ppo.subprocess, "run", fake_run)
    args = SimpleNamespace(out=tmp_path, config="c.yaml", overrides=[], xla_cache=cache)
    out, _ = skills_vs_ppo.run_skills(args, 1)
    assert out == tmp_path / "skills_seed1" and "seed=1" in seen["cmd"]
    assert seen["env"]["JAX_COMPILATION_CACHE_DIR"] == str(cache)


def test_op_profile_lists_a_programs_own_ops_with_their_shapes_and_jax_operations():
    """jaxrl_hier.bench.op_profile (skills_speed.py --trace): the profiler's events of the program's
    ops, per call, each traced to its HLO shape and JAX operation; the runtime's host-side events left out."""
    import jax
    import jax.numpy as jnp

    from jaxrl_hier.bench import op_profile

    f = jax.jit(lambda a, b: jnp.tanh(a @ b).sum())
    a, b = jnp.ones((64, 128)), jnp.ones((128, 32))
    hlo = f.lower(a, b).compile().as_text()
    f(a, b).block_until_ready()
    ops = op_profile(lambda: jax.block_until_ready(f(a, b)), 3, hlo)
    assert ops and all(o["op"] in hlo and o["shape"] for o in ops)
    assert any((o["op_name"] or "").startswith("jit(<lambda>)") for o in ops)
    assert all(o["runs_per_call"] == 1 and o["ms_per_call"] > 0 for o in ops)


def test_an_events_own_time_leaves_out_the_events_nested_in_it():
    from jaxrl_hier.bench import _self_times

    def ev(name, ts, dur, tid=1):
        return {"name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1}

    loop = [ev("while", 0, 10), ev("dot", 2, 3), ev("cond", 6, 3), ev("fusion", 7, 1), ev("dot", 0, 4, tid=2)]
    own = {(e["name"], e["tid"]): t for e, t in _self_times(loop)}
    assert own == {("while", 1): 4, ("dot", 1): 3, ("cond", 1): 2, ("fusion", 1): 1, ("dot", 2): 4}


def test_skills_vs_ppo_says_where_a_skills_runs_wall_time_went(tmp_path):
    """Each later stage's chunks from its metrics.jsonl; the rest is the wall time outside rounds and stages."""
    from benchmarks.skills import skills_vs_ppo

    (tmp_path / "chain").mkdir()
    (tmp_path / "chain" / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"wall_s": w, "env_steps": s}) for w, s in ((9.0, 100), (1.0, 200))) + "\n")
    stages = skills_vs_ppo.stage_times(tmp_path)
    assert stages == {"chain": {"wall_s": 10.0, "first_chunk_s": 9.0, "env_steps": 200, "steps_per_s": 20.0}}
    skills = {"wall_s": 30.0, "round_time_s": 12.0, "compile_rounds_s": 5.0, "stages": stages}
    assert skills_vs_ppo.wall_parts(skills) == {"skill rounds": 7.0, "skill rounds that compiled": 5.0,
                                                "chain": 10.0, "the rest": 8.0}
    assert skills_vs_ppo.wall_parts({**skills, "wall_s": None}) is None


def test_moe_benchmark_times_the_whole_banks_gradient_at_each_block_size(tmp_path):
    from benchmarks.skills import moe

    argv = ["--out", str(tmp_path), "--experts", "1", "3", "--rows", "12", "--obs-dim", "5", "--hidden", "4",
            "--layers", "1", "--actions", "3", "--repeats", "1"]
    assert moe.main(argv + ["--block-sizes", "0"]) == 2
    assert moe.main(argv + ["--block-sizes", "2", "4"]) == 0
    records = json.loads((tmp_path / "moe.json").read_text())["records"]
    bank = [(r["dispatch"], r["experts"], r["block_size"]) for r in records if r["workload"] == "bank grad"]
    assert bank == [(d, e, b) for e in (1, 3) for d, b in (("gather", 2), ("gather", 4), ("gather (batched)", 2),
                                                            ("gather (batched)", 4), ("mask", None))]
    assert (tmp_path / "moe.png").is_file()


def test_skills_speed_env_only_times_the_envs_alone(tmp_path):
    """`--env-only`: the base env and each listed skill's env at the config's num_envs, nothing trained."""
    from benchmarks.skills import skills_speed

    out = tmp_path / "o"
    argv = ["ppo.num_envs=8", "updates_per_round=1", "ppo.num_steps=4", "--config", str(ROOT / "configs/skills_techtree.yaml"),
            "--out", str(out), "--env-only", "--repeats", "1", "--skills", "make_wood_pickaxe"]
    assert skills_speed.main(argv) == 0
    result = json.loads((out / "skills_speed.json").read_text())
    assert result["complete"] and result["num_envs"] == 8 and not result["round"] and not result["policy"]
    assert set(result["env_only"]) == {"base", "make_wood_pickaxe"}
    assert all(r["steps_per_s"] > 0 for r in result["env_only"].values())
    assert "| env alone (8 envs) |" in (out / "skills_speed.md").read_text()
