"""Shared fixtures: the stand-in NVML library, built once per test session, and the browser.

Servers run as unprivileged accounts (gpu-local makes one per hub user), and read
what the tests write for them (the stand-in NVML, its GPU files, notebooks) under
the tests' temporary folders. pytest makes those folders for root alone (mode 0700,
under ``/tmp/pytest-of-root``, which every root pytest run on the machine resets):
as root, this session's temporary folders lie in a folder of their own instead, and
each test's folder may be passed through (mode 0711: entered, not listed). The
hub's own files stay its own (the test hub's database is mode 0600).
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from hub import passable
from needs import missing
from parentsuite import SUMMARIES, tables

# Property tests draw new examples on every run here, and find new faults that way; in CI (CI=true) they
# draw the same examples every run, so that a landing is decided by the code, not by the draw.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the parents' suites' summaries, from any worker process
        summaries = Path(tempfile.mkdtemp(prefix="gpuspawner-suites-"))
        os.environ[SUMMARIES] = str(summaries)
        config._gpuspawner_summaries = summaries
    if os.geteuid() == 0 and config.option.basetemp is None and not hasattr(config, "workerinput"):
        top = Path(tempfile.mkdtemp(prefix="gpuspawner-tests-"))
        top.chmod(0o711)
        config.option.basetemp = str(top / "t")
        config._gpuspawner_tmp = top


#: the session fixtures that start an expensive part once per run (a dockerd and its images, a swarm, a Slurm
#: cluster, a PostgreSQL server, a Kubernetes control plane, Kueue on it) -> the pytest-xdist group whose tests share it
EXPENSIVE = {"dockerd": "docker", "engine": "docker", "swarm_engine": "docker", "suite_engine": "docker",
             "slurm_cluster": "slurm",
             "postgres": "postgres",
             "kube_cluster": "kube", "kueue": "kube"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n``, ``--dist loadgroup``), every test that uses one expensive part runs on
    the same worker, so each part still starts once per run; the other tests go wherever a core is free.

    Parts that one test uses together join one group (a test on dockerd and PostgreSQL puts every
    dockerd test and every PostgreSQL test on the same worker), so no part starts on two workers."""
    parts = {item: {EXPENSIVE[name] for name in getattr(item, "fixturenames", ()) if name in EXPENSIVE}
             for item in items}
    group = {part: part for part in set(EXPENSIVE.values())}

    def root(part: str) -> str:
        while group[part] != part:
            part = group[part]
        return part

    for used in parts.values():
        first, *others = sorted(used) or [""]
        for other in others:
            group[root(other)] = root(first)
    for item, used in parts.items():
        if used:
            item.add_marker(pytest.mark.xdist_group(root(next(iter(used)))))


def pytest_collection_finish(session):
    """Say so, rather than start a part on two workers at once, where pytest-xdist did not read the groups."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more): this pytest "
                                "and pytest-xdist do not work together; install the versions pyproject.toml names")


def pytest_terminal_summary(terminalreporter):
    """The parents' own test suites (tests/parents): one table line per suite, passed/total per mode."""
    lines = tables()
    if lines:
        terminalreporter.section("the parents' own test suites with gpuspawner's classes")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_unconfigure(config):
    summaries = getattr(config, "_gpuspawner_summaries", None)
    if summaries is not None:
        shutil.rmtree(summaries, ignore_errors=True)
    top = getattr(config, "_gpuspawner_tmp", None)
    if top is not None:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def tmp_path(tmp_path):
    """pytest's own, which servers (unprivileged accounts) may pass through."""
    return passable(tmp_path)


@pytest.fixture
def fresh_metrics():
    """No hub state's metrics served before or after the test (tests make several hubs in one process)."""
    from gpuspawner.state import stop_serving_hub_metrics

    stop_serving_hub_metrics()
    yield
    stop_serving_hub_metrics()


@pytest.fixture(scope="session")
def fakenvml_libdir(tmp_path_factory) -> Path:
    """Directory holding the stand-in libnvidia-ml.so.1, compiled from tests/fakenvml."""
    import fakenvml

    return passable(fakenvml.build(tmp_path_factory.mktemp("fakenvml")))


@pytest.fixture(scope="session")
def fakenvml_v1_libdir(tmp_path_factory) -> Path:
    """The stand-in without nvmlDeviceGetMemoryInfo_v2, as a driver before 510."""
    import fakenvml

    return passable(fakenvml.build(tmp_path_factory.mktemp("fakenvml-v1"), without_memory_v2=True))


@pytest.fixture(scope="session")
def chromium_installed() -> None:
    """Debian's Chromium is there; else the test skips (fails in CI)."""
    from chromium import CHROMIUM

    if not os.access(CHROMIUM, os.X_OK):
        missing(f"needs Debian's chromium at {CHROMIUM} (scripts/setup installs it)")


@pytest.fixture(scope="session")
def labextension_built() -> None:
    """The JupyterLab extension is built; else the test skips (fails in CI)."""
    from chromium import BUILT

    if not BUILT.exists():
        missing("the JupyterLab extension is not built (scripts/setup builds it)")


@pytest.fixture
def browser(chromium_installed):
    """A headless Chromium (Debian's), closed after the test."""
    from chromium import ARGS, CHROMIUM, playwright_sync_api

    with playwright_sync_api().sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory):
    """A real control plane for this test run: etcd (Debian), kube-apiserver, kube-scheduler and
    kube-controller-manager of gpuspawner.backends.kube.dev.cluster.KUBE_VERSION on loopback (client
    certificates, ``Node,RBAC``), with the recorded nodes (tests/kube/fixtures/nodes.json: two A100
    nodes, a MIG node, a time-sliced T4 node, a CPU node) as fake nodes kept Ready by its
    ``kubelet`` (a :class:`~gpuspawner.backends.kube.dev.kubelet.FakeKubelet`), whose runner (a
    :class:`~gpuspawner.backends.kube.dev.pods.ProcessRunner`) really runs the pods of the namespaces in its
    ``namespaces`` (``kube_namespace_running``), and whose nodes serve ``exec`` into them.

    The binaries are built on first use into ``~/.cache/gpuspawner/kube/<version>/bin``
    (``GPUSPAWNER_KUBE_CACHE``; minutes cold, nothing warm); the cluster starts in seconds. A
    :class:`~gpuspawner.backends.kube.dev.cluster.KubeCluster`: ``api(method, path, body)`` as its admin,
    ``admin_kubeconfig``, ``service_account(ns, name)``, ``kubelet.add_node(...)``. Tests share it:
    each works in a namespace of its own (``kube_namespace``) and leaves the standing nodes as they
    are. Here, not in tests/kube, so the tests there and kubespawner's own suite (tests/parents) share
    the one cluster. Where it cannot be built or started, the tests that use it skip, saying why (fail in CI).
    Every process is stopped by its pid at the end of the run.
    """
    from gpuspawner.backends.kube.dev.cluster import KubeCluster, build, cannot_start, start_watcher
    from kubefixtures import load

    why = cannot_start()
    if why:
        missing(why)
    try:
        build()
    except RuntimeError as error:
        missing(f"the Kubernetes control plane could not be built: {error}")
    from gpuspawner.backends.kube.dev.pods import ProcessRunner

    # pods really run (as local processes) only in the namespaces a test adds to ``kubelet.runner.namespaces``
    cluster = KubeCluster(tmp_path_factory.mktemp("kube"), runner=lambda kubelet: ProcessRunner(kubelet, set()))
    watcher = start_watcher(cluster.dir)  # stops it should this test process die without teardown
    try:
        cluster.start(nodes=load("nodes.json"))
        yield cluster
    finally:
        cluster.stop()
        watcher.terminate()
        watcher.wait()
