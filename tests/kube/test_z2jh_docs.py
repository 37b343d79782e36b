"""A zero-to-jupyterhub configuration, as z2jh's own docs write it, works unchanged with gpu-kube.

The ``config.yaml`` below is put together from z2jh's documentation, each part as its page
shows it: "Using multiple profiles to let users select their environment" (four profiles,
one with ``lifecycle_hooks``), "Set user GPU guarantees / limits" (a profile with
``nvidia.com/gpu: "1"``), "Modifying user shared memory size" (``storage.extraVolumes``),
"Set environment variables" (``extraEnv``), and the optimization page's dedicated user
node pool (``matchNodePurpose: require``); the one line not from z2jh is a second GPU
profile's node selector on GKE's accelerator label, from the GKE GPU guide z2jh links.
The hub turns it into KubeSpawner settings as z2jh's hub configuration does
(:func:`z2jh_settings`), with ``spawner_class`` gpu-kube and nothing else added.

The cluster is as z2jh's GKE instructions leave it: a T4 node labelled and tainted by
GKE (no GPU Feature Discovery labels) and a CPU node, both in the user node pool. Each
profile is started through JupyterHub's steps (options, the options hook, ``start``)
on the real control plane, the hub as its ServiceAccount (those two nodes added beside the
standing ones for the test); the pod the API server holds is checked, and the node the real
scheduler bound it to (labels, affinity, taints, GPUs).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import yaml
from traitlets.config import Config

from kubefixtures import nodes_added
from profiles import env, gpu_limits

CONFIG_YAML = """
singleuser:
  # Defines the default image
  image:
    name: jupyter/minimal-notebook
    tag: 2343e33dec46
  extraEnv:
    EDITOR: "vim"
  storage:
    extraVolumes:
      # Arbitrary key for identity & ordering
      1-shm-volume:
        name: shm-volume
        emptyDir:
          medium: Memory
    extraVolumeMounts:
      # Arbitrary key for identity & ordering
      1-shm-volume:
        name: shm-volume
        mountPath: /dev/shm
  profileList:
    - display_name: "Minimal environment"
      description: "To avoid too much bells and whistles: Python."
      default: true
    - display_name: "Datascience environment"
      description: "If you want the additional bells and whistles: Python, R, and Julia."
      kubespawner_override:
        image: jupyter/datascience-notebook:2343e33dec46
    - display_name: "Spark environment"
      description: "The Jupyter Stacks spark image!"
      kubespawner_override:
        image: jupyter/all-spark-notebook:2343e33dec46
    - display_name: "Learning Data Science"
      description: "Datascience Environment with Sample Notebooks"
      kubespawner_override:
        image: jupyter/datascience-notebook:2343e33dec46
        lifecycle_hooks:
          postStart:
            exec:
              command:
                - "sh"
                - "-c"
                - >
                  gitpuller https://github.com/data-8/materials-fa17 master materials-fa;
    - display_name: "GPU Server"
      description: "Spawns a notebook server with access to a GPU"
      kubespawner_override:
        extra_resource_limits:
          nvidia.com/gpu: "1"
    - display_name: "T4 GPU Server"
      kubespawner_override:
        extra_resource_limits:
          nvidia.com/gpu: "1"
        node_selector:
          cloud.google.com/gke-accelerator: nvidia-tesla-t4

scheduling:
  userPods:
    nodeAffinity:
      matchNodePurpose: require
"""

# (KubeSpawner trait, path under singleuser) as z2jh's hub configuration maps them
SINGLEUSER = (("profile_list", "profileList"), ("environment", "extraEnv"), ("node_selector", "nodeSelector"),
              ("default_url", "defaultUrl"), ("mem_limit", "memory.limit"), ("cpu_limit", "cpu.limit"))
NODE_PURPOSE = {"key": "hub.jupyter.org/node-purpose", "operator": "In", "values": ["user"]}


def z2jh_settings(values: dict) -> Config:
    """The KubeSpawner configuration z2jh's hub makes from ``values`` (the keys used here)."""
    c = Config()
    c.JupyterHub.spawner_class = "gpu-kube"
    singleuser = values["singleuser"]
    for trait, path in SINGLEUSER:
        value = singleuser
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            setattr(c.KubeSpawner, trait, value)
    c.KubeSpawner.image = f"{singleuser['image']['name']}:{singleuser['image']['tag']}"
    storage = singleuser.get("storage") or {}
    c.KubeSpawner.volumes = [v for _, v in sorted((storage.get("extraVolumes") or {}).items())]
    c.KubeSpawner.volume_mounts = [v for _, v in sorted((storage.get("extraVolumeMounts") or {}).items())]
    if values["scheduling"]["userPods"]["nodeAffinity"]["matchNodePurpose"] == "require":
        c.KubeSpawner.node_affinity_required = [{"matchExpressions": [NODE_PURPOSE]}]
    c.KubeSpawner.tolerations = [{"key": key, "operator": "Equal", "value": "user", "effect": "NoSchedule"}
                                 for key in ("hub.jupyter.org/dedicated", "hub.jupyter.org_dedicated")]
    return c


def node(name: str, labels: dict, allocatable: dict, taints: list) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "hub.jupyter.org/node-purpose": "user", **labels}},
            "spec": {"taints": taints},
            "status": {"capacity": {"cpu": "4", "memory": "15Gi", "pods": "110", **allocatable}}}


GKE_T4 = node("gke-gpu-pool-1", {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
                                 "cloud.google.com/gke-nodepool": "gpu-pool"},
              {"nvidia.com/gpu": "1"}, [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
GKE_CPU = node("gke-user-pool-1", {"cloud.google.com/gke-nodepool": "user-pool"}, {}, [])


@pytest.fixture
def pod_items() -> list[dict]:
    return []  # no pod in the cluster but the test's


@pytest.fixture
def gke_nodes(cluster):
    """The GKE nodes, kept Ready by the fake kubelet for this test, removed afterwards."""
    with nodes_added(cluster.kube, GKE_T4, GKE_CPU):
        yield


@pytest.fixture
def z2jh(cluster, gke_nodes):
    config = z2jh_settings(yaml.safe_load(CONFIG_YAML))
    config.KubeSpawner.namespace = cluster.namespace
    config.KubeSpawner.k8s_api_host = cluster.url

    async def spawn(user: str, options: dict) -> dict:
        from gpuspawner.backends.kube.spawner import GPUKubeSpawner

        spawner = GPUKubeSpawner(_mock=True, config=config,
                                 user=SimpleNamespace(name=user, id=len(user), url=f"/user/{user}/", groups=[]))
        spawner.user_options = options
        await spawner._run_apply_user_options(options)
        await asyncio.wait_for(spawner.start(), 60)
        pod = cluster.pod(spawner.pod_name)  # running, where the scheduler bound it
        await spawner.stop(now=True)
        return pod

    return SimpleNamespace(config=config, spawn=spawn)


def container(pod: dict) -> dict:
    return pod["spec"]["containers"][0]


async def test_z2jh_docs_config_spawns_each_profile_as_kubespawner_would(z2jh):
    minimal = await z2jh.spawn("ada", {})  # the profile marked default
    assert container(minimal)["image"] == "jupyter/minimal-notebook:2343e33dec46"
    assert env(minimal)["EDITOR"] == "vim"
    assert {"name": "shm-volume", "mountPath": "/dev/shm"} in container(minimal)["volumeMounts"]
    assert {"name": "shm-volume", "emptyDir": {"medium": "Memory"}} in minimal["spec"]["volumes"]
    assert gpu_limits(minimal) == {} and env(minimal)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert minimal["spec"]["nodeName"] == GKE_CPU["metadata"]["name"]

    for slug, image in (("datascience-environment", "jupyter/datascience-notebook:2343e33dec46"),
                        ("spark-environment", "jupyter/all-spark-notebook:2343e33dec46")):
        assert container(await z2jh.spawn("ada", {"profile": slug}))["image"] == image
    learning = await z2jh.spawn("ada", {"profile": "learning-data-science"})
    command = container(learning)["lifecycle"]["postStart"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"] and command[2].startswith("gitpuller https://github.com/data-8/materials-fa17")

    for slug in ("gpu-server", "t4-gpu-server"):
        gpu = await z2jh.spawn("grace", {"profile": slug})
        assert gpu_limits(gpu) == {"nvidia.com/gpu": "1"}
        assert container(gpu)["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert env(gpu)["EDITOR"] == "vim" and "NVIDIA_VISIBLE_DEVICES" not in env(gpu)  # the device plugin's
        assert gpu["spec"]["nodeName"] == GKE_T4["metadata"]["name"]  # GKE's node, without GPU Feature Discovery labels
        assert {"matchExpressions": [NODE_PURPOSE]} in (
            gpu["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"])
    assert gpu["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}


async def test_z2jh_docs_config_form_lists_the_profiles_with_the_default_chosen(z2jh):
    from forms import Checked, Fields, form_of
    from gpuspawner.backends.kube.spawner import GPUKubeSpawner

    spawner = GPUKubeSpawner(_mock=True, config=z2jh.config)
    html = await form_of(spawner)
    assert Fields(html).radios["profile"] == ["minimal-environment", "datascience-environment", "spark-environment",
                                              "learning-data-science", "gpu-server", "t4-gpu-server"]
    assert Checked(html).radios["profile"] == "minimal-environment"
    assert "Spawns a notebook server with access to a GPU" in html
