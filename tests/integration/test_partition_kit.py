"""The test partition (tests/kit/partition.py) is what the partition tests rest on: silent
both ways, refusing nothing, and passing everything again once healed."""

from __future__ import annotations

import socket

import pytest

from tests.kit.partition import opened_partition


def test_the_kits_partition_drops_both_ways_and_refuses_nothing() -> None:
    # Nothing crosses either way, and no error comes back.
    with opened_partition() as partition:
        listener = partition.listener()
        client = socket.create_connection((partition.there, listener.getsockname()[1]), 5)
        server, _ = listener.accept()
        with client, server:
            client.sendall(b"a")
            assert server.recv(1) == b"a"
            partition.drop()
            client.sendall(b"b")  # accepted by the client's kernel, never delivered
            server.sendall(b"c")
            server.settimeout(1.5)
            client.settimeout(0.1)
            with pytest.raises(TimeoutError):
                server.recv(1)
            with pytest.raises(TimeoutError):
                client.recv(1)
            with socket.socket() as late, pytest.raises(TimeoutError):
                late.settimeout(1.5)
                late.connect((partition.there, listener.getsockname()[1]))  # not refused
            partition.heal()
            server.settimeout(30)  # TCP's next retransmission, some backoff away
            client.settimeout(30)
            assert server.recv(1) == b"b" and client.recv(1) == b"c"  # retransmitted
