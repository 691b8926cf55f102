"""Policy-guided tree search (PGTS) over LLM reasoning steps: the search env (`env`), the reward
model (`reward_model`), the baselines (`baselines`) and the pipeline CLI (`cli`). See docs/pgts.md."""

from jaxrl_hier.search.env import SearchEnv, SearchParams, TreeState, render_tree

__all__ = ["SearchEnv", "SearchParams", "TreeState", "render_tree"]
