"""Turn-based text environments for utterance-level agents (the `guided` trainer), offline.

An environment hands out episodes, renders each one's dialogue so far as the state text a policy
continues, and takes one utterance per turn. Which policy speaks at turn t (`speaker(t)`) is fixed
by the environment, so a trainer knows before it starts how many utterances each role produces
per episode (static shapes). Every environment also yields supervised warm-start examples
(`sft_problems`), as `Problem`s whose prompt is a state and whose target is an utterance.

- `TwoTurnEnv` wraps any answer-line task (arithmetic by default, or GSM8K-format files): the
  actor answers (turn 1), the guidance model reads the problem and that answer and writes a hint
  (turn 2), the actor answers again with the hint (turn 3); the reward, given at the last turn, is
  that answer's correctness (with `shaped`, turn 1 earns its own answer's correctness and the last
  turn the difference, the same total). Its warm-start hints are rule-based, of one of two kinds
  (`hint_kind`): `verdict` says `lower` when the turn-1 answer is too high, `higher` when it is too
  low, `right` when it is correct, `none` without an answer line; `step` says `right` when the
  answer is correct and otherwise gives the problem one step closer to its answer (arithmetic:
  the expression with its first operation worked out, `4-2` for `8-4-2=`; GSM8K-format files:
  the first line of the worked answer); `reduce` ignores the turn-1 answer and gives the problem
  worked out one operation at a time down to its last one (arithmetic only: `7+1-3 8-3` for
  `9-2+1-3=`), so the guidance does every operation but one, step by step, and the second answer
  the last one: a division of the work.
- `GuessNumberEnv`: guess a secret integer in [1, high]; the oracle answers `higher` or `lower`;
  reward -1 per turn that misses, 0 for the turn that hits, at most `max_turns` turns. Its
  warm-start guesses are uniform over the numbers still possible, so a policy that learns to halve
  the interval needs fewer turns than the warm-start. No secret is held out (the class says why);
  evaluation plays distinct secrets, all of them when as many are asked.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Sequence

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks.answers import extract_answer
from jaxrl_hier.tasks.base import Problem, check_split_args, distinct_problems, split_rng

ACTOR, GUIDANCE = "actor", "guidance"
HINTS = ("lower", "higher", "right", "none")  # the verdict kind's hints
HINT_KINDS = ("verdict", "step", "reduce")


# ----------------------------------------------------------------------------- two-turn problem solving


@dataclasses.dataclass
class TwoTurnEpisode:
    problem: Problem
    turn1: str = ""
    hint: str = ""
    turn2: str = ""
    turn: int = 0
    done: bool = False
    reward: float = 0.0


def first_step(problem: Problem) -> str | None:
    """The problem one step closer to its answer: arithmetic's expression with its first operation
    worked out (`meta["reduced"]`), else the first line of a multi-line SFT target (GSM8K's worked
    answers); None when the task has no worked step."""
    if problem.meta.get("reduced"):
        return problem.meta["reduced"]
    lines = problem.target.split("\n")
    return lines[0] if len(lines) > 1 and extract_answer(lines[0]) is None else None


def rule_hint(task: Any, problem: Problem, completion: str, kind: str = "verdict") -> str:
    """The rule-based hint for a turn-1 completion (see module doc): verdict = lower / higher /
    right / none; step = right, or the problem one step closer to its answer (`first_step`); reduce =
    the problem worked out one operation at a time down to its last one, whatever the completion."""
    if kind == "reduce":
        if "reductions" not in problem.meta:
            raise ConfigError(f"hint_kind: reduce needs the arithmetic task's expressions; {task.name} gave none "
                              f"for {problem.prompt!r}.")
        return problem.meta["reductions"]
    answer = extract_answer(completion)
    if kind == "step":
        if answer is not None and task.is_correct(problem, completion):
            return "right"
        step = first_step(problem)
        if step is None:
            raise ConfigError(f"hint_kind: step needs a task with worked solutions; {task.name} gave none for "
                              f"{problem.prompt!r}.")
        return step
    if answer is None:
        return "none"
    if task.is_correct(problem, completion):
        return "right"
    try:
        return "lower" if float(answer) > float(problem.answer) else "higher"
    except ValueError:
        return "none"


@dataclasses.dataclass(frozen=True)
class TwoTurnEnv:
    """Answer, hint, answer again: see the module docstring. `task` is any answer-line task.

    The turn-1 answer enters the later states as its parsed number (`?` without one, or when it is
    longer than `answer_chars`), so state lengths are bounded whatever was sampled."""

    task: Any
    answer_chars: int = 5
    wrong_fraction: float = 0.5  # share of warm-start hint / turn-2 examples with a wrong turn-1 answer
    max_offset: int = 3          # wrong warm-start answers are the answer +- 1..max_offset
    hint_kind: str = "verdict"   # the rule's hints: "verdict" (lower/higher/right/none), "step" or "reduce"
    # turn 1 earns its answer's correctness and the last turn the change (turn 2's minus turn 1's):
    # the episode's return is still turn 2's correctness, but the hint's and the second answer's
    # returns are what they added (potential-based shaping, the latest answer's correctness as the
    # potential), so repeating a right turn-1 answer earns the guidance nothing
    shaped: bool = False
    name: str = "two_turn"
    max_turns: int = 3
    #: the evaluation metrics reports show, (summarize key, label), the headline first
    METRICS: ClassVar[tuple[tuple[str, str], ...]] = (("turn2_accuracy", "turn 2"), ("turn1_accuracy", "turn 1"),
                                                      ("accuracy_gain", "accuracy gain"))

    def __post_init__(self):
        if self.hint_kind not in HINT_KINDS:
            raise ConfigError(f"hint_kind must be one of {list(HINT_KINDS)}, got {self.hint_kind!r}.")

    def rule_hint(self, problem: Problem, completion: str) -> str:
        """The rule's hint of this environment's kind for a turn-1 completion."""
        return rule_hint(self.task, problem, completion, self.hint_kind)

    def evaluation_label(self, split: str) -> str:
        """What an evaluation of `split` plays, for the logs."""
        return f"{split} problems"

    def speaker(self, turn: int) -> str:
        return GUIDANCE if turn == 1 else ACTOR

    def reset(self, split: str, n: int, seed: int) -> list[TwoTurnEpisode]:
        return [TwoTurnEpisode(p) for p in self.task.problems(split, n, seed)]

    def evaluation_episodes(self, split: str, n: int, seed: int) -> list[TwoTurnEpisode]:
        """Episodes of up to n distinct problems (`distinct_problems`): greedy play of a repeated
        problem repeats its episode, so repeats would only reweight the mean."""
        return [TwoTurnEpisode(p) for p in distinct_problems(self.task, split, n, seed)]

    def _shown(self, completion: str) -> str:
        answer = extract_answer(completion)
        return answer if answer is not None and len(answer) <= self.answer_chars else "?"

    def render(self, prompt: str, turn1: str | None = None, hint: str | None = None) -> str:
        """The state text: the problem; then its turn-1 answer and ":"; then the hint and a newline."""
        text = prompt
        if turn1 is not None:
            text += self._shown(turn1) + ":"
        if hint is not None:
            text += hint.replace("\n", " ") + "\n"
        return text

    def observation(self, ep: TwoTurnEpisode) -> str:
        if ep.turn == 0:
            return self.render(ep.problem.prompt)
        if ep.turn == 1:
            return self.render(ep.problem.prompt, ep.turn1)
        return self.render(ep.problem.prompt, ep.turn1, ep.hint)

    def step(self, ep: TwoTurnEpisode, utterance: str) -> tuple[TwoTurnEpisode, float, bool]:
        ep = dataclasses.replace(ep)
        reward = 0.0
        turn1_correct = lambda: float(self.task.is_correct(ep.problem, ep.turn1))  # noqa: E731
        if ep.turn == 0:
            ep.turn1 = utterance
            reward = turn1_correct() if self.shaped else 0.0
        elif ep.turn == 1:
            ep.hint = utterance
        else:
            ep.turn2 = utterance
            ep.done = True
            ep.reward = float(self.task.is_correct(ep.problem, utterance))  # the episode's return
            reward = ep.reward - (turn1_correct() if self.shaped else 0.0)
        ep.turn += 1
        return ep, reward, ep.done

    def max_state_chars(self, prompt_chars: int = 0, utterance_chars: int = 0) -> int:
        """The longest state text for prompts of `prompt_chars` and hints (utterances) of `utterance_chars`
        characters (every environment's bound takes both; each reads what its states hold)."""
        return prompt_chars + self.answer_chars + 1 + utterance_chars + 1

    def sft_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """Warm-start examples, a third of each kind: turn-1 answers, rule-based hints for a turn-1
        answer that is right or off by 1..max_offset, and turn-2 answers after such a hint."""
        check_split_args(split, n, seed)
        rng = split_rng(seed, split, f"{self.name}:sft")
        out = []
        for i, p in enumerate(self.task.problems(split, n, seed)):
            kind = i % 3
            if kind == 0:
                out.append(p)
                continue
            turn1 = p.target
            try:
                value = int(p.answer)
            except ValueError:
                value = None
            if value is not None and rng.random() < self.wrong_fraction:
                off = rng.randint(1, self.max_offset) * rng.choice((-1, 1))
                turn1 = f"#### {value + off}"
            hint = self.rule_hint(p, turn1)
            if kind == 1:
                out.append(Problem(self.render(p.prompt, turn1), p.answer, hint, {**p.meta, "kind": "hint"}))
            else:
                out.append(Problem(self.render(p.prompt, turn1, hint), p.answer, p.target,
                                   {**p.meta, "kind": "turn2"}))
        return out

    def sft_correct(self, problem: Problem, completion: str) -> bool:
        """A warm-start example solved: the rule's hint exactly, or a correct answer."""
        if problem.meta.get("kind") == "hint":
            return completion.strip() == problem.target
        return bool(self.task.is_correct(problem, completion))

    def sft_well_formed(self, problem: Problem, completion: str) -> bool:
        """A hint of the env's kind (one from HINTS; or `right` or one line that is no answer line),
        or an answer in the task's format."""
        if problem.meta.get("kind") == "hint":
            hint = completion.strip()
            if self.hint_kind == "verdict":
                return hint in HINTS
            return bool(hint) and "\n" not in hint and extract_answer(hint) is None
        return bool(self.task.is_well_formed(problem, completion))

    def summarize(self, episodes: Sequence[TwoTurnEpisode]) -> dict[str, float]:
        """turn-1 and turn-2 accuracy, their difference, hint length, and how often each hint was right."""
        n = max(len(episodes), 1)
        t1 = sum(self.task.is_correct(e.problem, e.turn1) for e in episodes) / n
        t2 = sum(self.task.is_correct(e.problem, e.turn2) for e in episodes) / n
        hint_ok = sum(e.hint.strip() == self.rule_hint(e.problem, e.turn1) for e in episodes) / n
        return {"turn1_accuracy": t1, "turn2_accuracy": t2, "accuracy_gain": t2 - t1,
                "hint_length": sum(len(e.hint) for e in episodes) / n, "hint_rule_agreement": hint_ok,
                "return": sum(e.reward for e in episodes) / n}

    def record(self, ep: TwoTurnEpisode) -> dict[str, Any]:
        return {"problem": ep.problem.prompt, "answer": ep.problem.answer, "turn1": ep.turn1, "hint": ep.hint,
                "turn2": ep.turn2, "reward": ep.reward}


# ----------------------------------------------------------------------------- guess the number


@dataclasses.dataclass
class GameEpisode:
    """One game of a `SecretGame`: the secret, the guesses and replies so far ("?" for a bad guess)."""

    secret: Any
    guesses: list = dataclasses.field(default_factory=list)
    replies: list = dataclasses.field(default_factory=list)
    turn: int = 0
    done: bool = False
    success: bool = False
    ret: float = 0.0


GuessEpisode = WordleEpisode = GameEpisode  # the games' episodes, by the game's name


class SecretGame:
    """What the guessing games share: secrets per split (`secrets`), the state text (`header`, then one
    "guess reply" line per missed turn), and a turn: `_parse` reads the utterance (None: not a guess),
    a hit ends the game with reward 0, a miss costs -1 and gets `reply(guess, secret)` ("bad" for None).
    A subclass is a frozen dataclass with `max_turns` and `name`."""

    max_turns: int
    name: str
    #: the evaluation metrics reports show, (summarize key, label), the headline first
    METRICS: ClassVar[tuple[tuple[str, str], ...]] = (("turns", "turns per game"), ("success", "success rate"))

    def __post_init__(self):
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or not 1 <= self.max_turns <= 32:
            raise ConfigError(f"{self.name}: max_turns must be an integer in [1, 32], got {self.max_turns!r}.")

    def secrets(self, split: str) -> Sequence[Any]:
        raise NotImplementedError

    def held_out(self, pool: Sequence[str], split: str) -> list[str]:
        """The split's share of `pool` by each item's hash (`tasks.base.split_of`: 20% test, 20% validation,
        the rest train): secrets of one split are never secrets of another."""
        from jaxrl_hier.tasks.base import split_of

        return [x for x in pool if split_of(f"{self.name}:{x}", 0.2, 0.2) == split]

    def rule_problems(self, split: str, n: int, seed: int, rule: Any) -> list[Problem]:
        """Warm-start examples: games of `rule(guesses, replies, rng) -> utterance` on secrets of `split`,
        each cut at a random turn, with the rule's next utterance as the target (meta: the turns so far)."""
        check_split_args(split, n, seed)
        rng, pool = split_rng(seed, split, f"{self.name}:sft"), self.secrets(split)
        out = []
        while len(out) < n:
            secret = rng.choice(pool)
            guesses: list[str] = []
            replies: list[str] = []
            cut = rng.randrange(self.max_turns)
            while True:
                said = rule(guesses, replies, rng)
                if len(guesses) == cut or said == secret:
                    out.append(Problem(self.render(guesses, replies), secret, said,
                                       {"task": self.name, "split": split, "guesses": list(guesses),
                                        "replies": list(replies)}))
                    break
                guesses.append(said)
                replies.append(self.reply(said, secret))
        return out

    def header(self) -> str:
        raise NotImplementedError

    def reply(self, guess: Any, secret: Any) -> str:
        raise NotImplementedError

    def _parse(self, utterance: str) -> Any | None:
        raise NotImplementedError

    def evaluation_label(self, split: str) -> str:
        """What an evaluation of `split` plays, for the logs."""
        return f"{split} secrets"

    def sft_well_formed(self, problem: Problem, completion: str) -> bool:
        """A guess the game can read (`_parse`: a number in range, a listed word, an object or attribute)."""
        return self._parse(completion) is not None

    def speaker(self, turn: int) -> str:
        return ACTOR

    def reset(self, split: str, n: int, seed: int) -> list[GameEpisode]:
        check_split_args(split, n, seed)
        rng, pool = split_rng(seed, split, self.name), self.secrets(split)
        return [GameEpisode(rng.choice(pool)) for _ in range(n)]

    def evaluation_episodes(self, split: str, n: int, seed: int) -> list[GameEpisode]:
        """Games of up to n distinct secrets of the split, in the order reset's draw meets them: with n
        at least the split's secrets, every one once, so greedy play's mean is its exact mean over them,
        where n secrets drawn with replacement would weight some games more than others."""
        check_split_args(split, n, seed)
        rng, pool = split_rng(seed, split, self.name), self.secrets(split)  # reset's stream
        secrets: dict[Any, None] = {}
        while len(secrets) < min(n, len(pool)):
            secrets.setdefault(rng.choice(pool))
        return [GameEpisode(s) for s in secrets]

    def render(self, guesses: Sequence[str], replies: Sequence[str]) -> str:
        return self.header() + "".join(f"{g} {r}\n" for g, r in zip(guesses, replies))

    def observation(self, ep: GameEpisode) -> str:
        return self.render(ep.guesses, ep.replies)

    def step(self, ep: GameEpisode, utterance: str) -> tuple[GameEpisode, float, bool]:
        ep = dataclasses.replace(ep, guesses=list(ep.guesses), replies=list(ep.replies))
        guess = self._parse(utterance)
        ep.turn += 1
        if guess == ep.secret:
            ep.success = ep.done = True
            return ep, 0.0, True
        ep.guesses.append("?" if guess is None else str(guess))
        ep.replies.append("bad" if guess is None else self.reply(guess, ep.secret))
        ep.ret -= 1.0
        ep.done = ep.turn >= self.max_turns
        return ep, -1.0, ep.done

    def summarize(self, episodes: Sequence[GameEpisode]) -> dict[str, float]:
        """Success rate, mean turns (a failed episode counts max_turns), mean turns of the successes, return."""
        n = max(len(episodes), 1)
        wins = [e for e in episodes if e.success]
        return {"success": len(wins) / n, "turns": sum(e.turn for e in episodes) / n,
                "turns_to_success": (sum(e.turn for e in wins) / len(wins)) if wins else float(self.max_turns),
                "return": sum(e.ret for e in episodes) / n}

    def record(self, ep: GameEpisode) -> dict[str, Any]:
        return {"secret": ep.secret, "guesses": ep.guesses + ([str(ep.secret)] if ep.success else []),
                "replies": ep.replies, "turns": ep.turn, "success": ep.success, "return": ep.ret}


@dataclasses.dataclass(frozen=True)
class GuessNumberEnv(SecretGame):
    """Guess a secret in [1, high] in at most `max_turns` turns; see the module docstring.

    State text: "guess 1-16:\\n" then one line per turn, "8 higher\\n". An utterance that is not a
    number in range counts as a missed turn with the reply "bad".

    There are no held-out secrets: every split draws its secrets from the whole of 1..high, in
    its own seeded stream. The secret is all a game is, and the state never shows it, so a secret
    the policy never met in training would only test a prior that training taught it to be wrong
    (and bisection, the yardstick, assumes the uniform prior over 1..high). What evaluation
    measures instead is the policy's play over the secrets (`evaluation_episodes`)."""

    high: int = 16
    max_turns: int = 5
    name: str = "guess_number"

    def __post_init__(self):
        if isinstance(self.high, bool) or not isinstance(self.high, int) or not 2 <= self.high <= 999:
            raise ConfigError(f"guess_number: high must be an integer in [2, 999], got {self.high!r}.")
        super().__post_init__()

    def secrets(self, split: str) -> Sequence[int]:
        return range(1, self.high + 1)  # every split: no secret is held out (the class says why)

    def header(self) -> str:
        return f"guess 1-{self.high}:\n"

    def reply(self, guess: int, secret: int) -> str:
        return "higher" if guess < secret else "lower"

    def evaluation_label(self, split: str) -> str:
        return f"{split} secrets of 1..{self.high} (no secret is held out)"

    def max_state_chars(self, prompt_chars: int = 0, utterance_chars: int = 0) -> int:
        width = len(str(self.high))
        return len(self.header()) + (self.max_turns - 1) * (width + 1 + len("higher") + 1)

    def _parse(self, utterance: str) -> int | None:
        text = utterance.strip()
        if not text.isdigit() or len(text) > len(str(self.high)):
            return None
        value = int(text)
        return value if 1 <= value <= self.high else None

    def consistent(self, guesses: Sequence[int], replies: Sequence[str]) -> tuple[int, int]:
        """The interval [lo, hi] of secrets consistent with the replies so far."""
        lo, hi = 1, self.high
        for g, r in zip(guesses, replies):
            if r == "higher":
                lo = max(lo, g + 1)
            elif r == "lower":
                hi = min(hi, g - 1)
        return lo, hi

    def sft_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """Warm-start examples: a history of guesses drawn uniformly from the numbers still possible,
        cut at a random turn, and the next such guess as the target."""
        check_split_args(split, n, seed)
        rng = split_rng(seed, split, f"{self.name}:sft")
        out = []
        while len(out) < n:
            secret = rng.randint(1, self.high)
            guesses: list[int] = []
            replies: list[str] = []
            cut = rng.randrange(self.max_turns)
            while True:
                lo, hi = self.consistent(guesses, replies)
                guess = rng.randint(lo, hi)
                if len(guesses) == cut or guess == secret:
                    out.append(Problem(self.render([str(g) for g in guesses], replies), str(secret), str(guess),
                                       {"task": self.name, "split": split, "low": lo, "high": hi}))
                    break
                guesses.append(guess)
                replies.append("higher" if guess < secret else "lower")
        return out

    def sft_correct(self, problem: Problem, completion: str) -> bool:
        """A warm-start guess is good when it is still possible given the replies so far."""
        guess = self._parse(completion)
        return guess is not None and problem.meta["low"] <= guess <= problem.meta["high"]



# ----------------------------------------------------------------------------- wordle

#: the shipped word list: every guess must be one of these; secrets split into train, validation and test
WORDS = tuple("""
about above actor acute admit adopt adult after again agent agree ahead alarm album alert alike alive allow
alone along alter among anger angle angry apart apple apply arena argue arise array aside asset audio audit
avoid award aware badly baker basic basis beach began begin being below bench birth black blame blind block
blood board boost booth bound brain brand bread break breed brief bring broad broke brown build built buyer
cable cargo camel canal candy carry catch cause chain chair chart chase cheap check chest chief child china
chose civil claim class clean clear click clock close coach coast could count court cover craft crash cream
crime cross crowd crown curve cycle daily dance dated dealt death debut delay depth doing doubt dozen draft
drama drawn dream dress drink drive drove dying eager early earth eight elite empty enemy enjoy enter entry
equal error event every exact exist extra faith false fault fiber field fifth fifty fight final first flash
fleet floor fluid focus force forth forty forum found frame frank fraud fresh front fruit fully funny giant
given glass globe going grace grade grand grant grass great green gross group grown guard guess guest guide
happy heart heavy hence horse hotel house human ideal image index inner input issue joint judge known label
large laser later laugh layer learn lease least leave legal level light limit local logic loose lower lucky
lunch major maker march match maybe mayor meant media metal might minor minus mixed model money month moral
motor mount mouse mouth movie music needs never newly night noise north noted novel nurse occur ocean offer
often order other owner panel paper party peace phase phone photo piece pilot pitch place plain plane plant
plate point pound power press price pride prime print prior prize proof proud prove queen quick quiet quite
radio raise range rapid ratio reach ready refer right rival river robin rough round route royal rural scale
scene scope score sense serve seven shall shape share sharp sheet shelf shell shift shirt shock shoot short
shown sight since sixth sixty sized skill sleep slide small smart smile smith smoke solid solve sorry sound
south space spare speak speed spend spent split spoke sport staff stage stake stand start state steam steel
stick still stock stone stood store storm story strip stuck study stuff style sugar suite super sweet table
taken taste taxes teach teeth thank theft their theme there these thick thing think third those three threw
throw tight timer title today topic total touch tough tower track trade train treat trend trial tried tries
truck truly trust truth twice under undue union unity until upper upset urban usage usual valid value video
virus visit vital voice waste watch water wheel where which while white whole whose woman women world worry
worse worst worth would wound write wrong wrote yield young youth
""".split())


def wordle_feedback(guess: str, secret: str) -> str:
    """Per letter: `g` in the right place, `y` elsewhere in the secret, `.` not in it (letters are
    judged one by one, repeats not counted down)."""
    return "".join("g" if g == s else "y" if g in secret else "." for g, s in zip(guess, secret))


@dataclasses.dataclass(frozen=True)
class WordleEnv(SecretGame):
    """Find a secret five-letter word of `WORDS` in at most `max_turns` guesses, each a word of the list;
    each missed guess is answered with its letters' feedback (`wordle_feedback`). State text:
    "wordle:\n" then one line per turn, "crane .gy..\n" (an utterance that is not a listed word: "? bad").
    Reward -1 per missed turn, 0 for the hit. The secrets of the three splits are disjoint (a fixed
    share of the list each, by the word's hash: `tasks.base.split_of`), so test words are never
    secrets in training, though any word may be guessed. Warm-start guesses are uniform over the
    words still consistent with the feedback so far."""

    max_turns: int = 6
    name: str = "wordle"
    word_length: int = 5

    def secrets(self, split: str) -> list[str]:
        """The split's secret words (disjoint: `held_out`)."""
        return self.held_out(WORDS, split)

    def header(self) -> str:
        return "wordle:\n"

    def reply(self, guess: str, secret: str) -> str:
        return wordle_feedback(guess, secret)

    def evaluation_label(self, split: str) -> str:
        return f"{split} secret words (disjoint from the other splits')"

    def max_state_chars(self, prompt_chars: int = 0, utterance_chars: int = 0) -> int:
        return len(self.header()) + (self.max_turns - 1) * (2 * self.word_length + 2)

    def _parse(self, utterance: str) -> str | None:
        text = utterance.strip()
        return text if text in _WORD_SET else None

    def consistent(self, guesses: Sequence[str], replies: Sequence[str]) -> list[str]:
        """The words whose feedback to every past guess is the reply it got."""
        pairs = [(g, r) for g, r in zip(guesses, replies) if r != "bad"]
        return [w for w in WORDS if all(wordle_feedback(g, w) == r for g, r in pairs)]

    def sft_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """Warm-start examples: a history of guesses drawn uniformly from the words still consistent,
        cut at a random turn, and the next such guess as the target (secrets of `split`)."""
        return self.rule_problems(split, n, seed, lambda guesses, replies, rng: rng.choice(self.consistent(guesses, replies)))

    def sft_correct(self, problem: Problem, completion: str) -> bool:
        """A warm-start guess is good when it is a word still consistent with the feedback so far."""
        guess = self._parse(completion)
        return guess is not None and guess in self.consistent(problem.meta["guesses"], problem.meta["replies"])


_WORD_SET = frozenset(WORDS)


# ----------------------------------------------------------------------------- twenty questions

#: the closed set of objects and the attributes each has (the oracle's table); every object's attribute
#: set is distinct, so questions alone can single any object out
OBJECTS: dict[str, frozenset] = {name.strip(): frozenset(attrs.split()) for name, attrs in (line.split(":") for line in """
cat: animal soft
horse: animal big
cow: animal big food
eagle: animal flies
duck: animal flies water food
shark: animal big water
fish: animal water food
snake: animal long
crab: animal water food red
parrot: animal flies red green
frog: animal water green
sheep: animal white soft food
rabbit: animal soft white
swan: animal flies water white
bear: animal big soft
mouse: animal
bee: animal flies sweet
tree: plant big wood green
rose: plant red
grass: plant green long
leaf: plant green soft
cactus: plant green
apple: plant food round sweet red
orange: plant food round sweet
lemon: plant food round
banana: plant food sweet long
carrot: plant food long
potato: plant food
tomato: plant food round red
lettuce: plant food green
pea: plant food green round
cake: food sweet round soft
bread: food soft
candy: food sweet
milk: food white
egg: food white round
pizza: food round hot
soup: food hot water
coffee: hot water
car: metal big
train: metal big long
plane: metal big flies
bicycle: metal
boat: big water wood
ship: metal big water
coin: metal round
hammer: metal wood tool
knife: metal tool long
spoon: metal tool
stove: metal hot
pencil: wood tool long
paper: white wood
chair: wood
door: wood big
bed: wood soft big
pillow: soft
ball: round
rope: long tool
kite: flies
balloon: flies round red
cloud: white flies water
sun: big round hot
moon: big round white
snow: white soft water
river: water long big
fire: red hot
candle: hot white long
bucket: water tool
""".strip().splitlines())}
ATTRIBUTES = tuple(sorted(set().union(*OBJECTS.values())))
LONGEST_PHRASE = max(map(len, [*OBJECTS, *ATTRIBUTES]))  # characters of the longest object or attribute


@dataclasses.dataclass(frozen=True)
class TwentyQuestionsEnv(SecretGame):
    """Find a secret object of `OBJECTS` in at most `max_turns` turns. Each turn the policy names an
    attribute (a question: "is it ...?", answered `yes` or `no` from the table) or an object (a guess:
    the hit ends the game; a miss is answered `wrong`). State text: "20 questions:\n" then one line per
    turn, "animal yes\n", "cat wrong\n" ("? bad" for an utterance that names neither). Reward -1 per
    missed turn, 0 for the hit. The secrets of the three splits are disjoint objects (`tasks.base.split_of`
    on the name), so test objects are never secrets in training, though any object may be guessed.

    The warm-start (`sft_problems`) knows the table but not which question helps: with one object
    consistent with the answers it guesses it, else with probability 1/2 it guesses uniformly among the
    consistent objects and otherwise asks a uniformly drawn attribute not yet asked: it finds 32% of the
    objects within 10 turns. Asking the attribute that splits the consistent objects most evenly, and
    guessing only when one is left, finds 93% in 7.6 turns on average. Credit for a question arrives
    turns later, with the hit."""

    max_turns: int = 10
    name: str = "twenty_questions"

    def secrets(self, split: str) -> list[str]:
        """The split's secret objects (disjoint: `held_out`)."""
        return self.held_out(list(OBJECTS), split)

    def header(self) -> str:
        return "20 questions:\n"

    def reply(self, guess: str, secret: str) -> str:
        if guess in OBJECTS:
            return "wrong"
        return "yes" if guess in OBJECTS[secret] else "no"

    def evaluation_label(self, split: str) -> str:
        return f"{split} secret objects (disjoint from the other splits')"

    def max_state_chars(self, prompt_chars: int = 0, utterance_chars: int = 0) -> int:
        return len(self.header()) + (self.max_turns - 1) * (LONGEST_PHRASE + 1 + len("wrong") + 1)

    def _parse(self, utterance: str) -> str | None:
        text = utterance.strip()
        return text if text in OBJECTS or text in ATTRIBUTES else None

    def consistent(self, guesses: Sequence[str], replies: Sequence[str]) -> list[str]:
        """The objects whose table agrees with every answer so far and that were not guessed."""
        return [o for o in OBJECTS if all(
            (g != o) if r == "wrong" else (r == "bad") or ((g in OBJECTS[o]) == (r == "yes"))
            for g, r in zip(guesses, replies))]

    def rule_utterance(self, guesses: Sequence[str], replies: Sequence[str], rng: Any) -> str:
        """The warm-start's next utterance (class docstring)."""
        left = self.consistent(guesses, replies)
        unasked = [a for a in ATTRIBUTES if a not in guesses]
        if len(left) == 1 or not unasked or rng.random() < 0.5:
            return rng.choice(left)
        return rng.choice(unasked)

    def sft_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """Warm-start examples: a game of the rule's utterances (secrets of `split`) cut at a random turn,
        and the rule's next utterance as the target."""
        return self.rule_problems(split, n, seed, self.rule_utterance)

    def sft_correct(self, problem: Problem, completion: str) -> bool:
        """A warm-start utterance is good when it guesses an object still consistent with the answers or
        asks an attribute not yet asked."""
        said, guesses = self._parse(completion), problem.meta["guesses"]
        if said in OBJECTS:
            return said in self.consistent(guesses, problem.meta["replies"])
        return said is not None and said not in guesses


# ----------------------------------------------------------------------------- maze

MOVES = "nesw"  # the four moves, and the open directions' letters in this order
_STEP = {"n": (-1, 0), "e": (0, 1), "s": (1, 0), "w": (0, -1)}
_BACK = {"n": "s", "e": "w", "s": "n", "w": "e"}


@functools.lru_cache(maxsize=8)
def make_mazes(count: int, size: int) -> tuple[tuple[str, ...], ...]:
    """`count` perfect mazes (one path between any two cells) of size x size cells, each cell's open
    directions as a string of `MOVES` letters ("es"); maze i is carved by a depth-first search with
    backtracking seeded by its index, so the set is fixed."""
    import random

    mazes = []
    for index in range(count):
        rng = random.Random(f"maze:{size}:{index}")
        open_ = [set() for _ in range(size * size)]
        seen, stack = {0}, [0]
        while stack:
            cell = stack[-1]
            r, c = divmod(cell, size)
            nexts = [(d, (r + dr) * size + c + dc) for d, (dr, dc) in _STEP.items()
                     if 0 <= r + dr < size and 0 <= c + dc < size and (r + dr) * size + c + dc not in seen]
            if not nexts:
                stack.pop()
                continue
            d, to = rng.choice(nexts)
            open_[cell].add(d)
            open_[to].add(_BACK[d])
            seen.add(to)
            stack.append(to)
        mazes.append(tuple("".join(m for m in MOVES if m in o) for o in open_))
    return tuple(mazes)


def maze_distances(maze: Sequence[str], size: int, start: int) -> list[int]:
    """Moves from `start` to every cell (breadth-first)."""
    dist = [-1] * (size * size)
    dist[start], frontier = 0, [start]
    while frontier:
        nxt = []
        for cell in frontier:
            for d in maze[cell]:
                dr, dc = _STEP[d]
                to = cell + dr * size + dc
                if dist[to] < 0:
                    dist[to] = dist[cell] + 1
                    nxt.append(to)
        frontier = nxt
    return dist


@dataclasses.dataclass(frozen=True)
class MazeEnv(SecretGame):
    """Walk from a start cell to a goal cell of a maze seen only from inside (LMRL-Gym's partially
    observed Maze): each turn the policy says a move, `n`, `e`, `s` or `w`; the reply is the cell it
    reached and that cell's open directions ("e 01 sw"), or `wall` when the move is blocked (the agent
    stays). The opening line gives the goal, the start and its open directions: "goal 34 at 00 es\n";
    cells are written row then column. Reward -1 per turn that does not reach the goal, 0 for the move
    that does; at most `max_turns` turns.

    A game ("secret") is (maze, start, goal): `mazes` fixed perfect mazes of size x size cells
    (`make_mazes`), and every start-goal pair of a maze `min_distance` to `max_distance` moves apart.
    The mazes are split by their index into train, validation and test (`held_out`), so a test maze is
    never played in training: the policy must learn to explore, not a map.

    The warm-start (`sft_problems`) walks at random without turning back (unless at a dead end): on the
    shipped setting (60 mazes of 5 x 5: 31 train, 10 validation, 19 test; goals 4-6 moves away; 10
    turns) it reaches 46% of the 2,714 test games. A walker that remembers the cells it saw, prefers
    unseen ones nearest the goal and backtracks from dead ends (`explorer_move`) reaches 74%, in 5.3
    turns on average when it does. Credit for a turn into a dead end arrives turns later."""

    max_turns: int = 10
    name: str = "maze"
    size: int = 5
    mazes: int = 60
    min_distance: int = 4
    max_distance: int = 6

    def __post_init__(self):
        super().__post_init__()
        if not 2 <= self.size <= 10 or self.mazes < 3 or not 1 <= self.min_distance <= self.max_distance:
            raise ConfigError(f"maze: need 2 <= size <= 10 (cells are written as two digits), mazes >= 3 and "
                              f"1 <= min_distance <= max_distance; got size={self.size}, mazes={self.mazes}, "
                              f"min_distance={self.min_distance}, max_distance={self.max_distance}.")
        if not all(self.secrets(s) for s in ("train", "validation", "test")):
            raise ConfigError(f"maze: some split has no start-goal pair {self.min_distance}-{self.max_distance} "
                              f"moves apart in {self.mazes} mazes of {self.size}x{self.size}; raise mazes or widen "
                              "the distances.")

    def maze(self, index: int) -> tuple[str, ...]:
        return make_mazes(self.mazes, self.size)[index]

    def maze_indices(self, split: str) -> list[int]:
        """The split's mazes (disjoint: `held_out` on the maze's index)."""
        return [int(i) for i in self.held_out([str(i) for i in range(self.mazes)], split)]

    def secrets(self, split: str) -> list[tuple[int, int, int]]:
        """(maze, start, goal) of every pair of cells of the split's mazes that are min..max_distance apart."""
        return _maze_games(self, split)

    def cell(self, index: int) -> str:
        return "".join(map(str, divmod(index, self.size)))

    def opening(self, secret: tuple[int, int, int]) -> str:
        maze, start, goal = secret
        return f"goal {self.cell(goal)} at {self.cell(start)} {self.maze(maze)[start]}\n"

    def header(self) -> str:
        return ""  # the first line depends on the game: `opening`

    def observation(self, ep: GameEpisode) -> str:
        return self.opening(ep.secret) + self.render(ep.guesses, ep.replies)

    def evaluation_label(self, split: str) -> str:
        return f"{split} start-goal pairs of {len(self.maze_indices(split))} mazes disjoint from the other splits'"

    def max_opening_chars(self) -> int:
        return len(self.opening((0, 0, 0))) - len(self.maze(0)[0]) + len(MOVES)

    def max_line_chars(self) -> int:
        return len("n 00 \n") + len(MOVES)

    def max_state_chars(self, prompt_chars: int = 0, utterance_chars: int = 0) -> int:
        return self.max_opening_chars() + (self.max_turns - 1) * self.max_line_chars()

    def _parse(self, utterance: str) -> str | None:
        text = utterance.strip()
        return text if len(text) == 1 and text in MOVES else None

    def move(self, maze: int, cell: int, move: str) -> int | None:
        """The cell a move leads to, None into a wall."""
        if move not in self.maze(maze)[cell]:
            return None
        dr, dc = _STEP[move]
        return cell + dr * self.size + dc

    def position(self, secret: tuple[int, int, int], moves: Sequence[str]) -> int:
        maze, cell, _ = secret
        for m in moves:
            to = self.move(maze, cell, m) if m in _STEP else None
            cell = cell if to is None else to
        return cell

    def reply_to(self, secret: tuple[int, int, int], cell: int, move: str | None) -> tuple[int, str]:
        """The cell after `move` from `cell` and the reply line's text after the move."""
        if move is None:
            return cell, "bad"
        to = self.move(secret[0], cell, move)
        if to is None:
            return cell, "wall"
        return to, f"{self.cell(to)} {self.maze(secret[0])[to]}"

    def step(self, ep: GameEpisode, utterance: str) -> tuple[GameEpisode, float, bool]:
        ep = dataclasses.replace(ep, guesses=list(ep.guesses), replies=list(ep.replies))
        move = self._parse(utterance)
        cell, reply = self.reply_to(ep.secret, self.position(ep.secret, ep.guesses), move)
        ep.turn += 1
        ep.guesses.append("?" if move is None else move)
        if cell == ep.secret[2]:
            ep.replies.append("goal")
            ep.success = ep.done = True
            return ep, 0.0, True
        ep.replies.append(reply)
        ep.ret -= 1.0
        ep.done = ep.turn >= self.max_turns
        return ep, -1.0, ep.done

    def record(self, ep: GameEpisode) -> dict[str, Any]:
        return {"maze": ep.secret[0], "start": self.cell(ep.secret[1]), "goal": self.cell(ep.secret[2]),
                "moves": ep.guesses, "replies": ep.replies, "turns": ep.turn, "success": ep.success, "return": ep.ret}

    def open_here(self, secret: tuple[int, int, int], moves: Sequence[str], replies: Sequence[str]) -> str:
        """The open directions the text shows for the current cell (the last move's reply, else the opening)."""
        for r in reversed(replies):
            if r not in ("wall", "bad"):
                return r.split(" ")[1]
        return self.maze(secret[0])[secret[1]]

    def rule_move(self, secret: tuple[int, int, int], moves: Sequence[str], replies: Sequence[str], rng: Any) -> str:
        """The warm-start's move: uniform over the open directions but the way back (class docstring)."""
        open_ = self.open_here(secret, moves, replies)
        made = [m for m, r in zip(moves, replies) if r not in ("wall", "bad")]
        forward = [d for d in open_ if not made or d != _BACK[made[-1]]]
        return rng.choice(forward or list(open_))

    def explorer_move(self, secret: tuple[int, int, int], moves: Sequence[str], replies: Sequence[str], rng: Any) -> str:
        """The yardstick: the open direction to an unseen cell nearest the goal, else back along the path."""
        maze, cell, goal = secret
        path, seen = [cell], {cell}
        for m in moves:
            to = self.move(maze, path[-1], m) if m in _STEP else None
            if to is not None:
                path = path[:-1] if len(path) > 1 and to == path[-2] else path + [to]
                seen.add(to)
        here, (gr, gc) = path[-1], divmod(goal, self.size)
        fresh = [(abs(divmod(to, self.size)[0] - gr) + abs(divmod(to, self.size)[1] - gc), d)
                 for d in self.maze(maze)[here] if (to := self.move(maze, here, d)) not in seen]
        if fresh:
            return min(fresh)[1]
        back = [d for d in self.maze(maze)[here] if len(path) > 1 and self.move(maze, here, d) == path[-2]]
        return back[0] if back else rng.choice(self.maze(maze)[here])

    def play(self, secret: tuple[int, int, int], policy: Any, rng: Any) -> GameEpisode:
        """One game of `policy(secret, moves, replies, rng) -> move`."""
        ep = GameEpisode(secret)
        while not ep.done:
            ep, _, _ = self.step(ep, policy(secret, ep.guesses, ep.replies, rng))
        return ep

    def sft_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """Warm-start examples: a game of the rule's moves (games of `split`) cut at a random turn, and the
        rule's next move as the target."""
        check_split_args(split, n, seed)
        rng, pool = split_rng(seed, split, f"{self.name}:sft"), self.secrets(split)
        out = []
        while len(out) < n:
            secret = rng.choice(pool)
            ep, cut = GameEpisode(secret), rng.randrange(self.max_turns)
            while not ep.done:
                said = self.rule_move(secret, ep.guesses, ep.replies, rng)
                if ep.turn == cut:
                    out.append(Problem(self.observation(ep), self.cell(secret[2]), said,
                                       {"task": self.name, "split": split, "game": list(secret),
                                        "moves": list(ep.guesses), "replies": list(ep.replies)}))
                    break
                ep, _, _ = self.step(ep, said)
        return out

    def sft_correct(self, problem: Problem, completion: str) -> bool:
        """A warm-start move is good when the current cell is open that way."""
        move, meta = self._parse(completion), problem.meta
        return move is not None and move in self.open_here(tuple(meta["game"]), meta["moves"], meta["replies"])


@functools.lru_cache(maxsize=32)
def _maze_games(env: MazeEnv, split: str) -> list[tuple[int, int, int]]:
    out = []
    for m in env.maze_indices(split):
        maze = env.maze(m)
        for start in range(env.size * env.size):
            dist = maze_distances(maze, env.size, start)
            out += [(m, start, goal) for goal, d in enumerate(dist) if env.min_distance <= d <= env.max_distance]
    return out


def optimal_guess_turns(high: int) -> float:
    """Mean turns of bisection (guess the interval's midpoint, rounding down) over secrets 1..high."""
    total = 0
    for secret in range(1, high + 1):
        lo, hi, turns = 1, high, 0
        while True:
            turns += 1
            g = (lo + hi) // 2
            if g == secret:
                break
            lo, hi = (g + 1, hi) if g < secret else (lo, g - 1)
        total += turns
    return total / high


__all__ = ["ACTOR", "GUIDANCE", "HINTS", "HINT_KINDS", "TwoTurnEnv", "TwoTurnEpisode", "GuessNumberEnv", "GuessEpisode",
           "WORDS", "WordleEnv", "WordleEpisode", "wordle_feedback", "OBJECTS", "ATTRIBUTES", "LONGEST_PHRASE", "TwentyQuestionsEnv", "GameEpisode", "SecretGame", "first_step", "rule_hint",
           "optimal_guess_turns", "MOVES", "MazeEnv", "make_mazes", "maze_distances"]
