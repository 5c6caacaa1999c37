"""A Llama model with random weights and a word-level tokenizer, both built
here and saved to a folder that `transformers serve` loads as a local model
(no hub: nothing is downloaded).

    python3 tests/python/serve_model.py DIR [--shape tiny|llama-8b-2l] [--dtype float32|bfloat16]

SHAPES holds the two shapes the serving tests use: `tiny` (a few hundred
thousand parameters, for the CPU) and `llama-8b-2l` (Llama-3-8B's hidden
size, heads, KV heads, MLP width and vocabulary with two layers, for a GPU).
The vocabulary's size is the config's vocab_size: the tokenizer has exactly
that many entries, so every id the model can emit decodes to a word.
"""
from __future__ import annotations

import argparse
import json
import pathlib

# The first entries, in id order. Only the end-of-sequence token is a
# special token of the tokenizer (decoding skips it): every other id the
# model can emit decodes to one word, so a client counts the tokens it got.
# The role markers are plain words the chat template writes.
SPECIALS = ["<unk>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
UNK, EOS = 0, 1
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# vocab_size differs from every other dimension of its shape, so that the LM
# head's GEMM (N = vocab_size) is told apart from the layers' by its key.
SHAPES = {
    "tiny": dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
    "llama-8b-2l": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                        rope_theta=500000.0),
}
# Random weights drawn wider than Llama's 0.02, so that the logits of the
# greedy choice stand well apart (no near-ties that numerical noise between
# two runs could flip; the test checks the margin).
INIT_STD = 0.5


def words(n):
    """n plain words (w0, w1, ...) after the special tokens."""
    return [f"w{i}" for i in range(n - len(SPECIALS))]


def build_tokenizer(vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + words(vocab_size))}
    assert len(vocab) == vocab_size
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with one space
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(out_dir, shape="tiny", dtype="float32", seed=0, device="cpu"):
    """Write config, weights (random, from seed, drawn on device),
    generation config and tokenizer to out_dir; return the config's fields."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dims = SHAPES[shape]
    cfg = LlamaConfig(**dims, bos_token_id=None, eos_token_id=EOS, pad_token_id=EOS, tie_word_embeddings=False,
                      initializer_range=INIT_STD, dtype=dtype)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(eos_token_id=EOS, pad_token_id=EOS, do_sample=False)
    model.save_pretrained(out)
    build_tokenizer(dims["vocab_size"]).save_pretrained(out)
    return dict(dims, dtype=dtype, seed=seed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda: faster for big shapes)")
    a = ap.parse_args(argv)
    print(json.dumps(build(a.dir, a.shape, a.dtype, a.seed, a.device)))


if __name__ == "__main__":
    main()
