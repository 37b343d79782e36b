"""Live GPU statistics inside the notebook server: a jupyter_server extension.

Enabled on install by ``jupyter-config/jupyter_server_config.d/gpuspawner.json``
(``ServerApp.jpserver_extensions = {"gpuspawner.monitor": true}``). Importing
this package touches no NVML; see ``extension.py`` for what loading does.
"""

from __future__ import annotations


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "gpuspawner.monitor"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from .extension import load

    load(serverapp)


def _unload_jupyter_server_extension(serverapp) -> None:
    from .extension import unload

    unload(serverapp)
