"""The operator page's reads of ``/ui/api/jobs`` in a real headless browser (Debian's
chromium): one at a time, the next 3 s after an answer or after a read given up for having no
answer, and a token entered during a read used once that read ends."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fastapi.responses import JSONResponse, Response
from test_ui import RUNNING_JOB, _page_with_api

#: the page's time-out of a read, shortened for the tests (the page's own is 30 s)
TIMEOUT = ("const TIMEOUT_MS = 30000;", "const TIMEOUT_MS = 1000;")


def _short_timeout(js: str) -> str:
    assert TIMEOUT[0] in js
    return js.replace(*TIMEOUT)


class Answers:
    """The API's answers in turn, each once ``hold`` (seconds, or an event set) has passed;
    counts the reads running at once and notes when each began and ended."""

    def __init__(self, *steps: tuple[float | threading.Event, Response]) -> None:
        self.steps = list(steps)
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.began: list[float] = []
        self.ended: list[float] = []

    def __iter__(self) -> Answers:
        return self

    def __next__(self) -> Response:
        with self.lock:
            if not self.steps:
                raise StopIteration
            hold, answer = self.steps.pop(0)
            self.began.append(time.monotonic())
            self.running += 1
            self.most = max(self.most, self.running)
        if isinstance(hold, threading.Event):
            hold.wait(30)
        else:
            time.sleep(hold)
        with self.lock:
            self.running -= 1
            self.ended.append(time.monotonic())
        return answer


def _job() -> JSONResponse:
    return JSONResponse({"version": "x", "jobs": [RUNNING_JOB]})


def _console_errors(driver: Any) -> list[Any]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and "/ui/api/jobs" not in e["message"]]  # the failed reads themselves


@pytest.mark.integration
def test_a_browser_waits_for_each_answer_before_asking_again() -> None:
    """An API that takes 4 s to answer (longer than the page's 3 s between reads): the page
    keeps asking, one request at a time, never one over another still running."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    answers = Answers(*[(4.0, _job()) for _ in range(3)])
    with _page_with_api(answers) as (driver, port):
        driver.get(f"http://127.0.0.1:{port}/ui")
        driver.find_element(By.ID, "token").send_keys("ffo_x")
        driver.find_element(By.ID, "show").click()
        WebDriverWait(driver, 60).until(lambda _: len(answers.ended) >= 3)
    assert answers.most == 1, answers.most


@pytest.mark.integration
def test_a_read_without_an_answer_is_given_up_and_the_page_reads_again() -> None:
    """A read the server never answers (a connection half-open) is given up after the page's
    time-out: the page says the server does not answer, and reads again 3 s later."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    never = threading.Event()
    answers = Answers((never, _job()), (0.0, _job()))
    with _page_with_api(answers, script=_short_timeout) as (driver, port):
        try:
            driver.get(f"http://127.0.0.1:{port}/ui")
            driver.find_element(By.ID, "token").send_keys("ffo_x")
            driver.find_element(By.ID, "show").click()
            message = driver.find_element(By.ID, "message")
            WebDriverWait(driver, 20).until(lambda _: message.text != "")
            assert message.text == "the server does not answer (nothing within 1 s)"
            WebDriverWait(driver, 20).until(
                lambda _: driver.find_elements(By.CSS_SELECTOR, 'section[data-job="job-a"]'))
            assert message.text == ""
            assert answers.began[1] - answers.began[0] > 3.5  # 1 s given up, then 3 s
            assert _console_errors(driver) == []
        finally:
            never.set()  # the server's read ends: it can stop


@pytest.mark.integration
def test_a_token_entered_during_a_read_is_used_once_that_read_ends_never_alongside() -> None:
    """A token entered while a read with the last one runs: the page reads with it as soon as
    that read ends, not beside it, and the old token's refusal (401) neither removes the new
    token nor says "unknown operator token"."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    refused = JSONResponse({"error": "unauthorized", "detail": "unknown operator token"},
                           status_code=401)
    answers = Answers((2.0, refused), (0.0, _job()))
    asked: list[str] = []
    with _page_with_api(answers, asked=asked) as (driver, port):
        driver.get(f"http://127.0.0.1:{port}/ui")
        driver.find_element(By.ID, "token").send_keys("ffo_old")
        driver.find_element(By.ID, "show").click()
        WebDriverWait(driver, 20).until(lambda _: answers.running == 1)
        driver.find_element(By.ID, "token").send_keys("ffo_new")
        driver.find_element(By.ID, "show").click()
        WebDriverWait(driver, 20).until(
            lambda _: driver.find_elements(By.CSS_SELECTOR, 'section[data-job="job-a"]'))
        assert asked[:2] == ["Bearer ffo_old", "Bearer ffo_new"]
        assert answers.most == 1, answers.most
        assert answers.began[1] - answers.ended[0] < 1.5  # at once, not 3 s later
        assert driver.find_element(By.ID, "message").text == ""
        assert driver.execute_script(
            'return sessionStorage.getItem("fedforest-operator-token")') == "ffo_new"
        assert _console_errors(driver) == []
