"""Bottom-up skill learning: skills with dependencies, dependency-gated mixture-of-experts
policies that reuse frozen experts, and a crash-safe scheduler that trains independent skills
concurrently in one compiled program. See docs/skills.md.

    python -m jaxrl_hier.skills run --config configs/skills_techtree.yaml --output-dir runs/skills
"""

from jaxrl_hier.skills.generators import GeneratorUnavailable, ProposalContext, TechTreePlanner
from jaxrl_hier.skills.library import builtin_library, craftax_classic_library, craftax_library, techtree_library
from jaxrl_hier.skills.spec import Condition, Skill, SkillError, SkillLibrary, load_skills_yaml

__all__ = ["Condition", "GeneratorUnavailable", "ProposalContext", "Skill", "SkillError", "SkillLibrary",
           "TechTreePlanner", "builtin_library", "craftax_classic_library", "craftax_library", "load_skills_yaml",
           "techtree_library"]
