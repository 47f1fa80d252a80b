"""``qinglong secrets rotate-key``: re-encrypt every secret under a new key.

With the key file (default), a fresh key is made current, every row is re-encrypted, and
old keys are dropped only once no row uses them (an interrupted run loses nothing; run it
again). With ``QL_SECRET_KEY``, put the new key first in the list (``new,old``), run this,
then remove the old key from the variable.
"""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.client import register_secret_actions
from app.cli.common import database, require_key_for_stored_secrets


def register(sub: Any) -> None:
    """Add ``secrets rotate-key`` (and the client's ``list|set|delete``) to the parser."""
    secrets = sub.add_parser("secrets", help="set, list and delete secrets; rotate their key")
    ssub = secrets.add_subparsers(dest="secrets_command", metavar="ACTION", required=True)
    ssub.add_parser("rotate-key", help="re-encrypt every secret under a new key").set_defaults(
        handler=cmd_rotate_key
    )
    register_secret_actions(ssub)  # over HTTP (docs/cli.md)


def cmd_rotate_key(args: argparse.Namespace) -> int:
    """Rotate the secret key; prints counts and key ids, never key material or values."""
    from app.storage.secret_crypto import KeyRing
    from app.storage.secrets_repo import SecretRepository

    with database(args) as (settings, engine):
        settings.ensure_data_dir()
        require_key_for_stored_secrets(settings)
        ring = KeyRing.from_settings(secret_key=settings.secret_key, key_file=settings.key_file)
        rewritten, dropped = SecretRepository(engine, ring).rotate()
    print(f"re-encrypted {rewritten} secret(s) under key {ring.current.id}")
    if dropped:
        print(f"retired key(s): {' '.join(dropped)}")
    elif not ring.file_backed:
        print("QL_SECRET_KEY is set: remove the old keys from it now")
    return 0
