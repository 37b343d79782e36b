"""A pytest plugin for a run of dockerspawner 14's own tests here: what JupyterHub 6 and this machine need.

Loaded with ``-p dockersuite`` beside :mod:`parentswap` (``test_dockerspawner_suite.py``
runs it), in every mode alike, the parent's baseline included. It edits nothing of theirs;
it adapts what their tests run on:

- JupyterHub 6's ``User._new_spawner`` wants the server's database row to exist; their
  tests ask ``user.spawners[name]`` for servers never created (JupyterHub 5 made the row
  then): the row is made first, as JupyterHub 5 did.
- Their named servers (``also-has@``) are invalid names since JupyterHub 6: the hub
  allows starting existing ones (``allow_existing_invalid_named_servers = "allow-start"``).
- This kernel has no IPVS, so a swarm service's ingress-published port never answers:
  SwarmSpawner publishes the server's port in host mode (``extra_endpoint_spec``) on a
  free port of this machine.

The rest comes from the environment ``test_dockerspawner_suite.py`` gives the run:
``DOCKER_HOST`` (a private engine whose default bridge is its own), ``HUB_CONNECT_IP``
(that bridge's address, read by their conftest), and for Docker Hub pulls a loopback registry.
"""

from __future__ import annotations

from jupyterhub.tests.mocking import MockHub
from jupyterhub.user import User

from gpuspawner.ports import free_port

#: the port a swarm service's server is published on in host mode (one swarm test at a time)
SWARM_PORT = free_port()

_new_spawner = User._new_spawner


def _new_spawner_with_row(self, server_name, *args, **kwargs):
    if server_name not in self.orm_spawners:
        self._new_orm_spawner(server_name, server_name)
    return _new_spawner(self, server_name, *args, **kwargs)


User._new_spawner = _new_spawner_with_row

_hub_init = MockHub.__init__


def _hub_init_here(self, *args, **kwargs):
    _hub_init(self, *args, **kwargs)
    self.allow_existing_invalid_named_servers = "allow-start"
    self.config.SwarmSpawner.extra_endpoint_spec = {"ports": {SWARM_PORT: (8888, "tcp", "host")}}


MockHub.__init__ = _hub_init_here
