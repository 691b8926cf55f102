"""The package as `pip install .` gives it: the wheel holds the configs, the license and the console
script, and the installed package (not the source tree) runs the train CLI's `--help` and loads the
default config and a packaged config by name, from a directory outside the source tree. Nothing
trains. Also: CITATION.cff and CHANGELOG.md carry the version of pyproject.toml.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
CONFIGS = sorted(p.name for p in (ROOT / "jaxrl_hier" / "configs").glob("*.yaml"))


def _setuptools_builds_offline() -> bool:
    """Whether this environment's setuptools meets pyproject's build requirement (`setuptools>=N`), so
    the wheel builds without an isolated build environment (which pip fills from the package index)."""
    from packaging.requirements import Requirement

    (requirement,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    try:
        return importlib.metadata.version("setuptools") in requirement.specifier
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory) -> tuple[Path, Path]:
    """(the built wheel, the folder it is installed into with `pip install --target`)."""
    tmp = tmp_path_factory.mktemp("packaging")
    # Build from a copy of what the wheel is made of, so no build/ or egg-info lands in the source tree
    # and nothing left in an old build/ folder can slip into the wheel.
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "jaxrl_hier", src / "jaxrl_hier", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"), str(src)]
    if _setuptools_builds_offline():
        build.append("--no-build-isolation")
    subprocess.run(build, check=True, capture_output=True, text=True, timeout=240)
    (wheel,) = (tmp / "dist").glob("jaxrl_hier-*.whl")
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=120)
    return wheel, site


def _run_installed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python ARGS` in `cwd` with the installed copy first on the path (ahead of an editable install)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def test_wheel_holds_configs_license_and_console_script(wheel_install):
    wheel, _ = wheel_install
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"jaxrl_hier-{VERSION}.dist-info"
        entry_points = z.read(f"{info}/entry_points.txt").decode()
        metadata = z.read(f"{info}/METADATA").decode()
    assert "ppo_default.yaml" in CONFIGS
    assert [n for n in CONFIGS if f"jaxrl_hier/configs/{n}" not in names] == []
    assert f"{info}/licenses/LICENSE" in names
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "[console_scripts]" in entry_points
    assert "jaxrl-hier-train = jaxrl_hier.train:main" in entry_points.splitlines()


LOAD_CONFIGS = """
import json, sys
import jaxrl_hier
from jaxrl_hier.algorithms.ppo import PPOConfig
from jaxrl_hier.config import config_from_args
from jaxrl_hier.train import load_raw_config, parse_args

out = {"package": jaxrl_hier.__file__}
for label, argv in (("default", []), ("by_name", ["--config", "ppo_cartpole"])):
    args = parse_args(argv)
    raw, source = load_raw_config(args)
    raw.pop("algorithm", None)
    out[label] = {"source": source, "env": config_from_args(PPOConfig, raw, args).env}
print(json.dumps(out))
"""


def test_installed_package_runs_outside_the_source_tree(wheel_install, tmp_path):
    _, site = wheel_install
    work = tmp_path / "elsewhere"
    work.mkdir()
    assert not work.resolve().is_relative_to(ROOT)

    proc = _run_installed(site, work, "-c", LOAD_CONFIGS)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(out["package"]).resolve().is_relative_to(site.resolve()), out
    assert Path(out["default"]["source"]) == site / "jaxrl_hier" / "configs" / "ppo_default.yaml"
    assert out["default"]["env"] == yaml.safe_load((ROOT / "jaxrl_hier/configs/ppo_default.yaml").read_text())["env"]
    assert Path(out["by_name"]["source"]) == site / "jaxrl_hier" / "configs" / "ppo_cartpole.yaml"
    assert out["by_name"]["env"] == yaml.safe_load((ROOT / "jaxrl_hier/configs/ppo_cartpole.yaml").read_text())["env"]

    proc = _run_installed(site, work, "-m", "jaxrl_hier.train", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--config" in proc.stdout and "ppo_default" in proc.stdout

    # A name that is neither a file nor a packaged config: one error line listing the packaged names.
    proc = _run_installed(site, work, "-m", "jaxrl_hier.train", "--config", "ppo_cartpol")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: config file not found: ppo_cartpol."), proc.stderr
    assert "Did you mean 'ppo_cartpole'?" in proc.stderr
    assert all(name.removesuffix(".yaml") in proc.stderr for name in CONFIGS)
    assert "Traceback" not in proc.stderr
    assert not (work / "runs").exists()  # nothing was started


def test_top_level_configs_links_to_the_packaged_ones():
    link = ROOT / "configs"
    assert link.is_symlink() and os.readlink(link) == "jaxrl_hier/configs"
    assert sorted(p.name for p in link.glob("*.yaml")) == CONFIGS


def test_citation_and_changelog_carry_the_version():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0"
    assert citation["title"] == PYPROJECT["project"]["name"]
    assert citation["version"] == VERSION
    assert citation["license"] == PYPROJECT["project"]["license"] == "Apache-2.0"
    assert citation["authors"] and citation["message"] and citation["date-released"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and f"## [{VERSION}]" in changelog
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]


def test_resolve_config_finds_files_then_packaged_names(tmp_path, monkeypatch):
    from jaxrl_hier.config import ConfigError, packaged_config_dir, packaged_config_names, resolve_config

    assert packaged_config_dir() == ROOT / "jaxrl_hier" / "configs"
    assert packaged_config_names() == [n.removesuffix(".yaml") for n in CONFIGS]
    assert resolve_config("ppo_cartpole") == resolve_config("ppo_cartpole.yaml") == packaged_config_dir() / "ppo_cartpole.yaml"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ppo_cartpole.yaml").write_text("env: CartPole-v1\n")
    assert resolve_config("ppo_cartpole.yaml") == Path("ppo_cartpole.yaml")  # a file that exists wins
    with pytest.raises(ConfigError, match=r"config file not found: sub/ppo_cartpole.yaml\. .*ppo_default"):
        resolve_config("sub/ppo_cartpole.yaml")  # a path with a folder is never looked up by name
