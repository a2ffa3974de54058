"""Fixtures for the web console (docs/console.md): one real server per module, headless
Debian chromium driven by Playwright, and screenshots of each page."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from tests.conftest import ServerProcess

from waymark.client import Client

# docs/img/regenerate.sh sets this so the tests' screenshots also land in docs/img.
SHOTS = os.environ.get("WAYMARK_CONSOLE_SCREENSHOTS")


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        # ./run test installs it (apt); a bare pytest on a machine without it fails here.
        raise RuntimeError("the console tests need Debian's chromium: apt-get install chromium")
    return found


@pytest.fixture(scope="module")
def server(
    spawn_module_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> ServerProcess:
    return spawn_module_server(
        tmp_path_factory.mktemp("console-data"),
        "--heartbeat-s",
        "0.5",
        "--history-interval-s",
        "0.2",
    )


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url) as client:
        yield client


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context (its own sessionStorage); page errors fail the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"the console threw: {errors}"


@pytest.fixture
def shot(tmp_path: Path) -> Callable[[Page, str], Path]:
    """Save a screenshot of the page under the test's tmp dir (and docs/img when asked)."""

    def take(page: Page, name: str) -> Path:
        path = tmp_path / f"console-{name}.png"
        page.screenshot(path=path, full_page=True)
        assert path.stat().st_size > 10_000  # a page with content, not a blank frame
        if SHOTS:
            shutil.copyfile(path, Path(SHOTS) / path.name)
        return path

    return take
