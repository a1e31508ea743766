"""Hugging Face causal language models from a local folder (``runtime: transformers``).

The version folder holds what ``save_pretrained`` writes: ``config.json``, the weights as
safetensors and the tokenizer files (nothing is fetched from a hub: ``local_files_only``).
Needs the ``torch`` extra (torch and transformers).

One generation thread, one sequence at a time (no parallel sequences: requests queue in
the server's generation gate). Each step feeds the last token with the KV cache of the
step before; sampling and stopping follow :mod:`modelyard.runtimes.generation`: greedy
at temperature 0, else top-k, top-p, temperature and a seeded draw.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from modelyard.errors import InternalError, InvalidInputError, ServerError
from modelyard.protocol.generate import FINISH_LENGTH, FINISH_STOP
from modelyard.runtimes.base import RuntimeSpec
from modelyard.runtimes.generation import (
    GenerationJob,
    GenerationStats,
    check_context,
    int_option,
)
from modelyard.runtimes.generation_thread import GenerationThread
from modelyard.runtimes.textstream import TextStream


class CausalLMRuntime(GenerationThread):
    """A ``transformers`` causal LM with a dedicated generation thread."""

    _thread_name = "hf-generate"

    def __init__(self) -> None:
        super().__init__()
        self._torch: Any = None
        self._model: Any = None
        self._tokenizer: Any = None
        self._n_ctx = 0
        self._eos: set[int] = set()
        self._generated = 0
        self._prompt_tokens = 0
        self._active = 0
        self._cache_arg = "past_key_values"

    @property
    def context_length(self) -> int:
        """Tokens one sequence may hold."""
        return self._n_ctx

    def load(self, spec: RuntimeSpec) -> None:
        """Load config, safetensors weights and tokenizer from the version folder."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch = torch
        folder = Path(spec.version_dir)
        torch.set_num_threads(max(1, int_option(spec, "n_threads", 2)))
        self._tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model: Any = AutoModelForCausalLM.from_pretrained(
            folder, local_files_only=True, use_safetensors=True
        )
        self._model = model.eval()
        # transformers 5.x renamed ``past_key_values`` to ``cache`` (the old name warns).
        self._cache_arg = (
            "cache"
            if "cache" in inspect.signature(self._model.forward).parameters
            else "past_key_values"
        )
        trained = int(getattr(self._model.config, "max_position_embeddings", 2048))
        self._n_ctx = int_option(spec, "n_ctx", 0) or min(trained, 4096)
        eos = self._model.config.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    def warm_up(self) -> None:
        """One forward pass of one token: the first forward allocates."""
        torch = self._torch
        with torch.inference_mode():
            self._model(input_ids=torch.tensor([[self._first_token()]]), use_cache=True)

    def _first_token(self) -> int:
        bos = self._tokenizer.bos_token_id
        return int(bos) if bos is not None else 0

    def stats(self) -> GenerationStats:
        """Counters now; the KV cache grows with the sequence, so 0 is reported."""
        return GenerationStats(
            self._generated, self._prompt_tokens, self._active, 0, self._n_ctx, 1
        )

    def close(self) -> None:
        """Stop the thread."""
        self._stop_thread()

    def _is_cancelled(self, seq: int) -> bool:
        with self._lock:
            if seq in self._cancelled:
                self._cancelled.discard(seq)
                return True
        return False

    def _run(self) -> None:
        while not self._closed:
            job = self._inbox.get()
            if job is None or self._is_cancelled(job.seq):
                continue
            self._active = 1
            try:
                self._generate(job)
            except ServerError as exc:
                self._fail(job.seq, exc)
            except Exception as exc:
                self._fail(job.seq, InternalError(f"generation failed: {exc}"))
            finally:
                self._active = 0

    def _prompt(self, job: GenerationJob) -> list[int]:
        tok = self._tokenizer
        if job.messages is not None:
            if not getattr(tok, "chat_template", None):
                raise InvalidInputError("this model has no chat template; send a prompt instead")
            try:
                text = tok.apply_chat_template(
                    [{"role": r, "content": c} for r, c in job.messages],
                    add_generation_prompt=True,
                    tokenize=False,
                )
            except Exception as exc:
                raise InvalidInputError(f"the model's chat template failed: {exc}") from None
            ids = tok(str(text), add_special_tokens=False)["input_ids"]
            return [int(i) for i in ids]
        ids = tok(job.prompt or "", add_special_tokens=True)["input_ids"]
        if not ids:
            raise InvalidInputError("the prompt is empty")
        return [int(i) for i in ids]

    def _generate(self, job: GenerationJob) -> None:
        torch = self._torch
        sink = self._sink
        assert sink is not None
        unsupported = job.extras()
        if unsupported:  # refused, never ignored: the answer would not be what was asked
            raise InvalidInputError(
                f"the transformers runtime does not support {', '.join(map(repr, unsupported))}"
                "; serve the model as GGUF with the llama_cpp runtime for them"
            )
        prompt = self._prompt(job)
        check_context(len(prompt), job.max_tokens, self._n_ctx)
        self._prompt_tokens += len(prompt)
        stream = TextStream(job.stop)
        gen = torch.Generator().manual_seed(job.seed if job.seed is not None else _random_seed())
        generated = len(job.resume_ids)  # a preempted job resumes after its tokens
        past: Any = None
        ids = torch.tensor([prompt + list(job.resume_ids)])
        pending: list[int] = []
        with torch.inference_mode():
            while True:
                if self._is_cancelled(job.seq):
                    return
                out = self._model(input_ids=ids, use_cache=True, **{self._cache_arg: past})
                past = out[self._cache_arg]
                token = self._sample(out.logits[0, -1], job, gen)
                generated += 1
                self._generated += 1
                if token in self._eos:
                    rest = stream.finish()
                    sink.chunk(
                        job.seq, rest.text, [*pending, token], FINISH_STOP, len(prompt), generated
                    )
                    return
                piece = stream.push(token, self._bytes(token))
                pending += piece.token_ids
                if piece.stopped:
                    sink.chunk(job.seq, piece.text, pending, FINISH_STOP, len(prompt), generated)
                    return
                full = len(prompt) + generated >= self._n_ctx
                if (job.max_tokens is not None and generated >= job.max_tokens) or full:
                    rest = stream.finish()
                    sink.chunk(
                        job.seq,
                        piece.text + rest.text,
                        pending + rest.token_ids,
                        FINISH_LENGTH,
                        len(prompt),
                        generated,
                    )
                    return
                if piece.text:
                    sink.chunk(job.seq, piece.text, pending, None, len(prompt), generated)
                    pending = []
                ids = torch.tensor([[token]])

    def _bytes(self, token: int) -> bytes:
        # Byte-level BPE: the token's bytes, so a character split over tokens is joined
        # by the TextStream rather than replaced piece by piece.
        tok = self._tokenizer
        text = tok.convert_ids_to_tokens(token)
        backend = getattr(tok, "backend_tokenizer", None)
        if backend is not None and isinstance(text, str):
            decoded = backend.decoder.decode([text])
            return str(decoded).encode("utf-8")
        return str(tok.decode([token])).encode("utf-8")

    def _sample(self, logits: Any, job: GenerationJob, gen: Any) -> int:
        torch = self._torch
        if job.temperature <= 0:
            return int(torch.argmax(logits))
        logits = logits.float()
        if job.top_k > 0:
            k = min(job.top_k, logits.shape[-1])
            kth = torch.topk(logits, k).values[-1]
            logits = torch.where(logits < kth, torch.full_like(logits, float("-inf")), logits)
        if job.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            cum = torch.cumsum(probs, dim=-1)
            drop = cum - probs > job.top_p  # keep the smallest set reaching top_p
            sorted_logits[drop] = float("-inf")
            logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
        probs = torch.softmax(logits / job.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=gen))


def _random_seed() -> int:
    import random

    return random.getrandbits(63)
