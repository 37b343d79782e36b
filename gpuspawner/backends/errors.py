"""The one way a backend answers a user with an HTTP error JupyterHub shows as it is."""

from __future__ import annotations

from tornado import web

__all__ = ["user_error"]


def user_error(status: int, message: str) -> web.HTTPError:
    """An HTTP error whose message JupyterHub shows to the user as it is."""
    error = web.HTTPError(status, "%s", message)
    error.jupyterhub_message = message
    return error
