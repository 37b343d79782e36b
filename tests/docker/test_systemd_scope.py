"""gpu-local's systemd fence against a real systemd: PID 1 of a container on the private engine.

The container boots Debian's systemd 252; the test makes GPU device nodes in it
and runs, with ``docker exec``, exactly the ``systemd-run`` words gpuspawner puts
before a server's command (:func:`gpuspawner.backends.local.fence_systemd.scope_command`),
followed by a small opener. The opener runs as the user, in the start's own
scope, with the pid ``systemd-run`` had; its own GPU's node opens as far as a
node without a driver does (ENXIO), another GPU's is refused (EPERM), and the
scope is gone once it exits.

Limits, said plainly: the engine's host decides the cgroup version the
container's systemd uses (this machine: cgroup v1, so systemd enforces with the
v1 devices controller; a cgroup v2 host: with its BPF device program).
"""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from engine import ROOT
from gpuspawner.backends.local.fence_systemd import scope_command

SYSTEMD_PACKAGES = ("systemd", "systemd-sysv", "python3", "passwd")

OPENER = r"""
import json, os, sys
def attempt(path):
    try:
        os.close(os.open(path, os.O_RDWR))
        return "opened"
    except OSError as e:
        return e.strerror
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
scope = [l.rsplit("/", 1)[-1] for l in open("/proc/self/cgroup").read().splitlines() if ".scope" in l]
print(json.dumps({"pid": os.getpid(), "uid": os.getuid(), "scope": scope,
                  "open": {p: attempt(p) for p in sys.argv[1:]}}))
"""


def _build():
    spec = importlib.util.spec_from_file_location("images_build", ROOT / "images" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def systemd_container(dockerd):
    """A container whose PID 1 is systemd, running (or degraded: some units need real hardware)."""
    build = _build()
    cache = ROOT / "build" / "images"
    cache.mkdir(parents=True, exist_ok=True)
    image = build._import_base(dockerd.client, build.base_tarball(cache, SYSTEMD_PACKAGES, "systemd"))
    container = dockerd.client.containers.run(
        image, ["/lib/systemd/systemd"], detach=True, network_mode="none",
        cap_add=["SYS_ADMIN"], security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        device_cgroup_rules=["c 195:* rwm"],  # the container may use GPU nodes; the scope narrows that
        tmpfs={"/run": "", "/run/lock": "", "/tmp": ""},
        volumes={"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
        environment={"container": "docker"},
    )
    try:
        state = b""
        for _ in range(240):  # until systemd has booted (a few seconds), at most about a minute
            state = container.exec_run(["systemctl", "is-system-running"]).output.strip()
            if state in (b"running", b"degraded"):
                break
            time.sleep(0.25)
        assert state in (b"running", b"degraded"), f"systemd did not boot: {state!r}\n{container.logs()[-2000:]!r}"
        yield container
    finally:
        container.remove(force=True)


def sh(container, script: str) -> str:
    rc, out = container.exec_run(["sh", "-c", script])
    assert rc == 0, out.decode(errors="replace")
    return out.decode()


def test_a_scope_opens_only_its_own_gpu_node(systemd_container):
    c = systemd_container
    sh(c, "for n in 0 1; do mknod -m 666 /dev/nvidia$n c 195 $n; done; mknod -m 666 /dev/nvidiactl c 195 255;"
          " useradd --create-home ada")
    gid = int(sh(c, "id -g ada"))
    uid = int(sh(c, "id -u ada"))
    words = scope_command("hubA", "start1", [0], user="ada", group=gid)
    nodes = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/null", "/dev/ptmx"]
    # `exec` keeps the shell's pid for systemd-run, which must keep it for the server
    rc, out = c.exec_run(["sh", "-c", 'echo $$; exec "$@"', "sh", *words, "python3", "-c", OPENER, *nodes],
                         environment={"CUDA_VISIBLE_DEVICES": "GPU-0"})
    text = out.decode(errors="replace")
    assert rc == 0, text
    first, report = text.strip().splitlines()[0], json.loads(text.strip().splitlines()[-1])
    assert report["pid"] == int(first), "the server keeps the pid the hub started"
    assert report["uid"] == uid
    assert report["scope"] and all(s == "gpuspawner-hubA-start1.scope" for s in report["scope"])
    assert report["open"] == {
        "/dev/nvidia0": "No such device or address",  # its own GPU: the fence lets it through
        "/dev/nvidia1": "Operation not permitted",  # another GPU: refused by the kernel
        "/dev/nvidiactl": "No such device or address",
        "/dev/null": "opened",
        "/dev/ptmx": "opened",
    }
    units = sh(c, "systemctl list-units --all --no-legend 'gpuspawner-*'")
    assert units.strip() == "", f"the scope outlived its process: {units}"
    # the same command without the scope words: the container itself lets both GPU nodes through
    rc, out = c.exec_run(["python3", "-c", OPENER, "/dev/nvidia1"])
    assert json.loads(out.decode().strip().splitlines()[-1])["open"]["/dev/nvidia1"] == "No such device or address"
