"""The GRPO benchmark's task, shared by its arms (`benchmarks/llm_rl/grpo.py`) and the peers' minimal scripts
(`benchmarks/llm_rl/grpo_minimal.py`): the prompts, the reward, the forbidden token ids, the step clock and
Tunix's token-suppressing rollout.

This module imports nothing but the standard library at import time (no JAX, no torch, nothing of
jaxrl_hier), so a minimal peer script that uses it runs as a plain script of that peer would.
"""

from __future__ import annotations

import time
from typing import Any

NUM_GENERATIONS = 4
NEW_TOKENS = 32
TEMPERATURE = 1.0
LEARNING_RATE = 1e-5
MAX_GRAD_NORM = 1.0
SEED = 0
# 8 arithmetic-like prompts of one length (11 characters), so no system pads one prompt more than another.
PROMPTS = ("12+34*5-67=", "90-12*3+45=", "7*8+91-234=", "45+67-8*90=",
           "13*2+46-75=", "88-9*10+16=", "5+6*7-89+0=", "31-4*15+92=")


def digit_fraction(completion: str) -> float:
    """The shared reward: the fraction of digit characters in a completion (cheap and deterministic)."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


class RewardLog:
    """The reward function every system calls (TRL's and Tunix's signature: prompts, completions,
    **kwargs -> list of floats); it keeps each call's completion lengths, so the caller can check that
    every system generated the same amount."""

    __name__ = "digit_fraction"  # TRL names its reward metrics after the function

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, prompts: list, completions: list, **_: Any) -> list[float]:
        texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
        self.calls.append([len(t) for t in texts])
        return [digit_fraction(t) for t in texts]


def special_ids(tokenizer: Any, vocab_size: int | None = None) -> list[int]:
    """Token ids no system may sample (pad, bos, eos, unk, and every id of a `vocab_size` model that the
    tokenizer lacks): every completion then runs to NEW_TOKENS characters."""
    special = {i for i in (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id,
                           tokenizer.unk_token_id) if i is not None}
    return sorted(special | set(range(len(tokenizer), vocab_size or 0)))


def clock() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads): a step start."""
    return time.perf_counter(), time.process_time()


def step_intervals(starts: list[tuple[float, float]], warmup: int, steps: int) -> dict:
    """Warm-up and timed step seconds (wall, and CPU of the process) from the `clock()` readings taken at
    the starts of warmup + steps + 1 steps."""
    if len(starts) < warmup + steps + 1:
        raise RuntimeError(f"expected {warmup + steps + 1} step starts, saw {len(starts)}")
    wall = [b[0] - a[0] for a, b in zip(starts, starts[1:])]
    cpu = [b[1] - a[1] for a, b in zip(starts, starts[1:])]
    return dict(warmup_step_s=wall[:warmup], step_s=wall[warmup:warmup + steps],
                step_cpu_s=cpu[warmup:warmup + steps])


def tunix_qwen2_config(qwen2_lib: Any, hf: Any) -> Any:
    """Tunix's Qwen2 `ModelConfig` from the checkpoint's transformers config (`qwen2_lib`: Tunix's
    `tunix.models.qwen2.model`, passed in so that this module imports nothing); the benchmark's
    Tunix arm and its minimal script build the model the same way."""
    return qwen2_lib.ModelConfig(
        num_layers=hf.num_hidden_layers, vocab_size=hf.vocab_size, embed_dim=hf.hidden_size,
        hidden_dim=hf.intermediate_size, num_heads=hf.num_attention_heads,
        head_dim=hf.hidden_size // hf.num_attention_heads, num_kv_heads=hf.num_key_value_heads,
        rope_theta=int(hf.rope_parameters["rope_theta"]), norm_eps=hf.rms_norm_eps,
        use_tied_embedding=hf.tie_word_embeddings)


def suppressing_rollout(forbidden: list[int]) -> type:
    """Tunix's vanilla rollout with the token ids `forbidden` never sampled (its sampler takes
    `forbidden_tokens`, the vanilla rollout passes none); hand the class to
    `ClusterConfig(rollout_engine=...)`, Tunix's hook for custom rollout engines."""
    from tunix.rl.rollout import base_rollout, vanilla_rollout

    class SuppressingRollout(vanilla_rollout.VanillaRollout):
        def __init__(self, rollout_actor, tokenizer, mesh, rollout_config):
            cfg = rollout_actor.config
            super().__init__(rollout_actor, tokenizer, base_rollout.CacheConfig(
                cache_size=rollout_config.kv_cache_size, num_layers=cfg.num_layers,
                num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))

        def generate(self, prompts, rollout_config, **kwargs):
            # Tunix hands over numpy str_ items (np.repeat of the batch), which transformers 5's
            # tokenizers refuse; plain str are the same text.
            out = self._sampler(
                input_strings=[str(p) for p in prompts], max_generation_steps=rollout_config.max_tokens_to_generate,
                max_prompt_length=rollout_config.max_prompt_length, echo=False,
                temperature=rollout_config.temperature, top_p=rollout_config.top_p, top_k=rollout_config.top_k,
                seed=rollout_config.seed, pad_output=False, eos_tokens=rollout_config.eos_tokens,
                forbidden_tokens=forbidden)
            return base_rollout.RolloutOutput(text=out.text, logits=out.logits, tokens=out.tokens,
                                              left_padded_prompt_tokens=out.padded_prompt_tokens,
                                              logprobs=out.logprobs)

    return SuppressingRollout
