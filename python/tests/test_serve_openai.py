"""The `openai` client, unchanged, against lazyfuse-serve: completions and
chat, streamed and not, and its typed errors for bad requests.

The server binary is the one `cargo test --workspace --release` builds
(scripts/test runs that first); the checkpoint is the tiny transformers-made
Llama under tests/fixtures/hf with a chat template added."""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "release" / "lazyfuse-serve"
FIXTURE = ROOT / "tests" / "fixtures" / "hf" / "llama_gqa"


@pytest.fixture(scope="module")
def server():
    assert BINARY.exists(), f"{BINARY} is missing: run `cargo build --release -p lazyfuse-serve`"
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "tiny-llama"
        shutil.copytree(FIXTURE, model)
        template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                    "{% if add_generation_prompt %}the{% endif %}")
        (model / "tokenizer_config.json").write_text(json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}))
        proc = subprocess.Popen(
            [str(BINARY), "--model", str(model), "--port", "0", "--max-model-len", "128", "--quiet"],
            stderr=subprocess.PIPE, text=True)
        try:
            url = None
            for line in proc.stderr:
                if "ready on " in line:
                    url = line.split("ready on ")[1].strip()
                    break
            assert url, "the server did not start"
            yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_completions_and_chat_streamed_and_not(server):
    models = server.models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]
    r = server.completions.create(model="tiny-llama", prompt="the quick brown fox",
                                  max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens == 4
    text = r.choices[0].text
    assert text
    pieces = [c.choices[0].text for c in server.completions.create(
        model="tiny-llama", prompt="the quick brown fox", max_tokens=6, temperature=0,
        stream=True, extra_body={"ignore_eos": True}) if c.choices]
    assert "".join(pieces) == text

    chat = server.chat.completions.create(model="tiny-llama", max_tokens=5, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.role == "assistant"
    content = chat.choices[0].message.content
    chunks = list(server.chat.completions.create(
        model="tiny-llama", max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True}, messages=[{"role": "user", "content": "hi"}]))
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content


def test_bad_requests_are_typed_openai_errors(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.completions.create(model="tiny-llama", prompt="the", max_tokens=0)
    assert "max_tokens" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        server.completions.create(model="gpt-4o", prompt="the", max_tokens=3)
    with pytest.raises(openai.BadRequestError) as e:
        server.completions.create(model="tiny-llama", prompt=list(range(3, 103)) * 2, max_tokens=3)
    assert "200" in str(e.value) and "128" in str(e.value)
    # Still serving.
    r = server.completions.create(model="tiny-llama", prompt=[1, 5, 9], max_tokens=2)
    assert r.usage.completion_tokens == 2
