"""The QL_HTTP_* settings (docs/http-limits.md) and how they reach uvicorn's workers."""

from __future__ import annotations

import argparse
import functools
import pickle

import pytest
import uvicorn

from app.api import retirement
from app.cli.serve import APP_FACTORY, uvicorn_options
from app.settings import HttpLimits, Settings


def test_http_limits_default_to_the_documented_values() -> None:
    limits = Settings.from_env({}).http
    assert limits == HttpLimits(65536, 10.0, 30.0, 1000, "httptools")


def test_http_limits_are_read_from_their_variables() -> None:
    env = {
        "QL_HTTP_MAX_HEADER_BYTES": "8192",
        "QL_HTTP_HEADER_TIMEOUT_S": "2.5",
        "QL_HTTP_BODY_TIMEOUT_S": "4",
        "QL_HTTP_MAX_CONNECTIONS": "20",
        "QL_HTTP_PARSER": "h11",
    }
    assert Settings.from_env(env).http == HttpLimits(8192, 2.5, 4.0, 20, "h11")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("QL_HTTP_MAX_HEADER_BYTES", "512"),
        ("QL_HTTP_MAX_HEADER_BYTES", "64k"),
        ("QL_HTTP_HEADER_TIMEOUT_S", "0"),
        ("QL_HTTP_BODY_TIMEOUT_S", "soon"),
        ("QL_HTTP_MAX_CONNECTIONS", "0"),
        ("QL_HTTP_PARSER", "zttp"),
    ],
)
def test_an_invalid_http_limit_is_refused_with_its_name(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        Settings.from_env({name: value})


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_the_protocol_handed_to_uvicorn_carries_the_limits_through_a_pickle(parser: str) -> None:
    # uvicorn pickles its Config, `http` included, into each worker it spawns.
    limits = HttpLimits(max_connections=7, parser=parser)
    factory = pickle.loads(pickle.dumps(retirement.http_protocol(limits)))
    assert isinstance(factory, functools.partial)
    assert factory.func is retirement.PROTOCOLS[parser]
    assert factory.keywords == {"limits": limits}


def test_qinglong_api_hands_uvicorn_its_protocol_and_no_websocket_protocol() -> None:
    # The api has no WebSocket route (docs/http-limits.md § No protocol switch): uvicorn must
    # not even import its WebSocket module. Its Config (pickled into each spawned worker)
    # says so; tests/e2e/test_http_limits.py checks the running process.
    args = argparse.Namespace(host="127.0.0.1", port=8080, workers=2)
    settings = Settings.from_env({"QL_HTTP_PARSER": "h11"})
    config = uvicorn.Config(APP_FACTORY, **uvicorn_options(args, settings))
    assert config.ws == "none"
    assert config.http.func is retirement.PROTOCOLS["h11"]  # type: ignore[union-attr]
    assert config.h11_max_incomplete_event_size == settings.http.max_header_bytes
    assert pickle.loads(pickle.dumps(config)).ws == "none"
