"""A tiny random Hugging Face LlamaForCausalLM, made locally (no hub), for the
``transformers`` runtime: a byte-level BPE tokenizer trained with ``tokenizers`` on the
bundled text, a small config, random weights, saved with ``save_pretrained`` as
safetensors. Needs the ``torch`` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from modelyard.examples.gguf_llama import CHAT_TEMPLATE, CORPUS, printable_token


def write_tiny_causal_lm(folder: Path, seed: int = 0, vocab_size: int = 400) -> Path:
    """Write config, safetensors weights and tokenizer into ``folder``; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    # cast: typed only where transformers is installed (check_no_extras.sh runs without it)
    fast: Any = cast(Any, PreTrainedTokenizerFast)(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=specials[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # never the likeliest: greedy output stays printable text
        for token, index in tok.get_vocab().items():
            if token in specials or not printable_token(token):
                model.lm_head.weight[index] = 0
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    fast.save_pretrained(folder)
    return folder
