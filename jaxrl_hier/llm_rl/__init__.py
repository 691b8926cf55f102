"""LLM reinforcement learning on the Flax LLM core: SFT warm-start, co-located GRPO / DAPO / Dr.GRPO.

Pieces meant for reuse by every LLM-RL algorithm here: `data` (static prompt/completion layout),
`rollout` (sampling G completions per prompt and teacher-forced scoring on the same arrays),
`losses` (group advantages, the clipped surrogate with the variants' token weights, KL),
`rewards` (device or host rewards of a task), `sft` (supervised warm-start) and `sft_stage` (its
resumable stage in a run directory), `model_setup` (local checkpoint or tiny from-scratch model and
its tokenizer, LoRA). `grpo.make_train` builds the trainer and
`cli.run_grpo` is the `algorithm: grpo` entry of `python -m jaxrl_hier.train`. See docs/grpo.md.
"""
