"""GGUF models through llama-cpp-python (the ``llm`` extra), inside a worker process.

One model, one llama.cpp context with ``parallel`` sequences, and one dedicated
generation thread: it admits queued jobs into free sequence slots, evaluates every
active sequence in one ``llama_decode`` batch per step (the prompts of new jobs and the
last token of running ones: continuous batching), samples each, and reports the text at
once. One thread, not a thread pool: llama.cpp decodes about four times slower when each
token comes from another thread.

The weights are memory-mapped (replicas and versions of one file share the page cache,
and the budget charges the file once); llama.cpp's extra weight buffers (AMX / repacked
copies) are off unless ``weights: repacked``: they double the resident memory and slow
warm loads many times over (docs/decisions/0035). llama-cpp-python 0.3.36 does not
expose that flag as a keyword, so the model is loaded through the low-level API.
"""

from __future__ import annotations

import ctypes
import queue
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelyard.errors import InternalError, InvalidInputError, ServerError
from modelyard.protocol.generate import FINISH_LENGTH, FINISH_STOP, TokenLogprob
from modelyard.runtimes.base import RuntimeSpec, find_model_file
from modelyard.runtimes.chat_template import chat_messages, compile_chat_template
from modelyard.runtimes.generation import (
    GenerationJob,
    GenerationStats,
    bool_option,
    check_context,
    int_option,
)
from modelyard.runtimes.generation_thread import GenerationThread
from modelyard.runtimes.llama_backend import (
    REPACKED,
    SPARE_CONTEXT_OPTION,
    init_backend,
    weights_option,
)
from modelyard.runtimes.llama_dims import model_dims
from modelyard.runtimes.llama_sampling import Sampling, detokenize_answer, tokenize_answer
from modelyard.runtimes.prompt_prefix import SlotPrefixes
from modelyard.runtimes.textstream import TextStream

DEFAULT_MAX_CONTEXT = 4096
"""The context a model gets without ``n_ctx``: its trained length, at most this."""
KV_ELEMENT_BYTES = 2
"""llama.cpp's KV cache holds F16 keys and values by default."""


def prepare_fork_server() -> None:
    """Import llama-cpp-python and start its backend, once, in the fork server.

    Every worker forked afterwards inherits both; they cost more than loading a small
    GGUF file (see ``RUNTIME_PRELOAD`` in ``workers/forkserver.py``). Neither starts a
    thread, so forking stays safe.
    """
    import llama_cpp

    init_backend(llama_cpp)
    # jinja2 builds its lexer (a dozen regular expressions) per environment settings on
    # first use; building it here saves each worker 3-4 ms of its chat template's compile.
    compile_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")


@dataclass(slots=True)
class _Sequence:
    """A job in a sequence slot: its tokens, sampler and text so far."""

    job: GenerationJob
    slot: int
    prompt: list[int]
    sampler: Sampling
    stream: TextStream
    fed: int = 0
    """Prompt tokens already evaluated."""
    position: int = 0
    """Tokens in this sequence's KV cache."""
    last: int = -1
    """The token sampled last, evaluated in the next step."""
    evaluated: list[int] = field(default_factory=list)
    """Generated tokens in this sequence's KV cache (after the prompt's ``fed``)."""
    generated: int = 0
    logits_index: int = -1
    pending_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    """The request's own prompt; ``prompt`` also holds the tokens of a resumed job."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """Sampled tokens' log probabilities not reported yet (when the job asked)."""


_CONTEXT_OPTIONS = ("n_ctx", "parallel", "n_batch", "n_threads", "prefix_reuse")


def _context_options(spec: RuntimeSpec | None) -> tuple[str | None, ...]:
    """What a context is made with: two specs with the same can share a spare context."""
    options = spec.options if spec is not None else {}
    return tuple(options.get(k) for k in _CONTEXT_OPTIONS)


class LlamaCppRuntime(GenerationThread):
    """A GGUF model served by llama.cpp with parallel sequences (see the module doc)."""

    _thread_name = "llama-generate"
    _wake_on_cancel = True  # the loop blocks on the inbox only when idle

    def __init__(self) -> None:
        super().__init__()
        self._llama: Any = None
        self._model: Any = None
        self._adapter: Any = None
        self._ctx: Any = None
        self._vocab: Any = None
        self._batch: Any = None
        self._template: Any = None
        self._template_source: str | None = None
        self._bos_text = ""
        self._eos_text = ""
        self._n_ctx = 0
        self._parallel = 1
        self._n_batch = 512
        self._kv_bytes = 0
        self._waiting: list[GenerationJob] = []
        self._active: dict[int, _Sequence] = {}
        self._generated = 0
        self._prompt_tokens = 0
        self._reused_tokens = 0
        self._prefixes = SlotPrefixes(1)
        self._dims: Any = None
        self._gpu = False
        self._owns_model = False
        """False for an adapter's runtime: the model is its base's (:meth:`attach_adapter`)."""
        self._spare: LlamaCppRuntime | None = None
        """A context made ahead for the next adapter (option ``spare_context``)."""
        self._spare_spec: RuntimeSpec | None = None
        self._made_with: RuntimeSpec | None = None
        """The spec an adapter's context was made with (:meth:`_context_runtime`)."""

    # ------------------------------------------------------------------ load

    @property
    def context_length(self) -> int:
        """Tokens one sequence may hold (``n_ctx``)."""
        return self._n_ctx

    def load(self, spec: RuntimeSpec) -> None:
        """Map the GGUF file and create a context of ``parallel`` x ``n_ctx`` tokens."""
        import llama_cpp

        llama = self._llama = llama_cpp
        init_backend(llama)
        path = find_model_file(Path(spec.version_dir), (".gguf",), spec.model_file)
        mparams = llama.llama_model_default_params()
        mparams.n_gpu_layers = int_option(spec, "n_gpu_layers", 0)
        mparams.use_mmap = True
        mparams.use_mlock = False
        # "repacked": llama.cpp's extra weight buffers (faster kernels, private copies).
        mparams.use_extra_bufts = weights_option(spec) == REPACKED
        self._model = llama.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {path}")
        self._owns_model = True
        self._gpu = mparams.n_gpu_layers > 0
        self._vocab = llama.llama_model_get_vocab(self._model)
        self._dims = model_dims(llama, self._model, path)
        self._create_context(spec)
        self._bos_text = self._piece(llama.llama_vocab_bos(self._vocab), special=True)
        self._eos_text = self._piece(llama.llama_vocab_eos(self._vocab), special=True)
        if bool_option(spec, SPARE_CONTEXT_OPTION, False):
            self._spare_spec = spec
            self.refill_spare()
        # The chat template is compiled when a chat request first needs it (2-3 ms on a
        # switch's path otherwise, which a completion never uses).
        raw = llama.llama_model_chat_template(self._model, None)
        self._template_source = raw.decode("utf-8", errors="replace") if raw else None

    def attach_adapter(self, spec: RuntimeSpec) -> LlamaCppRuntime:
        """A runtime for the LoRA adapter in ``spec``'s folder over this loaded model: the
        adapter read (``llama_adapter_lora_init``) and a context of its own with it set,
        sharing this runtime's weights (no second mapping). The context is the spare one
        made ahead when its options are the adapter's (:meth:`refill_spare`), so a switch
        costs the adapter's read; a new one otherwise. Its own generation thread runs
        once started; :meth:`close` frees the adapter and its context only.

        ValueError when llama.cpp refuses the adapter (corrupt, or made for another
        model): this runtime is untouched and keeps serving.
        """
        llama = self._llama
        path = find_model_file(Path(spec.version_dir), (".gguf",), spec.model_file)
        adapter = llama.llama_adapter_lora_init(self._model, str(path).encode())
        if not adapter:
            raise ValueError(f"llama.cpp could not load the LoRA adapter {path.name}")
        spare, self._spare = self._spare, None
        if spare is not None and _context_options(spare._made_with) != _context_options(spec):
            self._spare = spare  # made for other options: kept for an adapter that fits
            spare = None
        try:
            child = spare or self._context_runtime(spec)
        except BaseException:
            llama.llama_adapter_lora_free(adapter)
            raise
        child._adapter = adapter
        try:
            adapters = (llama.llama_adapter_lora_p_ctypes * 1)(adapter)
            if llama.llama_set_adapters_lora(child._ctx, adapters, 1, (ctypes.c_float * 1)(1.0)):
                raise ValueError(f"llama.cpp could not apply the LoRA adapter {path.name}")
        except BaseException:
            child.close()
            raise
        return child

    @property
    def has_spare_context(self) -> bool:
        """True while a context made ahead waits for the next adapter."""
        return self._spare is not None

    def refill_spare(self) -> None:
        """Make the spare context the next adapter takes, if this model keeps one and
        has none (after an adapter took it: off the switch's path). Its KV cache and
        buffers are this model's own memory, measured with it."""
        if self._spare is None and self._spare_spec is not None and self._model:
            self._spare = self._context_runtime(self._spare_spec)

    def _context_runtime(self, spec: RuntimeSpec) -> LlamaCppRuntime:
        """A runtime over this loaded model with a new context of ``spec``'s options."""
        child = LlamaCppRuntime()
        child._llama, child._model, child._vocab = self._llama, self._model, self._vocab
        child._dims, child._gpu = self._dims, self._gpu
        child._bos_text, child._eos_text = self._bos_text, self._eos_text
        child._template_source = self._template_source
        child._made_with = spec
        try:
            child._create_context(spec)
        except BaseException:
            child.close()
            raise
        return child

    def _create_context(self, spec: RuntimeSpec) -> None:
        """This runtime's context over the loaded model, as ``spec``'s options say."""
        llama = self._llama
        self._parallel = parallel = max(1, int_option(spec, "parallel", 1))
        self._n_batch = max(parallel, int_option(spec, "n_batch", 512))
        threads = max(1, int_option(spec, "n_threads", 2))
        dims = self._dims
        n_ctx = int_option(spec, "n_ctx", 0) or min(dims.context_length, DEFAULT_MAX_CONTEXT)

        cparams = llama.llama_context_default_params()
        cparams.n_ctx = n_ctx * parallel
        cparams.n_batch = self._n_batch
        cparams.n_ubatch = self._n_batch
        cparams.n_seq_max = parallel
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        # Each sequence its own n_ctx; a prefix is reused within a slot (prompt_prefix.py).
        cparams.kv_unified = False
        cparams.no_perf = True
        # On the CPU, flash attention made a short prompt over a 1,000-token cached prefix
        # 2.8x slower and a full prompt 15% slower (bench_llm_prefix.py); GPUs keep auto.
        cparams.flash_attn_type = -1 if self._gpu else 0  # auto : disabled
        self._ctx = llama.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise ValueError(
                f"llama.cpp could not create a context of {n_ctx} tokens x {parallel} sequences"
            )
        self._n_ctx = llama.llama_n_ctx(self._ctx) // parallel
        self._kv_bytes = self._n_ctx * parallel * dims.kv_bytes_per_token(KV_ELEMENT_BYTES)
        self._batch = llama.llama_batch_init(self._n_batch, 0, 1)
        self._prefixes = SlotPrefixes(parallel, enabled=bool_option(spec, "prefix_reuse", True))

    def chat_template(self) -> Any:
        """The model's chat template, compiled on first use; None if it has none."""
        if self._template is None and self._template_source is not None:
            self._template = compile_chat_template(self._template_source)
        return self._template

    def warm_up(self) -> None:
        """Evaluate one token, then empty the cache: the compute buffers are allocated
        and the weights' pages mapped, so a footprint measured next includes them.

        Not part of :meth:`load`: a request waiting for the load evaluates its prompt
        first, which does the same (a decode costs 6-7 ms on a 60 MB model, and the
        prompt after it only 0-2 ms less).
        """
        llama = self._llama
        token = llama.llama_vocab_bos(self._vocab)
        self._set_batch([(token, 0, 0, True)])
        if llama.llama_decode(self._ctx, self._batch) != 0:
            raise ValueError("llama.cpp failed its warm-up decode")
        llama.llama_memory_clear(llama.llama_get_memory(self._ctx), True)

    # ------------------------------------------------------------------ jobs

    def stats(self) -> GenerationStats:
        """Counters: tokens generated, prompt tokens (and those reused from the KV
        cache), active jobs, KV-cache bytes."""
        return GenerationStats(
            generated_tokens=self._generated,
            prompt_tokens=self._prompt_tokens,
            active=len(self._active),
            kv_cache_bytes=self._kv_bytes,
            context_length=self._n_ctx,
            parallel=self._parallel,
            reused_prompt_tokens=self._reused_tokens,
        )

    def close(self) -> None:
        """Stop the thread, then free the context and the model (an adapter's runtime:
        its adapter, not the model it shares)."""
        self._stop_thread()
        llama = self._llama
        if llama is None:
            return
        spare, self._spare, self._spare_spec = self._spare, None, None
        if spare is not None:
            spare.close()
        for s in self._active.values():
            s.sampler.free()
        self._active.clear()
        if self._batch is not None:
            llama.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama.llama_free(self._ctx)
            self._ctx = None
        if self._adapter:  # an adapter's runtime: its adapter, not the shared model
            llama.llama_adapter_lora_free(self._adapter)
            self._adapter = None
        if self._model and self._owns_model:
            llama.llama_model_free(self._model)
        self._model = None

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self._closed:
            block = not self._active and not self._waiting
            try:
                item = self._inbox.get(block=block)
                while True:
                    if item is not None:
                        self._waiting.append(item)
                    item = self._inbox.get_nowait()
            except queue.Empty:
                pass
            if self._closed:
                return
            self._drop_cancelled()
            self._admit()
            if self._active:
                try:
                    self._step()
                except Exception as exc:  # a decode failure fails the running jobs
                    for s in list(self._active.values()):
                        self._end(s, clear=True)
                        self._fail(s.job.seq, InternalError(f"generation failed: {exc}"))

    def _drop_cancelled(self) -> None:
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
        if not cancelled:
            return
        self._waiting = [j for j in self._waiting if j.seq not in cancelled]
        for s in list(self._active.values()):
            if s.job.seq in cancelled:
                self._end(s)

    def _admit(self) -> None:
        free = [i for i in range(self._parallel) if i not in self._active]
        for job in [j for j in self._waiting if j.task != "generate"]:
            self._waiting.remove(job)  # answered at once: they need no sequence slot
            self._answer_task(job)
        while free and self._waiting:
            job = self._waiting.pop(0)
            try:
                # A chat template writes its own BOS, as in llama-cpp-python's chat
                # completion; a plain prompt gets the model's BOS added.
                prompt = self._tokenize(self._render(job), add_bos=job.messages is None)
                check_context(len(prompt), job.max_tokens, self._n_ctx)
                sampler = Sampling(self._llama, self._vocab, self._n_ctx, job)
            except ServerError as exc:
                self._fail(job.seq, exc)
                continue
            except Exception as exc:  # the thread keeps serving the other jobs
                self._fail(job.seq, InternalError(f"generation failed: {exc}"))
                continue
            # A preempted job resumes: its earlier tokens are evaluated as prompt and
            # counted as generated (recompute, as vLLM resumes a preempted sequence).
            tokens = prompt + list(job.resume_ids)
            slot, reused = self._prefixes.choose(free, tokens)
            free.remove(slot)
            # The slot keeps the tokens' first ``reused``; the rest of its cache goes.
            llama = self._llama
            llama.llama_memory_seq_rm(llama.llama_get_memory(self._ctx), slot, reused, -1)
            self._prompt_tokens += len(prompt)
            self._reused_tokens += reused
            self._active[slot] = _Sequence(
                job,
                slot,
                tokens,
                sampler,
                TextStream(job.stop),
                fed=reused,
                position=reused,
                generated=len(job.resume_ids),
                prompt_tokens=len(prompt),
            )

    def _answer_task(self, job: GenerationJob) -> None:
        """``tokenize`` or ``detokenize``: one chunk (a tokenize's pieces as logprobs 0)."""
        llama, vocab = self._llama, self._vocab
        try:
            if job.task == "tokenize":
                ids = tokenize_answer(llama, vocab, job)
                pieces = tuple(TokenLogprob(t, self._piece_bytes(t, True), 0.0) for t in ids)
                if self._sink is not None:
                    self._sink.chunk(job.seq, "", ids, FINISH_STOP, len(ids), 0, pieces)
            elif job.task == "detokenize":
                text = detokenize_answer(llama, vocab, job.token_ids)
                if self._sink is not None:
                    self._sink.chunk(job.seq, text, list(job.token_ids), FINISH_STOP, 0, 0)
            else:
                raise InvalidInputError(f"unknown task {job.task!r}")
        except ServerError as exc:
            self._fail(job.seq, exc)
        except Exception as exc:  # the thread keeps serving
            self._fail(job.seq, InternalError(f"{job.task} failed: {exc}"))

    def _step(self) -> None:
        llama = self._llama
        entries: list[tuple[int, int, int, bool]] = []
        room = self._n_batch
        for s in self._active.values():
            s.logits_index = -1
            if s.fed < len(s.prompt):
                take = min(room, len(s.prompt) - s.fed)
                if take <= 0:
                    continue
                for i in range(s.fed, s.fed + take):
                    last = i == len(s.prompt) - 1
                    if last:
                        s.logits_index = len(entries)
                    entries.append((s.prompt[i], i, s.slot, last))
                s.fed += take
                s.position = s.fed
                room -= take
            elif room > 0:
                s.logits_index = len(entries)
                entries.append((s.last, s.position, s.slot, True))
                s.evaluated.append(s.last)
                s.position += 1
                room -= 1
        if not entries:
            return
        self._set_batch(entries)
        rc = llama.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        for s in list(self._active.values()):
            if s.logits_index >= 0:
                try:
                    token = s.sampler.sample(self._ctx, s.logits_index)
                    lp = s.sampler.token_logprob(
                        self._ctx, s.logits_index, token, self._piece_bytes
                    )
                except ServerError as exc:  # a grammar no token can continue
                    self._end(s)
                    self._fail(s.job.seq, exc)
                    continue
                if lp is not None:
                    s.logprobs.append(lp)
                self._generated += 1
                self._accept(s, token)

    def _accept(self, s: _Sequence, token: int) -> None:
        llama = self._llama
        s.generated += 1
        s.last = token
        if llama.llama_vocab_is_eog(self._vocab, token):
            piece = s.stream.finish()
            self._report(s, piece.text, [*piece.token_ids, token], FINISH_STOP)
            self._end(s)
            return
        piece = s.stream.push(token, self._piece_bytes(token))
        if piece.stopped:
            self._report(s, piece.text, piece.token_ids, FINISH_STOP)
            self._end(s)
            return
        full = s.position + 1 >= self._n_ctx
        if (s.job.max_tokens is not None and s.generated >= s.job.max_tokens) or full:
            rest = s.stream.finish()
            self._report(s, piece.text + rest.text, piece.token_ids + rest.token_ids, FINISH_LENGTH)
            self._end(s)
            return
        if piece.text:
            self._report(s, piece.text, piece.token_ids, None)

    def _report(self, s: _Sequence, text: str, ids: list[int], finish: str | None) -> None:
        # The log probabilities of the tokens this piece holds, in order (a piece holds
        # the tokens the stop-string check kept back too).
        lps = tuple(s.logprobs[: len(ids)]) if s.logprobs else ()
        del s.logprobs[: len(lps)]
        if self._sink is not None:
            self._sink.chunk(s.job.seq, text, ids, finish, s.prompt_tokens, s.generated, lps)

    def _end(self, s: _Sequence, *, clear: bool = False) -> None:
        """Free the job's sampler and its slot; the slot's cache keeps what the job
        evaluated, for a later prompt that starts the same (``clear``: after a failed
        decode, whose cache content is unknown)."""
        llama = self._llama
        if clear:
            llama.llama_memory_seq_rm(llama.llama_get_memory(self._ctx), s.slot, -1, -1)
            self._prefixes.forget(s.slot)
        else:
            self._prefixes.keep(s.slot, s.prompt[: s.fed] + s.evaluated)
        s.sampler.free()
        self._active.pop(s.slot, None)

    # ------------------------------------------------------------------ helpers

    def _set_batch(self, entries: list[tuple[int, int, int, bool]]) -> None:
        b = self._batch
        b.n_tokens = len(entries)
        for i, (token, pos, seq_id, logits) in enumerate(entries):
            b.token[i] = token
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = 1 if logits else 0

    def _render(self, job: GenerationJob) -> str:
        if job.messages is None:
            return job.prompt or ""
        if self._template_source is None:
            raise InvalidInputError("this model has no chat template; send a prompt instead")
        messages, tools = chat_messages(job, self._template_source)
        try:
            text = self.chat_template().render(
                messages=messages,
                tools=tools,
                add_generation_prompt=True,
                bos_token=self._bos_text,
                eos_token=self._eos_text,
            )
        except ServerError:
            raise
        except Exception as exc:
            raise InvalidInputError(f"the model's chat template failed: {exc}") from None
        assert isinstance(text, str)
        return text

    def _tokenize(self, text: str, *, add_bos: bool) -> list[int]:
        # As llama-cpp-python's own completion does: BOS if the model asks for it, and
        # special tokens in the text (a rendered chat template) parsed as such.
        llama = self._llama
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama.llama_token * n_max)()
        n = llama.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_bos, True)
        if n < 0:
            raise InvalidInputError(f"the prompt needs {-n} tokens; it could not be tokenized")
        if n == 0:
            raise InvalidInputError("the prompt is empty")
        return list(buf[:n])

    def _piece_bytes(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._llama.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._llama.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def _piece(self, token: int, *, special: bool) -> str:
        if token < 0:
            return ""
        buf = ctypes.create_string_buffer(64)
        n = self._llama.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        return buf.raw[: max(0, n)].decode("utf-8", errors="replace")
