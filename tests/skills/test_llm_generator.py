"""LLM skill generators against a fake OpenAI-compatible server on loopback, and a tiny local model."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jaxrl_hier.envs import make
from jaxrl_hier.skills.generators import GeneratorUnavailable, ProposalContext, make_validator
from jaxrl_hier.skills.library import techtree_library
from jaxrl_hier.skills.llm_generator import (PROPOSAL_SCHEMA, LocalLLMGenerator, OpenAIChatGenerator, build_messages,
                                             check_schema, extract_json)
from jaxrl_hier.skills.trainer import quantities_for

LIB = techtree_library().subset(["collect_wood", "place_table"])
QUANTITIES = tuple(quantities_for(make("TechTree-v0")[0], LIB))
CONTEXT = ProposalContext("make_wood_pickaxe", "TechTree-v0",
                          tuple({"name": s.name, "requires": list(s.requires), "success": [str(c) for c in s.success],
                                 "status": "completed"} for s in LIB.skills), QUANTITIES)
VALIDATE = make_validator(LIB, techtree_library(), QUANTITIES, max_experts=4, max_conditions=2)
GOOD = {"name": "make_wood_pickaxe", "description": "craft", "requires": ["place_table"],
        "success": ["achievement.make_wood_pickaxe == 1"]}


def chat(content):
    return 200, {"choices": [{"message": {"role": "assistant", "content": content}}]}


class FakeServer:
    """Answers POSTs from a script of (status, body) or ("sleep", seconds, then) entries."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                step = outer.script.pop(0)
                if step[0] == "sleep":
                    time.sleep(step[1])
                    step = step[2]
                status, payload = step
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    servers = []

    def start(*script):
        s = FakeServer(script)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def client(url, sleeps=None, **kw):
    return OpenAIChatGenerator(url, "fake-model", timeout_s=kw.pop("timeout_s", 5.0),
                               max_retries=kw.pop("max_retries", 2),
                               sleep=(sleeps.append if sleeps is not None else lambda s: None), **kw)


def test_valid_answer_is_validated_and_request_is_well_formed(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    s = server(chat("Sure! ```json\n" + json.dumps(GOOD) + "\n```"))
    skill = client(s.url).propose(CONTEXT, VALIDATE)
    assert skill.name == "make_wood_pickaxe" and skill.requires == ("place_table",)
    req = s.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    assert req["body"]["model"] == "fake-model" and req["body"]["messages"][0]["role"] == "system"
    user = req["body"]["messages"][1]["content"]
    assert "inventory.wood" in user and "place_table" in user


def test_invalid_answers_are_rejected_with_the_reason_and_asked_again(server):
    bad_quantity = dict(GOOD, success=["inventory.gold >= 1"])
    s = server(chat("no json here"), chat(json.dumps({"name": "X Y", "requires": [], "success": []})),
               chat(json.dumps(bad_quantity)), chat(json.dumps(GOOD)))
    skill = client(s.url, max_invalid=4).propose(CONTEXT, VALIDATE)
    assert skill.name == "make_wood_pickaxe" and len(s.requests) == 4
    last = s.requests[-1]["body"]["messages"]
    rejections = [m["content"] for m in last if m["role"] == "user"][1:]
    assert "no JSON object" in rejections[0] and "schema" in rejections[1]
    assert "unknown quantity 'inventory.gold'" in rejections[2]


def test_too_many_invalid_answers_give_up(server):
    s = server(*[chat(json.dumps(dict(GOOD, requires=["nope"])))] * 3)
    with pytest.raises(GeneratorUnavailable, match="no valid proposal in 3 tries.*unknown skill 'nope'"):
        client(s.url).propose(CONTEXT, VALIDATE)


def test_done_answer_means_nothing_more_to_propose(server):
    s = server(chat(json.dumps({"done": True, "reason": "covered"})))
    assert client(s.url).propose(CONTEXT, VALIDATE) is None


def test_server_errors_are_retried_with_backoff(server):
    s = server((500, {"error": "busy"}), (429, {"error": "slow down"}), chat(json.dumps(GOOD)))
    sleeps = []
    assert client(s.url, sleeps, backoff_s=0.5).propose(CONTEXT, VALIDATE).name == "make_wood_pickaxe"
    assert sleeps == [0.5, 1.0]


def test_slow_answers_time_out_and_a_dead_endpoint_stops_cleanly(server):
    s = server(*[("sleep", 1.0, chat(json.dumps(GOOD)))] * 3)
    sleeps = []
    with pytest.raises(GeneratorUnavailable, match="unreachable after 2 retries"):
        client(s.url, sleeps, timeout_s=0.3).propose(CONTEXT, VALIDATE)
    assert len(sleeps) == 2 and len(s.requests) == 3
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    sleeps = []
    with pytest.raises(GeneratorUnavailable, match=f"127.0.0.1:{port}/v1/chat/completions unreachable after 2"):
        client(f"http://127.0.0.1:{port}/v1", sleeps, backoff_s=0.25).propose(CONTEXT, VALIDATE)
    assert sleeps == [0.25, 0.5]


def test_missing_api_key_for_a_remote_host_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("MY_KEY", raising=False)
    with pytest.raises(ValueError, match="MY_KEY is empty; export MY_KEY"):
        OpenAIChatGenerator("https://api.example.com/v1", "m", api_key_env="MY_KEY")


def test_extract_json_finds_the_object_in_prose():
    assert extract_json('Here: {"a": {"b": "}"}} trailing') == {"a": {"b": "}"}}
    with pytest.raises(ValueError):
        extract_json("[1, 2]")


    fenced = ('Here you go:\n```json\n{"name": "a", "description": "say \\"}\\" twice", "requires": [], '
              '"success": ["x >= 1"]}\n```')
    assert extract_json(fenced)["description"] == 'say "}" twice'
    with pytest.raises(ValueError, match="empty"):
        extract_json("  ")


def test_schema_reasons_name_the_field():
    check_schema(GOOD)
    check_schema(dict(GOOD, max_timesteps=1000))
    check_schema({"done": True, "reason": "covered"})
    for bad, field in [(dict(GOOD, name="Bad Name"), "$.name"), (dict(GOOD, success=[]), "$.success"),
                       (dict(GOOD, success=["inventory.wood ~ 3"]), "$.success[0]"),
                       (dict(GOOD, extra=1), "$"), (dict(GOOD, max_timesteps=1.5), "$.max_timesteps"),
                       ({"done": False}, "$.done")]:
        with pytest.raises(ValueError, match=re.escape(f"schema ({field}:")):
            check_schema(bad)
    assert set(PROPOSAL_SCHEMA) == {"oneOf"}


def test_messages_carry_the_library_and_quote_rejections():
    messages = build_messages(CONTEXT, [("{bad", "the answer holds no JSON object")])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    user = messages[1]["content"]
    assert "TechTree-v0" in user and "make_wood_pickaxe" in user and "achievement.place_table" in user
    assert "- place_table [completed] requires collect_wood" in user
    assert messages[2]["content"] == "{bad" and "the answer holds no JSON object" in messages[3]["content"]


def test_validate_result_is_returned_and_its_reason_quoted(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    seen, accepted = [], object()

    def validate(answer):
        seen.append(answer)
        if len(seen) == 1:
            raise ValueError("unknown quantity inventory.gold")
        return accepted

    s = server(chat(json.dumps(GOOD)), chat(json.dumps(GOOD)))
    assert client(s.url).propose(CONTEXT, validate) is accepted
    assert seen == [GOOD, GOOD]
    second = s.requests[1]["body"]["messages"]
    assert second[-2] == {"role": "assistant", "content": json.dumps(GOOD)}
    assert "unknown quantity inventory.gold" in second[-1]["content"] and second[-1]["role"] == "user"
    assert s.requests[0]["body"]["messages"] == build_messages(CONTEXT)
    assert s.requests[0]["body"]["temperature"] == 0.2


def test_client_errors_are_not_retried_and_empty_responses_are_invalid(server):
    s = server((400, {"error": "bad model"}))
    sleeps = []
    with pytest.raises(GeneratorUnavailable, match="HTTP 400.*not retried"):
        client(s.url, sleeps).propose(CONTEXT, VALIDATE)
    assert sleeps == [] and len(s.requests) == 1
    s = server((200, {"choices": []}), (200, {"object": "error"}), chat(json.dumps(GOOD)))
    assert client(s.url).propose(CONTEXT, VALIDATE).name == "make_wood_pickaxe"
    assert "the answer is empty" in s.requests[-1]["body"]["messages"][-1]["content"]


def test_local_servers_need_no_key(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    s = server(chat(json.dumps(GOOD)))
    assert client(s.url).propose(CONTEXT, VALIDATE).name == "make_wood_pickaxe"
    assert s.requests[0]["auth"] is None
    OpenAIChatGenerator("http://localhost:8000/v1", "m")


# ----------------------------------------------------------------------------- local LLM


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random 2-layer Llama with a word-level tokenizer (as in tests/llm/test_models_io.py)."""
    torch = pytest.importorskip("torch")
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[PAD]", "[UNK]", "</s>", "{", "}", '"name"', ":", "system", "user", "assistant"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                                eos_token="</s>")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    path = tmp_path_factory.mktemp("tiny_llama")
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def test_local_llm_runs_the_whole_loop(tiny_llama):
    gen = LocalLLMGenerator(str(tiny_llama), max_new_tokens=8, max_invalid=2)
    with pytest.raises(GeneratorUnavailable, match="local LLM gave no valid proposal in 2 tries"):
        gen.propose(CONTEXT, VALIDATE)  # a random model: generate -> decode -> parse -> rejected, twice
    assert gen.calls == 2
    text = gen._generate(build_messages(CONTEXT))
    assert isinstance(text, str) and "[PAD]" not in text


def test_local_llm_parses_and_validates_scripted_answers(tiny_llama):
    from jaxrl_hier.llm import load_pretrained

    class Scripted(LocalLLMGenerator):
        """The real parse/validate/retry loop, with the model's answers scripted."""

        def __init__(self, lm, answers, **kw):
            super().__init__(lm, **kw)
            self.answers, self.prompts = list(answers), []

        def _generate(self, messages):
            self.prompts.append(messages)
            return self.answers.pop(0)

    lm = load_pretrained(tiny_llama)  # an already-loaded model is accepted as is
    gen = Scripted(lm, ["I think {oops", "```json\n" + json.dumps(GOOD) + "\n```"])
    assert gen.lm is lm and gen.propose(CONTEXT, VALIDATE).name == "make_wood_pickaxe"
    assert "no JSON object" in gen.prompts[1][-1]["content"]
    assert Scripted(lm, ['{"done": true, "reason": "covered"}']).propose(CONTEXT, VALIDATE) is None
    gen = Scripted(lm, [json.dumps(dict(GOOD, success=["inventory.gold >= 1"]))] * 3)
    with pytest.raises(GeneratorUnavailable, match="3 tries; last reason: .*unknown quantity 'inventory.gold'"):
        gen.propose(CONTEXT, VALIDATE)


def test_local_llm_prompt_rendering(tiny_llama):
    from jaxrl_hier.llm import load_pretrained

    lm = load_pretrained(tiny_llama)
    gen = LocalLLMGenerator(lm)
    text, special = gen._render([{"role": "user", "content": "hi"}])
    assert (text, special) == ("user: hi\nassistant:", True)  # no chat template: role-prefixed lines
    lm.tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                                  "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert gen._render([{"role": "user", "content": "hi"}]) == ("<user>hi<assistant>", False)


def test_local_llm_errors_name_the_problem(tmp_path):
    with pytest.raises(Exception, match=re.escape(str(tmp_path / "nowhere"))):
        LocalLLMGenerator(str(tmp_path / "nowhere"))

    class NoTokenizer:
        params, tokenizer = {}, None

    with pytest.raises(ValueError, match="no tokenizer"):
        LocalLLMGenerator(NoTokenizer())
