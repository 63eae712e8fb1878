"""A Hugging Face causal LM on the lazyfuse device: ``from_pretrained``,
``.to("lazyfuse")``, ``generate()``; the same model under
``torch.compile(backend="lazyfuse")`` for its logits.

    python python/examples/hf_generate.py [MODEL_DIR] [--tokens N]

MODEL_DIR is a local checkpoint (default: the tiny Llama fixture in
tests/fixtures/hf/llama_gqa). Prints the greedy tokens from PyTorch's CPU
eager and from the device, and the compile counts.
"""

import argparse
import os
import time

import torch
from transformers import AutoModelForCausalLM

import lazyfuse

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?",
                    default=os.path.join(HERE, "..", "..", "tests", "fixtures", "hf", "llama_gqa"))
    ap.add_argument("--tokens", type=int, default=24)
    a = ap.parse_args()
    ids = torch.tensor([[1, 5, 9, 23, 7, 3, 11, 2]])

    cpu = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    want = cpu.generate(ids, max_new_tokens=a.tokens, do_sample=False)
    print("cpu eager:", want[0].tolist())

    dev = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval().to("lazyfuse")
    for run in ("first", "warm"):
        c0, t0 = lazyfuse.counters()["compiles"], time.perf_counter()
        got = dev.generate(ids.to("lazyfuse"), max_new_tokens=a.tokens, do_sample=False)
        dt = time.perf_counter() - t0
        print(f"lazyfuse ({run}): {got.cpu()[0].tolist()}  {dt:.2f} s,"
              f" {lazyfuse.counters()['compiles'] - c0} compiles")
    assert got.cpu().tolist() == want.tolist()

    compiled = torch.compile(cpu, backend="lazyfuse")
    with torch.no_grad():
        diff = (compiled(ids).logits - cpu(ids).logits).abs().max().item()
    print(f"torch.compile(backend='lazyfuse') logits: max |diff| vs eager {diff:.2e}")


if __name__ == "__main__":
    main()
