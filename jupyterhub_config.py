"""The runnable default: a JupyterHub at http://127.0.0.1:8000 with GPU profiles.

Real GPUs when NVML finds some; otherwise 2 x A100 80GB and 2 x Tesla T4
simulated through the stand-in NVML library. Log in with any user name and
the password in GPUSPAWNER_PASSWORD (default "gpu"); "admin" is an admin.
Servers run in Docker containers (``gpu-docker``) when a Docker engine answers
(DOCKER_HOST, or /var/run/docker.sock; ``scripts/hub`` builds the single-user
image first), otherwise as local processes with CUDA_VISIBLE_DEVICES set to
their GPUs. GPUSPAWNER_BACKEND=local or =docker forces one. GPUSPAWNER_BACKEND=slurm
makes every server a Slurm job (``gpu-slurm``): on the site's cluster when
``sinfo`` answers (SLURM_CONF, or Slurm's default configuration), otherwise on
a private one-node cluster with the simulated GPUs, started here and stopped
when the hub exits.

No server runs as root: local servers and the private cluster's jobs run as a
system account per user, ``jupyter-<name>`` (GPUSPAWNER_ACCOUNT_PREFIX changes
the prefix), which the hub makes on the user's first start, with its home under
the state folder; a hub that is not root runs local servers as its own user.

Start it with ``scripts/hub`` (which installs what is missing and builds the
stand-in library), or ``jupyterhub -f jupyterhub_config.py`` once built.
"""

import os
import sys
from pathlib import Path

from gpuspawner.backends.docker.engine import reachable_engine
from gpuspawner.hub.setup import (
    RECOMMENDED_CULLER,
    RECOMMENDED_QUEUE_TIMEOUT,
    RECOMMENDED_QUOTA_PER_USER,
    configure,
)
from gpuspawner.hub.sqlite import private_database, sqlite_db_kwargs
from gpuspawner.simulation import (
    SIMULATION_ENV,
    make_device_files,
    place_on_device_files,
    real_or_simulated,
    simulated_devices_in,
)

c = get_config()  # noqa: F821 (provided by JupyterHub)

here = Path(__file__).resolve().parent
state = Path(os.environ.get("GPUSPAWNER_STATE_DIR", here / "build" / "hub"))
state.mkdir(parents=True, exist_ok=True)

simulated = real_or_simulated(
    library_dir=Path(os.environ.get("GPUSPAWNER_FAKENVML_DIR", here / "build" / "fakenvml")),
    state_dir=state,
)

c.JupyterHub.bind_url = os.environ.get("GPUSPAWNER_BIND_URL", "http://127.0.0.1:8000")
# the hub's internal API and the proxy's API (change them to run two hubs on one machine)
c.JupyterHub.hub_bind_url = os.environ.get("GPUSPAWNER_HUB_BIND_URL", "http://127.0.0.1:8081")
c.ConfigurableHTTPProxy.api_url = os.environ.get("GPUSPAWNER_PROXY_API_URL", "http://127.0.0.1:8001")
# the hub's database holds every user's tokens: the hub's alone (servers run on this host as other users)
c.JupyterHub.db_url = f"sqlite:///{private_database(state / 'jupyterhub.sqlite')}"
# WAL, commits that do not wait for the disk: JupyterHub commits ~10 times per spawn on its event
# loop, and a storm of spawns otherwise blocks every answer for seconds (gpuspawner/hub/sqlite.py).
c.JupyterHub.db_kwargs = sqlite_db_kwargs(os.environ.get("GPUSPAWNER_SQLITE_SYNCHRONOUS", "NORMAL"))
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
# the hub's id on its servers: after a restart it adopts, or stops, only what carries it (give each
# hub on one host its own)
c.GPUSpawnerMixin.gpu_hub_id = os.environ.get("GPUSPAWNER_HUB_ID", "jupyterhub")

# Login: any name, one shared password; "admin" administers the hub.
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = os.environ.get("GPUSPAWNER_PASSWORD", "gpu")
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {"admin"}

c.Spawner.default_url = "/lab"
c.GPUSpawnerMixin.simulated_gpus = simulated
backend = os.environ.get("GPUSPAWNER_BACKEND", "auto")
if backend not in ("auto", "local", "docker", "slurm"):
    raise SystemExit(f"GPUSPAWNER_BACKEND={backend}: use auto, local, docker or slurm")
engine = reachable_engine() if backend in ("auto", "docker") else None
if backend == "docker" and engine is None:
    raise SystemExit("GPUSPAWNER_BACKEND=docker but no Docker engine answers (DOCKER_HOST or /var/run/docker.sock)")

if engine:
    # Servers: containers of the single-user image, each with exactly its GPUs (by UUID).
    import docker

    network = os.environ.get("GPUSPAWNER_DOCKER_NETWORK", "bridge")
    client = docker.DockerClient(base_url=engine, version="auto")
    gateway = client.networks.get(network).attrs["IPAM"]["Config"][0]["Gateway"]
    client.close()
    c.JupyterHub.spawner_class = "gpu-docker"
    c.JupyterHub.hub_bind_url = f"http://{gateway}:{os.environ.get('GPUSPAWNER_HUB_PORT', '8081')}"
    c.DockerSpawner.image = os.environ.get("GPUSPAWNER_IMAGE", "gpuspawner-singleuser:latest")
    c.DockerSpawner.network_name = network
    c.DockerSpawner.use_internal_ip = True
    c.DockerSpawner.remove = True
    c.DockerSpawner.start_timeout = 180
    # each user's files: a named volume at the image's home, kept across servers, and shared
    # by the user's notebook GPU jobs (their containers mount it too)
    c.DockerSpawner.volumes = {"gpuspawner-user-{username}": {"bind": "/home/jovyan", "mode": "rw"}}
    if simulated:
        # As the NVIDIA runtime mounts the driver, mount the stand-in NVML and its GPUs.
        c.DockerSpawner.volumes.update({
            os.environ["LD_LIBRARY_PATH"].split(":")[0]: {"bind": "/opt/fakenvml", "mode": "ro"},
            os.environ["FAKENVML_CONFIG"]: {"bind": "/etc/fakenvml/gpus.json", "mode": "ro"},
        })
        c.DockerSpawner.environment = {
            "LD_LIBRARY_PATH": "/opt/fakenvml", "FAKENVML_CONFIG": "/etc/fakenvml/gpus.json",
            "FAKENVML_CONTAINER": "1",
        }
        # Simulated GPUs do not exist for the engine's NVIDIA toolkit (if it has one at all).
        c.GPUDockerSpawner.use_device_requests = os.environ.get("GPUSPAWNER_DEVICE_REQUESTS") == "1"
elif backend == "slurm":
    # Servers: Slurm jobs, one node each, with --gres=gpu:TYPE:N; Slurm places and queues them.
    from gpuspawner.backends.slurm.dev import cluster_answers, start_for_this_process

    private = None
    if cluster_answers():  # the site's cluster (SLURM_CONF, or Slurm's default configuration)
        print(f"[gpuspawner] Slurm: the cluster of {os.environ.get('SLURM_CONF', 'the default slurm.conf')}",
              file=sys.stderr)
    elif not simulated:
        raise SystemExit("GPUSPAWNER_BACKEND=slurm: no Slurm cluster answers `sinfo` (set SLURM_CONF); "
                         "the private cluster is only started for simulated GPUs")
    else:
        # a private one-node cluster (gpu:a100:2,gpu:t4:2 on device files of the simulated GPUs),
        # stopped when the hub exits or dies; the servers load the stand-in NVML
        private = start_for_this_process(state / "slurm")
        place_on_device_files(state, private.device_nodes())
        print(f"[gpuspawner] Slurm: started a private cluster, SLURM_CONF={private.conf}", file=sys.stderr)
        if not private.constrain_devices:
            print("[gpuspawner] Slurm: no cgroup v1 devices controller here: jobs are not confined "
                  "to their GPUs (ConstrainDevices)", file=sys.stderr)
    c.JupyterHub.spawner_class = "gpuspawner.backends.slurm.spawner.GPUSlurmSpawner"  # (entry point gpu-slurm)
    if private and os.geteuid() == 0:
        # the private cluster runs on this host: each user's jobs run as a system account of their own
        # (jupyter-<name>, made by the hub on first use, home under the state folder), never as root
        c.GPUSlurmSpawner.create_system_users = True
        c.GPUSlurmSpawner.system_user_prefix = os.environ.get("GPUSPAWNER_ACCOUNT_PREFIX", "jupyter-")
        c.GPUSlurmSpawner.system_user_home = str(state / "users")
        c.GPUSlurmSpawner.exec_prefix = "runuser -u {username} --"  # sbatch, squeue, scancel as that account
    else:
        # a site's cluster: jobs are submitted as the hub's user (this hub's users are not the site's
        # accounts), and start in a folder per user under the state folder (one the nodes share)
        c.GPUSlurmSpawner.exec_prefix = ""
        c.GPUSlurmSpawner.home_dir_template = str(state / "users" / "{username}")
        c.Spawner.pre_spawn_hook = lambda spawner: Path(spawner.req_homedir).mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            c.Spawner.args = ["--allow-root"]
    # the job runs batchspawner-singleuser and jupyterhub-singleuser from this environment
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    c.Spawner.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
    c.Spawner.env_keep = ["PATH", "PYTHONPATH", "LANG", "SLURM_CONF",
                          *(SIMULATION_ENV if private else ())]
    c.Spawner.start_timeout = 300  # includes the wait in Slurm's queue
else:
    # Servers: local processes on exactly their GPUs (fenced by device cgroups where this host
    # allows it; the hub says at start when it cannot), each user's running as a system account
    # of their own, never as root: jupyter-<name>, made by the hub on the user's first start, home
    # under the state folder. A hub that is not root runs every server as its own user instead.
    from gpuspawner.backends.local.fence import detect

    isolation = detect()
    if not isolation.enforced:
        print(f"[gpuspawner] {isolation.note}", file=sys.stderr)
    if os.geteuid() == 0:
        c.JupyterHub.spawner_class = "gpu-local"
        c.GPULocalProcessSpawner.create_system_users = True
        c.GPULocalProcessSpawner.system_user_prefix = os.environ.get("GPUSPAWNER_ACCOUNT_PREFIX", "jupyter-")
        c.GPULocalProcessSpawner.system_user_home = str(state / "users")
        if simulated:  # the simulated GPUs get device files, which the fence refuses to other users' servers
            place_on_device_files(state, make_device_files(state / "dev", len(simulated_devices_in(state))))
    else:
        c.JupyterHub.spawner_class = "gpu-local-simple"
        c.SimpleLocalProcessSpawner.home_dir_template = str(state / "users" / "{username}")
    c.Spawner.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
    if simulated:  # servers load the same stand-in NVML as the hub
        c.Spawner.env_keep = ["JUPYTERHUB_SINGLEUSER_APP", "PATH", "LANG", *SIMULATION_ENV]

c.GPUSpawnerMixin.gpu_profiles = [
    {
        "slug": "cpu",
        "display_name": "CPU only",
        "description": "No GPU: data preparation, plotting, light work.",
        "gpu_counts": [0],
    },
    {
        "slug": "gpu",
        "display_name": "GPU notebook",
        "description": "Exclusive GPUs of the model you pick. TensorFlow and PyTorch see only them.",
        "gpu_models": ["any"],
        "gpu_counts": [1, 2, 4],
        "default_gpus": 1,
        "default": True,
    },
    {
        "slug": "gpu-queued",
        "display_name": "GPU notebook, wait for a GPU",
        "description": "One GPU of any model; when none is free, your server waits in the queue (up to 30 minutes).",
        "gpu_models": ["any"],
        "gpu_counts": [1],
        "default_gpus": 1,
        "queue": True,
    },
    {
        "slug": "t4-small",
        "display_name": "Small: 1 x T4",
        "description": "One Tesla T4 for inference and teaching.",
        "gpu_models": ["t4"],
        "gpu_counts": [1],
        "default_gpus": 1,
    },
]
if backend == "slurm":  # no hub queue on Slurm: a GPU job that must wait waits in Slurm's queue
    c.GPUSpawnerMixin.gpu_profiles = [p for p in c.GPUSpawnerMixin.gpu_profiles if not p.get("queue")]

# Operating GPUs (README "Operating GPUs"): quotas, the queue's limit, the GPU overview at /hub/gpus and
# usage at /hub/gpus/usage (in the navigation bar; users see their own, admins and scope custom:gpus:read
# everyone's), a GPU section on /hub/admin, metrics at /hub/metrics,
# and the GPU idle culler service. Call configure() last: it appends to services and load_roles.
c.JupyterHub.allow_named_servers = True
# The quota, the queue's limit and the culler's settings are those the replay chose
# (python -m gpuspawner.replay; README "Choosing settings with the replay"; RECOMMENDED_CULLER in
# gpuspawner/recommended.py): every 60 s, stop a server whose GPUs stayed below 5 % and whose
# kernels ran no code for 8 minutes, after warning its user 3 minutes before. Kernel activity
# counts as use (a kernel running code, or answering completions as its user types): simulated
# GPUs read 0 % whatever a notebook does, and on real GPUs it keeps a server whose user is at work
# (a CPU step between GPU cells). Set it False to let the GPUs alone decide, as a site that wants
# its GPUs back from CPU-only work would. GPUSPAWNER_CULLER_<SETTING> (PERIOD, THRESHOLD,
# IDLE_TIMEOUT, WARN_BEFORE, in seconds and %) overrides one, e.g. to watch it work in a demo.
c.GPUSpawnerMixin.gpu_quota_per_user = int(os.environ.get("GPUSPAWNER_QUOTA_PER_USER", str(RECOMMENDED_QUOTA_PER_USER)))
c.GPUSpawnerMixin.gpu_queue_timeout = RECOMMENDED_QUEUE_TIMEOUT
configure(c, culler={
    "url": c.JupyterHub.bind_url,  # the servers' monitors are read through the proxy
    **{key: os.environ.get(f"GPUSPAWNER_CULLER_{key.upper()}", value)  # period, threshold,
       for key, value in RECOMMENDED_CULLER.items()},                  # idle_timeout, warn_before
    "kernel_activity": True,
    "pid_file": str(state / "gpu-culler.pid"),  # one culler per hub, also across restarts
})
