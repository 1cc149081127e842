"""`ql web` in a real headless Chromium (Debian's `chromium`, DevTools protocol on a pipe), and its
token rule with plain HTTP requests. Screenshots land in the test's tmp dir (runs.png, run.png)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.ops.browser import Browser, chromium_binary
from tests.ops.support import http_get, ql, ql_env, spawn, stop, wait_for



def _ticker(stop_file: Path) -> list[str]:
    """Prints a numbered line every 0.2 s until ``stop_file`` exists: the test decides when it ends,
    so a slow machine never sees it end before the page has watched it grow."""
    return ["sh", "-c", f'i=1; while [ ! -e "{stop_file}" ]; do echo line $i; i=$((i+1)); sleep 0.2; done; echo done']


def _require_chromium() -> str:
    binary = chromium_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the `chromium` binary is missing under CI=true: .ci/run installs it (apt-get install chromium)")
        pytest.skip("the `chromium` binary is not installed (apt-get install -y chromium)")
    return binary


def _start_web(args: list[str], env: dict[str, str], log: Path, listen: str = "127.0.0.1:0"
               ) -> tuple[subprocess.Popen[bytes], str]:
    proc = spawn(["--json", *args, "web", "--listen", listen], env=env, log=log)

    def listening() -> str | None:
        for line in log.read_text().splitlines():
            if line.startswith('{"type":"listening"'):
                return json.loads(line)["url"]
        if proc.poll() is not None:
            raise AssertionError(f"ql web exited {proc.returncode}: {log.read_text()}")
        return None

    return proc, wait_for(listening, what="ql web to listen", diagnose=log.read_text)


def test_the_pages_in_a_real_browser(tmp_path: Path) -> None:
    binary = _require_chromium()
    env = ql_env(tmp_path)
    data = str(tmp_path / "data")
    # The data dir must exist (ql web only reads): one quick run creates it.
    assert ql(["--data-dir", data, "run", "--", "sh", "-c", "exit 0"], env=env).returncode == 0
    web, url = _start_web(["--data-dir", data], env, tmp_path / "web.log")
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    browser = Browser(binary, profile)
    try:
        stop_file = tmp_path / "stop-ticker"
        submitted = ql(["--data-dir", data, "--json", "run", "--detach", "--name", "ticker", "--",
                        *_ticker(stop_file)], env=env)
        assert submitted.returncode == 0, submitted.stderr
        run_id = json.loads(submitted.stdout.splitlines()[0])["run_id"]

        browser.goto(url)
        listed = browser.evaluate("document.getElementById('runs').innerText")
        assert run_id in listed and "ticker" in listed
        browser.screenshot(tmp_path / "runs.png")
        browser.goto(f"{url}?status=failed")
        assert run_id not in (browser.evaluate("document.body.innerText") or "")

        browser.goto(f"{url}runs/{run_id}")
        log_text = "document.getElementById('log').textContent"
        wait_for(lambda: "line 2\n" in (browser.evaluate(log_text) or ""), what="the first lines in the page")
        first = browser.evaluate(log_text)
        # Growing while the task prints, without a reload: the SSE stream appends.
        grown = wait_for(lambda: (t := browser.evaluate(log_text)) and len(t) > len(first) + 20 and t,
                         what="the log to grow in the page")
        assert grown.startswith(first)
        assert browser.evaluate("document.getElementById('logstate').textContent") == "live"
        browser.screenshot(tmp_path / "run.png")
        stop_file.touch()
        wait_for(lambda: (browser.evaluate("document.getElementById('logstate').textContent") or "")
                 .startswith("ended: succeeded"), what="the end event", timeout=120)
        final = browser.evaluate(log_text)
        lines = final.splitlines()
        assert lines[-1] == "done" and len(lines) > 3
        assert lines[:-1] == [f"line {i}" for i in range(1, len(lines))]  # nothing lost, nothing twice
        page = browser.evaluate("document.documentElement.outerHTML")
        assert "while [" not in page and "sleep 0.2" not in page and "stop-ticker" not in page  # no command
        assert "attempt.spawned" in browser.evaluate("document.getElementById('events').innerText")

        browser.goto(f"{url}runs/{run_id}?offset=7")  # len("line 1\n")
        wait_for(lambda: (browser.evaluate("document.getElementById('logstate').textContent") or "")
                 .startswith("ended"), what="the replay from an offset")
        assert browser.evaluate(log_text).startswith("line 2\n")

        browser.goto(f"{url}workers")
        assert "no cluster control database" in browser.evaluate("document.body.innerText")
    finally:
        browser.close()
        assert stop(web) == 0
    assert (tmp_path / "runs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "run.png").stat().st_size > 1000


def _token_config(tmp_path: Path, mode: int = 0o600) -> tuple[Path, str]:
    """A config naming the token file by a RELATIVE path: it resolves against the config's directory
    (the tests run `ql` from another working directory)."""
    token = "t0ken-" + os.urandom(16).hex()
    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    token_file = secrets / "web.token"
    token_file.write_text(token + "\n")
    token_file.chmod(mode)
    config = tmp_path / "ql.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\nweb_token_file = "secrets/web.token"\n[limits]\n')
    return config, token


def test_a_non_local_bind_needs_the_token(tmp_path: Path) -> None:
    env = ql_env(tmp_path)
    data = str(tmp_path / "data")
    assert ql(["--data-dir", data, "run", "--", "sh", "-c", "echo hi"], env=env).returncode == 0
    refused = ql(["--data-dir", data, "web", "--listen", "0.0.0.0:0"], env=env, timeout=60)
    assert refused.returncode == 2 and "web_token_file" in refused.stderr and "Traceback" not in refused.stderr

    config, token = _token_config(tmp_path)
    web, url = _start_web(["--config", str(config)], env, tmp_path / "web.log", listen="0.0.0.0:0")
    try:
        port = url.rsplit(":", 1)[1].strip("/")
        base = f"http://127.0.0.1:{port}"
        status, body = http_get(base + "/")
        assert status == 401 and "<table" not in body
        assert http_get(base + "/runs/x/log")[0] == 401
        assert http_get(base + "/", {"Authorization": "Bearer " + token[:-1] + "x"})[0] == 401
        assert http_get(base + "/", {"Cookie": "ql_web_token=nope"})[0] == 401
        status, body = http_get(base + "/", {"Authorization": "Bearer " + token})
        assert status == 200 and "<table id=runs>" in body
        # The login form sets an HttpOnly cookie that then opens the pages.
        req = urllib.request.Request(base + "/login", data=f"token={token}".encode(), method="POST")

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                return None

        opener = urllib.request.build_opener(NoRedirect)
        try:
            opener.open(req, timeout=10)
            raise AssertionError("the login did not redirect")
        except urllib.error.HTTPError as exc:
            assert exc.code == 303
            cookie = exc.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert http_get(base + "/", {"Cookie": cookie.split(";", 1)[0]})[0] == 200
    finally:
        assert stop(web) == 0


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    env = ql_env(tmp_path)
    config, _token = _token_config(tmp_path, mode=0o644)
    assert ql(["--config", str(config), "run", "--", "sh", "-c", "exit 0"], env=env).returncode == 0
    done = ql(["--config", str(config), "web", "--listen", "0.0.0.0:0"], env=env, timeout=60)
    assert done.returncode == 2 and "chmod 600" in done.stderr
    assert "web_token_file" in done.stderr and "Traceback" not in done.stderr
    # A configured token is needed on loopback too: a bad file never degrades to "no token".
    done = ql(["--config", str(config), "web", "--listen", "127.0.0.1:0"], env=env, timeout=60)
    assert done.returncode == 2 and "chmod 600" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_token_file_of_another_user_is_refused(tmp_path: Path) -> None:
    env = ql_env(tmp_path)
    config, token = _token_config(tmp_path)
    assert ql(["--config", str(config), "run", "--", "sh", "-c", "exit 0"], env=env).returncode == 0
    os.chown(tmp_path / "secrets" / "web.token", 65534, 65534)  # nobody: still mode 0600
    done = ql(["--config", str(config), "web", "--listen", "127.0.0.1:0"], env=env, timeout=60)
    assert done.returncode == 2 and "owned by another user" in done.stderr and "web_token_file" in done.stderr
    assert token not in done.stderr + done.stdout


def test_web_token_file_is_a_top_level_path_key(tmp_path: Path) -> None:
    """The config validates the key like the other paths; the retired [plugin.web] form is refused
    (never ignored: its token would silently stop protecting the page)."""
    env = ql_env(tmp_path)
    config = tmp_path / "ql.toml"
    data = tmp_path / "data"
    cases = [
        (f'data_dir = "{data}"\nweb_token_file = 3\n', "web_token_file must be a path"),
        (f'data_dir = "{data}"\nweb_token_file = ""\n', "web_token_file must be a path"),
        (f'data_dir = "{data}"\nweb_token_file = "a\\u0000b"\n', "NUL"),
        (f'data_dir = "{data}"\n[plugin.web]\ntoken_file = "/x"\n', "web_token_file"),
        (f'data_dir = "{data}"\n[limits]\nweb_token_file = "/x"\n', "limits.web_token_file"),
    ]
    for text, expected in cases:
        config.write_text(text)
        done = ql(["--config", str(config), "web", "--listen", "127.0.0.1:0"], env=env, timeout=60)
        assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr, (text, done)
    config.write_text(f'data_dir = "{data}"\n')
    assert ql(["--config", str(config), "run", "--", "sh", "-c", "exit 0"], env=env).returncode == 0
    config.write_text(f'data_dir = "{data}"\nweb_token_file = "missing.token"\n')
    done = ql(["--config", str(config), "web", "--listen", "127.0.0.1:0"], env=env, timeout=60)
    assert done.returncode == 2 and str(tmp_path / "missing.token") in done.stderr, done.stderr

    from ql_core.config import load_config

    config.write_text(f'data_dir = "{data}"\nweb_token_file = "~/web.token"\n')
    loaded = load_config(config_path=config, environ={})
    assert loaded.web_token_file == Path(os.path.expanduser("~/web.token"))
    config.write_text(f'data_dir = "{data}"\n')
    assert load_config(config_path=config, environ={}).web_token_file is None


def test_without_the_web_extra_the_error_names_it(tmp_path: Path) -> None:
    """A Python that cannot import starlette gets the install hint, not a traceback."""
    env = ql_env(tmp_path)
    data = str(tmp_path / "data")
    assert ql(["--data-dir", data, "run", "--", "sh", "-c", "exit 0"], env=env).returncode == 0
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "starlette.py").write_text("raise ImportError('blocked for the test')\n")
    env["PYTHONPATH"] = str(blocker)
    done = ql(["--data-dir", data, "web"], env=env, timeout=60)
    assert done.returncode == 2 and "ql-runner[web]" in done.stderr, done.stderr


def test_the_standalone_profile_serves_the_same_pages(tmp_path: Path) -> None:
    env = ql_env(tmp_path)
    data = str(tmp_path / "data")
    done = ql(["--data-dir", data, "--profile", "standalone", "--json", "run", "--name", "solo", "--", "sh", "-c",
               "echo standalone-out; exit 4"], env=env)
    assert done.returncode == 4
    run_id = json.loads(done.stdout.splitlines()[-1])["run_id"]
    web, url = _start_web(["--data-dir", data, "--profile", "standalone"], env, tmp_path / "web.log")
    try:
        status, body = http_get(url + "?status=failed")
        assert status == 200 and run_id in body and "solo" in body
        status, body = http_get(f"{url}runs/{run_id}")
        assert status == 200 and "run.failed" in body and "<td>4</td>" in body
        status, body = http_get(f"{url}runs/{run_id}/log?offset=9")
        assert status == 200 and '"text": "e-out\\n"' in body and "event: end" in body
        assert http_get(f"{url}runs/{run_id}/log?offset=-1")[0] == 400
        assert http_get(f"{url}runs/nope")[0] == 404
        assert http_get(url + "?status=bogus")[0] == 400
    finally:
        assert stop(web) == 0
