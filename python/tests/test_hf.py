"""Hugging Face causal LMs (Llama and Qwen2: GQA, tied embeddings, biases)
on the device and under torch.compile, against PyTorch's CPU eager."""

import copy
import os

import pytest
import torch

import lazyfuse

transformers = pytest.importorskip("transformers")

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "hf")
IDS = torch.tensor([[1, 5, 9, 23, 7, 3, 11, 2], [4, 8, 15, 16, 23, 42, 6, 1]])


def fixture(name):
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(FIXTURES, name), dtype=torch.float32
    ).eval()


def random_qwen2():
    """A random Qwen2 with q/k/v biases, GQA and tied embeddings."""
    torch.manual_seed(1)
    cfg = transformers.Qwen2Config(
        vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True,
        max_position_embeddings=128,
    )
    m = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
    return m


MODELS = {
    "llama_gqa": lambda: fixture("llama_gqa"),
    "llama_tied_llama3": lambda: fixture("llama_tied_llama3"),
    "qwen2": lambda: fixture("qwen2"),
    "qwen2_random_biases_tied": random_qwen2,
}


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_gradients_on_the_device(name):
    ref = MODELS[name]()
    dev = copy.deepcopy(ref).to("lazyfuse")
    with torch.no_grad():
        want = ref(IDS).logits
        got = dev(IDS.to("lazyfuse")).logits.cpu()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    ref.train()
    dev.train()
    ref(IDS, labels=IDS).loss.backward()
    dev(IDS.to("lazyfuse"), labels=IDS.to("lazyfuse")).loss.backward()
    for (n, p), q in zip(ref.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-4, rtol=1e-4, msg=n)


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_random_biases_tied"])
def test_logits_under_torch_compile(name):
    ref = MODELS[name]()
    with torch.no_grad():
        want = ref(IDS).logits
        got = torch.compile(copy.deepcopy(ref), backend="lazyfuse")(IDS).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_random_biases_tied"])
def test_logits_of_a_device_model_under_torch_compile(name):
    """A model moved to the device, then compiled: it runs as the fused
    eager device (Dynamo skips the device ops) and gives CPU eager's
    logits, on the device."""
    ref = MODELS[name]()
    cm = torch.compile(copy.deepcopy(ref).to("lazyfuse"), backend="lazyfuse")
    with torch.no_grad():
        want = ref(IDS).logits
        out = cm(IDS.to("lazyfuse")).logits
    assert out.device.type == "lazyfuse"
    torch.testing.assert_close(out.cpu(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2"])
def test_greedy_generate_on_the_device(name):
    ref = MODELS[name]()
    ids = IDS[:1]
    want = ref.generate(ids, max_new_tokens=10, do_sample=False)
    dev = copy.deepcopy(ref).to("lazyfuse")
    got = dev.generate(ids.to("lazyfuse"), max_new_tokens=10, do_sample=False)
    assert got.cpu().tolist() == want.tolist()
    # Warm, a generation of 20 tokens compiles at most once per cache
    # bucket it crosses (none per token).
    dev.generate(ids.to("lazyfuse"), max_new_tokens=20, do_sample=False)
    c0 = lazyfuse.counters()["compiles"]
    dev.generate(ids.to("lazyfuse"), max_new_tokens=20, do_sample=False)
    assert lazyfuse.counters()["compiles"] - c0 <= 2
