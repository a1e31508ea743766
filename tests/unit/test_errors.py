"""The one list of retryable errors: both front ends take their Retry-After from it."""

from __future__ import annotations

import pytest

from modelyard import errors
from modelyard.errors import ErrorCode, ServerError, error_from_code, retry_after_value

RETRY_LATER = {
    ErrorCode.OVERLOADED,
    ErrorCode.MEMORY_BUDGET,
    ErrorCode.CIRCUIT_OPEN,
    ErrorCode.MODEL_LOAD_FAILED,
}
"""The codes whose answers carried ``retry-after: 1`` before ``retryable`` was the source."""


@pytest.mark.parametrize("code", list(ErrorCode))
def test_only_the_retry_later_codes_get_a_default_retry_after(code: ErrorCode) -> None:
    exc = error_from_code(code.value, "m")
    assert exc.retryable is (code in RETRY_LATER)
    assert retry_after_value(exc) == ("1" if code in RETRY_LATER else None)


@pytest.mark.parametrize(("seconds", "header"), [(0.01, "1"), (1.0, "1"), (1.2, "2"), (30.0, "30")])
def test_an_explicit_retry_after_rounds_up_to_whole_seconds(seconds: float, header: str) -> None:
    assert retry_after_value(errors.ModelNotReadyError("m", retry_after_s=seconds)) == header
    assert retry_after_value(errors.ModelLoadError("m", retry_after_s=seconds)) == header


def test_the_rest_and_grpc_answers_agree_with_retry_after_value() -> None:
    from modelyard.frontends.grpc.servicer import _retry_metadata
    from modelyard.frontends.http.errors import error_response

    for code in ErrorCode:
        exc: ServerError = error_from_code(code.value, "m")
        expected = retry_after_value(exc)
        assert error_response(exc).headers.get("retry-after") == expected
        assert dict(_retry_metadata(exc)).get("retry-after") == expected
