"""Build the single-user image on a Docker engine that reaches no registry.

    .venv/bin/python images/build.py [--tag gpuspawner-singleuser:latest] [--cache build/images]

The engine is the one ``DOCKER_HOST`` names (default: the local socket).
Three steps, each cached under ``--cache`` by a key of its inputs, so a rerun
(or a fresh engine in the next test session) takes seconds:

1. base image: a Debian bookworm root filesystem bootstrapped by
   ``mmdebstrap`` (python3, python3-venv, ca-certificates, libcjson1 for the
   stand-in NVML), then ``docker import``;
2. wheelhouse: ``pip download`` on this host for the image's Python (3.11.2,
   manylinux), plus a wheel of this checkout of gpuspawner;
3. ``docker build`` of ``images/singleuser/Dockerfile`` with the base as the
   ``BASE`` build argument; the result is also ``docker save``d, and loaded
   from there when an engine lacks it.

Prints the image's tag when done. Containers never reach a package registry:
everything comes from the host.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE_DIR = ROOT / "images" / "singleuser"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "libcjson1")
PIP_TARGET = (
    "--only-binary=:all:", "--python-version", "3.11.2",
    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64", "--platform", "any",
)


def requirements() -> list[str]:
    """What the image installs besides gpuspawner; jupyterhub matches the hub's version."""
    hub = metadata.version("jupyterhub")
    return [f"jupyterhub=={hub}", "jupyterlab", "jupyter_server", "nvidia-ml-py", "jinja2", "tornado", "traitlets"]


def _key(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _tree_key(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _log(message: str) -> None:
    print(f"images/build: {message}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kwargs) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


def base_tarball(cache: Path) -> Path:
    """A bootstrapped Debian root filesystem (cached)."""
    key = _key(SUITE, BASE_PACKAGES, "apt")
    path = cache / f"base-{key}.tar"
    if path.exists():
        return path
    if not shutil.which("mmdebstrap"):
        raise RuntimeError("mmdebstrap is missing: apt-get install mmdebstrap (scripts/setup does)")
    _log(f"bootstrapping Debian {SUITE} with mmdebstrap (about a minute)")
    tmp = cache / f".base-{key}-{os.getpid()}.tar"  # mmdebstrap picks the format from ".tar"
    try:
        _run(["mmdebstrap", "--variant=apt", "--include=" + ",".join(BASE_PACKAGES), SUITE, str(tmp)])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def wheelhouse(cache: Path) -> Path:
    """Wheels for the image's Python, downloaded on this host (cached)."""
    reqs = requirements()
    key = _key(reqs, PIP_TARGET)
    path = cache / f"wheels-{key}"
    if path.is_dir():
        return path
    _log("downloading wheels for the image")
    tmp = Path(tempfile.mkdtemp(prefix=".wheels-", dir=cache))
    try:
        _run([sys.executable, "-m", "pip", "download", "-q", *PIP_TARGET, "-d", str(tmp), *reqs])
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def package_sources() -> list[Path]:
    return [p for p in (ROOT / "gpuspawner").rglob("*") if p.is_file() and "__pycache__" not in p.parts] + [
        ROOT / "pyproject.toml", ROOT / "README.md",
    ]


def gpuspawner_wheel(cache: Path) -> Path:
    key = _tree_key(package_sources())
    outdir = cache / f"gpuspawner-{key}"
    if not outdir.is_dir():
        tmp = Path(tempfile.mkdtemp(prefix=".gpuspawner-", dir=cache))
        try:
            _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp), str(ROOT)])
            os.replace(tmp, outdir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return next(outdir.glob("gpuspawner-*.whl"))


def build(tag: str, cache: Path, client: docker.DockerClient | None = None) -> str:
    """Make ``tag`` exist on the engine; return the content-keyed tag it points at too."""
    cache.mkdir(parents=True, exist_ok=True)
    client = client or docker.from_env(timeout=600)
    base = base_tarball(cache)
    wheels = wheelhouse(cache)
    wheel = gpuspawner_wheel(cache)
    dockerfile = (DOCKERFILE_DIR / "Dockerfile").read_bytes()
    key = _key(base.name, wheels.name, wheel.parent.name, hashlib.sha256(dockerfile).hexdigest())
    keyed = f"gpuspawner-singleuser:{key}"
    saved = cache / f"singleuser-{key}.tar"

    if not _has_image(client, keyed) and saved.exists():
        _log(f"loading {saved.name}")
        with open(saved, "rb") as f:
            client.images.load(f)
    if not _has_image(client, keyed):
        base_tag = f"gpuspawner-base:{base.stem.split('-', 1)[1]}"
        if not _has_image(client, base_tag):
            _log(f"importing {base.name} as {base_tag}")
            repo, _, btag = base_tag.partition(":")
            with open(base, "rb") as f:
                client.api.import_image_from_data(f, repository=repo, tag=btag)
        with tempfile.TemporaryDirectory(prefix="singleuser-", dir=cache) as context:
            ctx = Path(context)
            shutil.copy(DOCKERFILE_DIR / "Dockerfile", ctx / "Dockerfile")
            shutil.copytree(wheels, ctx / "wheels")
            shutil.copy(wheel, ctx / "wheels" / wheel.name)
            _log(f"building {keyed}")
            try:
                client.images.build(path=str(ctx), tag=keyed, buildargs={"BASE": base_tag}, rm=True, forcerm=True)
            except docker.errors.BuildError as e:
                lines = "".join(str(item.get("stream") or item.get("error") or "") for item in e.build_log)
                raise RuntimeError(f"docker build failed: {e}\n{lines[-4000:]}") from e
        _log(f"saving {saved.name}")
        for old in cache.glob("singleuser-*.tar"):
            old.unlink()
        tmp = saved.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            for chunk in client.images.get(keyed).save(named=True):
                f.write(chunk)
        os.replace(tmp, saved)
    image = client.images.get(keyed)
    repo, _, name_tag = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, "", "latest")
    image.tag(repo, name_tag)
    return keyed


def _has_image(client: docker.DockerClient, name: str) -> bool:
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="gpuspawner-singleuser:latest")
    parser.add_argument("--cache", type=Path, default=ROOT / "build" / "images")
    parser.add_argument("--if-missing", action="store_true", help="do nothing if the engine has --tag already")
    args = parser.parse_args(argv)
    try:
        if args.if_missing and _has_image(docker.from_env(), args.tag):
            print(args.tag)
            return 0
        build(args.tag, args.cache.resolve())
    except (RuntimeError, docker.errors.DockerException) as e:
        print(f"images/build: {e}", file=sys.stderr)
        return 1
    print(args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
