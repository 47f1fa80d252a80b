"""The client's prompts on a real terminal (a pty): Ctrl-D is one line, not a traceback.

``qinglong login`` and ``qinglong secrets set`` read from the terminal without echo
(``getpass``, on /dev/tty); both read before any request, so no server is needed.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _answer_eof(
    args: list[str], env: dict[str, str], prompt: bytes, key: bytes = b"\x04"
) -> tuple[int, str]:
    """Run ``python -m app ARGS`` on a pty, send ``key`` (Ctrl-D) once ``prompt`` shows; (exit
    code, what the terminal showed)."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", *args], stdin=secondary, stdout=secondary,
        stderr=secondary, env=env, start_new_session=True,
        preexec_fn=lambda: os.close(os.open(os.ttyname(0), os.O_RDWR)),  # the controlling tty
    )  # fmt: skip
    os.close(secondary)
    shown = b""
    sent = False
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if not sent and prompt in shown:
                os.write(primary, key)
                sent = True
            ready, _, _ = select.select([primary], [], [], 0.1)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # EIO: the process exited and the terminal drained
                break
            if not chunk:
                break
            shown += chunk
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(primary)
    return code, shown.decode(errors="replace")


@pytest.mark.parametrize(
    ("args", "prompt", "said"),
    [
        (["login", "--url", "http://127.0.0.1:9"], b"API token: ",
         "error: no token given; nothing was saved"),
        (["secrets", "set", "db-pass", "--url", "http://127.0.0.1:9", "--token", "ql_t"],
         b"value of db-pass: ", "error: no value given; nothing was set"),
    ],
)  # fmt: skip
def test_ctrl_d_at_a_prompt_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], prompt: bytes, said: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_CLIENT_CONFIG"] = str(tmp_path / "client.toml")
    code, shown = _answer_eof(args, env, prompt)
    assert "Traceback" not in shown, shown
    assert shown.strip().splitlines()[-1] == said, shown
    assert code == 2
    assert not (tmp_path / "client.toml").exists()


def test_enter_alone_at_logins_prompt_says_no_token_was_given(tmp_path: Path) -> None:
    # It said "no API token: pass --token, set QL_TOKEN or run `qinglong login`", to a user
    # running qinglong login.
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_CLIENT_CONFIG"] = str(tmp_path / "client.toml")
    args = ["login", "--url", "http://127.0.0.1:9"]
    code, shown = _answer_eof(args, env, b"API token: ", key=b"\r")
    assert shown.strip().splitlines()[-1] == "error: no token given; nothing was saved", shown
    assert code == 2
    assert not (tmp_path / "client.toml").exists()


def test_no_token_at_all_names_where_a_new_services_first_one_comes_from(tmp_path: Path) -> None:
    # `qinglong serve` (a pip install, not `make run`) prints no token; a user with none
    # was told to `qinglong login`, which needs one: token bootstrap was nowhere in sight.
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_CLIENT_CONFIG"] = str(tmp_path / "client.toml")
    done = subprocess.run(
        [sys.executable, "-m", "app", "runs", "list"], env=env, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "error: no API token: pass --token, set QL_TOKEN or run `qinglong login` (a new "
        "service's first token: `qinglong token bootstrap` on its machine)\n"
    ), done.stderr
