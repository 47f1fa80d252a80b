"""The one list of what can go wrong (app/domain/errors.py) and the ports' Raises: lines.

Pure reads of the source: the hierarchy drawn in the module docstring is the real one, every
exception class in app/ is either defined there or listed there, and every port method says
what it raises, naming only exceptions that list defines (or the standard library's).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
from pathlib import Path

import app.domain.errors as errors
from app.domain.errors import (
    Conflict,
    DomainError,
    ErrorCode,
    InvalidTransition,
    LaunchFailed,
    LaunchOutcomeUnknown,
    NotMigrated,
    QueueFull,
    ValidationFailed,
)
from app.domain.states import AttemptStatus, RunStatus, transition_attempt, transition_run
from app.execution import ports

APP = Path(errors.__file__).resolve().parents[1]
DOC = errors.__doc__ or ""
_TREE_LINE = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)")


def _drawn_tree() -> list[tuple[str, str]]:
    """(class, drawn parent) for every node of the docstring's tree."""
    parents: list[str] = ["Exception"]
    pairs: list[tuple[str, str]] = []
    for line in DOC.splitlines():
        found = _TREE_LINE.match(line.removeprefix("    "))
        if found is None:
            continue
        depth = len(found["indent"]) // 4
        del parents[depth + 1 :]
        pairs.append((found["name"], parents[depth]))
        parents.append(found["name"])
    return pairs


def test_the_docstring_draws_the_real_hierarchy() -> None:
    pairs = _drawn_tree()
    assert len(pairs) >= 15
    for name, parent in pairs:
        cls = getattr(errors, name, None) or getattr(builtins, name)
        base = getattr(errors, parent, None) or getattr(builtins, parent)
        assert cls.__bases__ == (base,), (name, parent)


def test_every_exception_class_of_the_module_is_drawn() -> None:
    drawn = {name for name, _ in _drawn_tree()}
    defined = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    }
    assert defined == drawn - {"ValueError"}


def _exception_classes_in_app() -> dict[str, Path]:
    """Every class in app/ deriving (by name, transitively) from an exception class."""
    known = {
        name
        for name in dir(builtins)
        if isinstance(getattr(builtins, name), type)
        and issubclass(getattr(builtins, name), BaseException)
    } | {"StarletteHTTPException", "HTTPException"}
    classes: list[tuple[str, list[str], Path]] = []
    for path in APP.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                ]
                classes.append((node.name, bases, path))
    found: dict[str, Path] = {}
    grew = True
    while grew:
        grew = False
        for name, bases, path in classes:
            if name not in found and any(b in known or b in found for b in bases):
                found[name] = path
                grew = True
    return found


def test_every_exception_class_in_app_is_defined_or_listed_in_the_one_module() -> None:
    found = _exception_classes_in_app()
    assert "ArtifactRefused" in found and "SocketInUse" in found  # the walk sees them
    for name, path in found.items():
        where = path.relative_to(APP.parent).as_posix()
        if where == "app/domain/errors.py":
            assert f"── {name}" in DOC, name
        else:
            assert re.search(rf"{re.escape(where)}:[^;]*\b{name}\b", DOC), (name, where)


def test_a_refused_transition_is_one_type_whichever_layer_noticed_it() -> None:
    try:
        transition_run(RunStatus.SUCCEEDED, RunStatus.RUNNING)
    except Conflict as exc:  # the state machine's refusal is a Conflict too
        assert isinstance(exc, InvalidTransition)
        assert exc.code is ErrorCode.INVALID_TRANSITION
    else:
        raise AssertionError("a terminal run moved")
    refused = InvalidTransition(
        "attempt", AttemptStatus.STARTING, AttemptStatus.STARTING, reason="already armed"
    )
    assert (refused.code, refused.detail) == (ErrorCode.INVALID_TRANSITION, "already armed")
    try:
        transition_attempt(AttemptStatus.CLAIMED, AttemptStatus.RUNNING)
    except InvalidTransition as exc:
        assert exc.detail == "attempt cannot move from claimed to running"
    else:
        raise AssertionError("a claimed attempt ran without starting")


def test_not_migrated_has_its_own_code_and_is_no_validation_failure() -> None:
    refusal = NotMigrated()
    assert isinstance(refusal, DomainError) and not isinstance(refusal, ValidationFailed)
    assert refusal.code is ErrorCode.NOT_MIGRATED
    assert "qinglong migrate" in refusal.detail


def test_an_unknown_launch_outcome_is_never_a_launch_failure() -> None:
    assert not issubclass(LaunchOutcomeUnknown, LaunchFailed)
    assert LaunchOutcomeUnknown("WORKER_NO_ANSWER").reason == "WORKER_NO_ANSWER"


def _port_methods() -> list[tuple[str, str, str]]:
    """(protocol, method, docstring) of every method of every port (properties excluded)."""
    found = []
    for cls_name, cls in vars(ports).items():
        if not (inspect.isclass(cls) and cls.__module__ == ports.__name__):
            continue
        for name, member in vars(cls).items():
            if name.startswith("_") or not inspect.isfunction(member):
                continue
            found.append((cls_name, name, inspect.getdoc(member) or ""))
    return found


def test_every_port_method_says_what_it_raises() -> None:
    methods = _port_methods()
    assert len(methods) >= 30
    missing = [f"{c}.{m}" for c, m, doc in methods if "Raises:" not in doc]
    assert missing == []


def test_a_raises_line_names_only_exceptions_of_the_one_module_or_the_standard_library() -> None:
    for cls_name, method, doc in _port_methods():
        line = " ".join(doc.split("Raises:", 1)[1].split("\n\n", 1)[0].split())
        line = re.sub(r"\([^)]*\)", "", line)  # the parenthesised reasons and codes
        for word in re.findall(r"\b[A-Z][A-Za-z]+\b", line):
            if word in {"A", "Raises"}:
                continue
            cls = getattr(errors, word, None) or getattr(builtins, word, None)
            assert inspect.isclass(cls) and issubclass(cls, Exception), (cls_name, method, word)



def test_a_queue_full_of_one_run_says_one_run_not_1_runs() -> None:
    assert QueueFull(1).detail.startswith("1 run is queued already (QL_MAX_QUEUED)")
    assert QueueFull(3).detail.startswith("3 runs are queued already")
