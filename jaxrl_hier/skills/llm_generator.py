"""Skill generators backed by an LLM: an OpenAI-compatible chat endpoint, or a local Flax model.

Both build the same conversation (`build_messages`): the env, the target, the quantity names a
condition may use, and every skill so far with its status. The answer must be one JSON object,
either a proposal `{"name", "description", "requires", "success"[, "max_timesteps"]}` or
`{"done": true, "reason"}`; `max_timesteps` becomes the skill's budget per attempt (capped by the
config's `skill_timesteps`, see `Scheduler._budget`). It is checked against `PROPOSAL_SCHEMA` (jsonschema), then by the
scheduler's `validate` (known skills and quantities, no cycle, new name). An invalid answer is
logged with its reason and the model is asked again with its answer and the reason in the
conversation, so it can correct itself; after `max_invalid` invalid answers, or when the endpoint
stays unreachable after `max_retries` retries with exponential backoff, the generator raises
`GeneratorUnavailable` and the scheduler stops generation, keeping the work done.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Sequence

import jsonschema

from jaxrl_hier.skills.generators import GeneratorUnavailable, ProposalContext

_LOG = logging.getLogger("jaxrl_hier.skills")
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")

CONDITION_PATTERN = r"^\s*[A-Za-z_][A-Za-z0-9_.]*\s*(>=|<=|==|!=|>|<)\s*-?\d+(\.\d+)?\s*$"
_PROPOSAL: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["name", "requires", "success"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
        "description": {"type": "string"},
        "requires": {"type": "array", "items": {"type": "string"}},
        "success": {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": CONDITION_PATTERN}},
        "max_timesteps": {"type": "integer", "minimum": 1}}}
_DONE: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["done"],
    "properties": {"done": {"const": True}, "reason": {"type": "string"}}}
PROPOSAL_SCHEMA: dict[str, Any] = {"oneOf": [_PROPOSAL, _DONE]}

SYSTEM = """You design a curriculum of skills for a reinforcement-learning agent, bottom-up.
Each skill is trained with RL; a skill reuses the trained policies of the skills it requires.
Answer with exactly one JSON object and nothing else:
{"name": "snake_case_name", "description": "...", "requires": ["existing skill names"],
 "success": ["<quantity> <op> <number>", ...]}
where op is one of >=, <=, ==, >, <, != and every condition must hold for success
(optional: "max_timesteps": <integer>, the env steps one training attempt of the skill may take;
the run's own budget per attempt is the ceiling).
Use only the quantity names listed by the user and only existing skill names in "requires".
Propose one new skill that moves the agent towards the target, whose requirements are already
proposed. If the existing skills already cover the target, answer {"done": true, "reason": "..."}."""


def build_messages(context: ProposalContext, feedback: Sequence[tuple[str, str]] = ()) -> list[dict[str, str]]:
    """The conversation: task, state of the library, then one (rejected answer, reason) exchange
    per earlier invalid answer, so the model sees what it said and why it was refused."""
    skills = "\n".join(f"- {s['name']} [{s['status']}] requires {', '.join(s['requires']) or 'nothing'}; "
                       f"success: {' and '.join(s['success'])}" for s in context.skills) or "(none yet)"
    user = (f"Environment: {context.env}\nTarget: {context.target}\n"
            f"Quantities: {', '.join(context.quantities)}\nExisting skills:\n{skills}\n"
            "Propose the next skill as JSON.")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    for answer, reason in feedback:
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": f"That answer was rejected: {reason}. Answer again with one "
                                                    "valid JSON object."})
    return messages


def extract_json(text: str) -> dict:
    """The first balanced {...} that parses as a JSON object: answers often come in ```json fences
    or with prose around them. Raises ValueError when there is none."""
    if not text.strip():
        raise ValueError("the answer is empty")
    start = text.find("{")
    while start != -1:
        end = _balanced_end(text, start)
        if end is not None:
            try:
                value = json.loads(text[start:end])
            except ValueError:
                value = None
            if isinstance(value, dict):
                return value
        start = text.find("{", start + 1)
    raise ValueError("the answer holds no JSON object")


def _balanced_end(text: str, start: int) -> int | None:
    """Index just past the '}' closing the '{' at `start` (braces inside strings ignored), or None."""
    depth, in_str, escape = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def check_schema(answer: dict) -> None:
    """`PROPOSAL_SCHEMA`, checked against the branch the answer means (done or proposal) so the
    reason quoted back to the model names the actual field, not "valid under none of oneOf"."""
    try:
        jsonschema.validate(answer, _DONE if "done" in answer else _PROPOSAL)
    except jsonschema.ValidationError as err:
        raise ValueError(f"it does not match the schema ({err.json_path}: {err.message})") from None


def answer_loop(ask: Callable[[list[dict]], str], context: ProposalContext, validate: Callable[[dict], Any],
                max_invalid: int, name: str, log: logging.Logger) -> Any | None:
    """Ask, parse, schema-check, `validate`; on any invalid answer quote the reason back and ask
    again, at most `max_invalid` answers in all. None when the model says the target is covered."""
    feedback: list[tuple[str, str]] = []
    reason = "no answer"
    for _ in range(max(1, max_invalid)):
        text = ask(build_messages(context, feedback))
        try:
            answer = extract_json(text)
            check_schema(answer)
            if answer.get("done"):
                log.info("%s: target covered (%s)", name, answer.get("reason", ""))
                return None
            return validate(answer)
        except ValueError as err:  # SkillError is a ValueError too
            reason = str(err)
        log.warning("%s: rejected proposal: %s", name, reason)
        feedback.append((text, reason))
    raise GeneratorUnavailable(f"{name} gave no valid proposal in {max(1, max_invalid)} tries; last reason: {reason}")


class OpenAIChatGenerator:
    """`POST {base_url}/chat/completions` on any OpenAI-compatible server (vLLM, llama.cpp,
    hosted APIs), standard library only so the skills system needs no client package."""

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60.0,
                 max_retries: int = 4, backoff_s: float = 1.0, max_invalid: int = 3, temperature: float = 0.2,
                 sleep: Callable[[float], None] = time.sleep, logger: logging.Logger | None = None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout_s, self.max_retries = model, timeout_s, max_retries
        self.backoff_s, self.max_invalid, self.temperature, self.sleep = backoff_s, max_invalid, temperature, sleep
        self.log = logger or _LOG
        self.api_key = os.environ.get(api_key_env, "")
        host = urllib.parse.urlparse(base_url).hostname or ""
        if not self.api_key and host not in LOCAL_HOSTS:
            raise ValueError(f"the API key variable {api_key_env} is empty; export {api_key_env}=<key> (the config "
                             "names the variable, never the key), or point llm_base_url at a local server.")

    def _request(self, messages: list[dict]) -> urllib.request.Request:
        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return urllib.request.Request(self.url, data=body, headers=headers, method="POST")

    def _content(self, data: Any) -> str:
        """choices[0].message.content; "" (an invalid answer, re-asked) when the response lacks it."""
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            content = None
        if not isinstance(content, str):
            self.log.warning("LLM response from %s has no choices[0].message.content: %.200s", self.url, data)
            return ""
        return content

    def _post(self, messages: list[dict]) -> str:
        """One answer, retrying timeouts, connection errors, 429 and 5xx with exponential backoff."""
        request = self._request(messages)
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return self._content(json.loads(response.read().decode()))
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code} {err.reason}"
                if err.code != 429 and err.code < 500:
                    raise GeneratorUnavailable(f"{self.url} refused the request ({last}); not retried") from None
            except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
                # URLError wraps refused connections; TimeoutError is an OSError; ValueError is a
                # body that is not JSON (a proxy's error page, a truncated reply).
                last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
            self.log.warning("LLM request to %s failed (%s), attempt %d of %d", self.url, last, attempt + 1,
                             self.max_retries + 1)
        raise GeneratorUnavailable(f"{self.url} unreachable after {self.max_retries} retries ({last})")

    def propose(self, context: ProposalContext, validate: Callable[[dict], Any]) -> Any | None:
        return answer_loop(self._post, context, validate, self.max_invalid, f"LLM {self.model}", self.log)


class LocalLLMGenerator:
    """A local Hugging Face model run with `jaxrl_hier.llm` (no server, no download)."""

    def __init__(self, path_or_lm: Any, *, max_new_tokens: int = 256, temperature: float = 0.0, seed: int = 0,
                 max_invalid: int = 3, logger: logging.Logger | None = None):
        from jaxrl_hier.llm import load_pretrained

        # load_pretrained raises a ConfigError naming a missing directory
        self.lm = load_pretrained(path_or_lm) if isinstance(path_or_lm, (str, os.PathLike)) else path_or_lm
        if getattr(self.lm, "tokenizer", None) is None:
            raise ValueError("the local LLM has no tokenizer; put the tokenizer files in its directory.")
        self.max_new_tokens, self.temperature, self.max_invalid = max_new_tokens, temperature, max_invalid
        self.seed, self.calls = seed, 0
        self.log = logger or _LOG

    def _render(self, messages: list[dict]) -> tuple[str, bool]:
        """The prompt text, and whether the tokenizer should add its special tokens (a chat
        template already writes BOS, so adding it again would double it)."""
        tok = self.lm.tokenizer
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), False
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:", True

    def _generate(self, messages: list[dict]) -> str:
        import jax
        import numpy as np

        from jaxrl_hier.llm import generate

        tok = self.lm.tokenizer
        text, special = self._render(messages)
        ids = np.asarray([tok(text, add_special_tokens=special)["input_ids"]], np.int32)
        self.calls += 1  # a fresh key per call: sampled retries should not repeat themselves
        out = generate(self.lm, self.lm.params, ids, np.ones_like(ids),
                       key=jax.random.fold_in(jax.random.key(self.seed), self.calls),
                       max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id or 0)
        tokens, mask = np.asarray(out.tokens[0]), np.asarray(out.mask[0]).astype(bool)
        return tok.decode(tokens[mask].tolist(), skip_special_tokens=True)

    def propose(self, context: ProposalContext, validate: Callable[[dict], Any]) -> Any | None:
        return answer_loop(self._generate, context, validate, self.max_invalid, "local LLM", self.log)
