"""The Docker engine as gpu-docker meets it: whether one answers, and what its errors mean."""

from __future__ import annotations

import os

import docker.errors
import requests


def reachable_engine(timeout: float = 3.0) -> str | None:
    """The URL of the Docker engine ``DOCKER_HOST`` (or the local socket) names, if it answers."""
    url = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if url.startswith("unix://") and not os.path.exists(url[len("unix://"):]):
        return None
    try:
        client = docker.DockerClient(base_url=url, version="auto", timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except Exception:
        return None
    return url


#: Errors that mean "the engine did not answer", as opposed to "the engine said no".
UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)


def is_unreachable(error: BaseException) -> bool:
    if isinstance(error, UNREACHABLE):
        return True
    # docker-py wraps a failed version probe in a plain DockerException
    return type(error) is docker.errors.DockerException


class ImageUnavailable(docker.errors.NotFound):
    """The engine has no such image: its registry said "not found", or ``pull_policy`` is
    ``"never"`` and it is not on the host. Raised by ``pull_image`` where DockerSpawner
    raises ``docker.errors.NotFound`` (so code calling it sees what it always saw); a spawn
    answers it with 400 and :attr:`sentence` (DockerSpawner's own answer is a bare 500)."""

    def __init__(self, cause: docker.errors.NotFound, sentence: str) -> None:
        super().__init__(cause.args[0] if cause.args else sentence, response=cause.response,
                         explanation=cause.explanation)
        self.sentence = sentence
