"""How :func:`~fedforest_secure.protocol.steps.split_step` reads a step answer's
``X-FedForest-Step-Json-Bytes`` header: a decimal count of ASCII digits that leaves a JSON and a
task within the body splits it there; any other value is a :class:`ProtocolError`."""

from __future__ import annotations

import pytest

from fedforest_secure.errors import ProtocolError
from fedforest_secure.protocol.steps import join_step, split_step

BODY = b'{"next":{}}' + b"task"


@pytest.mark.parametrize(("header", "refusal"), [
    ("-1", "not a byte count"),
    ("+5", "not a byte count"),
    (" 5", "not a byte count"),
    ("", "not a byte count"),
    ("abc", "not a byte count"),
    ("0x5", "not a byte count"),
    ("\u0665", "not a byte count"),  # an Arabic-Indic five: a digit to str.isdigit
    ("9" * 21, "not a byte count"),
    ("9" * 20, "does not leave a task"),
    ("0", "does not leave a task"),
    (str(len(BODY) + 1), "does not leave a task"),
    (str(len(BODY)), "does not leave a task"),
])
def test_a_header_that_is_not_a_count_leaving_json_and_a_task_is_refused(
        header: str, refusal: str) -> None:
    with pytest.raises(ProtocolError, match=refusal):
        split_step(BODY, header)


@pytest.mark.parametrize("n", [1, 11, len(BODY) - 1])
def test_a_count_within_the_body_splits_it_there(n: int) -> None:
    assert split_step(BODY, str(n)) == (BODY[:n], BODY[n:])
    assert split_step(BODY, f"{n:05d}") == (BODY[:n], BODY[n:])  # leading zeros: a count


def test_an_answer_without_the_header_is_json_alone() -> None:
    assert split_step(BODY, None) == (BODY, None)


def test_a_joined_answer_splits_into_what_was_joined() -> None:
    body, headers = join_step(b'{"a":1}', b"\x00task")
    assert split_step(body, *headers.values()) == (b'{"a":1}', b"\x00task")
