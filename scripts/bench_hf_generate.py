"""transformers' greedy decoding speed on a checkpoint, for the generate benchmark.

    /tmp/hf/bin/python scripts/bench_hf_generate.py DIR [--tokens 128] [--threads 2] [--prompt-ids 3,17,101]

Torch on the CPU with --threads threads, greedy decoding of --tokens new tokens
(end tokens ignored) with transformers' KV cache, one untimed warm-up run, then
the median of --runs timed runs. Prints tokens/s and the tokens, so they can be
checked against lazyfuse's (`cargo run --release --example generate`).
"""
import argparse, statistics, time
import torch
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--tokens", type=int, default=128)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--prompt-ids", default="3,17,101")
a = ap.parse_args()
torch.set_num_threads(a.threads)
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
ids = torch.tensor([[int(x) for x in a.prompt_ids.split(",")]])


def run():
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=False,
                              eos_token_id=None, pad_token_id=0)


run()
times = []
for _ in range(a.runs):
    t0 = time.perf_counter()
    out = run()
    times.append(time.perf_counter() - t0)
t = statistics.median(times)
print(f"transformers {a.tokens} tokens in {t:.3f} s: {a.tokens / t:.1f} tokens/s (threads {a.threads})")
print("generated:", " ".join(str(x) for x in out[0, ids.shape[1]:].tolist()))
