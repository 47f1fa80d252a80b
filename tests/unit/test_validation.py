"""The validation rules of docs/api.md §1 and docs/design.md §3.5 as pure functions."""

from __future__ import annotations

import pytest

from app.domain.errors import ValidationFailed
from app.domain.validation import (
    merge_environment,
    parse_instant,
    validate_argv,
    validate_cwd,
    validate_env_key,
    validate_env_value,
    validate_leftovers,
    validate_name,
    validate_priority,
    validate_recipe,
    validate_timeout,
)


@pytest.mark.parametrize("name", ["a", "job-1", "x.y_z", "0" * 128])
def test_valid_names_pass(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "A", "-a", ".a", "a b", "a/b", "a" * 129, "é"])
def test_invalid_names_are_refused(name: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        validate_name(name)
    assert info.value.code == "INVALID_NAME"


@pytest.mark.parametrize(
    "argv",
    [["/usr/bin/python3", "job.py"], ["/bin/true"], ["/bin/sh", "-c", "echo hi"],
     ["/bin/bash", "-c", "exit 3"], ["/x"] + ["a"] * 63],
)  # fmt: skip
def test_valid_argv_passes(argv: list[str]) -> None:
    assert validate_argv(argv) == argv


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        ([], "INVALID_ARGV"),
        (["python3"], "INVALID_ARGV"),
        (["./job"], "INVALID_ARGV"),
        (["/bin/sh", "script.sh"], "INVALID_ARGV"),
        (["/bin/sh", "-c"], "INVALID_ARGV"),
        (["/bin/true", "a\x00b"], "INVALID_ARGV"),
        (["/x"] + ["a"] * 64, "LIMIT_EXCEEDED"),
        (["/x", "a" * 4097], "LIMIT_EXCEEDED"),
        (["/x", "é" * 2049], "LIMIT_EXCEEDED"),
        (["/x/../bin/sh", "-c", "x"], "INVALID_ARGV"),
    ],
)
def test_invalid_argv_is_refused_with_its_code(argv: list[str], code: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        validate_argv(argv)
    assert info.value.code == code


@pytest.mark.parametrize(("key", "code"), [("lower", "INVALID_ENV_KEY"), ("1A", "INVALID_ENV_KEY"),
                                           ("QL3_RUN_ID", "RESERVED_ENV_KEY"), ("A-B", "INVALID_ENV_KEY")])  # fmt: skip
def test_invalid_env_keys_are_refused(key: str, code: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        validate_env_key(key)
    assert info.value.code == code


def test_env_values_are_bounded_and_nul_free() -> None:
    assert validate_env_value("x" * 32 * 1024)
    with pytest.raises(ValidationFailed):
        validate_env_value("x" * (32 * 1024 + 1))
    with pytest.raises(ValidationFailed):
        validate_env_value("a\x00")


def test_a_recipes_refused_value_is_named_by_its_key_never_shown() -> None:
    # One of many keys was "an environment value is longer than 32768 bytes": which one?
    long = "s3cr3t" * 6000
    with pytest.raises(ValidationFailed) as info:
        validate_recipe({"SHORT": "x", "BIG_BLOB": long}, {})
    assert info.value.detail == "the value of BIG_BLOB is longer than 32768 bytes"
    with pytest.raises(ValidationFailed) as info:
        validate_recipe({"NUL_HERE": "a\x00b"}, {})
    assert info.value.detail == "the value of NUL_HERE must be a string without NUL"


def test_recipe_refuses_a_key_in_both_maps_and_too_many_keys() -> None:
    with pytest.raises(ValidationFailed) as info:
        validate_recipe({"A": "1"}, {"A": "secret-a"})
    assert info.value.code == "DUPLICATE_ENV_KEY"
    with pytest.raises(ValidationFailed) as info:
        validate_recipe({f"K{i}": "v" for i in range(257)}, {})
    assert info.value.code == "LIMIT_EXCEEDED"
    with pytest.raises(ValidationFailed) as info:
        validate_recipe({}, {"A": "Not A Name"})
    assert info.value.code == "INVALID_NAME"


def test_timeout_priority_and_cwd_bounds() -> None:
    assert validate_timeout(None) is None
    assert validate_timeout(604_800) == 604_800
    for bad in (0, 604_801, True):
        with pytest.raises(ValidationFailed):
            validate_timeout(bad)
    assert validate_priority(-100) == -100
    for bad_priority in (101, -101, False):
        with pytest.raises(ValidationFailed):
            validate_priority(bad_priority)
    assert validate_cwd("/srv/jobs") == "/srv/jobs"
    with pytest.raises(ValidationFailed):
        validate_cwd("relative")


def test_leftovers_are_kill_or_keep() -> None:
    assert validate_leftovers("kill") == "kill"
    assert validate_leftovers("keep") == "keep"
    for bad in ("KILL", "", "none", "process"):
        with pytest.raises(ValidationFailed) as info:
            validate_leftovers(bad)
        assert info.value.code == "VALIDATION_FAILED"


def test_merge_environment_puts_reserved_ids_last_and_only_reserved_keys() -> None:
    env = merge_environment({"A": "1"}, {"TOKEN": "s"}, {"QL3_RUN_ID": "r"})
    assert env == {"A": "1", "TOKEN": "s", "QL3_RUN_ID": "r"}
    with pytest.raises(ValueError):
        merge_environment({}, {}, {"PATH": "/bin"})


def test_a_shell_given_a_script_file_is_told_how_to_run_one() -> None:
    # `/bin/sh script.sh`, as a crontab line runs it: the refusal named the -c form only, so
    # a user moving a script kept guessing; it says how to run a script file too.
    with pytest.raises(ValidationFailed) as info:
        validate_argv(["/bin/sh", "tick.sh"])
    assert info.value.detail == (
        "a shell program must be called as [shell, '-c', script]; to run a script file, give "
        "its absolute path as argv[0] (executable, with its #! line), or [shell, '-c', "
        "'sh ./script.sh'] with cwd"
    )


def test_an_instant_is_read_as_rfc_3339_says() -> None:
    """docs/api.md §6: an offset's minute ends at 59; a fraction of any length is cut to the
    millisecond; a leap second is the last millisecond of the second before it."""
    read = {
        "1970-01-01T00:00:00Z": 0,
        "1970-01-01T08:00:00.0019999999999+08:00": 1,
        "1970-01-01t00:00:01.5z": 1500,
        "2016-12-31T23:59:60Z": 1_483_228_799_999,
        "2016-12-31T23:59:59.999Z": 1_483_228_799_999,
        "2017-01-01T08:59:60+09:00": 1_483_228_799_999,
        "0001-01-01T00:00:00Z": -62_135_596_800_000,
    }
    for text, ms in read.items():
        assert parse_instant(text, field="since") == ms, text
    for bad in ("1970-01-01T00:00:00-00:60", "1970-01-01T00:00:00+24:00",
                "1970-01-01T00:00:61Z", "1970-01-01T24:00:00Z", "1970-01-01T00:60:00Z",
                "1970-01-01T00:00:00.Z", "1970-02-29T00:00:00Z", "0000-01-01T00:00:00Z",
                "1970-01-01T00:00:00", "1970-01-01T00:00Z", "1970-01-01 00:00:00Z"):  # fmt: skip
        with pytest.raises(ValidationFailed, match="since must be an RFC 3339 instant"):
            parse_instant(bad, field="since")
