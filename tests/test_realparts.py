"""The real parts the browser and proxy tests stand on are there and work."""

import subprocess

from tests.realparts import chromium_driver, require


def test_headless_chromium_renders_a_page_on_a_test_hostname():
    driver = chromium_driver()
    try:
        driver.get("data:text/html,<title>tally</title><p id=x>ok</p>")
        assert driver.title == "tally"
        assert driver.execute_script("return navigator.webdriver") is True
    finally:
        driver.quit()


def test_nginx_is_installed_and_parses_a_config(tmp_path):
    nginx = require("nginx", "/usr/sbin/nginx")
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"pid {tmp_path}/nginx.pid; error_log stderr; events {{}} "
                    "http { server { listen 127.0.0.1:1; } }\n")
    result = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(conf)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
