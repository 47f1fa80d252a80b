"""Several hosts (docs/several-hosts.md): the advertised api address, and the ping facts an
api takes from its own host's worker."""

from __future__ import annotations

import socket

import pytest

from app.cli.serve import listen_url
from app.context.execution_wiring import HostWorker
from app.settings import advertise_url_from_env


def test_the_advertised_url_is_a_base_url_or_refused_in_one_line() -> None:
    assert advertise_url_from_env({}) is None
    assert advertise_url_from_env({"QL_ADVERTISE_URL": "https://b.example:8443/"}) == (
        "https://b.example:8443"
    )
    for bad in ("b.example:8000", "ftp://b", "http://b/api", "http://"):
        with pytest.raises(ValueError, match="QL_ADVERTISE_URL must be"):
            advertise_url_from_env({"QL_ADVERTISE_URL": bad})


def test_serve_advertises_its_listen_address_and_a_wildcard_as_the_host_name() -> None:
    assert listen_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert listen_url("0.0.0.0", 9000) == f"http://{socket.gethostname()}:9000"
    assert listen_url("::1", 80) == "http://[::1]:80"


def test_the_api_records_its_own_workers_lease_and_refuses_another_instances() -> None:
    host = HostWorker(own_instance_id="me")
    assert host.answered({"ok": True}) and host.instance_id is None  # an older worker
    assert host.answered({"ok": True, "instance_id": "me", "epoch": 3})
    assert (host.instance_id, host.epoch) == ("me", 3)
    assert not host.answered({"ok": True, "instance_id": "other", "epoch": 9})
    assert (host.instance_id, host.epoch) == ("me", 3)  # unchanged: never dispatch through it
