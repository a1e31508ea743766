"""Schemathesis cases from the served OpenAPI document, sent to a real server.

Shared by ``tests/security/test_schemathesis.py`` and ``bench/fuzz_server.py``. Cases
come from every operation in both of schemathesis' generation modes (positive: what the
document allows; negative: what it forbids), plus the model operations aimed at real
model names, so that inference and lifecycle verbs reach real models and not only 404s.
The run never stops at a failure: it counts every answer, and the caller asserts.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode, Response
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CONFORMANCE_CHECKS = (
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)
"""Checks that the answer is one the document describes (status, media type, body)."""

MODEL_PATH_PREFIXES = ("/v2/models/{model}", "/v2/repository/models/{model}")
"""Operations worth aiming at real model names as well as at random ones."""

REQUEST_TIMEOUT_S = 60.0


@dataclass
class FuzzReport:
    """What a run sent and what came back."""

    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    """One line per 5xx answer: method, path, status and the error body."""
    transport_errors: list[str] = field(default_factory=list)
    """Requests that got no HTTP answer at all (a crash or a hang looks like this)."""
    nonconforming: list[str] = field(default_factory=list)
    """Answers the document does not describe (status, media type or body)."""
    elapsed_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The figures a report or an assertion needs."""
        return {
            "cases": self.cases,
            "server_errors": len(self.server_errors),
            "transport_errors": len(self.transport_errors),
            "nonconforming": len(self.nonconforming),
            "statuses": dict(sorted(self.statuses.items())),
            "elapsed_s": round(self.elapsed_s, 1),
        }


def _describe(case: Case[Any], response: Response | None = None) -> str:
    line = f"{case.method} {case.formatted_path}"
    if response is not None:
        line += f" -> {response.status_code} {response.content[:200]!r}"
    return line


def case_strategy(
    document: dict[str, Any], model_names: Sequence[str]
) -> st.SearchStrategy[Case[Any]]:
    """Every operation, positive and negative, plus model operations on ``model_names``."""
    schema = schemathesis.openapi.from_dict(document)
    modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    strategies = [schema.as_strategy(generation_mode=mode) for mode in modes]
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            continue
        operation = result.ok()
        if not operation.path.startswith(MODEL_PATH_PREFIXES):
            continue
        for name in model_names:
            for mode in modes:
                strategies.append(
                    operation.as_strategy(generation_mode=mode, path_parameters={"model": name})
                )
    return st.one_of(strategies)


def fuzz(
    base_url: str,
    document: dict[str, Any],
    *,
    cases: int,
    seed: int,
    model_names: Sequence[str] = (),
    conformance: bool = True,
) -> FuzzReport:
    """Send ``cases`` generated requests (fixed ``seed``) to ``base_url``; count outcomes."""
    report = FuzzReport()
    session = requests.Session()
    checks = list(CONFORMANCE_CHECKS)

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @hypothesis_seed(seed)
    @given(case=case_strategy(document, model_names))
    def run(case: Case[Any]) -> None:
        report.cases += 1
        try:
            response = case.call(base_url=base_url, session=session, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as exc:
            report.transport_errors.append(f"{_describe(case)}: {type(exc).__name__}: {exc}")
            return
        report.statuses[response.status_code] += 1
        if response.status_code >= 500:
            report.server_errors.append(_describe(case, response))
        if conformance:
            try:
                case.validate_response(response, checks=checks)
            except Exception as exc:  # schemathesis raises a group of check failures
                report.nonconforming.append(f"{_describe(case, response)}: {exc}"[:2000])

    started = time.monotonic()
    try:
        run()
    finally:
        report.elapsed_s = time.monotonic() - started
        session.close()
    return report
