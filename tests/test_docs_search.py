"""The documentation site's search works from files and from a local server.

The site is built into a temporary folder with ``mkdocs build --strict``;
headless Chromium (Debian's ``chromium`` and ``chromium-driver``, started and
stopped by the test, bound to nothing outside the machine) opens
``index.html`` as a file and, served by ``python -m http.server`` on
127.0.0.1, as a page; in both it types "random participation" into the
search box and must list the random-participation page. A screenshot of the
results is written (set ``DPFL_SCREENSHOTS`` to a folder to keep it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # builds the site and starts a browser (~1 min)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        check=True,
        timeout=600,
    )
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip(
            "needs Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver)"
        )
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--no-first-run",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    service = Service(driver)
    drv = webdriver.Chrome(service=service, options=options)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()
        service.stop()


def _search(drv, url: str, shot: Path) -> list[str]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    drv.get(url)
    box = WebDriverWait(drv, 30).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "input.md-search__input"))
    )
    # at this width the search box sits in the header: click into it and type
    WebDriverWait(drv, 10).until(ec.element_to_be_clickable(box)).click()
    box.send_keys("random participation")
    WebDriverWait(drv, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")
    )
    hrefs = [
        a.get_attribute("href") or ""
        for a in drv.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")
    ]
    drv.save_screenshot(str(shot))
    keep = os.environ.get("DPFL_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    return hrefs


def test_search_works_when_the_site_is_opened_as_files(site, browser, tmp_path):
    shot = tmp_path / "docs-search-file.png"
    hrefs = _search(browser, (site / "index.html").as_uri(), shot)
    assert any("random-participation" in h for h in hrefs), hrefs
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one


def test_search_works_when_the_site_is_served(site, browser, tmp_path):
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=site,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        shot = tmp_path / "docs-search-served.png"
        hrefs = _search(browser, f"http://127.0.0.1:{port}/index.html", shot)
        assert any("random-participation" in h for h in hrefs), hrefs
    finally:
        server.terminate()
        server.wait(timeout=10)
