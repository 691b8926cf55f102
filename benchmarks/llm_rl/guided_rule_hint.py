"""How much a two-turn run's warm-start model gains from a hint: its own guidance versus the rule's.

    python benchmarks/llm_rl/guided_rule_hint.py RUN_DIR [--out FILE]

Loads RUN_DIR/sft/model (the backbone after the warm-start; adapters at identity, so every role is
the backbone), plays the held-out episodes of RUN_DIR/config.yaml greedily, and reports the
environment's summary twice: with the guidance model's hints, and with the rule's hint of the config's
`hint_kind` in their place (verdict: lower / higher / right / none; step: right, or the first step of
the worked solution; reduce: the problem worked down to its last operation; each knows the answer); plus how often the guidance gives the rule's hint
when the turn-1 answer is wrong. The result file of the shipped config is
benchmarks/results/cpu/guided_arithmetic/rule_hint_diagnostic.txt.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", default=None, help="also write the report to this file")
    args = parser.parse_args()

    import jax
    import numpy as np

    from jaxrl_hier.io import atomic_write_text
    from jaxrl_hier.llm import load_pretrained
    from jaxrl_hier.llm_rl.guided import make_env, make_train
    from jaxrl_hier.llm_rl.guided_config import GuidedConfig
    from jaxrl_hier.runs import load_saved_config
    from jaxrl_hier.tasks import build_char_tokenizer
    from jaxrl_hier.tasks.jax_rewards import decode_completions

    cfg = load_saved_config(GuidedConfig, Path(args.run_dir))
    env = make_env(cfg)
    tok = build_char_tokenizer()
    lm = load_pretrained(os.path.join(args.run_dir, "sft", "model"))
    lm.tokenizer = tok
    agent = make_train(cfg, env, lm, tok)
    state = agent.init(jax.random.key(0))
    generate = agent._generator(lm, True)

    def speak(episodes, role):
        ids, mask = agent.encode_states([env.observation(e) for e in episodes])
        out = generate(state.policy[role], lm.params, ids, mask, jax.random.key(0))
        return decode_completions(tok, out.tokens, out.mask)

    eps = env.evaluation_episodes("test", cfg.eval_episodes, cfg.seed)  # the run's evaluation games
    eps = [env.step(e, t)[0] for e, t in zip(eps, speak(eps, "actor"))]
    hints = speak(eps, "guidance")
    lines = []
    for name, given in (("rule hint", [env.rule_hint(e.problem, e.turn1) for e in eps]), ("model hint", hints)):
        after = [env.step(e, h)[0] for e, h in zip(eps, given)]
        after = [env.step(e, t)[0] for e, t in zip(after, speak(after, "actor"))]
        lines.append(f"{name} {({k: round(v, 3) for k, v in env.summarize(after).items()})}")
    wrong = [h.strip() == env.rule_hint(e.problem, e.turn1) for e, h in zip(eps, hints)
             if not env.task.is_correct(e.problem, e.turn1)]
    lines.append(f"guidance agrees with the rule on wrong turn-1 answers: {float(np.mean(wrong)) if wrong else None}")
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if args.out:
        atomic_write_text(args.out, report)


if __name__ == "__main__":
    main()
