"""End to end: `streamlit run dashboard/app.py` over a real workspace, opened in headless Chromium;
sign in through the form (selenium + chromedriver), then screenshot the pages into tests/artifacts/.

(Chromium's own `--screenshot` flag fires before Streamlit's websocket has rendered anything, so a
browser driver is needed to wait for the page and to type the credentials.)"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.dashboard_workspace import PASSWORDS, build_workspace

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
CHROMEDRIVER = shutil.which("chromedriver") or (
    "/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian package `chromium`; .ci/run installs it)")
    root = tmp_path_factory.mktemp("e2e") / "ws"
    build_workspace(root)
    port = _free_port()
    log = open(root.parent / "streamlit.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(REPO / "dashboard" / "app.py"),
            "--server.headless",
            "true",
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
            "--browser.gatherUsageStats",
            "false",
        ],
        env={**os.environ, "PRIVRELEASE_HOME": str(root)},
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
            if proc.poll() is not None:
                pytest.fail(
                    f"streamlit exited: {(root.parent / 'streamlit.log').read_text()[-2000:]}"
                )
        else:
            pytest.fail("streamlit did not become healthy within 2 minutes")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _assert_real_screenshot(path: Path) -> None:
    img = np.asarray(Image.open(path).convert("L"), dtype=np.float32)
    assert img.shape[0] >= 800 and img.shape[1] >= 1200
    assert img.std() > 5  # not a blank page


def test_sign_in_and_pages_in_a_browser(server):
    """Wrong password refused, right one signs in; every steward page renders without a traceback."""
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install selenium)"
    )
    if CHROMEDRIVER is None:
        pytest.skip("chromedriver is not installed (Debian package `chromium-driver`)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tempfile.mkdtemp(prefix='privrelease-e2e-')}",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    wait = WebDriverWait(driver, 120)
    try:
        driver.get(f"{server}/?user=alice")
        password = wait.until(
            ec.presence_of_element_located((By.CSS_SELECTOR, "input[type='password']"))
        )
        name = driver.find_element(By.CSS_SELECTOR, "input[type='text']")
        assert name.get_attribute("value") == "alice"  # pre-filled only
        time.sleep(1)
        driver.save_screenshot(str(ARTIFACTS / "dashboard-signin.png"))
        sign_in = driver.find_element(By.XPATH, "//button[.//p[text()='Sign in']]")
        password.send_keys("not-the-password")
        sign_in.click()
        wait.until(ec.presence_of_element_located((By.XPATH, "//*[contains(., 'wrong password')]")))
        assert not driver.find_elements(By.XPATH, "//h1[contains(., 'Overview')]")
        password = driver.find_element(By.CSS_SELECTOR, "input[type='password']")
        password.send_keys(Keys.CONTROL, "a")  # .clear() bypasses React's change events
        password.send_keys(Keys.DELETE)
        password.send_keys(PASSWORDS["alice"])
        driver.find_element(By.XPATH, "//button[.//p[text()='Sign in']]").click()
        wait.until(ec.presence_of_element_located((By.XPATH, "//h1[contains(., 'Overview')]")))
        wait.until(
            ec.presence_of_element_located((By.CSS_SELECTOR, "[data-testid='stImage'] img"))
        )  # the gauge
        sidebar = driver.find_element(By.CSS_SELECTOR, "[data-testid='stSidebar']").text
        assert "alice" in sidebar and "steward" in sidebar
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, "[data-stale='true']"))
        time.sleep(3)  # tables draw on a canvas after the element exists
        shots = {
            "signin": ARTIFACTS / "dashboard-signin.png",
            "overview": ARTIFACTS / "dashboard-overview.png",
        }
        driver.save_screenshot(str(shots["overview"]))
        # Text each page renders last: the screenshot waits for it and for no stale (faded) element.
        markers = {"Ledger": "ε after (RDP)", "Releases": "Reject", "Audit trail": "Chain verified"}
        for page, marker in markers.items():
            driver.find_element(
                By.XPATH, f"//*[@data-testid='stSidebar']//label[contains(., '{page}')]"
            ).click()
            wait.until(ec.presence_of_element_located((By.XPATH, f"//h1[contains(., '{page}')]")))
            wait.until(
                ec.presence_of_element_located(
                    (
                        By.XPATH,
                        f"//*[@data-testid='stMain']//*[text()='{marker}' "
                        f"or contains(text(), '{marker}')]",
                    )
                )
            )
            wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, "[data-stale='true']"))
            time.sleep(3)
            assert "Traceback" not in driver.find_element(By.TAG_NAME, "body").text
            shots[page] = ARTIFACTS / f"dashboard-{page.lower().replace(' ', '-')}.png"
            driver.save_screenshot(str(shots[page]))
        for path in shots.values():
            _assert_real_screenshot(path)
    finally:
        driver.quit()
