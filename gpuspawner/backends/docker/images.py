"""gpu-docker's images: DockerSpawner's pull by its ``pull_policy``, said in sentences, and the CUDA check.

A mixin of :class:`~gpuspawner.backends.docker.spawner.GPUDockerSpawner`: an image the engine
does not have and cannot get is :class:`~gpuspawner.backends.docker.engine.ImageUnavailable`
(400 with a sentence); an image needing a newer CUDA than the chosen GPUs' driver is refused
with 409 (:mod:`gpuspawner.compat`).
"""

from __future__ import annotations

import docker.errors
from traitlets.config import Configurable

from ... import compat
from ..errors import user_error
from .engine import ImageUnavailable


class DockerImagesMixin(Configurable):
    """Pulling the chosen image and checking the CUDA version it needs."""

    async def pull_image(self, image):
        """DockerSpawner's pull, by its ``pull_policy``; then the image's CUDA check.

        An image the engine does not have and cannot get (its registry says "not found", or
        ``pull_policy`` is ``"never"``) raises :class:`ImageUnavailable`, the
        ``docker.errors.NotFound`` DockerSpawner raises; a spawn answers it with 400.
        """
        self.gpu_event(f"Checking image {image}", 40)
        try:
            await super().pull_image(image)
        except docker.errors.NotFound as e:
            raise ImageUnavailable(e, self._missing_image(image, e)) from e
        except docker.errors.APIError as e:
            message = (f"Image {image} could not be pulled ({e.explanation or e}). "
                       "Ask an administrator to check the registry.")
            self.gpu_event(f"Failed: {message}", 100)
            raise user_error(500, message) from e
        await self._check_image_cuda(image)

    def _missing_image(self, image: str, error: docker.errors.APIError) -> str:
        if self.pull_policy.lower() == "never":
            return (f"Image {image} is not on the Docker host, and pull_policy 'never' keeps the hub from pulling "
                    "it. Choose another image, or ask an administrator to pull it.")
        return (f"Image {image} does not exist: its registry says {error.explanation or 'not found'}. "
                "Choose another image, or ask an administrator to publish it.")

    async def _check_image_cuda(self, image: str) -> None:
        """Refuse (409) an image needing a newer CUDA than the GPUs' driver; needs the image on this engine."""
        if not (self.check_cuda_compatibility and self.gpu_allocation):
            return
        try:
            info = await self.docker("inspect_image", image)
        except docker.errors.NotFound:
            # pull_policy "skip" (SwarmSpawner's default): the image may be only where the server runs
            self.log.info("%s: image %s is not on the engine at %s (pull_policy %r); its CUDA version is not checked",
                          self._log_name, image, self.engine_url, self.pull_policy)
            return
        config = info.get("Config") or {}
        try:
            requirements = compat.image_requirements(config.get("Env"), config.get("Labels"))
        except ValueError as e:
            self.log.warning("%s: image %s: %s; not checking its CUDA version", self._log_name, image, e)
            return
        problem = compat.check_image(image, requirements, compat.host_cuda(self.gpu_allocation))
        if problem:
            self.gpu_event(f"Refused: {problem}", 100)
            raise user_error(409, problem)
