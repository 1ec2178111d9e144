"""The command-line tools and the demo against what an operator may hand them.

* **Credentials in a URL** (``http://alice:PASSWORD@host/metrics``): ``doctor``, ``top`` and
  ``report`` send them to the server as HTTP Basic authentication (a real server on loopback that
  answers 401 without them proves it) and write them nowhere: not in stdout or stderr, not in the
  shareable HTML report, not in the ``--save`` snapshot file, not in a report rebuilt from it, not
  in an error message.
* **Duplicated samples** (an endpoint serving every family twice): the scrape is refused as
  Prometheus refuses it; ``doctor`` fails, ``top`` and ``report`` say so, and no summed (doubled)
  number is shown.
* **An admin token that is not UTF-8** (what ``os.environ`` and ``sys.argv`` make of such bytes):
  ``specobs demo`` exits 2 with one line naming where the token came from, no traceback.

The endpoints are real observers behind a real ``PrometheusSink(port=0)`` (tests/test_top.py's
:class:`Engine`), reached through :class:`Gate`, a small real HTTP server in front of them.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import http.server
import json
import math
import os
import re
import subprocess
import sys
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from specobs.tools import _client
from specobs.tools import _scrape as scr
from tests import test_top
from tests._hostile_server import Measured, run_measured
from tests.test_top import ROOT, Engine, cli_env, cli_here, closed_port_url

engines = test_top.engines
__all__ = ["engines"]

WAIT = "0.3"


# -- a real HTTP server in front of a real endpoint -----------------------------------------------


class Gate:
    """A stdlib HTTP server that forwards every GET (path and query) to ``upstream`` and serves
    what came back. With ``user``/``password`` it first asks for HTTP Basic authentication (401
    and ``WWW-Authenticate`` without the right pair). Under ``/dup`` it serves the upstream's body
    twice: ``/dup/metrics`` is ``/metrics`` with every sample repeated.

    ``allowed`` / ``refused`` count requests let through and turned away."""

    def __init__(self, upstream: str, user: str | None = None, password: str | None = None
                 ) -> None:
        self.upstream = upstream.rstrip("/")
        self.expected = None if user is None else "Basic " + base64.b64encode(
            f"{user}:{password}".encode()).decode()
        self.allowed = 0
        self.refused = 0
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner._serve(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-gate",
                                       daemon=True)
        self.thread.start()

    def _serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        if self.expected is not None and h.headers.get("Authorization") != self.expected:
            with self._lock:
                self.refused += 1
            body = b"authentication required\n"
            h.send_response(401)
            h.send_header("WWW-Authenticate", 'Basic realm="metrics"')
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        with self._lock:
            self.allowed += 1
        path, twice = h.path, h.path.startswith("/dup/")
        if twice:
            path = path.removeprefix("/dup")
        headers = {"Accept": h.headers.get("Accept", "*/*")}
        with httpx.Client(timeout=10) as client:
            got = client.get(self.upstream + path, headers=headers)
        body = got.content * (2 if twice else 1)
        h.send_response(got.status_code)
        h.send_header("Content-Type", got.headers.get("content-type", "text/plain"))
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def url(self, path: str, userinfo: str = "") -> str:
        return f"http://{userinfo + '@' if userinfo else ''}127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def gates() -> Iterator[Callable[..., Gate]]:
    made: list[Gate] = []

    def make(*args: Any, **kwargs: Any) -> Gate:
        gate = Gate(*args, **kwargs)
        made.append(gate)
        return gate

    try:
        yield make
    finally:
        for gate in made:
            gate.close()


def _secret() -> str:
    """A password that appears nowhere unless something leaks it."""
    return f"pw{uuid.uuid4().hex}"


def _leaks(secret: str, user: str, *texts: str) -> list[str]:
    """Every form of the credentials found in ``texts``: the password, ``user:password`` and the
    Basic authorization value (base64)."""
    forms = (secret, f"{user}:{secret}", base64.b64encode(f"{user}:{secret}".encode()).decode())
    return [form for form in forms for text in texts if form in text]


# -- N48: credentials in a URL --------------------------------------------------------------------


def test_display_url_drops_only_the_userinfo() -> None:
    d = _client.display_url
    assert d("http://alice:pw@127.0.0.1:9477/metrics") == "http://127.0.0.1:9477/metrics"
    assert d("https://alice@[::1]:443/m?q=a@b#x@y") == "https://[::1]:443/m?q=a@b#x@y"
    # Up to the authority's last @, as urlsplit and httpx read it.
    assert d("http://a:b@c@host:1/") == "http://host:1/"
    for plain in ("http://host:1/p@x", "http://[::1]:9/", "127.0.0.1:9477", "runs/a@b.jsonl"):
        assert d(plain) == plain
    # What the request is made with keeps them: httpx turns them into Basic authentication.
    assert scr.normalize_url("alice:pw@127.0.0.1:9") == "http://alice:pw@127.0.0.1:9/metrics"


def test_credentials_reach_the_server_and_nothing_the_tools_write(
    engines: Callable[..., Engine], gates: Callable[..., Gate], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret, user = _secret(), "alice"
    eng = engines(baseline=50.0).start()
    gate = gates(eng.url.removesuffix("/metrics"), user, secret)
    url = gate.url("/metrics", f"{user}:{secret}")
    clean = gate.url("/metrics")

    # Without the credentials the server turns the tools away: what follows is authenticated.
    rc, out, _ = cli_here(capsys, "doctor", clean, "--wait", WAIT)
    assert rc == 2 and "answered HTTP 401" in out, out  # unusable endpoint
    assert gate.refused == 1 and gate.allowed == 0

    # Exit 1 only for the test engine's fixed sampler, over the overhead budget.
    rc, out, err = cli_here(capsys, "doctor", url, "--wait", WAIT)
    assert rc == 1 and "(exit 1: a problem found)" in out, out + err
    assert re.search(r"^WARN +overhead +.*sampling is fixed", out, re.M), out
    assert out.splitlines()[0] == f"specobs doctor {clean}"
    assert re.search(r"^OK +cycles advancing +\d+ cycles in", out, re.M), out
    written = [out, err]
    rc, out, err = cli_here(capsys, "doctor", url, "--wait", WAIT, "--json")
    assert rc == 1 and json.loads(out)["url"] == clean, out + err
    written += [out, err]

    rc, out, err = cli_here(capsys, "top", url, "--once", "--plain", "--interval", "0.2")
    assert rc == 0, out + err
    rate = re.search(r"cycles/s=([\d.]+)", out)
    assert rate and float(rate.group(1)) > 0, out
    written += [out, err]

    page, saved = tmp_path / "run.html", tmp_path / "run.jsonl"
    rc, out, err = cli_here(capsys, "report", "--from", url, "--duration", "1", "--interval",
                            "0.5", "-o", str(page), "--save", str(saved))
    assert rc == 0, out + err
    assert f"sampled {clean} for" in err, err
    html_text, saved_text = page.read_text(), saved.read_text()
    assert f"<title>specobs report — {clean}</title>" in html_text
    assert json.loads(saved_text.splitlines()[0])["source"] == clean
    written += [out, err, html_text, saved_text]

    rebuilt = tmp_path / "again.html"
    rc, out, err = cli_here(capsys, "report", "--from", str(saved), "-o", str(rebuilt))
    assert rc == 0, out + err
    rebuilt_text = rebuilt.read_text()
    assert clean in rebuilt_text
    written += [out, err, rebuilt_text]

    assert _leaks(secret, user, *written) == []
    # doctor 2 + 2, top 2, report 3 scrapes: every one authenticated, none turned away.
    assert gate.allowed >= 9 and gate.refused == 1


def test_an_older_snapshot_file_with_credentials_does_not_carry_them_into_a_report(
    engines: Callable[..., Engine], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    secret = _secret()
    eng = engines().start()
    page, saved = tmp_path / "run.html", tmp_path / "run.jsonl"
    rc, out, err = cli_here(capsys, "report", "--from", eng.url, "--duration", "1",
                            "--interval", "0.5", "-o", str(page), "--save", str(saved))
    assert rc == 0, out + err
    # What a version that saved the URL as given wrote.
    lines = saved.read_text().splitlines()
    header = json.loads(lines[0])
    with_credentials = eng.url.replace("http://", f"http://alice:{secret}@")
    header["source"] = with_credentials
    saved.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    rc, out, err = cli_here(capsys, "report", "--from", str(saved), "-o", str(page))
    assert rc == 0, out + err
    text = page.read_text()
    assert eng.url in text
    assert _leaks(secret, "alice", out, err, text) == []


@pytest.mark.parametrize("tool", [
    ["doctor", "{url}", "--wait", "0"],
    ["doctor", "{url}", "--wait", "0", "--json"],
    ["top", "{url}", "--once", "--plain", "--interval", "0.05"],
    ["report", "--from", "{url}", "--duration", "1", "--interval", "0.5"],
    ["top", "--prometheus", "{base}", "--once", "--plain", "--interval", "0.05"],
    ["report", "--prometheus", "{base}", "--last", "1m"],
], ids=["doctor", "doctor-json", "top", "report", "top-prometheus", "report-prometheus"])
def test_error_messages_leave_the_credentials_out(
    tool: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret, user = _secret(), "bob"
    dead = closed_port_url()
    base = dead.removesuffix("/metrics")
    args = [a.format(url=dead.replace("http://", f"http://{user}:{secret}@"),
                     base=base.replace("http://", f"http://{user}:{secret}@")) for a in tool]
    if args[0] == "report":
        args += ["-o", str(tmp_path / "x.html")]
    rc, out, err = cli_here(capsys, *args)
    # doctor: an unusable endpoint is exit 2; top and report: 1.
    assert rc == (2 if args[0] == "doctor" else 1), out + err
    shown = base if "--prometheus" in args else dead
    assert f"cannot connect to {shown}" in out + err, out + err
    assert _leaks(secret, user, out, err) == []


@pytest.mark.parametrize("url", [
    "http://alice:{pw}@127.0.0.1:99999/metrics",
    "ftp://alice:{pw}@127.0.0.1:21/metrics",
    "alice:{pw}@127.0.0.1:99999",
])
@pytest.mark.parametrize("tool", ["doctor", "top", "report"])
def test_usage_errors_leave_the_credentials_out(
    tool: str, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = _secret()
    given = url.format(pw=secret)
    rc, out, err = cli_here(capsys, *((tool, given) if tool != "report" else
                                      (tool, "--from", given)))
    assert rc == 2, out + err
    assert err.startswith(f"specobs {tool}: ") and "127.0.0.1" in err, err
    assert _leaks(secret, "alice", out, err) == []


@pytest.mark.slow
def test_top_and_report_authenticate_to_prometheus_and_leave_it_out(
    prometheus_server: Callable[..., Any], engines: Callable[..., Engine],
    gates: Callable[..., Gate], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    secret, user = _secret(), "bob"
    eng = engines(baseline=50.0).start()
    target = f"127.0.0.1:{eng.port}"
    server = prometheus_server([target])
    server.wait_for_target_up(timeout_seconds=20)
    selector = f'{{job="specobs",instance="{target}"}}'
    server.wait_for(f"increase(specobs_cycles_total{selector}[5s])",
                    lambda r: bool(r) and float(r[0]["value"][1]) > 0, timeout_seconds=20)
    gate = gates(server.url, user, secret)
    base = gate.url("", f"{user}:{secret}")

    rc, out, err = cli_here(capsys, "top", "--prometheus", base, "--selector", selector,
                            "--window", "5s", "--once", "--plain")
    assert rc == 0, out + err
    assert "clock=gpu" in out and "accept=50.0%" in out, out
    written = [out, err]
    page = tmp_path / "prom.html"
    rc, out, err = cli_here(capsys, "report", "--prometheus", base, "--selector", selector,
                            "--last", "10s", "--step", "5s", "-o", str(page))
    assert rc == 0, out + err
    text = page.read_text()
    assert gate.url("") in text
    written += [out, err, text]
    assert _leaks(secret, user, *written) == []
    assert gate.allowed > 0 and gate.refused == 0


# -- N44: duplicated samples ----------------------------------------------------------------------


def test_a_real_exposition_has_no_duplicates_and_twice_over_is_refused(
    engines: Callable[..., Engine],
) -> None:
    eng = engines(traces=True)
    eng.run(20)
    with httpx.Client(timeout=5) as client:
        text = client.get(eng.url).text
        openmetrics = client.get(eng.url, headers={"Accept": scr.OPENMETRICS_ACCEPT}).text
    assert scr.parse_exposition(text).total("specobs_cycles_total") == 20
    assert scr.parse_exposition(openmetrics).total("specobs_cycles_total") == 20
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    with pytest.raises(scr.ScrapeError) as err:
        scr.parse_exposition(text + text)
    message = str(err.value)
    assert f"the body has {samples} duplicate samples" in message
    assert "duplicate sample for timestamp" in message
    # NaN samples are skipped, but a repeated one is a duplicate all the same.
    with pytest.raises(scr.ScrapeError, match="has 1 duplicate sample "):
        scr.parse_exposition("specobs_x NaN\nspecobs_x NaN\n")
    # Only the name is quoted: label values are the server's text.
    with pytest.raises(scr.ScrapeError) as err:
        scr.parse_exposition('a{l="\x1b[2J"} 1\na{l="\x1b[2J"} 1\n')
    assert "\x1b" not in str(err.value) and "first: a)" in str(err.value)


def test_doctor_top_and_report_refuse_an_endpoint_serving_every_sample_twice(
    engines: Callable[..., Engine], gates: Callable[..., Gate], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    eng = engines(baseline=50.0).start()
    gate = gates(eng.url.removesuffix("/metrics"))

    # The same endpoint once over: all good (the gate changes nothing).
    rc, out, err = cli_here(capsys, "doctor", gate.url("/metrics"), "--wait", WAIT, "--json")
    report = json.loads(out)
    assert rc == 1, out + err  # the test engine's fixed sampler, over the overhead budget
    assert [c["name"] for c in report["checks"] if c["verdict"] in ("WARN", "FAIL")] == \
        ["overhead"]

    dup = gate.url("/dup/metrics")
    rc, out, err = cli_here(capsys, "doctor", dup, "--wait", WAIT, "--json")
    assert rc == 2 and err == "", err
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["reachable"]["verdict"] == "OK"
    assert checks["specobs endpoint"]["verdict"] == "FAIL"
    reason = checks["specobs endpoint"]["reason"]
    assert reason.startswith(f"{dup}: the body has ") and "duplicate samples" in reason, reason
    # No number from the doubled body: every later check is skipped.
    assert {c["verdict"] for n, c in checks.items()
            if n not in ("reachable", "specobs endpoint")} == {"SKIP"}

    rc, out, err = cli_here(capsys, "doctor", dup, "--wait", WAIT)
    assert rc == 2
    assert re.search(r"^FAIL +specobs endpoint +.*duplicate samples", out, re.M), out

    rc, out, err = cli_here(capsys, "top", dup, "--once", "--plain", "--interval", "0.05")
    assert rc == 1, out + err
    lines = out.splitlines()
    assert len(lines) == 2 and all("error: the body has " in ln and "duplicate samples" in ln
                                   for ln in lines), out
    assert "cycles/s=" not in out

    rc, out, err = cli_here(capsys, "report", "--from", dup, "--duration", "1", "--interval",
                            "0.5", "-o", str(tmp_path / "x.html"))
    assert rc == 1 and err.count("\n") == 1 and "duplicate samples" in err, err
    assert not (tmp_path / "x.html").exists()


# -- N59: an admin token that is not UTF-8 --------------------------------------------------------


def _demo(argv: list[bytes], token: bytes | None) -> subprocess.CompletedProcess[bytes]:
    env = {k.encode(): v.encode() for k, v in cli_env().items()}
    if token is not None:
        env[b"SPECOBS_DEMO_ADMIN_TOKEN"] = token
    return subprocess.run(
        [sys.executable.encode(), b"-m", b"specobs.cli", b"demo", b"--port", b"1",
         b"--cache-dir", b"/nonexistent", *argv],
        capture_output=True, env=env, cwd=ROOT, timeout=120, check=False,
        stdin=subprocess.DEVNULL,
    )


NOT_UTF8 = b"\xff\xfe" + binascii.hexlify(os.urandom(16))


@pytest.mark.parametrize("where", ["env", "flag"])
def test_an_admin_token_that_is_not_utf8_is_one_line_and_exit_2(where: str) -> None:
    result = (_demo([], NOT_UTF8) if where == "env"
              else _demo([b"--admin-token", NOT_UTF8], None))
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, err
    name = "SPECOBS_DEMO_ADMIN_TOKEN" if where == "env" else "--admin-token"
    assert err.splitlines() == [
        f"specobs demo: {name} is not UTF-8 text (it holds bytes that do not decode as UTF-8); "
        "make one with: python -c 'import secrets; print(secrets.token_hex(16))'"
    ], err
    assert b"Traceback" not in result.stdout + result.stderr
    # The secret part of the token is not printed.
    assert NOT_UTF8[2:] not in result.stdout + result.stderr


def test_create_app_refuses_a_token_that_is_not_utf8() -> None:
    pytest.importorskip("fastapi")
    from specobs.demo._server import admin_token_problem, create_app

    token = NOT_UTF8.decode("utf-8", "surrogateescape")
    assert admin_token_problem(token) is not None
    assert admin_token_problem("short") is not None
    assert admin_token_problem("é" * 16) is None
    # Checked before the engine is touched: no engine needed to see the refusal.
    with pytest.raises(ValueError, match=r"^the admin token is not UTF-8 text"):
        create_app(cast(Any, None), admin_token=token)


# -- a token in a URL's query string --------------------------------------------------------------


def test_display_url_redacts_credential_parameters() -> None:
    d = _client.display_url
    assert d("http://a:pw@h:1/metrics?access_token=S3CRET") == \
        "http://h:1/metrics?access_token=REDACTED"
    assert d("http://h/m?x=1&api_key=K1&y=2") == "http://h/m?x=1&api_key=REDACTED&y=2"
    assert d("https://h/m?X-Amz-Signature=ab&X-Amz-Credential=c&region=eu") == \
        "https://h/m?X-Amz-Signature=REDACTED&X-Amz-Credential=REDACTED&region=eu"
    assert d("http://h/m?client_secret=s;password=p&Token=t&jwt=j") == \
        "http://h/m?client_secret=REDACTED;password=REDACTED&Token=REDACTED&jwt=REDACTED"
    assert d("http://h/m#access_token=T&state=s") == "http://h/m#access_token=REDACTED&state=s"
    # Names that only contain a shorter word, valueless parameters and non-credentials stay.
    for plain in ("http://h/m?monkey=3&match[]=up", "http://h/m?token", "http://h/m?key=",
                  "http://h/m?q=a@b#x@y"):
        assert d(plain) == plain
    assert _client.scrub("404: /metrics?access_token=S3CRET%2B1 not found",
                         "http://h/metrics?access_token=S3CRET%2B1") == \
        "404: /metrics?access_token=REDACTED not found"


def test_a_token_in_the_query_string_reaches_the_server_and_nothing_the_tools_write(
    engines: Callable[..., Engine], gates: Callable[..., Gate], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--from "http://host/metrics?access_token=..."`` (an endpoint behind a proxy that takes
    its token in the query): the token went into the report HTML (7 times), the ``--save``
    file, stdout and ``doctor --json``. Now every URL the tools print or save goes through
    the one redaction; the request still carries the token."""
    token = _secret()
    eng = engines(baseline=50.0).start()
    gate = gates(eng.url.removesuffix("/metrics"))
    url = gate.url(f"/metrics?access_token={token}&x-api-key={token}k&view=all")
    shown = gate.url("/metrics?access_token=REDACTED&x-api-key=REDACTED&view=all")
    written = []
    rc, out, err = cli_here(capsys, "doctor", url, "--wait", WAIT, "--json")
    assert json.loads(out)["url"] == shown, out + err
    written += [out, err]
    rc, out, err = cli_here(capsys, "top", url, "--once", "--plain", "--interval", "0.2")
    assert rc == 0, out + err
    written += [out, err]
    page, saved = tmp_path / "run.html", tmp_path / "run.jsonl"
    rc, out, err = cli_here(capsys, "report", "--from", url, "--duration", "1", "--interval",
                            "0.5", "-o", str(page), "--save", str(saved), "--json")
    assert rc == 0, out + err
    html_text, saved_text = page.read_text(), saved.read_text()
    assert json.loads(saved_text.splitlines()[0])["source"] == shown
    assert shown.replace("&", "&amp;") in html_text or shown in html_text
    written += [out, err, html_text, saved_text]
    # A server that echoes the request in its error: the one-line message leaves it out.
    echo = _Echo404()
    try:
        for tool in (["doctor", echo.url(token), "--wait", "0"],
                     ["report", "--from", echo.url(token), "-o", str(tmp_path / "x.html")]):
            rc, out, err = cli_here(capsys, *tool)
            assert rc in (1, 2) and "answered HTTP 404" in out + err, out + err
            assert "access_token=REDACTED" in out + err
            written += [out, err]
        assert echo.seen == 2
    finally:
        echo.close()
    assert token not in "".join(written)
    assert gate.allowed >= 6  # every request went out with the token


class _Echo404:
    """A server that answers 404 quoting the request line, query string included."""

    def __init__(self) -> None:
        owner = self
        self.seen = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.seen += 1
                body = f"no such page: {self.path}\n".encode()
                self.send_response(404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, token: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/m?access_token={token}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- snapshot files that are too big, nested, or not numbers --------------------------------------


@pytest.fixture
def saved_run(engines: Callable[..., Engine], tmp_path: Path,
              capsys: pytest.CaptureFixture[str]) -> Path:
    """A real ``--save`` file: six scrapes of a real endpoint."""
    eng = engines(baseline=50.0).start()
    saved = tmp_path / "run.jsonl"
    rc, out, err = cli_here(capsys, "report", "--from", eng.url, "--duration", "1", "--interval",
                            "0.2", "-o", str(tmp_path / "first.html"), "--save", str(saved))
    assert rc == 0, out + err
    return saved


def _rows(saved: Path) -> tuple[str, list[dict[str, Any]]]:
    lines = saved.read_text().splitlines()
    return lines[0], [json.loads(line) for line in lines[1:]]


def _grown(saved: Path, dest: Path, n: int) -> Path:
    """``n`` rows continuing the real run of ``saved`` at its own pace: row i is the first row
    plus i times what the run added from its first scrape to its last (every counter grows,
    every histogram stays one), a scrape apart in time as the run's were on average."""
    header, rows = _rows(saved)
    first, last = rows[0], rows[-1]
    end = {(name, json.dumps(labels, sort_keys=True)): v for name, labels, v in last["samples"]}
    step = (last["t"] - first["t"]) / (len(rows) - 1)
    scale = 1 / (len(rows) - 1)
    opener: Any = gzip.open if dest.name.endswith(".gz") else open
    with opener(dest, "wt") as f:
        f.write(header + "\n")
        for i in range(n):
            samples = [[name, labels,
                        v + (end[(name, json.dumps(labels, sort_keys=True))] - v) * i * scale]
                       for name, labels, v in first["samples"]]
            f.write(json.dumps({"t": round(first["t"] + step * i, 6), "fetch_seconds": 0.01,
                                "samples": samples}, separators=(",", ":")) + "\n")
    return dest


def _report(path: Path, tmp_path: Path, *extra: str) -> Measured:
    return run_measured(["report", "--from", str(path), "-o", str(tmp_path / "r.html"), *extra],
                        env=cli_env(), cwd=str(ROOT), kill_after=240)


def test_a_long_snapshot_file_is_read_in_one_pass_and_thinned(
    saved_run: Path, tmp_path: Path
) -> None:
    """A day of ``--save`` (1 GB, about 50,000 rows) ran over 120 s at 2.7 GB before. A file is
    now read line by line and thinned evenly to at most ``MAX_SNAPSHOTS`` rows, first and last
    kept, so its whole-run totals are the file's own; stderr says how many were used. The test
    file is 4,000 rows (about 100 MB) of a real run continued; memory stays that of a few
    hundred snapshots."""
    from specobs.tools.report import _data

    rows = 4000
    for name in ("long.jsonl", "long.jsonl.gz"):
        path = _grown(saved_run, tmp_path / name, rows)
        got = _report(path, tmp_path, "--json")
        assert got.returncode == 0, got
        kept = re.search(r": ([\d,]+) snapshots; the report uses ([\d,]+) of them", got.output)
        assert kept is not None, got
        assert int(kept.group(1).replace(",", "")) == rows
        assert _data.MAX_SNAPSHOTS // 2 <= int(kept.group(2).replace(",", "")) <= \
            _data.MAX_SNAPSHOTS + 1
        summary = json.loads(got.output[got.output.index("{"):got.output.rindex("}") + 1])
        _, first_rows = _rows(saved_run)
        per_step = (sum(v for n, _, v in first_rows[-1]["samples"] if n == "specobs_cycles_total")
                    - sum(v for n, _, v in first_rows[0]["samples"]
                          if n == "specobs_cycles_total")) / (len(first_rows) - 1)
        run = summary["runs"][0]
        assert run["breakdown"]["cycles"] == pytest.approx(per_step * (rows - 1), rel=1e-9)
        assert run["duration_seconds"] == pytest.approx(
            (first_rows[-1]["t"] - first_rows[0]["t"]) / (len(first_rows) - 1) * (rows - 1),
            rel=1e-6)
        assert got.peak_rss_mb < 400, got  # the whole file parsed: gigabytes


@pytest.mark.parametrize("what", ["bomb", "long_line", "many_lines", "max_bytes"])
def test_a_snapshot_file_is_bounded_before_it_is_parsed(
    what: str, saved_run: Path, tmp_path: Path
) -> None:
    """A 3 MB gzip that inflates to 3 GiB on one line took 48 s and 3.2 GB and ended in a
    MemoryError traceback; ``--max-bytes`` did not apply to files. Each bound now stops the
    read where it is reached, with one line and exit 1: a line over 64 MiB (gzip bomb or
    plain), more than a million lines, more than ``--max-bytes`` in all (after
    decompression)."""
    header = saved_run.read_text().splitlines()[0] + "\n"
    extra: tuple[str, ...] = ()
    if what == "bomb":  # 1 MB of gzip, 1 GiB inflated, one line
        path = tmp_path / "bomb.jsonl.gz"
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        with open(path, "wb") as f:
            f.write(z.compress(header.encode()))
            block = b"a" * (1 << 20)
            for _ in range(1024):
                f.write(z.compress(block))
            f.write(z.flush())
        expected = "line 2 is longer than 64 MiB"
    elif what == "long_line":
        path = tmp_path / "line.jsonl"
        with open(path, "w") as f:
            f.write(header + '{"t": 1, "samples": [' + "0," * (50 << 20))
        expected = "line 2 is longer than 64 MiB"
    elif what == "many_lines":
        path = tmp_path / "lines.jsonl"
        path.write_text(header + "\n" * 3_000_000)
        expected = "has more than 1,000,000 lines"
    else:
        path = _grown(saved_run, tmp_path / "some.jsonl.gz", 200)
        extra = ("--max-bytes", "1MiB")
        expected = "holds more than 1 MiB (after decompression; line "
    got = _report(path, tmp_path, *extra)
    assert got.returncode == 1, got
    lines = got.output.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in got.output, got
    assert got.peak_rss_mb < 400, got


def _corrupted(saved: Path, dest: Path, how: str) -> Path:
    header, rows = _rows(saved)
    if how == "inf":
        rows[-1]["samples"] = [[n, lab, math.inf if n == "specobs_cycles_total" else v]
                               for n, lab, v in rows[-1]["samples"]]
    elif how == "1e308":
        rows[-1]["samples"] = [[n, lab, 1e308 if n == "specobs_cycles_total" else v]
                               for n, lab, v in rows[-1]["samples"]]
    elif how == "nan":
        rows[2]["samples"] = [[n, lab, math.nan if n == "specobs_cycles_total" else v]
                              for n, lab, v in rows[2]["samples"]]
    elif how == "backwards":
        for i, row in enumerate(rows):
            row["t"] = 1_800_000_000.0 - i
    elif how == "same_time":
        rows[3]["t"] = rows[2]["t"]
    text = [header] + [json.dumps(r) for r in rows]
    if how == "nested_row":
        text.insert(2, "[" * 200_000)
    elif how == "nested_header":
        text[0] = "[" * 200_000
    dest.write_text("\n".join(text) + "\n")
    return dest


@pytest.mark.parametrize(("how", "expected"), [
    ("inf", "sample specobs_cycles_total has value inf"),
    ("1e308", "sample specobs_cycles_total has value 1e+308"),
    ("nan", "sample specobs_cycles_total has value nan"),
    ("backwards", "not after line 2's"),
    ("same_time", "not after line 4's"),
    ("nested_row", "line 3 is not a snapshot (RecursionError"),
    ("nested_header", "is not a specobs snapshot file"),
])
def test_a_snapshot_file_with_impossible_values_is_refused_in_one_line(
    how: str, expected: str, saved_run: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``inf``, 1e308 or time running backwards gave a report and exit 0 ("inf cycles over 6 s",
    a 300-digit count, "cycles over -6 s"); nested JSON gave a RecursionError traceback."""
    path = _corrupted(saved_run, tmp_path / f"{how}.jsonl", how)
    rc, out, err = cli_here(capsys, "report", "--from", str(path), "-o", str(tmp_path / "x.html"))
    assert rc == 1, out + err
    assert expected in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not (tmp_path / "x.html").exists()
