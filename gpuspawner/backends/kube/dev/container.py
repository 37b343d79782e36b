"""What a container runtime gives a pod's process, as far as gpuspawner.backends.kube.dev.pods stands in for it.

- **Its own loopback and pod IP.** :data:`SHIM_C`, built with the machine's C compiler into the
  runner's folder and preloaded (``LD_PRELOAD``, with ``GPUSPAWNER_POD_IP``), maps a bind to
  ``0.0.0.0`` or ``127.0.0.1`` and a connection to ``127.0.0.1`` onto the pod's IP (a loopback
  address of its own): a server that listens on every address listens on its pod IP, and what a
  pod runs on its ``localhost`` (JupyterHub's proxy API, say) is the pod's alone, as in a network
  namespace. Python and Node (libuv) call the C library for both, so both are covered.
- **Its volumes.** In a mount namespace of its own (``unshare --mount``), each ``volumeMount`` of a
  ``configMap``, ``secret`` or ``emptyDir`` volume (with ``subPath``) is bind-mounted from the pod's
  folder onto its ``mountPath``; a path that does not exist on the machine is made on an overlay of
  its top folder (``/etc``, say), so nothing outside the pod changes. Other volume kinds
  (persistentVolumeClaim, hostPath, ...) are not mounted. Only as root; else no mounts.
- **Its user**: the mounts made, the process gives up root for the pod's uid, gid and groups, then
  execs the container's program.

``python -m gpuspawner.backends.kube.dev.container PLAN.json -- PROGRAM ARGS...`` is that last step (run
under ``unshare --mount --propagation private``); PLAN: ``{"mounts": [[source, target], ...],
"upper": folder for overlays, "user": [uid, gid, [groups]], "cwd": folder}``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SHIM_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static int pod_ip(struct in_addr *ip) {
    const char *text = getenv("GPUSPAWNER_POD_IP");
    return text && inet_pton(AF_INET, text, ip) == 1;
}

/* addr, or a copy in *out with the pod IP in place of the addresses that are the pod's own */
static const struct sockaddr *mapped(const struct sockaddr *addr, socklen_t len, int binding,
                                     struct sockaddr_in *out) {
    struct in_addr ip;
    if (!addr || addr->sa_family != AF_INET || len < sizeof(struct sockaddr_in) || !pod_ip(&ip))
        return addr;
    memcpy(out, addr, sizeof *out);
    in_addr_t a = ntohl(out->sin_addr.s_addr);
    if (a == INADDR_LOOPBACK || (binding && a == INADDR_ANY)) {
        out->sin_addr = ip;
        return (const struct sockaddr *)out;
    }
    return addr;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    struct sockaddr_in copy;
    if (!real) real = dlsym(RTLD_NEXT, "bind");
    return real(fd, mapped(addr, len, 1, &copy), len);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    struct sockaddr_in copy;
    if (!real) real = dlsym(RTLD_NEXT, "connect");
    return real(fd, mapped(addr, len, 0, &copy), len);
}
"""


def build_shim(folder: Path) -> Path:
    """:data:`SHIM_C` compiled into ``folder/podnet.so`` (readable by every pod's user)."""
    source, library = folder / "podnet.c", folder / "podnet.so"
    source.write_text(SHIM_C)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("pods cannot run here: no C compiler (cc) to build their loopback shim")
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"], check=True,
                   capture_output=True)
    library.chmod(0o755)
    return library


def command(plan: Path, argv: list[str]) -> list[str]:
    """How the runner starts a container: in a mount namespace of its own where it can make one (root)."""
    helper = [sys.executable, "-m", "gpuspawner.backends.kube.dev.container", str(plan), "--", *argv]
    if os.geteuid() == 0 and shutil.which("unshare"):
        return ["unshare", "--mount", "--propagation", "private", *helper]
    return helper


def _top_overlay(target: Path, upper: Path, done: set[str]) -> None:
    """Make ``target`` exist in this mount namespace: its top folder overlaid with one of the pod's own."""
    top = Path("/", target.parts[1])
    if str(top) in done or not top.is_dir():
        return
    name = target.parts[1]
    (upper / name / "upper").mkdir(parents=True, exist_ok=True)
    (upper / name / "work").mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={top},upperdir={upper / name / 'upper'},workdir={upper / name / 'work'}", str(top)],
                   check=True)
    done.add(str(top))


def mount_all(mounts: list[list[str]], upper: Path) -> None:
    overlaid: set[str] = set()
    for source, target in mounts:
        path = Path(target)
        if not path.exists():
            _top_overlay(path, upper, overlaid)
            if Path(source).is_dir():
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
        subprocess.run(["mount", "--bind", source, target], check=True)


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[0]).read_text())
    program = argv[argv.index("--") + 1:]
    if os.geteuid() == 0:
        if plan["mounts"]:
            mount_all(plan["mounts"], Path(plan["upper"]))
        uid, gid, groups = plan["user"]
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
    os.chdir(plan["cwd"])
    os.execv(program[0], program)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
