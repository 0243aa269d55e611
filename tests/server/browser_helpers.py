"""Debian's headless Chromium, driven by Selenium through chromium-driver, for the browser
tests; and a server on a thread of its own, so that Selenium's blocking calls never stall it.

Without chromium, chromium-driver or selenium the tests that use `chromium` are skipped with a
message saying how to enable them; under CI (`CI` set, as `.ci/run` does) they fail instead.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, TypeVar

import anyio
import pytest

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.remote.webdriver import WebDriver
except ImportError:  # `chromium` says what to install
    webdriver = None

T = TypeVar("T")


def _missing() -> str | None:
    if webdriver is None:
        return "selenium is not installed (pip install -e '.[dev]')"
    for command in ("chromium", "chromedriver"):
        if shutil.which(command) is None:
            return f"{command} is not installed (apt-get install -y chromium chromium-driver)"
    return None


@contextmanager
def chromium() -> Iterator[WebDriver]:
    """A headless Chromium, quit at the end; skips (fails under CI) without one."""
    missing = _missing()
    if missing is not None:
        message = f"browser tests need Chromium and Selenium: {missing}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        options=options, service=Service(executable_path=shutil.which("chromedriver"))
    )
    try:
        yield driver
    finally:
        driver.quit()


@contextmanager
def on_a_thread(serve: Callable[[], AbstractAsyncContextManager[T]]) -> Iterator[T]:
    """What `serve()` yields, while it runs on a thread of its own (its own event loop)."""
    ready: queue.Queue[Any] = queue.Queue()
    stop = threading.Event()

    async def main() -> None:
        try:
            async with serve() as served:
                ready.put(served)
                while not stop.is_set():
                    await anyio.sleep(0.05)
        except BaseException as e:
            ready.put(e)
            raise

    thread = threading.Thread(target=anyio.run, args=(main,), daemon=True)
    thread.start()
    started = ready.get(timeout=30)
    if isinstance(started, BaseException):
        raise started
    try:
        yield started
    finally:
        stop.set()
        thread.join(timeout=30)
