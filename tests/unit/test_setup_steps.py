"""scripts/step: each long first-run step of scripts/setup and scripts/hub says what it does before it
starts, how far it is while it runs, and never stays silent; scripts/hub says where to log in once the
login page answers."""

from __future__ import annotations

import http.server
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from scriptmodule import load_script

REPO = Path(__file__).resolve().parents[2]
STEP = REPO / "scripts" / "step"


step = load_script(STEP, "scripts_step")


def run_step(what: str, program: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """scripts/step as scripts/setup runs it (the machine's python3), on a fake step written in Python."""
    return subprocess.run(["python3", str(STEP), *args, what, "--", sys.executable, "-c", program],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **env})


def test_a_docker_build_says_each_step_and_keeps_its_own_output_back():
    program = ("import sys\n"
               "for line in ['Step 1/3 : FROM gpuspawner-base:1', ' ---> 1234', 'Step 2/3 : RUN pip install x',\n"
               "             'Step 3/3 : COPY notebooks /srv']:\n"
               "    print(line, flush=True)\n")
    done = run_step("hub: building the single-user image", program, GPUSPAWNER_STEP_EVERY="0")
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert lines[0] == "hub: building the single-user image ..."  # before the command said anything
    assert any("step 2/3: RUN pip install x" in line for line in lines), lines
    assert any("step 3/3: COPY notebooks /srv" in line for line in lines), lines
    assert lines[-1].startswith("hub: building the single-user image: done (")
    assert " ---> 1234" not in done.stdout and "Step 1/3 : FROM" not in done.stdout


def test_a_silent_step_still_says_it_is_running():
    done = run_step("setup: building the JupyterLab extension", "import time; time.sleep(1.5)",
                    GPUSPAWNER_STEP_QUIET="0.2")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0] == "setup: building the JupyterLab extension ..."
    heartbeats = [line for line in lines[1:-1] if line.startswith("setup: building the JupyterLab extension ... ")]
    assert heartbeats and all(line.endswith(" s") for line in heartbeats), lines
    assert lines[-1].startswith("setup: building the JupyterLab extension: done (")


def test_a_failing_step_shows_its_output_and_exits_with_its_status():
    done = run_step("setup: pip install", "import sys; print('ERROR: No matching distribution'); sys.exit(3)")
    assert done.returncode == 3
    assert "ERROR: No matching distribution" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("setup: pip install: failed (exit status 3) after ")


def test_a_command_that_does_not_exist_is_named():
    done = subprocess.run(["python3", str(STEP), "setup: x", "--", "/nonexistent/tool"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 127 and "could not start /nonexistent/tool" in done.stdout


def feed(lines: list[str], total: int | None = None) -> str:
    progress = step.Progress(total)
    for line in lines:
        progress.feed(line)
    return progress.says()


def test_progress_read_from_each_tool_s_own_output():
    assert feed(["#7 [base 4/12] RUN apt-get update"]) == "step 4/12: RUN apt-get update"  # BuildKit
    assert feed(["Step 4/9 : RUN pip install x", "Collecting six"]) == "step 4/9, 1 packages collected: six"
    assert feed(["Obtaining file:///repo", "Collecting tornado>=6", "Collecting pyyaml[extra]<7",
                 "  Using cached tornado.whl", "Collecting traitlets"]) == "3 packages collected: traitlets"  # pip
    assert feed(["Collecting jinja2>=3.1"]) == "1 packages collected: jinja2"
    assert feed(["Installing collected packages: a, b, c"]) == "installing 3 packages"
    assert feed(["npm http fetch GET 200 https://registry.npmjs.org/uplot 12ms (cache hit)",
                 "npm http fetch GET 200 https://registry.npmjs.org/uplot/-/uplot-1.6.30.tgz 3ms (cache hit)"],
                total=275) == "1/275 packages fetched"  # npm ci --loglevel http
    assert feed(["0 upgraded, 57 newly installed, 0 to remove and 3 not upgraded.", "Get:1 http://deb x",
                 "Setting up libcjson1:amd64 (1.7.15-1) ..."]) == "1/57 packages set up: libcjson1:amd64"  # apt
    assert feed(["I: downloading packages with apt..."]) == "downloading packages with apt..."  # mmdebstrap
    assert feed(["asset lib_index_js.js 12 KiB [emitted]"]) == "asset lib_index_js.js 12 KiB [emitted]"


class _Login(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # (the standard library's name)
        self.send_response(200 if self.path == "/hub/login" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_hub_says_where_to_log_in_once_the_login_page_answers():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Login)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = io.StringIO()
        url = f"http://:{server.server_port}"  # as a bind_url may leave the host out
        assert step.announce(url, os.getpid(), time.time() - 83, password_set=False, out=out) == 0
    finally:
        server.shutdown()
        server.server_close()
    said = out.getvalue()
    assert said.startswith("hub: the login page answers, 83 s after scripts/hub started: open "
                           f"http://127.0.0.1:{server.server_port}/hub/login"), said
    assert 'password "gpu"' in said


def test_no_announcement_once_the_hub_is_gone():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    out = io.StringIO()
    assert step.announce("http://127.0.0.1:9", gone.pid, time.time(), password_set=True, out=out) == 1
    assert out.getvalue() == ""
