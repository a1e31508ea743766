"""The authoriser, the plane of every REST route and gRPC method, and SecurityConfig."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.routing import Route

from modelyard.config.security import SecurityConfig, SecurityError, check_exposure, is_loopback
from modelyard.config.settings import ConfigError, load_settings
from modelyard.errors import PermissionDeniedError, UnauthenticatedError
from modelyard.frontends.auth import Authorizer, Plane
from modelyard.frontends.grpc.auth import GRPC_PLANES, grpc_plane
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.http.auth import rest_plane

MANAGEMENT = b"management-secret"
DATA = b"data-secret"
BOTH = Authorizer(management=MANAGEMENT, data=DATA, protect_metrics=True)


def _bearer(token: bytes) -> bytes:
    return b"Bearer " + token


@pytest.mark.parametrize("plane", list(Plane), ids=[p.value for p in Plane])
def test_nothing_configured_opens_every_plane(plane: Plane) -> None:
    open_ = Authorizer(management=None, data=None)
    assert not open_.is_enabled
    open_.check(plane, None)


GRANTS = [
    # plane, credential, expected (None: allowed)
    (Plane.OPEN, None, None),
    (Plane.DATA, None, UnauthenticatedError),
    (Plane.DATA, _bearer(b"nope"), PermissionDeniedError),
    (Plane.DATA, _bearer(DATA), None),
    (Plane.DATA, _bearer(MANAGEMENT), None),
    (Plane.MANAGEMENT, None, UnauthenticatedError),
    (Plane.MANAGEMENT, _bearer(DATA), PermissionDeniedError),
    (Plane.MANAGEMENT, _bearer(MANAGEMENT), None),
    (Plane.MANAGEMENT, _bearer(MANAGEMENT + b"x"), PermissionDeniedError),
    (Plane.MANAGEMENT, _bearer(MANAGEMENT[:-1]), PermissionDeniedError),
    (Plane.MANAGEMENT, b"bEaReR " + MANAGEMENT, None),
    (Plane.MANAGEMENT, b"Basic " + MANAGEMENT, UnauthenticatedError),
    (Plane.MANAGEMENT, MANAGEMENT, UnauthenticatedError),
    (Plane.MANAGEMENT, b"Bearer", UnauthenticatedError),
    (Plane.METRICS, None, UnauthenticatedError),
    (Plane.METRICS, _bearer(DATA), PermissionDeniedError),
    (Plane.METRICS, _bearer(MANAGEMENT), None),
]


@pytest.mark.parametrize(("plane", "credential", "expected"), GRANTS)
def test_check_by_plane_and_credential(
    plane: Plane, credential: bytes | None, expected: type[Exception] | None
) -> None:
    if expected is None:
        BOTH.check(plane, credential)
        BOTH.check(plane, None if credential is None else credential.decode())
    else:
        with pytest.raises(expected) as caught:
            BOTH.check(plane, credential)
        # The refusal never quotes a token, sent or configured.
        assert MANAGEMENT.decode() not in str(caught.value)
        assert DATA.decode() not in str(caught.value)


def test_data_plane_open_without_data_token() -> None:
    auth = Authorizer(management=MANAGEMENT, data=None)
    auth.check(Plane.DATA, None)
    auth.check(Plane.METRICS, None)
    with pytest.raises(UnauthenticatedError):
        auth.check(Plane.MANAGEMENT, None)


def test_non_ascii_credential_is_refused_not_crashed() -> None:
    with pytest.raises(PermissionDeniedError):
        BOTH.check(Plane.MANAGEMENT, "Bearer caf\u00e9\u2603")


def test_repr_hides_tokens() -> None:
    assert MANAGEMENT.decode() not in repr(BOTH)
    assert DATA.decode() not in repr(BOTH)


REST_PLANES = [
    ("GET", "/v2/health/live", Plane.OPEN),
    ("GET", "/v2/health/ready", Plane.OPEN),
    ("GET", "/v2", Plane.OPEN),
    ("GET", "/dashboard", Plane.OPEN),
    ("GET", "/dashboard/dashboard.js", Plane.OPEN),
    ("POST", "/v2/health/live", Plane.MANAGEMENT),
    ("GET", "/metrics", Plane.METRICS),
    ("POST", "/v2/models/m/infer", Plane.DATA),
    ("POST", "/v2/models/m/versions/3/infer", Plane.DATA),
    ("GET", "/v2/models/m", Plane.DATA),
    ("GET", "/v2/models/m/ready", Plane.DATA),
    ("GET", "/v2/models/m/versions/3/ready", Plane.DATA),
    ("POST", "/predict", Plane.DATA),
    ("GET", "/v1/models", Plane.DATA),
    ("GET", "/v1/models/m", Plane.DATA),
    ("POST", "/v1/completions", Plane.DATA),
    ("POST", "/v1/chat/completions", Plane.DATA),
    ("POST", "/v1/embeddings", Plane.DATA),
    ("POST", "/tokenize", Plane.DATA),
    ("POST", "/detokenize", Plane.DATA),
    ("GET", "/v2/health/details", Plane.MANAGEMENT),
    ("GET", "/v2/stats", Plane.MANAGEMENT),
    ("GET", "/v2/stats/timeseries", Plane.MANAGEMENT),
    ("POST", "/v2/repository/index", Plane.MANAGEMENT),
    ("POST", "/v2/repository/models/m/load", Plane.MANAGEMENT),
    ("POST", "/v2/repository/models/m/unload", Plane.MANAGEMENT),
    ("POST", "/v2/repository/models/m/pin", Plane.MANAGEMENT),
    ("PUT", "/v2/repository/models/m/aliases/a", Plane.MANAGEMENT),
    ("POST", "/v2/repository/models/m/rollback", Plane.MANAGEMENT),
    # Anything else, and look-alikes of open or data paths, fall to management.
    ("GET", "/v2/health/live/", Plane.MANAGEMENT),
    ("GET", "/v2/health", Plane.MANAGEMENT),
    ("GET", "/v2/models/m/extra/infer", Plane.MANAGEMENT),
    ("GET", "/v2/models/m/../../repository/index", Plane.MANAGEMENT),
    ("GET", "/anything", Plane.MANAGEMENT),
    ("GET", "/v1/models/m/extra", Plane.MANAGEMENT),
    ("POST", "/v1/chat/completions/", Plane.MANAGEMENT),
]


@pytest.mark.parametrize(("method", "path", "plane"), REST_PLANES)
def test_rest_plane(method: str, path: str, plane: Plane) -> None:
    assert rest_plane(method, path) is plane


def test_every_rest_route_is_classified_as_intended(tmp_path: Path) -> None:
    """Every route the server has lands on the plane the docs give it."""
    from modelyard.app import App

    app = App(load_settings(None, model_repository=str(tmp_path)))
    from modelyard.frontends.http.app import RestApi
    from modelyard.frontends.http.openai import OpenAIApi

    routes = [
        *RestApi(app.dataplane, 1).routes(),
        *OpenAIApi(app.dataplane, 1).routes(),
        *app.extra_routes(),
    ]
    seen = set()
    for route in routes:
        assert isinstance(route, Route)
        path = route.path.replace("{model}", "m").replace("{version}", "1")
        path = path.replace("{alias}", "a").replace("{name}", "x.js")
        for method in sorted(route.methods or ()):
            plane = rest_plane(method, path)
            seen.add(plane)
            if path.startswith(("/v2/repository", "/v2/stats", "/v2/logging")) or path == (
                "/v2/health/details"
            ):
                assert plane is Plane.MANAGEMENT, (method, path)
            elif path.startswith(("/v2/models/", "/v1/")) or path in (
                "/predict",
                "/tokenize",
                "/detokenize",
            ):
                assert plane is Plane.DATA, (method, path)
            elif path == "/metrics":
                assert plane is Plane.METRICS
            else:
                assert plane is Plane.OPEN, (method, path)
    assert seen == set(Plane)


def test_every_grpc_method_has_a_plane() -> None:
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    names = {method.name for method in service.methods}
    assert names == set(GRPC_PLANES)
    assert grpc_plane("/inference.GRPCInferenceService/ModelInfer") is Plane.DATA
    assert grpc_plane("/inference.GRPCInferenceService/ServerLive") is Plane.OPEN
    assert grpc_plane("/inference.GRPCInferenceService/RepositoryModelLoad") is Plane.MANAGEMENT
    assert grpc_plane("/inference.GRPCInferenceService/NewThing") is Plane.MANAGEMENT
    assert grpc_plane("/grpc.reflection.v1.ServerReflection/Info") is Plane.MANAGEMENT


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("example.internal", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_check_exposure() -> None:
    check_exposure("127.0.0.1", SecurityConfig())
    with pytest.raises(SecurityError, match=r"security\.management_token"):
        check_exposure("0.0.0.0", SecurityConfig())
    check_exposure("0.0.0.0", SecurityConfig(allow_unauthenticated_remote=True))
    check_exposure("0.0.0.0", SecurityConfig(management_token="t"))


@pytest.mark.parametrize(
    ("security", "fragment"),
    [
        ({"management_token": "a", "management_token_file": "f"}, "not both"),
        ({"data_token": "a", "data_token_file": "f"}, "not both"),
        ({"protect_metrics": True}, "protect_metrics needs"),
        ({"tls_certfile": "c.pem"}, "go together"),
        ({"tls_client_ca_file": "ca.pem"}, "mutual TLS"),
        ({"tokens": "a"}, "security.tokens"),
    ],
)
def test_security_mistakes_are_config_errors(security: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_settings(None, security=security)


def test_token_never_in_validation_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, security={"management_token": "hunter2-secret", "protect": 1})
    assert "hunter2-secret" not in str(caught.value)


def test_token_from_env_is_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELYARD_SECURITY__MANAGEMENT_TOKEN", "from-the-env")
    monkeypatch.setenv("MODELYARD_TOKEN", "the-client-side-variable-is-ignored")
    settings = load_settings(None)
    assert settings.security.management_secret() == "from-the-env"
    assert "from-the-env" not in repr(settings)
    assert "from-the-env" not in settings.model_dump_json()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("", "is empty"), ("\n  \n", "is empty"), ("two words", "must be printable ASCII")],
)
def test_bad_token_files(tmp_path: Path, content: str, fragment: str) -> None:
    token = tmp_path / "token"
    token.write_text(content, encoding="utf-8")
    security = SecurityConfig(management_token_file=token)
    with pytest.raises(SecurityError, match=rf"security\.management_token_file {fragment}"):
        security.management_secret()


def test_relative_paths_resolve_from_the_yaml(tmp_path: Path) -> None:
    security = SecurityConfig(
        data_token_file=Path("t"), tls_certfile=Path("/abs/c.pem"), tls_keyfile=Path("k.pem")
    )
    resolved = security.relative_to(tmp_path)
    assert resolved.data_token_file == tmp_path / "t"
    assert resolved.tls_keyfile == tmp_path / "k.pem"
    assert resolved.tls_certfile == Path("/abs/c.pem")
