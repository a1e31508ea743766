"""Tiny llama-architecture GGUF files with random weights, written locally (no hub).

The tokenizer is a byte-level BPE (GPT-2 style) whose merges are learned from the
bundled text below, so prompts in English tokenize into a few hundred real tokens. The
weights are random but deterministic (same arguments, byte-identical file). The output
rows of control and non-printable tokens are zeroed: a random model would otherwise pick
lone bytes >= 0x80 (invalid UTF-8 on their own) and special tokens, which makes greedy
output hard to compare and to read; with them zeroed greedy decoding emits printable text.

Needs the ``gguf`` package (the ``llm`` extra).
"""

from __future__ import annotations

import itertools
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CORPUS = """\
The quick brown fox jumps over the lazy dog. A model server keeps many models on one
machine, loads them when a request arrives, and evicts the ones nobody asked for in a
while. Each model runs in its own worker process, so a crash takes down only that model.
The budget counts the bytes of every model that is loading, warming, ready or draining,
and it never lets them pass the limit of the device. When a new model needs room, the
server picks the models to evict by their priority, their size and how often they are
used. Tokens leave the worker as soon as they are produced, and a client that goes away
stops the generation at once. Time to first token, time per output token and tokens per
second are measured for every model. The weights are mapped from the file, so two
workers that read the same file share the page cache. Hello world! How are you today?
I am fine, thank you. What is the capital of France? Paris is the capital of France.
One, two, three, four, five, six, seven, eight, nine, ten. Once upon a time there was a
little model that wanted to write stories about the sea, the sky and the mountains.
"""
"""The text the BPE merges are learned from (and a source of test prompts)."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""A ChatML template stored in the file's ``tokenizer.chat_template``."""

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>")
_BOS, _EOS, _PAD = 0, 1, 2  # indexes into SPECIAL_TOKENS, placed after the BPE tokens

_CONTROL = 3  # gguf TokenType.CONTROL
_NORMAL = 1  # gguf TokenType.NORMAL
_PRETOKENS = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")


@dataclass(frozen=True, slots=True)
class LlamaShape:
    """Dimensions of a tiny llama model; the file is about ``2 * parameters`` bytes (F16)."""

    layers: int
    width: int
    feed_forward: int
    heads: int = 8
    kv_heads: int = 4
    context_length: int = 2048
    merges: int = 500

    @property
    def head_dim(self) -> int:
        """Size of one attention head (``width / heads``)."""
        return self.width // self.heads


SHAPES: dict[str, LlamaShape] = {
    "tiny": LlamaShape(layers=6, width=256, feed_forward=768),
    "small": LlamaShape(layers=10, width=512, feed_forward=1408),
    "medium": LlamaShape(layers=10, width=1024, feed_forward=3072),
}
"""The example sizes: about 10, 60 and 250 MB."""


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible map from bytes to printable characters (byte-level BPE).
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in codes), strict=True))


def _learn_merges(text: str, count: int) -> list[tuple[str, str]]:
    """Byte-level BPE merges learned from ``text``; ties broken by the pair itself."""
    table = _bytes_to_unicode()
    words = Counter(tuple(table[b] for b in piece.encode()) for piece in _PRETOKENS.findall(text))
    merges: list[tuple[str, str]] = []
    vocab = dict(words)
    for _ in range(count):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, freq in vocab.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += freq
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged: dict[tuple[str, ...], int] = {}
        for word, freq in vocab.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + freq
        vocab = merged
    return merges


def printable_token(token: str) -> bool:
    """True when a byte-level BPE token's bytes are printable ASCII or a newline."""
    inverse = _inverse_table()
    if any(c not in inverse for c in token):
        return False
    return all(0x20 <= inverse[c] < 0x7F or inverse[c] == 0x0A for c in token)


def _inverse_table() -> dict[str, int]:
    return {c: b for b, c in _bytes_to_unicode().items()}


def vocabulary(merges: int = 500) -> tuple[list[str], list[str], list[int], list[bool]]:
    """``(tokens, merges, token_types, printable)`` of the example tokenizer."""
    table = _bytes_to_unicode()
    tokens = [table[b] for b in range(256)]
    pairs = _learn_merges(CORPUS, merges)
    seen = set(tokens)
    for a, b in pairs:
        if a + b not in seen:
            tokens.append(a + b)
            seen.add(a + b)
    types = [_NORMAL] * len(tokens) + [_CONTROL] * len(SPECIAL_TOKENS)

    printable = [printable_token(t) for t in tokens] + [False] * len(SPECIAL_TOKENS)
    return tokens + list(SPECIAL_TOKENS), [f"{a} {b}" for a, b in pairs], types, printable


def write_llama_gguf(path: Path, shape: LlamaShape, seed: int = 0) -> Path:
    """Write a random-weight llama GGUF of ``shape`` to ``path`` (atomically); return it."""
    import gguf

    tokens, merges, types, printable = vocabulary(shape.merges)
    n_vocab = len(tokens)
    first_special = n_vocab - len(SPECIAL_TOKENS)
    rng = np.random.default_rng(seed)

    def weight(rows: int, cols: int) -> np.ndarray:
        # Scaled so activations keep their size through the layers.
        w = rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)
        half: np.ndarray = w.astype(np.float16)
        return half

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(f"modelyard-example-{path.stem}")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.width)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.feed_forward)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(first_special + _BOS)
    writer.add_eos_token_id(first_special + _EOS)
    writer.add_pad_token_id(first_special + _PAD)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    kv_width = shape.kv_heads * shape.head_dim
    writer.add_tensor("token_embd.weight", weight(n_vocab, shape.width))
    for i in range(shape.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(shape.width, np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(shape.width, shape.width))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv_width, shape.width))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv_width, shape.width))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(shape.width, shape.width))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(shape.width, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(shape.feed_forward, shape.width))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(shape.feed_forward, shape.width))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(shape.width, shape.feed_forward))
    writer.add_tensor("output_norm.weight", np.ones(shape.width, np.float32))
    output = weight(n_vocab, shape.width)
    output[~np.asarray(printable)] = 0  # never the likeliest: greedy output stays printable
    writer.add_tensor("output.weight", output)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path
