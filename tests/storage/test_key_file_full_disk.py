"""The key file made on first use is never visible half written: on a real full disk (a
tmpfs) its making fails and leaves no file, and the next start, once there is room, makes a
whole one.

Before, it was written in place: a first start on a full disk left an empty ``secret.key``,
and every start after it, with room again, was refused (``secret.key holds no key``) until
someone removed the file by hand.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from app.storage.secret_crypto import KeyRing
from tests.disk import fill, mounted_tmpfs


def test_a_key_file_that_cannot_be_written_leaves_nothing_and_the_next_start_makes_it(
    tmp_path: Path,
) -> None:
    with mounted_tmpfs(tmp_path / "fs", size_mib=1) as fs:
        key_file = fs / "data" / "secret.key"
        filler = fill(fs)
        with pytest.raises(OSError) as refused:
            KeyRing.from_settings(secret_key=None, key_file=key_file)
        assert refused.value.errno == errno.ENOSPC
        assert list(key_file.parent.iterdir()) == []  # no key file, no temp file
        filler.unlink()
        ring = KeyRing.from_settings(secret_key=None, key_file=key_file)
        again = KeyRing.from_settings(secret_key=None, key_file=key_file)
        assert again.current.id == ring.current.id
        assert key_file.stat().st_mode & 0o777 == 0o600
