"""Makes the tiny Hugging Face checkpoints under tests/fixtures/hf/ with transformers.

Run by hand (not in CI; cargo test reads only the files this writes):
    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch==2.9.0 transformers safetensors
    /tmp/hf/bin/python scripts/make_hf_fixtures.py [--out tests/fixtures/hf] [--large DIR]

Each fixture directory is what save_pretrained writes (config.json,
generation_config.json, model.safetensors or shards with the index), plus
expected.json: the prompt ids, transformers' prompt logits (float32, one row
per position) and 32 greedy tokens (eos ignored). initializer_range is 0.25,
so greedy margins are far from ties. --large DIR also writes an 8-layer,
hidden-512 random Llama for benchmarks (not committed).
"""
import argparse, json, os
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

PROMPT = [3, 17, 101, 5, 42, 9, 77, 64, 1, 23, 88, 12]
TEXT = "the quick brown fox jumps over the lazy dog and runs far away"

# A word-level vocabulary of the model's 128 tokens: <unk>, <s> (bos 1), </s> (eos 2), words.
WORDS = ("the quick brown fox jumps over lazy dog and runs far away a an of to in is it on "
         "for with as at by from up out if or but not all any can will one two three four five "
         "six seven eight nine ten red green blue black white cat bird fish tree river hill sky "
         "sun moon star rain snow wind fire stone sand sea ship road town house door wall roof "
         "bed book pen cup milk bread salt tea time day night year old new big small long short "
         "high low fast slow hot cold good bad first last next back here there now then when why "
         "how who what this that").split()


def write_tokenizer(d, size=128):
    """tokenizer.json (Hugging Face tokenizers): word level over WORDS, then
    w<i> up to `size` tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    assert len(vocab) <= size, len(vocab)
    for i in range(len(vocab), size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(os.path.join(d, "tokenizer.json"))
    return tok


def base(**kw):
    d = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5, initializer_range=0.25, bos_token_id=1, eos_token_id=2,
             tie_word_embeddings=False)
    d.update(kw)
    return d


def rope(theta, **scaling):
    """rope_theta (and scaling) the way the installed transformers takes them."""
    if int(transformers.__version__.split(".")[0]) >= 5:
        return dict(rope_parameters=dict(rope_type=scaling.pop("rope_type", "default"), rope_theta=theta, **scaling))
    d = dict(rope_theta=theta)
    if scaling:
        d["rope_scaling"] = scaling
    return d


FIXTURES = {
    # GQA (4 query heads over 2 kv heads) with an explicit head_dim unlike hidden/heads.
    "llama_gqa": (LlamaConfig, LlamaForCausalLM, base(head_dim=32, **rope(10000.0)), torch.float32, None),
    # Tied embeddings, a large rope_theta and llama3 frequency scaling.
    "llama_tied_llama3": (LlamaConfig, LlamaForCausalLM,
                          base(tie_word_embeddings=True, num_key_value_heads=4,
                               **rope(500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=64)),
                          torch.float32, None),
    # Qwen2: q/k/v biases.
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, base(**rope(1000000.0)), torch.float32, None),
    # Weights stored in bf16 (what real checkpoints ship); reference computed in f32 from them.
    "llama_bf16": (LlamaConfig, LlamaForCausalLM, base(**rope(10000.0)), torch.bfloat16, None),
    # Weights stored in f16.
    "llama_f16": (LlamaConfig, LlamaForCausalLM, base(**rope(10000.0)), torch.float16, None),
    # Sharded safetensors with model.safetensors.index.json.
    "llama_sharded": (LlamaConfig, LlamaForCausalLM, base(**rope(10000.0)), torch.float32, "100KB"),
    # Qwen3: per-head RMSNorm of queries and keys, no q/k/v biases.
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, base(head_dim=32, **rope(1000000.0)), torch.float32, None),
    # Mixtral: 4 experts, top-2, probabilities renormalised.
    "mixtral": (MixtralConfig, MixtralForCausalLM,
                base(num_local_experts=4, num_experts_per_tok=2, **rope(1000000.0)), torch.float32, None),
    # Qwen2-MoE: 6 experts, top-2 without renormalising, a gated shared
    # expert, and layer 1 dense (mlp_only_layers).
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM,
                  base(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48,
                       shared_expert_intermediate_size=80, norm_topk_prob=False, decoder_sparse_step=1,
                       mlp_only_layers=[1], **rope(1000000.0)), torch.float32, None),
    # Qwen3-MoE: 8 experts, top-3 renormalised, q/k norms; stored in bf16.
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                  base(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=40, head_dim=16,
                       norm_topk_prob=True, **rope(1000000.0)), torch.bfloat16, None),
}


def make(name, cfg_cls, model_cls, cfg, dtype, shard, out):
    torch.manual_seed(sum(map(ord, name)))
    model = model_cls(cfg_cls(**cfg)).eval()
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.to(dtype).save_pretrained(d, **({"max_shard_size": shard} if shard else {}))
    # The reference: the saved weights, computed in float32.
    ref = model_cls.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        logits = ref(ids).logits[0].float()
        gen = ref.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0,
                           min_new_tokens=32)
    expected = dict(prompt_ids=PROMPT, logits=[[float(v) for v in row] for row in logits],
                    greedy_ids=gen[0, len(PROMPT):].tolist(), transformers=transformers.__version__,
                    torch=torch.__version__)
    if name == "llama_gqa":
        tok = write_tokenizer(d)
        text_ids = tok.encode(TEXT).ids
        with torch.no_grad():
            g = ref.generate(torch.tensor([text_ids]), max_new_tokens=16, do_sample=False,
                             eos_token_id=None, pad_token_id=0, min_new_tokens=16)[0, len(text_ids):].tolist()
        expected.update(prompt_text=TEXT, prompt_text_ids=text_ids, text_greedy_ids=g,
                        text_greedy=tok.decode(g))
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f)
    print(name, sorted(os.listdir(d)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/hf")
    ap.add_argument("--large", default=None)
    a = ap.parse_args()
    for name, (c, m, cfg, dtype, shard) in FIXTURES.items():
        make(name, c, m, cfg, dtype, shard, a.out)
    if a.large:
        cfg = base(vocab_size=2048, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                   num_attention_heads=8, num_key_value_heads=4, initializer_range=0.05, **rope(10000.0))
        make("llama_large", LlamaConfig, LlamaForCausalLM, cfg, torch.float32, None, a.large)
        # A tokenizer and a chat template, so servers (lazyfuse-serve,
        # transformers serve) can be benchmarked on it with text and chat.
        d = os.path.join(a.large, "llama_large")
        write_tokenizer(d, 2048)
        template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                    "{% if add_generation_prompt %}the{% endif %}")
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                           tokenizer_class="PreTrainedTokenizerFast", chat_template=template,
                           model_max_length=256), f)
