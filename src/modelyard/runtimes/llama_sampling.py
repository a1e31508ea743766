"""How llama.cpp picks one sequence's next token: its own sampler chain, grammars, logprobs.

Everything goes through llama.cpp's own samplers (``llama_sampler_init_*``), so a
sampling setting means what it means in llama.cpp's server:

* the chain: ``logit_bias``, then the frequency and presence penalties (over the tokens
  generated so far), then greedy, or top-k, top-p, temperature and a seeded draw;
* a JSON Schema becomes a GBNF grammar through llama-cpp-python's own converter
  (``json_schema_to_gbnf``) and a ``llama_sampler_init_grammar`` sampler. As in
  llama.cpp's ``common_sampler``, the grammar is applied lazily: the chain picks a token
  from the raw logits, the grammar checks that one token, and only when it is refused is
  the whole vocabulary filtered by the grammar and the token picked again, so a
  constrained sequence costs about what a free one does;
* log probabilities are the model's own (a log-softmax of the raw logits, before any
  sampler), as OpenAI and vLLM report them.
"""

from __future__ import annotations

import ctypes
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from modelyard.errors import InternalError, InvalidInputError
from modelyard.protocol.generate import TokenLogprob
from modelyard.runtimes.generation import GenerationJob

MAX_GRAMMAR_CHARS = 1 << 20
"""A grammar larger than this (a schema with huge repetition bounds) is refused."""
MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_REPEAT = 4096
"""The largest ``minItems``/``maxItems``/``minLength``/``maxLength`` bound accepted:
the converter spells a bound out rule by rule."""
_BOUNDS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def check_schema(schema: Any, depth: int = 0) -> None:
    """InvalidInputError for a schema nested deeper than :data:`MAX_SCHEMA_DEPTH` or with
    a repetition bound above :data:`MAX_SCHEMA_REPEAT` (either would make the grammar
    builder recurse or write without end)."""
    if depth > MAX_SCHEMA_DEPTH:
        raise InvalidInputError(f"'response_format': the JSON schema nests deeper than {depth}")
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in _BOUNDS and isinstance(value, int) and value > MAX_SCHEMA_REPEAT:
                raise InvalidInputError(
                    f"'response_format': the JSON schema's {key} is {value}; at most "
                    f"{MAX_SCHEMA_REPEAT} is supported"
                )
            check_schema(value, depth + 1)
    elif isinstance(schema, list):
        for item in schema:
            check_schema(item, depth + 1)


def schema_grammar(schema_text: str) -> str:
    """The GBNF grammar of a JSON Schema, by llama-cpp-python's converter;
    InvalidInputError naming ``response_format`` when the schema cannot be converted."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        check_schema(json.loads(schema_text))
        grammar = str(json_schema_to_gbnf(schema_text))
    except InvalidInputError:
        raise
    except (RecursionError, MemoryError):
        raise InvalidInputError("'response_format': the JSON schema is too complex") from None
    except Exception as exc:  # the converter raises plain exceptions for what it refuses
        raise InvalidInputError(
            f"'response_format': the JSON schema is not supported: {type(exc).__name__}: {exc}"
        ) from None
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise InvalidInputError("'response_format': the JSON schema's grammar is too large")
    return grammar


class Sampling:
    """One sequence's samplers: the chain, an optional grammar, the logprobs asked for.

    Used by the generation thread only; :meth:`free` releases the native samplers.
    """

    def __init__(self, llama: Any, vocab: Any, n_ctx: int, job: GenerationJob) -> None:
        self._llama = llama
        self._n_vocab = n_vocab = int(llama.llama_vocab_n_tokens(vocab))
        self.logprobs = job.logprobs
        self.grammar: Any = None
        self.chain: Any = None
        # Everything checked before the first native sampler is made: nothing leaks.
        bias = _logit_bias(llama, job.logit_bias, n_vocab)
        grammar = None if job.json_schema is None else schema_grammar(job.json_schema)
        try:
            self.chain = _chain(llama, job, bias, n_vocab, n_ctx)
        except Exception as exc:  # a binding that does not match the library
            raise InternalError(f"llama.cpp's samplers could not be made: {exc}") from None
        if grammar is not None:
            self.grammar = llama.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            if not self.grammar:
                self.free()
                raise InvalidInputError("'response_format': llama.cpp refused the grammar")
            self._cells = np.zeros(n_vocab, dtype=_TOKEN_DATA)
            self._ids = np.arange(n_vocab, dtype=np.int32)
            self._one = np.zeros(1, dtype=_TOKEN_DATA)

    def sample(self, ctx: Any, index: int) -> int:
        """The next token from the logits of batch row ``index``, accepted by every
        sampler (the penalties remember it, the grammar advances)."""
        llama = self._llama
        if self.grammar is None:
            return int(llama.llama_sampler_sample(self.chain, ctx, index))
        logits = self._logits(ctx, index)
        token = self._pick(logits, with_grammar=False)
        if not self._allowed(token, float(logits[token])):
            token = self._pick(logits, with_grammar=True)
        llama.llama_sampler_accept(self.grammar, token)
        llama.llama_sampler_accept(self.chain, token)
        return token

    def token_logprob(
        self, ctx: Any, index: int, token: int, piece: Callable[[int], bytes]
    ) -> TokenLogprob | None:
        """``token``'s log probability at batch row ``index`` and the most likely
        alternatives (``piece(id)`` gives a token's bytes); None when not asked for."""
        if self.logprobs is None:
            return None
        logits = self._logits(ctx, index).astype(np.float64)
        peak = float(logits.max())
        logz = peak + math.log(float(np.exp(logits - peak).sum()))
        top: tuple[tuple[int, bytes, float], ...] = ()
        k = min(self.logprobs, self._n_vocab)
        if k > 0:
            best = np.argpartition(-logits, k - 1)[:k]
            best = best[np.argsort(-logits[best], kind="stable")]
            top = tuple((int(t), piece(int(t)), float(logits[t] - logz)) for t in best)
        return TokenLogprob(token, piece(token), min(0.0, float(logits[token] - logz)), top)

    def free(self) -> None:
        """Release the native samplers (once)."""
        llama = self._llama
        if self.chain:
            llama.llama_sampler_free(self.chain)
        if self.grammar:
            llama.llama_sampler_free(self.grammar)
        self.chain = self.grammar = None

    # ------------------------------------------------------------------ the grammar's road

    def _logits(self, ctx: Any, index: int) -> np.ndarray:
        ptr = self._llama.llama_get_logits_ith(ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,))

    def _pick(self, logits: np.ndarray, *, with_grammar: bool) -> int:
        cells = self._cells
        cells["id"] = self._ids
        cells["logit"] = logits
        cells["p"] = 0.0
        array = self._array(cells)
        if with_grammar:
            self._llama.llama_sampler_apply(self.grammar, ctypes.byref(array))
        self._llama.llama_sampler_apply(self.chain, ctypes.byref(array))
        if not 0 <= array.selected < array.size:
            raise InvalidInputError("'response_format': no token can continue the grammar")
        return int(array.data[array.selected].id)

    def _allowed(self, token: int, logit: float) -> bool:
        one = self._one
        one["id"] = token
        one["logit"] = logit
        one["p"] = 0.0
        self._llama.llama_sampler_apply(self.grammar, ctypes.byref(self._array(one)))
        return bool(np.isfinite(one["logit"][0]))

    def _array(self, cells: np.ndarray) -> Any:
        llama = self._llama
        data = cells.ctypes.data_as(ctypes.POINTER(llama.llama_token_data))
        return llama.llama_token_data_array(data, len(cells), -1, False)


def _logit_bias(llama: Any, bias: tuple[tuple[int, float], ...], n_vocab: int) -> Any:
    for token, _ in bias:
        if not 0 <= token < n_vocab:
            raise InvalidInputError(
                f"'logit_bias': token id {token} is not in the model's vocabulary "
                f"(0 to {n_vocab - 1})"
            )
    if not bias:
        return None
    entries = (llama.llama_logit_bias * len(bias))()
    for i, (token, value) in enumerate(bias):
        entries[i].token = token
        entries[i].bias = value
    return entries


def _chain(llama: Any, job: GenerationJob, bias: Any, n_vocab: int, n_ctx: int) -> Any:
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    try:
        _fill_chain(llama, chain, job, bias, n_vocab, n_ctx)
    except BaseException:
        llama.llama_sampler_free(chain)  # frees the samplers already added
        raise
    return chain


def _fill_chain(
    llama: Any, chain: Any, job: GenerationJob, bias: Any, n_vocab: int, n_ctx: int
) -> None:
    add = llama.llama_sampler_chain_add
    if bias is not None:
        add(chain, llama.llama_sampler_init_logit_bias(n_vocab, len(bias), bias))
    if job.frequency_penalty or job.presence_penalty:
        # penalty_repeat 1: off; OpenAI's two penalties over every generated token.
        add(
            chain,
            llama.llama_sampler_init_penalties(
                n_vocab, n_ctx, 1.0, job.frequency_penalty, job.presence_penalty
            ),
        )
    if job.temperature <= 0.0:
        add(chain, llama.llama_sampler_init_greedy())
        return
    if job.top_k > 0:
        add(chain, llama.llama_sampler_init_top_k(job.top_k))
    if job.top_p < 1.0:
        add(chain, llama.llama_sampler_init_top_p(job.top_p, 1))
    add(chain, llama.llama_sampler_init_temp(job.temperature))
    seed = llama.LLAMA_DEFAULT_SEED if job.seed is None else job.seed & 0xFFFFFFFF
    add(chain, llama.llama_sampler_init_dist(seed))


def tokenize_answer(llama: Any, vocab: Any, job: GenerationJob) -> list[int]:
    """``tokenize``: the ids of ``job.prompt`` (BOS first when ``add_special``)."""
    data = (job.prompt or "").encode("utf-8")
    n_max = len(data) + 8
    buf = (llama.llama_token * n_max)()
    n = llama.llama_tokenize(vocab, data, len(data), buf, n_max, job.add_special, True)
    if n < 0:
        raise InvalidInputError("'content' could not be tokenized")
    return [int(t) for t in buf[:n]]


def detokenize_answer(llama: Any, vocab: Any, ids: tuple[int, ...]) -> str:
    """``detokenize``: the text of ``ids`` (special tokens written out, as llama.cpp's
    server does); InvalidInputError for an id outside the vocabulary."""
    n_vocab = int(llama.llama_vocab_n_tokens(vocab))
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise InvalidInputError(
            f"'tokens': token id {bad} is not in the model's vocabulary (0 to {n_vocab - 1})"
        )
    if not ids:
        return ""
    tokens = (llama.llama_token * len(ids))(*ids)
    size = 64 + 16 * len(ids)
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama.llama_detokenize(vocab, tokens, len(ids), buf, size, False, True)
        if n >= 0:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = -n + 1
    raise InvalidInputError("'tokens' could not be detokenized")
