"""The train CLI's bad-input errors: one clear message and exit code 2, before anything compiles."""

import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_hier.train import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["env=NoSuchEnv-v0"], ["unknown environment", "CartPole"]),
        (["num_envz=8"], ["unknown config key 'num_envz'", "Did you mean 'num_envs'"]),
        (["num_steps=12", "num_minibatches=8"], ["num_steps (12) must be divisible by num_minibatches (8)"]),
        (["num_envs=0"], ["'num_envs' must be positive"]),
        (["num_steps=-4"], ["'num_steps' must be positive"]),
        (["num_envs=abc"], ["'num_envs' must be an integer"]),
        (["world_uses=4", "reset_mode=auto"], ["'world_uses: 4' needs reset_mode 'pool' (got 'auto')"]),
        (["num_devices=64"], ["num_devices=64 but only"]),
        (["env_shards=3", "num_envs=16", "num_minibatches=4", "num_steps=8"],
         ["num_envs (16) must be divisible by the number of devices/env shards (3)"]),
        (["--config", "does/not/exist.yaml"], ["config file not found: does/not/exist.yaml"]),
        (["--config", "ppo_cartpol"], ["config file not found: ppo_cartpol.", "Did you mean 'ppo_cartpole'?",
                                        "packaged config: grpo_arithmetic,"]),
        (["matmul_dtype=float16"], ["'matmul_dtype' must be 'float32' or 'bfloat16', got 'float16'"]),
        (["network=gru", "matmul_dtype=bfloat16"], ["'matmul_dtype: bfloat16' applies to the MLP network only"]),
        (["env=Craftax-Classic-Pixels-v1"],  # the default config names the MLP
         ["network 'mlp' reads observations of rank 1, but Craftax-Classic-Pixels-v1 gives shape (63, 63, 3)",
          "Set network: cnn (or auto)"]),
        (["novalue"], ["not of the form key=value"]),
        (["--resume"], ["--resume needs --output-dir"]),
    ],
)
def test_bad_input_exits_2_with_clear_message(argv, expected, capsys, tmp_path):
    if "--resume" not in argv:
        argv = ["--output-dir", str(tmp_path / "run"), *argv]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ")
    for text in expected:
        assert text in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()  # failed before anything was set up


def test_resume_of_missing_run_is_clear(tmp_path, capsys):
    assert main(["--resume", "--output-dir", str(tmp_path / "nothing")]) == 2
    assert "config.yaml not found" in capsys.readouterr().err


def test_existing_checkpoints_need_resume(tmp_path, capsys):
    (tmp_path / "checkpoints" / "5").mkdir(parents=True)
    assert main(["--output-dir", str(tmp_path), "env=CartPole-v1"]) == 2
    assert "pass --resume" in capsys.readouterr().err


def test_cli_process_exit_code():
    # The real entry point, in its own process: the exit code reaches the shell.
    proc = subprocess.run([sys.executable, "-m", "jaxrl_hier.train", "bogus_key=1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown config key 'bogus_key'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_happy_path_writes_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["--output-dir", str(out), "--no-progress", "env=CartPole-v1", "num_envs=16", "num_steps=16",
                 "num_minibatches=4", "hidden_size=16", "num_layers=1", f"total_timesteps={16 * 16 * 6}",
                 "log_every=2", "checkpoint_every=4", "tensorboard=true"])
    assert code == 0
    import json

    import yaml

    config = yaml.safe_load((out / "config.yaml").read_text())
    assert next(iter(config)) == "algorithm" and config["algorithm"] == "ppo"
    assert config["env"] == "CartPole-v1" and config["num_envs"] == 16 and config["log_every"] == 2
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in lines] == [2, 4, 6]
    assert [r["env_steps"] for r in lines] == [512, 1024, 1536]
    for key in ("fps", "episode_return", "episode_length", "loss", "value_loss", "entropy"):
        assert key in lines[-1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == ["4", "6"]
    assert (out / "learning_curve.png").stat().st_size > 1000
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tensorboard").iterdir())
    assert not (out / "episode.gif").exists()  # GIFs are for Craftax only
    assert "episode return" in capsys.readouterr().err


def test_missing_logging_package_is_clear(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert main(["--output-dir", str(tmp_path), "wandb=true"]) == 2
    assert "wandb=true needs the wandb package: pip install -e '.[wandb]'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- resume safety, dispatch


def make_run_dir(path: Path, **changes) -> Path:
    """A run directory as a finished fresh run leaves it (config.yaml, metrics.jsonl), without compiling."""
    from jaxrl_hier.algorithms.ppo import PPOConfig
    from jaxrl_hier.config import load_config
    from jaxrl_hier.runs import save_run_config

    config = load_config(PPOConfig, ROOT / "configs" / "ppo_cartpole.yaml", changes)
    save_run_config(path / "config.yaml", "ppo", config)
    (path / "metrics.jsonl").write_text('{"update": 10, "env_steps": 20480}\n')
    return path


@pytest.mark.parametrize("override", ["total_timesteps=400000", "num_minibatches=2", "update_epochs=2", "seed=3"])
def test_unsafe_resume_override_exits_2_and_leaves_config_untouched(tmp_path, capsys, override):
    from jaxrl_hier.algorithms.ppo_cli import PPO_RESUME_SAFE_KEYS

    run = make_run_dir(tmp_path / "run")
    before = (run / "config.yaml").read_bytes()
    assert main(["--resume", "--output-dir", str(run), "log_every=5", override]) == 2
    err = capsys.readouterr().err
    key = override.split("=")[0]
    assert err.startswith(f"error: cannot change '{key}' on --resume"), err
    assert "Keys a resume may change: " + ", ".join(PPO_RESUME_SAFE_KEYS) in err
    assert (run / "config.yaml").read_bytes() == before  # the refused value never reaches the disk
    assert (run / "metrics.jsonl").read_text() == '{"update": 10, "env_steps": 20480}\n'


def test_resume_safe_keys_are_logging_only():
    from jaxrl_hier.algorithms.ppo import PPOConfig
    from jaxrl_hier.algorithms.ppo_cli import PPO_RESUME_SAFE_KEYS

    fields = {f.name for f in __import__("dataclasses").fields(PPOConfig)}
    assert set(PPO_RESUME_SAFE_KEYS) <= fields
    for key in ("total_timesteps", "num_minibatches", "update_epochs", "lr", "anneal_lr", "num_envs", "num_steps",
                "seed", "env", "env_shards", "num_devices"):
        assert key not in PPO_RESUME_SAFE_KEYS


def test_resume_rejects_changed_config_file(tmp_path, capsys):
    run = make_run_dir(tmp_path / "run")
    other = tmp_path / "other.yaml"
    other.write_text((run / "config.yaml").read_text().replace("lr: 0.0025", "lr: 0.001"))
    assert main(["--resume", "--output-dir", str(run), "--config", str(other)]) == 2
    assert "cannot change 'lr' on --resume (0.0025 in the run, 0.001 asked)" in capsys.readouterr().err


@pytest.mark.parametrize("existing", ["metrics.jsonl", "config.yaml"])
def test_fresh_run_over_an_earlier_run_is_refused(tmp_path, capsys, existing):
    (tmp_path / existing).write_text('{"update": 1}\n')
    assert main(["--output-dir", str(tmp_path), "env=CartPole-v1"]) == 2
    err = capsys.readouterr().err
    assert f"already holds an earlier run ({existing})" in err and "pass --resume" in err
    assert (tmp_path / existing).read_text() == '{"update": 1}\n'  # not appended to
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]


def test_unknown_algorithm_exits_2(tmp_path, capsys):
    assert main(["--output-dir", str(tmp_path / "run"), "algorithm=ppoo"]) == 2
    err = capsys.readouterr().err
    from jaxrl_hier.train import ALGORITHMS

    assert f"unknown algorithm 'ppoo'. Did you mean 'ppo'? Known algorithms: {', '.join(sorted(ALGORITHMS))}." in err
    assert not (tmp_path / "run").exists()


def test_algorithm_cannot_change_on_resume(tmp_path, capsys, monkeypatch):
    import jaxrl_hier.train as train

    monkeypatch.setitem(train.ALGORITHMS, "other", "jaxrl_hier.algorithms.ppo_cli:run_ppo")
    run = make_run_dir(tmp_path / "run")
    assert main(["--resume", "--output-dir", str(run), "algorithm=other"]) == 2
    assert "cannot change 'algorithm' on --resume" in capsys.readouterr().err


def test_dispatch_goes_through_the_registry(tmp_path, monkeypatch):
    import jaxrl_hier.train as train

    seen = {}

    def fake(args, raw):  # the contract a later algorithm implements
        seen.update(raw=raw, output_dir=args.output_dir, source=args.config_source)
        return 7

    monkeypatch.setattr(train, "_test_algorithm", fake, raising=False)
    monkeypatch.setitem(train.ALGORITHMS, "fake", "jaxrl_hier.train:_test_algorithm")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algorithm: fake\nlr: 0.5\n")
    assert main(["--config", str(cfg), "--output-dir", str(tmp_path / "o"), "steps=3"]) == 7
    assert seen == {"raw": {"lr": 0.5, "steps": 3}, "output_dir": tmp_path / "o", "source": str(cfg)}


def test_distributed_env_vars_must_be_integers(capsys, monkeypatch):
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    assert main(["--distributed", "env=CartPole-v1"]) == 2
    assert "JAX_NUM_PROCESSES must be an integer, got 'two'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- atomic writes, GIF


def test_atomic_writer_replaces_whole_files_only(tmp_path):
    from jaxrl_hier.io import atomic_writer

    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_writer(target, "w") as f:
            f.write("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    with atomic_writer(target, "w") as f:
        f.write("new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    assert target.stat().st_mode & 0o777 == 0o644


def test_atomic_directory_appears_whole_or_not_at_all(tmp_path):
    from jaxrl_hier.io import atomic_directory

    target = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("crash mid-copy")
    assert list(tmp_path.iterdir()) == []  # neither the directory nor its temporary one
    with atomic_directory(target) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "a.txt").write_text("whole")
        assert not target.exists()  # nothing under the name until the end
    assert (target / "sub" / "a.txt").read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == ["run"]
    assert target.stat().st_mode & 0o777 == 0o755
    with pytest.raises(OSError):  # never over a directory with files in it
        with atomic_directory(target) as tmp:
            (tmp / "b.txt").write_text("other")
    assert sorted(p.name for p in target.rglob("*")) == ["a.txt", "sub"]
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_episode_gif_frames_are_scaled_and_captioned():
    import numpy as np

    from jaxrl_hier.logging.episode_gif import annotate_frames

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 144, 144, 3), dtype=np.uint8)
    names = [[], ["collect_wood"], ["collect_wood", "place_table"]]
    out = annotate_frames(frames, names, scale=4)
    assert out.dtype == np.uint8 and out.shape[0] == 3 and out.shape[2] == 576 and out.shape[1] > 576
    # Nearest neighbour: every source pixel becomes a 4x4 block.
    np.testing.assert_array_equal(out[:, :576:4, ::4], frames)
    np.testing.assert_array_equal(out[:, 1:576:4, 3::4], frames)
    strips = out[:, 576:]
    assert (strips != strips[0, -1, -1]).any(axis=(1, 2, 3)).all()  # text drawn on every strip
    assert not np.array_equal(strips[0], strips[1]) and not np.array_equal(strips[1], strips[2])
    np.testing.assert_array_equal(annotate_frames(frames, None, scale=2), frames.repeat(2, 1).repeat(2, 2))
    with pytest.raises(ValueError, match="3 frames but 2 achievement lists"):
        annotate_frames(frames, names[:2])


def test_progress_bar_closes_when_the_loop_fails():
    """Every training loop draws its bar in `with progress_bar(...)`: an error in the loop closes the
    bar (tqdm finishes its line and stops its monitor thread) before the traceback is printed."""
    import argparse

    from jaxrl_hier.runs import progress_bar

    with pytest.raises(RuntimeError, match="in the loop"):
        with progress_bar(argparse.Namespace(no_progress=False), 10, 2, "test") as bar:
            bar.update(1)
            raise RuntimeError("in the loop")
    assert bar.n == 3 and bar.disable  # tqdm.close() disables the bar
    with progress_bar(argparse.Namespace(no_progress=True), 10, 0, "test") as bar:
        assert bar is None


def _imports(path):
    """Every module name an import statement of `path` names, at module level or inside a function
    (`from a.b import c` names a.b and a.b.c: c may be a module)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def test_no_library_module_or_other_family_imports_a_cli():
    """A CLI file is an entry point only: what two entry points share lives in a library module
    (the warm-start in llm_rl.sft_stage, the run directory in jaxrl_hier.runs). Only a package's
    own __main__ may import its CLI."""
    import re

    is_cli = re.compile(r"(^|_)cli$").search
    found = []
    for path in (ROOT / "jaxrl_hier").rglob("*.py"):
        for module in _imports(path):
            package, _, name = module.rpartition(".")
            own_main = path.name == "__main__.py" and package == ".".join(path.relative_to(ROOT).parent.parts)
            if is_cli(name) and not own_main:
                found.append(f"{path.relative_to(ROOT)} imports {module}")
    assert found == []


def test_the_package_has_no_import_circle():
    """Dependencies point down: no module reaches itself through the imports of the modules it
    imports, lazy imports inside functions included (a lazy import hides a circle, it does not
    remove it). A module importing its own parent package is not a circle: Python runs the
    package first anyway."""
    import graphlib

    modules = {}
    for path in (ROOT / "jaxrl_hier").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {m: {n for n in _imports(path) if n in modules and n != m and not m.startswith(n + ".")}
             for m, path in modules.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        raise AssertionError(f"import circle: {' -> '.join(err.args[1])}") from None


def test_every_cli_plot_writes_a_png_and_closes_its_figure(tmp_path):
    """The learning curves and PGTS's accuracy-vs-tokens plot go through logging.plots.save_figure:
    a whole PNG or nothing at the path, and no figure left open across a long run's plots."""
    import matplotlib.pyplot as plt

    from jaxrl_hier.llm_rl.cli import plot_grpo_curve
    from jaxrl_hier.llm_rl.guided_cli import plot_guided_curve
    from jaxrl_hier.search.cli import plot_accuracy_vs_tokens, plot_pgts_curve

    rows = [{"step": s, "update": s, "reward": 0.1 * s, "accuracy": 0.2, "episode_return": 1.0 + s,
             "achievement/correct": 0.5, "eval/accuracy": 0.3, "train/turns": 3.0, "eval/turns": 2.0} for s in range(3)]
    methods = [{"method": "CoT greedy", "tokens": 10.0, "accuracy": 0.4},
               {"method": "self-consistency@2", "tokens": 20.0, "accuracy": 0.5}]
    plots = {"grpo.png": lambda p: plot_grpo_curve(rows, p, "grpo"),
             "guided.png": lambda p: plot_guided_curve(rows, p, "guided", "guess_number"),
             "pgts.png": lambda p: plot_pgts_curve(rows, p, "pgts"),
             "tokens.png": lambda p: plot_accuracy_vs_tokens(methods, p, "tokens")}
    for name, plot in plots.items():
        plot(tmp_path / name)
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert plt.get_fignums() == [], name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(plots)  # no temporary file left beside them


def test_plot_curves_draws_each_series_where_its_records_hold_it(monkeypatch, tmp_path):
    """Panels of series: an evaluation key logged every other step is drawn at those steps only, a key
    no record holds draws nothing (and no legend entry), and each panel gets its own axes."""
    from jaxrl_hier.logging import plots

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, dpi: figures.append(fig))
    rows = [{"step": s, "reward": float(s), **({"eval/accuracy": s / 10} if s % 2 == 0 else {})} for s in range(5)]
    plots.plot_curves(rows, tmp_path / "c.png", x="step", panels=[
        plots.Panel("step", (plots.Series("reward", "reward"), plots.Series("missing", "never logged"))),
        plots.Panel("step", (plots.Series("eval/accuracy", "eval", style="o-"),), "accuracy")])
    (fig,) = figures
    left, right = fig.axes
    assert [line.get_label() for line in left.lines] == ["reward"]
    assert list(left.lines[0].get_xdata()) == [0, 1, 2, 3, 4]
    assert list(right.lines[0].get_xdata()) == [0, 2, 4] and list(right.lines[0].get_ydata()) == [0.0, 0.2, 0.4]
    assert right.get_ylabel() == "accuracy" and [t.get_text() for t in left.get_legend().get_texts()] == ["reward"]
    plots.pyplot().close(fig)


def test_pyplot_helper_selects_agg_and_jaxrl_hier_imports_no_matplotlib():
    """Every plot gets pyplot from logging.plots.pyplot (Agg, no display needed); matplotlib is imported
    only when a plot is drawn, never by importing the package (a fresh process shows it)."""
    import matplotlib

    from jaxrl_hier.logging.plots import pyplot

    plt = pyplot()
    assert plt is sys.modules["matplotlib.pyplot"]
    assert matplotlib.get_backend().lower() == "agg"
    proc = subprocess.run([sys.executable, "-c", "import jaxrl_hier, sys; assert 'matplotlib' not in sys.modules"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_only_the_pyplot_helper_sets_up_matplotlib():
    """One copy of the matplotlib set-up: no module of the package or its benchmarks but logging/plots.py
    calls matplotlib.use or imports pyplot itself; they call jaxrl_hier.logging.plots.pyplot()."""
    import ast

    helper = ROOT / "jaxrl_hier" / "logging" / "plots.py"
    found = []
    for path in sorted([*(ROOT / "jaxrl_hier").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        if path == helper:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "use" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "matplotlib":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} calls matplotlib.use")
            elif isinstance(node, ast.Import) and any(a.name == "matplotlib.pyplot" for a in node.names) or \
                    isinstance(node, ast.ImportFrom) and (node.module == "matplotlib.pyplot" or node.module == "matplotlib"
                                                          and any(a.name == "pyplot" for a in node.names)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports matplotlib.pyplot")
    assert found == []
