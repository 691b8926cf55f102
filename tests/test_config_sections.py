"""Nested config sections (`jaxrl_hier.config`): a section in YAML gives only the keys it changes over
the field's default, a dotted override sets one key, the saved config.yaml loads back to the same
config, an old flat key is refused with its new name, and a resume names a changed key by its
dotted name."""

import dataclasses
import types

import pytest

from jaxrl_hier.config import ConfigError, build_dataclass, parse_overrides, to_dict
from jaxrl_hier.llm_rl.guided_config import GuidedConfig
from jaxrl_hier.runs import check_resume_changes
from jaxrl_hier.search.config import PGTS_PPO, PGTSConfig


def test_a_section_changes_only_its_given_keys_over_the_field_default():
    config = build_dataclass(PGTSConfig, {"ppo": {"lr": 1e-3}, **parse_overrides(["ppo.num_envs=8", "sft.steps=7"])})
    assert config.ppo == dataclasses.replace(PGTS_PPO, lr=1e-3, num_envs=8)  # PGTS's defaults, not PPOConfig's
    assert (config.sft.steps, config.sft.batch_size) == (7, 64)
    assert GuidedConfig().sft.steps == 0 and build_dataclass(GuidedConfig, {"sft": {"batch_size": 8}}).sft.steps == 0
    # the dotted override wins over the section, in either order
    for values in ({"ppo": {"lr": 0.5}, "ppo.lr": 0.25}, {"ppo.lr": 0.25, "ppo": {"lr": 0.5}}):
        assert build_dataclass(PGTSConfig, values).ppo.lr == 0.25


def test_saved_config_loads_back_to_the_same_config():
    config = build_dataclass(PGTSConfig, {"ppo.ent_coef": 0.03, "sft.steps": 5, "sc_samples": [2, 8]})
    saved = to_dict(config)
    assert saved["ppo"]["ent_coef"] == 0.03 and saved["sft"]["steps"] == 5
    assert build_dataclass(PGTSConfig, saved) == config


@pytest.mark.parametrize("values, message", [
    ({"sft_steps": 3}, "config key 'sft_steps' in config is now 'sft.steps'"),
    ({"policy_hidden_size": 32}, "is now 'ppo.hidden_size'"),
    ({"ppo.lr": -1.0}, "section 'ppo': 'lr' must be positive"),
    ({"ppo": {"nope": 1}}, "unknown config key 'nope' in config, section 'ppo'"),
    ({"sft": 5}, "'sft' is a section of keys (SFTSection)"),
    ({"ppo.seed": 3}, "set 'seed' instead of 'ppo.seed'"),
    ({"max_nodes.x": 1}, "'max_nodes' must be an integer"),  # not a section
])
def test_bad_sections_name_the_key_and_the_fix(values, message):
    cls = PGTSConfig
    with pytest.raises(ConfigError) as err:
        build_dataclass(cls, values)
    assert message in str(err.value)
    with pytest.raises(ConfigError, match="is now 'sft.batch_size'"):
        build_dataclass(GuidedConfig, {"sft_batch_size": 8})


def test_resume_names_a_changed_section_key():
    saved = build_dataclass(PGTSConfig, {})
    check_resume_changes(saved, build_dataclass(PGTSConfig, {"eval_every": 4}), ("eval_every",))
    with pytest.raises(ConfigError, match=r"cannot change 'ppo.total_timesteps' on --resume \(16384 in the run"):
        check_resume_changes(saved, build_dataclass(PGTSConfig, {"ppo.total_timesteps": 32768}), ("eval_every",))
    check_resume_changes(saved, build_dataclass(PGTSConfig, {"sft.steps": 9}), ("sft.steps",))  # a dotted safe key


def test_a_bad_key_is_traced_to_the_file_or_the_command_line():
    """A key the command line set is reported as the command line's, not the config file's."""
    from jaxrl_hier.config import config_from_args

    def message(raw, override_keys):
        args = types.SimpleNamespace(config_source="configs/pgts_arithmetic.yaml", override_keys=override_keys)
        with pytest.raises(ConfigError) as err:
            config_from_args(PGTSConfig, raw, args)
        return str(err.value)

    assert "'max_nodez' in configs/pgts_arithmetic.yaml." in message({"max_nodez": 3}, set())
    assert "'max_nodez' in the command-line overrides." in message({"max_nodez": 3}, {"max_nodez"})
    assert "'num_envz' in the command-line overrides, section 'ppo'." in message({"ppo.num_envz": 3}, {"ppo.num_envz"})
    assert "'num_envz' in configs/pgts_arithmetic.yaml, section 'ppo'." in message({"ppo": {"num_envz": 3}}, {"seed"})
    assert "'sft_steps' in the command-line overrides is now 'sft.steps'" in message({"sft_steps": 3}, {"sft_steps"})
