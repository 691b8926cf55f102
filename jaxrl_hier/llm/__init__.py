"""LLM components: sampling and scoring over any model that follows the decoder contract
(`forward`, `init_cache`), and the memory planner. The Flax decoder models themselves are not
part of the package yet (issue 3); see docs/llm_sampling.md."""

from jaxrl_hier.llm import memory
from jaxrl_hier.llm.sampling import GenerateOutput, generate, token_logprobs

__all__ = ["GenerateOutput", "generate", "memory", "token_logprobs"]
