"""Build the notebook images on a Docker engine that reaches no registry.

    .venv/bin/python images/build.py [--image singleuser|tensorflow|pytorch] [--tag NAME:TAG] [--cache build/images]

``singleuser`` (the default) is the minimal image; ``tensorflow`` adds CPU
TensorFlow (the ``tensorflow-cpu`` wheel: about 320 MB of wheels) and the GPU
benchmark notebook; ``pytorch`` adds PyPI's torch (CUDA libraries included,
several GB: not built by the tests); ``hub`` builds ``images/hub/Dockerfile``
(z2jh's hub image plus gpuspawner[kube]) from a copy of this checkout, on a
stand-in of z2jh's hub image (``images/z2jh-hub-standin``: its layout, built here).

The engine is the one ``DOCKER_HOST`` names (default: the local socket).
Three steps, each cached under ``--cache`` by a key of its inputs, so a rerun
(or a fresh engine in the next test session) takes seconds:

1. base image: a Debian bookworm root filesystem bootstrapped by
   ``mmdebstrap`` (python3, python3-venv, ca-certificates, libcjson1 for the
   stand-in NVML), then ``docker import``;
2. wheelhouse: ``pip download`` on this host for the image's Python (3.11.2,
   manylinux), plus a wheel of this checkout of gpuspawner;
3. ``docker build`` of ``images/IMAGE/Dockerfile`` with the base as the
   ``BASE_IMAGE`` build argument (context: the Dockerfile, ``wheels/`` and
   ``images/notebooks/``); the result is also ``docker save``d, and loaded
   from there when an engine lacks it.

Prints the image's tag when done. Containers never reach a package registry:
everything comes from the host.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from importlib import metadata
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parent.parent
IMAGES_DIR = ROOT / "images"
NOTEBOOKS_DIR = IMAGES_DIR / "notebooks"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "libcjson1")
PIP_TARGET = (
    "--only-binary=:all:", "--python-version", "3.11.2",
    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux_2_28_x86_64", "--platform", "any",
)


# image name -> (extra wheels, build arguments besides BASE_IMAGE)
IMAGES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "singleuser": ((), {}),
    "tensorflow": (("tensorflow-cpu", "nbclient"), {"TENSORFLOW": "tensorflow-cpu", "PIP_ARGS": "--no-index"}),
    "pytorch": (("torch", "nbclient"), {"TORCH": "torch", "PIP_ARGS": "--no-index"}),
}


def requirements(image: str = "singleuser") -> list[str]:
    """What the image installs besides gpuspawner; jupyterhub matches the hub's version."""
    hub = metadata.version("jupyterhub")
    base = [f"jupyterhub=={hub}", "jupyterlab", "jupyter_server", "nvidia-ml-py", "jinja2", "tornado", "traitlets"]
    named = {_name(r) for r in base}
    own = [r.partition(";")[0].strip() for r in metadata.requires("gpuspawner") or [] if ";" not in r]
    base += [r for r in own if _name(r) not in named]  # gpuspawner's other dependencies (apprise, ...)
    return base + list(IMAGES[image][0])


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


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
    """Run ``cmd``, its output passed on to stderr as it comes (how far it is: scripts/hub's step reads it)."""
    tail: deque[str] = deque(maxlen=80)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                          **kwargs) as proc:
        for line in proc.stdout:
            tail.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{''.join(tail)[-6000:]}")


def base_tarball(cache: Path, packages: tuple[str, ...] = BASE_PACKAGES, name: str = "base") -> Path:
    """A bootstrapped Debian root filesystem with ``packages`` (cached as ``<name>-<key>.tar``)."""
    key = _key(SUITE, packages, "apt")
    path = cache / f"{name}-{key}.tar"
    if path.exists():
        return path
    if not shutil.which("mmdebstrap"):
        raise RuntimeError("mmdebstrap is missing: apt-get install mmdebstrap (scripts/setup does)")
    _log(f"bootstrapping Debian {SUITE} with mmdebstrap (about a minute)")
    tmp = cache / f".{name}-{key}-{os.getpid()}.tar"  # mmdebstrap picks the format from ".tar"
    try:
        _run(["mmdebstrap", "--variant=apt", "--include=" + ",".join(packages), SUITE, str(tmp)])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def save_image(client: docker.DockerClient, tag: str, saved: Path, older: str) -> None:
    """``docker save`` image ``tag`` to ``saved`` (written whole, then renamed), replacing the older saves."""
    for old in saved.parent.glob(older):
        old.unlink()
    tmp = saved.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        for chunk in client.images.get(tag).save(named=True):
            f.write(chunk)
    os.replace(tmp, saved)


def download_wheels(cache: Path, prefix: str, reqs: list[str], what: str) -> Path:
    """``pip download`` of ``reqs`` for the images' Python into ``cache/<prefix>-<key>`` (cached by the list)."""
    path = cache / f"{prefix}-{_key(reqs, PIP_TARGET)}"
    if path.is_dir():
        return path
    _log(f"downloading wheels for {what}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{prefix}-", dir=cache))
    try:
        _run([sys.executable, "-m", "pip", "download", "--progress-bar", "off", *PIP_TARGET, "-d", str(tmp), *reqs])
        try:
            os.replace(tmp, path)
        except OSError:
            if not path.is_dir():  # else another build downloaded the same list first: use that one
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def wheelhouse(cache: Path, image: str = "singleuser") -> Path:
    """Wheels for the image's Python, downloaded on this host (cached by the requirement list)."""
    return download_wheels(cache, "wheels", list(requirements(image)), f"the {image} image")


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


def build(tag: str, cache: Path, client: docker.DockerClient | None = None, image: str = "singleuser") -> str:
    """Make ``tag`` exist on the engine; return the content-keyed tag it points at too."""
    if image not in IMAGES:
        raise RuntimeError(f"unknown image {image!r}: choose one of {', '.join(IMAGES)}")
    cache.mkdir(parents=True, exist_ok=True)
    client = client or docker.from_env(timeout=600)
    base = base_tarball(cache)
    wheels = wheelhouse(cache, image)
    wheel = gpuspawner_wheel(cache)
    dockerfile_dir = IMAGES_DIR / image
    buildargs = dict(IMAGES[image][1])
    notebooks = sorted(NOTEBOOKS_DIR.glob("*.ipynb")) if image != "singleuser" else []
    key = _key(base.name, wheels.name, wheel.parent.name, sorted(buildargs.items()),
               _tree_key([dockerfile_dir / "Dockerfile", *notebooks]))
    keyed = f"gpuspawner-{image}:{key}"
    saved = cache / f"{image}-{key}.tar"

    if not _has_image(client, keyed) and saved.exists():
        _log(f"loading {saved.name}")
        with open(saved, "rb") as f:
            client.images.load(f)
    if not _has_image(client, keyed):
        base_tag = _import_base(client, base)
        with tempfile.TemporaryDirectory(prefix=f"{image}-", dir=cache) as context:
            ctx = Path(context)
            shutil.copy(dockerfile_dir / "Dockerfile", ctx / "Dockerfile")
            shutil.copytree(wheels, ctx / "wheels")
            shutil.copy(wheel, ctx / "wheels" / wheel.name)
            shutil.copytree(NOTEBOOKS_DIR, ctx / "notebooks")
            _log(f"building {keyed}")
            _docker_build(client, path=str(ctx), tag=keyed, buildargs={"BASE_IMAGE": base_tag, **buildargs})
        _log(f"saving {saved.name}")
        save_image(client, keyed, saved, f"{image}-*.tar")
    built = client.images.get(keyed)
    repo, _, name_tag = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, "", "latest")
    built.tag(repo, name_tag)
    return keyed


HUB_BUILD_REQUIREMENTS = ("hatchling>=1.21", "hatch-jupyter-builder>=0.9")


def hub_wheelhouse(cache: Path) -> Path:
    """Wheels for ``pip install /src[kube]`` in the hub image: its dependencies and build backend."""
    deps = []
    for req in metadata.requires("gpuspawner") or []:
        name, _, marker = req.partition(";")
        if not marker or re.search(r"""extra\s*==\s*['"]kube['"]""", marker):
            deps.append(name.strip())
    deps = sorted(deps) + list(HUB_BUILD_REQUIREMENTS)
    return download_wheels(cache, "hubwheels", deps, "the hub image")


#: What the stand-in of zero-to-jupyterhub's hub image (images/z2jh-hub-standin) holds: z2jh 4.4.0's
#: JupyterHub and KubeSpawner, and a sample of what its image adds (images/hub/Dockerfile must keep them).
Z2JH_STANDIN_REQUIREMENTS = (
    "jupyterhub==5.5.0", "jupyterhub-kubespawner==7.0.0", "pycurl", "jupyterhub-idle-culler", "oauthenticator",
    "jupyterhub-nativeauthenticator", "jupyterhub-firstuseauthenticator", "jupyterhub-tmpauthenticator",
    "psycopg2-binary", "pymysql",
)


def z2jh_standin(cache: Path, client: docker.DockerClient) -> str:
    """The stand-in of z2jh's hub image on the engine (built once, then ``docker save``d under ``cache``)."""
    base = base_tarball(cache)
    reqs = list(Z2JH_STANDIN_REQUIREMENTS)
    dockerfile = IMAGES_DIR / "z2jh-hub-standin" / "Dockerfile"
    key = _key(base.name, reqs, PIP_TARGET, _tree_key([dockerfile]))
    keyed = f"gpuspawner-z2jh-hub-standin:{key}"
    saved = cache / f"z2jh-hub-standin-{key}.tar"
    if not _has_image(client, keyed) and saved.exists():
        with open(saved, "rb") as f:
            client.images.load(f)
    if _has_image(client, keyed):
        return keyed
    wheels = download_wheels(cache, "z2jh-wheels", reqs, "the stand-in of the z2jh hub image")
    base_tag = _import_base(client, base)
    with tempfile.TemporaryDirectory(prefix="z2jh-standin-", dir=cache) as context:
        ctx = Path(context)
        shutil.copy(dockerfile, ctx / "Dockerfile")
        shutil.copytree(wheels, ctx / "wheels")
        (ctx / "requirements.txt").write_text("\n".join(reqs) + "\n")
        _log(f"building {keyed}")
        _docker_build(client, path=str(ctx), tag=keyed, buildargs={"BASE_IMAGE": base_tag})
    save_image(client, keyed, saved, "z2jh-hub-standin-*.tar")
    return keyed


def _docker_build(client: docker.DockerClient, **kwargs) -> None:
    """``docker build``, its steps ("Step 4/12 : RUN ...") passed on to stderr as they come."""
    said = []
    for item in client.api.build(rm=True, forcerm=True, timeout=1800, decode=True, **kwargs):
        text = str(item.get("stream") or item.get("status") or "")
        said.append(text)
        sys.stderr.write(text)
        sys.stderr.flush()
        if "error" in item:
            raise RuntimeError(f"docker build failed: {item['error']}\n{''.join(said)[-4000:]}")


def build_hub(tag: str, cache: Path, client: docker.DockerClient | None = None) -> str:
    """Build ``images/hub/Dockerfile`` offline on the stand-in of z2jh's hub image (no cache of the result)."""
    cache.mkdir(parents=True, exist_ok=True)
    client = client or docker.from_env(timeout=600)
    base_tag = z2jh_standin(cache, client)
    wheels = hub_wheelhouse(cache)
    with tempfile.TemporaryDirectory(prefix="hub-", dir=cache) as context:
        ctx = Path(context)
        # the Dockerfile's context is the repository root: copy only what it reads
        (ctx / "images" / "hub").mkdir(parents=True)
        shutil.copy(IMAGES_DIR / "hub" / "Dockerfile", ctx / "images" / "hub" / "Dockerfile")
        shutil.copytree(wheels, ctx / "images" / "hub" / "wheels")
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, ctx / name)
        shutil.copytree(ROOT / "gpuspawner", ctx / "gpuspawner", ignore=shutil.ignore_patterns("__pycache__"))
        _log(f"building {tag}")
        _docker_build(client, path=str(ctx), dockerfile="images/hub/Dockerfile", tag=tag,
                      buildargs={"BASE_IMAGE": base_tag, "PIP_ARGS": "--no-index --find-links /tmp/wheels"})
    return tag


def _import_base(client: docker.DockerClient, base: Path) -> str:
    name, _, key = base.stem.partition("-")
    base_tag = f"gpuspawner-{name}:{key}"
    if not _has_image(client, base_tag):
        _log(f"importing {base.name} as {base_tag}")
        repo, _, btag = base_tag.partition(":")
        with open(base, "rb") as f:
            client.api.import_image_from_data(f, repository=repo, tag=btag)
    return base_tag


def _has_image(client: docker.DockerClient, name: str) -> bool:
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", choices=sorted([*IMAGES, "hub"]), default="singleuser")
    parser.add_argument("--tag", help="default: gpuspawner-IMAGE:latest")
    parser.add_argument("--cache", type=Path, default=ROOT / "build" / "images")
    parser.add_argument("--if-missing", action="store_true", help="do nothing if the engine has --tag already")
    args = parser.parse_args(argv)
    args.tag = args.tag or f"gpuspawner-{args.image}:latest"
    try:
        if args.if_missing and _has_image(docker.from_env(), args.tag):
            print(args.tag)
            return 0
        if args.image == "hub":
            build_hub(args.tag, args.cache.resolve())
        else:
            build(args.tag, args.cache.resolve(), image=args.image)
    except (RuntimeError, docker.errors.DockerException) as e:
        print(f"images/build: {e}", file=sys.stderr)
        return 1
    print(args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
