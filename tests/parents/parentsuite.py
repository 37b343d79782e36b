"""Run a parent spawner's own, unmodified test folder with a gpuspawner class in the parent's place.

The parents' test folders (kubespawner, dockerspawner, batchspawner at the versions
gpuspawner pins) are kept outside this repository, in ``../shared/parents`` beside
it (``GPUSPAWNER_PARENTS`` names another place). Each run is a separate pytest
process over that folder with the plugin :mod:`parentswap` loaded, writing a JUnit XML
report that :func:`run_suite` reads back. Nothing in the parents' folders is
edited or written to (no cache, no bytecode); what JupyterHub 6 or this machine
needs is adapted through ``extra_plugins`` and the environment.

Each result is also kept for the end of the test session, where ``conftest.py``
prints one table per parent: passed/total per mode, as the issue asked.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

from needs import missing

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODES = ("parent", "cpu", "default")
MODE_TITLES = {"parent": "parent class", "cpu": "GPU class, CPU-only profile",
               "default": "GPU class, default profiles"}


def parents_dir() -> Path:
    return Path(os.environ.get("GPUSPAWNER_PARENTS", REPO.parent / "shared" / "parents"))


def parent_tests(name: str, relative: str = "tests") -> Path:
    """A parent's test folder (``name`` as in ``../shared/parents``); skips (fails in CI) when absent."""
    path = parents_dir() / name / relative
    if not path.is_dir():
        missing(f"the parents' own test folders are not at {parents_dir()} (set GPUSPAWNER_PARENTS)")
    return path


@dataclass
class SuiteResult:
    total: int = 0
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # failures and errors, with the first line of why
    skipped: list[str] = field(default_factory=list)
    output: str = ""

    def summary(self) -> str:
        """passed/run; tests the suite skipped itself (say, those needing a real cluster) are counted apart."""
        run = self.total - len(self.skipped)
        return f"{len(self.passed)}/{run}" + (f" ({len(self.skipped)} skipped)" if self.skipped else "")


#: suite title -> mode -> result, for the tables printed at the end of the session
RESULTS: dict[str, dict[str, SuiteResult]] = {}
#: where each run's summary is also written (set by tests/conftest.py), so that the tables print
#: when the suites ran in pytest-xdist's worker processes
SUMMARIES = "GPUSPAWNER_SUITE_SUMMARIES"


def _remember(title: str, mode: str, result: SuiteResult) -> None:
    RESULTS.setdefault(title, {})[mode] = result
    folder = os.environ.get(SUMMARIES)
    if folder:
        name = hashlib.sha256(f"{title}\0{mode}".encode()).hexdigest()[:16]
        (Path(folder) / f"{name}.json").write_text(json.dumps([title, mode, result.summary()]))


def _summaries() -> dict[str, dict[str, str]]:
    found = {title: {mode: r.summary() for mode, r in by_mode.items()} for title, by_mode in RESULTS.items()}
    folder = os.environ.get(SUMMARIES)
    for path in sorted(Path(folder).glob("*.json")) if folder and Path(folder).is_dir() else ():
        title, mode, summary = json.loads(path.read_text())
        found.setdefault(title, {})[mode] = summary
    return found


@dataclass
class RunningSuite:
    """A suite's run started by :func:`start_suite`; :func:`finish_suite` waits for it and reads its result."""

    title: str
    mode: str
    report: Path
    proc: subprocess.Popen
    timeout: float
    output: Path


def start_suite(title: str, tests: Path, mode: str, *, targets: list[tuple[str, ...]], gpu_class: str,
                defaults: dict | None = None, extra_plugins: tuple[str, ...] = (), env: dict | None = None,
                args: tuple[str, ...] = (), workdir: Path, timeout: float = 1800) -> RunningSuite:
    """Start running ``tests`` in ``mode`` (see :mod:`parentswap`) in a pytest subprocess; several modes may
    run at once (each in its own ``workdir``), which saves the time a suite spends sleeping.

    ``extra_plugins`` are more ``-p`` plugins (importable from this folder or ``PYTHONPATH``
    in ``env``); ``args`` go to pytest (the parents' own ``addopts`` are replaced by none).
    """
    report = workdir / f"junit-{mode}.xml"
    swap = {"targets": [list(t) for t in targets], "gpu_class": gpu_class, "mode": mode,
            "defaults": defaults or {}}
    run_env = {**os.environ, **(env or {}), "GPUSPAWNER_SWAP": json.dumps(swap), "PYTHONDONTWRITEBYTECODE": "1"}
    run_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), run_env.get("PYTHONPATH", "")) if p)
    plugins = [x for p in ("parentswap", *extra_plugins) for x in ("-p", p)]
    command = [sys.executable, "-m", "pytest", str(tests), *plugins, "-o", "addopts=", "-p", "no:cacheprovider",
               "--rootdir", str(tests), "-q", "-rA", f"--junitxml={report}", *args]
    output = workdir / f"output-{mode}.txt"
    with open(output, "wb") as out:
        proc = subprocess.Popen(command, cwd=workdir, env=run_env, stdout=out, stderr=subprocess.STDOUT)
    return RunningSuite(title, mode, report, proc, timeout, output)


def finish_suite(running: RunningSuite) -> SuiteResult:
    """Wait for ``running`` (killed, by its pid, after its timeout) and return what passed, failed and skipped."""
    try:
        running.proc.wait(running.timeout)
    except subprocess.TimeoutExpired:
        running.proc.kill()
        running.proc.wait()
    result = read_junit(running.report) if running.report.exists() else SuiteResult()
    result.output = running.output.read_text(errors="replace")[-25000:]
    _remember(running.title, running.mode, result)
    return result


def run_suite(title: str, tests: Path, mode: str, **kwargs) -> SuiteResult:
    """Run ``tests`` in ``mode`` and return what passed, failed and skipped (:func:`start_suite`'s arguments)."""
    return finish_suite(start_suite(title, tests, mode, **kwargs))


def read_junit(path: Path) -> SuiteResult:
    result = SuiteResult()
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        result.total += 1
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            why = (problem.get("message") or "").splitlines()[0][:200] if problem.get("message") else ""
            result.failed.append(f"{name}: {why}")
        elif case.find("skipped") is not None:
            result.skipped.append(f"{name}: {(case.find('skipped').get('message') or '')[:200]}")
        else:
            result.passed.append(name)
    return result


COMPATIBILITY = REPO / "docs" / "compatibility.md"


def allowed_failures(section: str) -> dict[str, str]:
    """node id -> why, for the test artefacts ``docs/compatibility.md`` lists under ``section``.

    Lines of the form ``- artefact: `node id` (modes): why`` below the heading ``## section``
    (up to the next ``## `` heading). A suite's test fails on any other failure.
    """
    allowed: dict[str, str] = {}
    inside = False
    for line in COMPATIBILITY.read_text().splitlines():
        if line.startswith("## "):
            inside = line[3:].strip() == section
        elif inside and line.startswith("- artefact: `"):
            node, _, why = line[len("- artefact: `"):].partition("`")
            allowed[node] = why.strip(" :")
    return allowed


def artefact_applies(why: str, mode: str | None) -> bool:
    """Whether an artefact whose text is ``why`` (``(all modes): ...`` or ``(`cpu`, `default`): ...``) is
    allowed in ``mode`` (None: in any)."""
    modes, _, _ = why.partition(")")
    return mode is None or "all modes" in modes or f"`{mode}`" in modes


def allowed_in(section: str, mode: str | None = None) -> set[str]:
    """The node ids ``docs/compatibility.md`` lists as artefacts under ``section`` for ``mode``."""
    return {node for node, why in allowed_failures(section).items() if artefact_applies(why, mode)}


def unexpected(result: SuiteResult, section: str, mode: str | None = None) -> list[str]:
    """The failures of ``result`` that ``docs/compatibility.md`` does not list as artefacts (of ``mode``,
    where given)."""
    allowed = allowed_in(section, mode)
    return [f for f in result.failed if f.split(": ", 1)[0] not in allowed]


def tables() -> list[str]:
    """One line per suite: passed/total per mode, as a Markdown table."""
    summaries = _summaries()
    if not summaries:
        return []
    lines = ["| suite | " + " | ".join(MODE_TITLES[m] for m in MODES) + " |", "|---" * (len(MODES) + 1) + "|"]
    for title, by_mode in sorted(summaries.items()):
        lines.append(f"| {title} | " + " | ".join(by_mode.get(m, "-") for m in MODES) + " |")
    return lines
