"""The protocol-neutral data plane: REST and gRPC both call these methods.

It validates a decoded request against the model's metadata, has the model service's
router take it to a ready version (hot-loading it if needed, within the request's
deadline) and that replica's scheduler, and wraps the outputs. It reaches the model table
only through :class:`~modelyard.service.model_service.ModelService` and never touches a
worker.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import numpy as np

from modelyard import __version__
from modelyard.clock import Clock
from modelyard.config.limits import LimitsConfig
from modelyard.errors import (
    DeadlineExceededError,
    ModelNotReadyError,
    PayloadTooLargeError,
    ServerError,
    WorkerGoneError,
    WorkerLostError,
)
from modelyard.frontends.classification import LabelCache
from modelyard.frontends.generation import Generation
from modelyard.frontends.model_views import listed_versions, model_statistics, repository_rows
from modelyard.frontends.tensor_checks import request_rows, select_outputs, validate_inputs
from modelyard.frontends.triton_config import triton_config
from modelyard.observability.log_settings import LogSettings
from modelyard.observability.metrics import OK, Metrics, outcome_code
from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from modelyard.protocol.limits import count_elements
from modelyard.protocol.load_parameters import load_config
from modelyard.protocol.names import check_model_name, check_version_name
from modelyard.protocol.predict import predict_answer, predict_call, predict_inputs
from modelyard.protocol.types import (
    InferInput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ServerMetadata,
    TensorMetadata,
    earliest,
    header_timeout_s,
)
from modelyard.runtimes.base import TensorSpec
from modelyard.service.model_service import (
    FallbackReason,
    ModelService,
    allows_fallback,
    check_client_timeout,
    fallback_reason,
    tensor_mismatch,
)
from modelyard.service.views import GenerationCounters, InstanceInfo, ServedVersion

log = logging.getLogger("modelyard.dataplane")

SERVER_NAME = "modelyard"
SERVED_BY = "served_by"
"""Response parameter naming the model that answered, set when a fallback did."""
FALLBACK_REASON = "fallback_reason"
"""Response parameter: why the requested model did not answer (see manager/fallback.py)."""
EXTENSIONS = (
    "classification",
    "logging",
    "model_repository",
    "model_configuration",
    "binary_tensor_data",
    "schedule_policy",
    "statistics",
)

_PLATFORMS = {
    "onnx": "onnxruntime_onnx",
    "sklearn": "sklearn",
    "python": "python",
    "torch": "pytorch_torchscript",
    "llama_cpp": "llama_cpp_gguf",
    "transformers": "transformers_causal_lm",
}


def _tensors(specs: list[TensorSpec]) -> tuple[TensorMetadata, ...]:
    return tuple(TensorMetadata(s.name, s.datatype, s.shape, s.optional) for s in specs)


def _raw_size(array: np.ndarray) -> int:
    if array.dtype == object:
        return sum(len(v) if isinstance(v, bytes | str) else 8 for v in array.reshape(-1))
    return int(array.nbytes)


class DataPlane:
    """Health, metadata, inference and repository verbs, whatever the transport."""

    def __init__(
        self,
        service: ModelService,
        metrics: Metrics | None = None,
        limits: LimitsConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.service = service
        """The model table: resolve, run, load; views (never the manager's parts)."""
        self.metrics = metrics
        """Counts request outcomes, latencies and cold-start waits (None: not counted)."""
        self.clock: Clock = clock or service.clock
        """Where request start times and deadlines are read (the manager's clock)."""
        service.on_load_wait(self._load_waited)
        self._models = service.models()
        self._resolve = service.resolve
        self._submit = service.submit
        limits = limits or LimitsConfig()
        self.max_request_elements = limits.max_request_elements
        """Tensor elements one request may carry; the decoders check it before allocating."""
        self.max_response_bytes = limits.max_response_bytes
        """Largest encoded response; the front ends check it after encoding."""
        self.is_serving = False
        """Set by the app once start-up finished; cleared when shutdown starts."""
        self.generation = Generation(
            service.generation, metrics, self.clock, self.check_response_bytes
        )
        """Text generation for generative models (``llama_cpp``, ``transformers``)."""
        self.generation.is_serving = self.ready
        self.labels = LabelCache()
        self.log_settings = LogSettings()
        """Triton's logging extension over the process's root logger (management)."""
        """Class labels by version folder, read once (classification extension)."""

    def _load_waited(self, record: ServedVersion, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.cold_start_wait(record.key.name, record.key.version, seconds)

    # ------------------------------------------------------------------ health

    def live(self) -> bool:
        """The process is up and its event loop answers."""
        return True

    def ready(self) -> bool:
        """The server accepts inference requests (started, not shutting down)."""
        return self.is_serving

    def model_ready(self, name: str, version: str | None) -> bool:
        """True when that version can serve now (its worker alive)."""
        return self._resolve(check_model_name(name), check_version_name(version)).is_ready

    # ------------------------------------------------------------------ metadata

    def server_metadata(self) -> ServerMetadata:
        """The server's name, version and protocol extensions."""
        return ServerMetadata(SERVER_NAME, __version__, EXTENSIONS)

    def model_metadata(self, name: str, version: str | None) -> ModelMetadata:
        """The protocol's model metadata; tensors are known once the model has loaded."""
        record = self._resolve(check_model_name(name), check_version_name(version))
        entry = self.service.model(name)
        info = record.info
        return ModelMetadata(
            name=name,
            versions=listed_versions(entry),
            platform=_PLATFORMS.get(record.config.runtime, record.config.runtime),
            inputs=() if info is None else _tensors(info.inputs),
            outputs=() if info is None else _tensors(info.outputs),
            generative=record.config.is_generative,
            context_length=self.service.context_length(record),
        )

    def generative_models(self) -> list[ModelMetadata]:
        """Metadata of every configured generative model (its default version), loaded
        or not: what an API that lists models (``/v1/models``) shows."""
        result = []
        for name, entry in sorted(self._models.items()):
            if not entry.config.is_generative or not entry.versions:
                continue
            try:
                result.append(self.model_metadata(name, None))
            except ServerError:  # no servable default version right now
                continue
        return result

    async def model_metadata_loaded(
        self, name: str, version: str | None, timeout_s: float | None = None
    ) -> ModelMetadata:
        """Metadata, loading the model first if its tensors are not known yet.

        The wait for the load is bounded by the client's own ``timeout_s`` if it gave one,
        else by the model's ``load_timeout_s`` (a load is not held to ``timeout_s``).
        """
        record = self._resolve(check_model_name(name), check_version_name(version))
        if record.info is None:
            deadline = None if timeout_s is None else self.clock.monotonic() + timeout_s
            await self.service.ensure_ready(record, deadline=deadline)
        return self.model_metadata(name, version)

    async def model_config(
        self, name: str, version: str | None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """The version's configuration in Triton's ``ModelConfig`` shape (its YAML and
        tensors; see :mod:`modelyard.frontends.triton_config`), loading it to learn its
        tensors as :meth:`model_metadata_loaded` does."""
        meta = await self.model_metadata_loaded(name, version, timeout_s)
        record = self._resolve(name, check_version_name(version))
        return triton_config(record.config, meta, record.info, bool(self.labels.get(record.path)))

    def statistics(self, name: str | None, version: str | None) -> dict[str, object]:
        """Triton's statistics extension (see :func:`~.model_views.model_statistics`)."""
        return model_statistics(self.service, name, version)

    # ------------------------------------------------------------------ inference

    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, route (hot-loading if needed), schedule, run, and wrap one request.

        Its inputs were counted against ``limits.max_request_elements`` by whoever built
        them: the decoders count the declared shapes before allocating, and a caller that
        builds arrays itself calls :meth:`check_elements`."""
        if not self.is_serving:
            raise ModelNotReadyError("server is not ready (starting or shutting down)")
        started = self.clock.monotonic()
        metrics = self.metrics
        try:
            if request.model_name not in self._models:  # known names were checked
                check_model_name(request.model_name)
            if request.model_version:
                check_version_name(request.model_version)
            record = self._resolve(request.model_name, request.model_version)
        except ServerError as exc:
            if metrics is not None:  # no model label: the name is the client's, unbounded
                metrics.request_done("", "", exc.code, self.clock.monotonic() - started)
            raise
        # Without a fallback chain or parameters, _infer would only await _infer_on.
        infer = self._infer if record.config.fallback or request.parameters else self._infer_on
        if metrics is None:
            return await infer(record, request, started)
        code: str = OK
        try:
            return await infer(record, request, started)
        except BaseException as exc:
            code = outcome_code(exc)
            raise
        finally:
            metrics.request_done(
                record.key.name, record.key.version, code, self.clock.monotonic() - started
            )

    async def predict(
        self, doc: Mapping[str, Any], timeout_ms: str | None = None
    ) -> dict[str, object]:
        """Answer a ``/predict`` document (see :mod:`modelyard.protocol.predict`).

        ``timeout_ms`` is the client's ``X-Modelyard-Timeout-Ms`` value, if any; with the
        document's ``timeout`` it bounds the whole call, the load and decoding included.
        """
        started = self.clock.monotonic()
        call = predict_call(doc)
        timeout_s = call.timeout_s
        if timeout_ms is not None:
            timeout_s = earliest(timeout_s, header_timeout_s(timeout_ms))
        if self.generation.is_generative(call.model):
            return await self.generation.predict_text(
                doc, call.model, call.version, call.priority, timeout_s
            )
        meta = await self.model_metadata_loaded(call.model, call.version, timeout_s)
        inputs = predict_inputs(doc, call.model, meta.inputs)
        self.check_elements(inputs)
        if timeout_s is not None:
            timeout_s -= self.clock.monotonic() - started
            if timeout_s <= 0:
                raise DeadlineExceededError(
                    f"the request's deadline passed before {call.model!r} ran"
                )
        request = InferRequest(
            model_name=call.model,
            model_version=call.version,
            inputs=inputs,
            priority=call.priority,
            timeout_s=timeout_s,
        )
        return predict_answer(await self.infer(request))

    async def _infer(
        self, record: ServedVersion, request: InferRequest, started: float
    ) -> InferResponse:
        may_fall_back = allows_fallback(request.parameters) and bool(record.config.fallback)
        try:
            return await self._infer_on(record, request, started)
        except ServerError as exc:
            reason = fallback_reason(exc) if may_fall_back else None
            if reason is None:
                raise
            return await self._fall_back(record, request, started, exc, reason)

    async def _fall_back(
        self,
        record: ServedVersion,
        request: InferRequest,
        started: float,
        error: ServerError,
        reason: FallbackReason,
    ) -> InferResponse:
        """Answer from the first model of ``record``'s fallback chain that can, within the
        request's own deadline (measured from ``started``); else raise ``error``."""
        for name in record.config.fallback:
            try:
                other = self._resolve(name, None)
                if record.info is not None and other.info is not None:
                    mismatch = tensor_mismatch(record.info, other.info)
                    if mismatch is not None:
                        log.error("model %s: fallback %s skipped: %s", record.key, name, mismatch)
                        continue
                response = await self._infer_on(other, request, started)
            except ServerError as exc:
                if fallback_reason(exc) is None:
                    raise
                continue  # this one cannot either: try the next
            response.parameters[SERVED_BY] = other.key.name
            response.parameters[FALLBACK_REASON] = reason
            if self.metrics is not None:
                self.metrics.fallback(record.key.name, other.key.name, reason)
            return response
        raise error

    async def _infer_on(
        self, record: ServedVersion, request: InferRequest, started: float
    ) -> InferResponse:
        """Run ``request`` on ``record`` through the service (route, lease, schedule) and
        wrap the outputs, counted in the version's statistics (success or failure)."""
        client_timeout_s = request.timeout_s
        if client_timeout_s is not None:
            check_client_timeout(client_timeout_s)
        prepare = functools.partial(validate_inputs, record.key.name, request)
        submit = self._submit
        try:
            try:
                info, outputs = await submit(
                    record, prepare, request.priority, started, client_timeout_s
                )
            except (WorkerLostError, WorkerGoneError):
                # Its worker was lost under it (Ray: its node or actor died), or had died
                # before its batch ran, so it got no answer: it is routed once more, and
                # the router waits for the restart within the request's deadline (not the
                # scheduler, whose estimates would then count the restart as a call's
                # time).
                info, outputs = await submit(
                    record, prepare, request.priority, started, client_timeout_s
                )
            batched = info.supports_batching
            response = self._response(record, request, info, outputs, batched)
        except ServerError:
            record.infer_stats.failed(self.clock.monotonic() - started)
            raise
        elapsed_s = self.clock.monotonic() - started
        record.infer_stats.succeeded(request_rows(request, batched), elapsed_s)
        return response

    def _response(
        self,
        record: ServedVersion,
        request: InferRequest,
        info: InstanceInfo,
        outputs: dict[str, np.ndarray],
        batched: bool,
    ) -> InferResponse:
        """The outputs the request asked for, refused when over the response limit."""
        response = InferResponse(
            model_name=record.key.name,
            model_version=record.key.version,
            outputs=select_outputs(
                request,
                outputs,
                info.outputs,
                batched=batched,
                # Labels are read only for a classification, which names its outputs.
                labels=functools.partial(self.labels.get, record.path)
                if request.outputs
                else tuple,
            ),
            id=request.id,
        )
        # The raw bytes are a lower bound of any encoding: refuse before encoding them.
        size = 0
        for output in response.outputs:  # a loop, no generator: this runs per request
            array = output.array
            size += _raw_size(array) if array.dtype == object else array.nbytes
        if size > self.max_response_bytes:
            self.check_response_bytes(size)
        return response

    def check_elements(self, inputs: list[InferInput]) -> None:
        """PayloadTooLargeError when ``inputs`` (arrays a caller built itself, as
        ``/predict`` does) hold more than ``limits.max_request_elements`` elements."""
        total = 0
        for tensor in inputs:
            total = count_elements(
                tensor.name, tensor.array.shape, total, self.max_request_elements
            )

    def check_response_bytes(self, size: int) -> None:
        """PayloadTooLargeError when a response of ``size`` bytes is over the limit."""
        if size > self.max_response_bytes:
            raise PayloadTooLargeError(
                f"the response would be {size} bytes; the server sends at most "
                f"{self.max_response_bytes} (limits.max_response_bytes): ask for fewer "
                "outputs or a smaller batch"
            )

    # ------------------------------------------------------------------ generation

    def is_generative(self, name: str) -> bool:
        """Whether ``name`` is a configured generative model (answers text, not tensors)."""
        return self.generation.is_generative(name)

    def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        """Generate text for ``request``, one :class:`GenerateChunk` per piece produced.

        An async generator; the last chunk carries ``finish_reason`` and the token counts.
        Typed errors before the first chunk: ModelNotFoundError (unknown model, 404),
        InvalidInputError (not a generative model; a prompt or ``max_tokens`` beyond the
        context, with the arithmetic: 400), OverloadedError (queue full, 429),
        DeadlineExceededError (no first token by the deadline, 504), MemoryBudgetError
        (the model cannot fit, 503). An error after the first chunk is raised from the
        iterator (WorkerCrashedError when the worker died). Closing the iterator early
        (``aclose``: the client went away) stops generation in the worker.
        See :meth:`modelyard.frontends.generation.Generation.generate`.
        """
        return self.generation.generate(request)

    async def generation_task(self, request: GenerateRequest) -> GenerateChunk:
        """``tokenize``/``detokenize`` on a generative model's own tokenizer: one chunk.
        See :meth:`modelyard.frontends.generation.Generation.run_task`."""
        return await self.generation.run_task(request)

    async def generate_text(self, request: GenerateRequest) -> dict[str, object]:
        """The whole generation as one answer (see
        :meth:`modelyard.frontends.generation.Generation.generate_text`)."""
        return await self.generation.generate_text(request)

    async def generation_counters(
        self, name: str, version: str | None = None
    ) -> GenerationCounters:
        """The worker's own counters of a loaded generative model (tokens generated,
        active sequences, KV-cache bytes); ModelNotReadyError when it is not loaded."""
        return await self.service.generation.counters(
            check_model_name(name), check_version_name(version)
        )

    # ------------------------------------------------------------------ repository

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """``[{"name", "version", "state", "reason"}]`` for every known version."""
        return repository_rows(self.service, ready_only)

    async def load(self, name: str, config: object = None) -> None:
        """Load the model's default version (repository extension); ModelNotReadyError
        when it did not become ready.

        ``config`` (the load request's ``config`` parameter: a JSON string, as Triton's
        clients send it, or an object, with the fields of a ``models:`` entry) adds a model
        folder the configuration does not list, or reconfigures an unloaded one.
        """
        name = check_model_name(name)
        await self.service.load(name, config=load_config(config))
        # Both front ends answer a load only once the model serves: a load that returned
        # without a ready default version is the client's 503, not a silent success.
        if not self.model_ready(name, None):
            raise ModelNotReadyError(f"model {name!r} did not become ready")

    async def unload(self, name: str) -> None:
        """Unload every loaded version of the model (repository extension)."""
        await self.service.unload(check_model_name(name))
