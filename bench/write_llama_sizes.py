"""Llama-architecture GGUF files with the real shapes of 1B, 7B and 13B models, written
locally in seconds (not run in CI; nothing is downloaded).

    .venv/bin/python bench/write_llama_sizes.py 7b /tmp/llama-7b.gguf
    .venv/bin/python bench/write_llama_sizes.py 1b 13b --folder /tmp/sizes

Shapes (vocabulary 32,000, trained context 4,096):

* ``1b``: TinyLlama-1.1B's: 22 layers, 2,048 wide, 32 heads (4 KV heads), feed-forward 5,632.
* ``7b``: LLaMA-2-7B's: 32 layers, 4,096 wide, 32 heads, feed-forward 11,008 (about 3.8 GB).
* ``13b``: LLaMA-2-13B's: 40 layers, 5,120 wide, 40 heads, feed-forward 13,824 (about 7.4 GB).

Every 2-D weight is Q4_0 (blocks of 32 weights: an fp16 scale and 16 bytes of nibbles)
with random nibbles under a scale chosen so that a weight's spread is ``1/sqrt(in)``,
as a trained layer's roughly is: activations keep their size through the layers, and
decoding runs the same kernels on the same bytes per token as a real model of that shape.
Norms are F32 ones. One block array per weight kind is written for every layer (the
writer holds references, not copies), so memory stays at one layer's worth and the
file streams to disk. The tokenizer is the example's byte-level BPE
(``modelyard.examples.gguf_llama``), padded with printable filler tokens to 32,000; the
output rows of control and non-printable tokens are zero, so greedy text is printable.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelyard.examples.gguf_llama import CHAT_TEMPLATE, SPECIAL_TOKENS, vocabulary


@dataclass(frozen=True)
class Size:
    """A model's shape."""

    layers: int
    width: int
    heads: int
    kv_heads: int
    feed_forward: int
    vocab: int = 32000
    context: int = 4096


SIZES = {
    "1b": Size(layers=22, width=2048, heads=32, kv_heads=4, feed_forward=5632),
    "7b": Size(layers=32, width=4096, heads=32, kv_heads=32, feed_forward=11008),
    "13b": Size(layers=40, width=5120, heads=40, kv_heads=40, feed_forward=13824),
}
BLOCK = 32
"""Weights per Q4_0 block."""
NIBBLE_STD = float(np.sqrt((16**2 - 1) / 12))
"""The spread of a uniform nibble in -8..7 (Q4_0 stores ``(q - 8) x scale``)."""


def q4_0(rows: int, cols: int, rng: np.random.Generator, zero_rows: np.ndarray | None = None):
    """``rows x cols`` weights as Q4_0 block bytes (``rows x cols/32 x 18`` uint8)."""
    blocks = cols // BLOCK
    out = np.empty((rows, blocks, 18), np.uint8)
    scale = np.float16(1.0 / (NIBBLE_STD * np.sqrt(cols)))
    out[:, :, :2] = np.frombuffer(scale.tobytes(), np.uint8)
    out[:, :, 2:] = rng.integers(0, 256, (rows, blocks, 16), dtype=np.uint8)
    if zero_rows is not None:
        out[zero_rows, :, :2] = 0  # scale 0: the row's logits are 0, never the likeliest
    return out.reshape(rows, blocks * 18)


def tokenizer(size: Size) -> tuple[list[str], list[str], list[int], np.ndarray]:
    """``(tokens, merges, types, printable)``: the example's BPE, padded to the vocabulary."""
    tokens, merges, types, printable = vocabulary()
    specials = len(SPECIAL_TOKENS)
    fill = size.vocab - len(tokens)
    # Byte-level BPE spells a leading space as "Ġ": " w0", " w1"… are printable text.
    filler = [f"\u0120w{i}" for i in range(fill)]
    tokens = tokens[:-specials] + filler + tokens[-specials:]
    types = types[:-specials] + [1] * fill + types[-specials:]
    printable = printable[:-specials] + [True] * fill + printable[-specials:]
    return tokens, merges, types, np.asarray(printable)


def write(size: Size, path: Path, seed: int = 0) -> Path:
    """Write a random-weight llama GGUF of ``size`` to ``path`` (atomically)."""
    import gguf

    q4 = gguf.GGMLQuantizationType.Q4_0
    rng = np.random.default_rng(seed)
    tokens, merges, types, printable = tokenizer(size)
    first_special = len(tokens) - len(SPECIAL_TOKENS)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"modelyard-random-{path.stem}")
    w.add_context_length(size.context)
    w.add_embedding_length(size.width)
    w.add_block_count(size.layers)
    w.add_feed_forward_length(size.feed_forward)
    w.add_head_count(size.heads)
    w.add_head_count_kv(size.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(size.width // size.heads)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(first_special)
    w.add_eos_token_id(first_special + 1)
    w.add_pad_token_id(first_special + 2)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)
    kv = size.kv_heads * (size.width // size.heads)
    d, ff = size.width, size.feed_forward
    ones = np.ones(d, np.float32)
    kinds = {
        "attn_q": (d, d),
        "attn_k": (kv, d),
        "attn_v": (kv, d),
        "attn_output": (d, d),
        "ffn_gate": (ff, d),
        "ffn_up": (ff, d),
        "ffn_down": (d, ff),
    }
    blocks = {k: q4_0(rows, cols, rng) for k, (rows, cols) in kinds.items()}
    w.add_tensor("token_embd.weight", q4_0(size.vocab, d, rng), raw_dtype=q4)
    for i in range(size.layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        for kind, data in blocks.items():
            w.add_tensor(f"blk.{i}.{kind}.weight", data, raw_dtype=q4)
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", q4_0(size.vocab, d, rng, ~printable), raw_dtype=q4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path


def main() -> None:
    """Write each named size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="+", help="1b, 7b or 13b; or one size and a path")
    parser.add_argument("--folder", default=".", help="where to write <size>.gguf")
    args = parser.parse_args()
    names = args.sizes
    targets = [(n, Path(args.folder) / f"llama-{n}.gguf") for n in names if n in SIZES]
    if len(names) == 2 and names[0] in SIZES and names[1] not in SIZES:
        targets = [(names[0], Path(names[1]))]
    for name, path in targets:
        started = time.perf_counter()
        write(SIZES[name], path)
        size = path.stat().st_size / 1e9
        print(f"{name}: {path} {size:.2f} GB in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
