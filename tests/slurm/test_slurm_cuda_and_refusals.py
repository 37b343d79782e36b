"""The nodes' driver CUDA against what an environment needs, and sbatch's refusals in words (pure parts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from traitlets import TraitError

from gpuspawner.backends.slurm.capacity import GresTypes, NeverFits, SlurmNode, choose_type, cuda_constraint, read_nodes
from gpuspawner.backends.slurm.cuda import CudaNeed, DriverCuda, feature_cuda
from gpuspawner.backends.slurm.queue import submit_refusal
from gpuspawner.backends.slurm.spawner import GPUSlurmSpawner

FIXTURES = Path(__file__).parent / "fixtures"
TORCH = CudaNeed((12, 6), "Profile 'torch'", "a profile")


def idle_nodes(features_22: str = "", features_23: dict | None = None):
    """The recorded idle node (gpu:a100:2,gpu:t4:2), with features as 22.05 or 23.02+ list them."""
    data = json.loads((FIXTURES / "sinfo-idle.json").read_text())
    node = data["nodes"][0]
    node["active_features"] = node["features"] = features_22
    if features_23 is not None:
        node["features"] = features_23
        del node["active_features"]
    return read_nodes(data)


@pytest.mark.parametrize("features, version", [
    (("cuda12.4",), (12, 4)), (("ib", "cuda_12.2", "CUDA-12.6"), (12, 6)), (("cuda12_4",), (12, 4)),
    (("ib", "a100"), None), (("cudax",), None), ((), None),
])
def test_node_features_name_the_drivers_cuda(features, version):
    assert feature_cuda(features) == version


def test_features_are_read_from_both_sinfo_json_layouts():
    assert idle_nodes("ib,cuda12.4")[0].features == ("ib", "cuda12.4")
    assert idle_nodes(features_23={"total": "ib,cuda12.4", "active": "cuda12.4"})[0].features == ("cuda12.4",)


def test_a_node_feature_wins_over_the_configured_map():
    drivers = DriverCuda({"a100": "12.2", "*": "cuda>=11.8"})
    assert drivers.version(("cuda12.6",), "a100") == (12, 6)
    assert drivers.version((), "a100") == (12, 2)
    assert drivers.version((), "t4") == (11, 8)
    assert DriverCuda().version((), "t4") is None


def test_an_environment_needing_a_newer_cuda_than_every_fitting_node_is_refused():
    nodes = idle_nodes()
    drivers = DriverCuda({"a100": "12.4", "t4": "12.2"})
    with pytest.raises(NeverFits) as e:
        choose_type(nodes, GresTypes(), ("a100",), 1, ["gpu"], TORCH, drivers)
    assert str(e.value) == ("Profile 'torch' needs CUDA 12.6 but the drivers of the nodes in Slurm partition gpu "
                            "with 1 a100 GPUs support CUDA 12.4 at most. Pick a profile built for CUDA 12.4 or "
                            "older, or ask an admin to update the driver.")
    assert e.value.code == "cuda_too_old"
    with pytest.raises(NeverFits, match="with 2 GPUs support CUDA 12.4 at most"):
        choose_type(nodes, GresTypes(), (), 2, (), TORCH, drivers)
    # the newest driver said is that of the nodes with the GPUs asked for, not the cluster's newest
    with pytest.raises(NeverFits, match="with 1 t4 GPUs support CUDA 12.2 at most"):
        choose_type(nodes, GresTypes(), ("t4",), 1, (), TORCH, drivers)


def test_any_model_goes_to_a_type_whose_driver_is_new_enough():
    nodes = idle_nodes()
    drivers = DriverCuda({"a100": "12.2", "t4": "12.6"})
    assert choose_type(nodes, GresTypes(), (), 1) == "a100"  # without a need: a100, first by name
    assert choose_type(nodes, GresTypes(), (), 1, (), TORCH, drivers) == "t4"


def test_an_unknown_driver_never_refuses():
    nodes = idle_nodes()
    assert choose_type(nodes, GresTypes(), ("a100",), 1, (), TORCH, DriverCuda({"t4": "11.0"})) == "a100"
    # a feature on the node says 12.6: the map's older version for a100 does not count
    assert choose_type(idle_nodes("cuda12.6"), GresTypes(), ("a100",), 1, (), TORCH,
                       DriverCuda({"a100": "11.0"})) == "a100"


def gpu_node(name: str, *features: str) -> SlurmNode:
    return SlurmNode(name, ("gpu",), "idle", gpus={"a100": 2}, features=("ib", *features))


def test_nodes_of_one_type_with_older_drivers_are_kept_off_by_their_cuda_features():
    cu124 = CudaNeed((12, 4), "Profile 'x'", "a profile")
    nodes = [gpu_node("n1", "cuda12.2"), gpu_node("n2", "cuda12.4"), gpu_node("n3", "cuda_12.6")]
    assert cuda_constraint(nodes, GresTypes(), "a100", 1, ["gpu"], cu124, DriverCuda()) == "cuda12.4|cuda_12.6"
    # every node new enough: no constraint
    assert cuda_constraint(nodes[1:], GresTypes(), "a100", 1, ["gpu"], cu124, DriverCuda()) == ""
    # a node with no CUDA feature and no known driver: a constraint would keep the job off it too
    unknown = [*nodes, gpu_node("n4")]
    assert cuda_constraint(unknown, GresTypes(), "a100", 1, ["gpu"], cu124, DriverCuda()) == ""
    # ... unless the map says its driver is too old
    assert cuda_constraint(unknown, GresTypes(), "a100", 1, ["gpu"], cu124,
                           DriverCuda({"a100": "12.0"})) == "cuda12.4|cuda_12.6"


def test_the_cuda_constraint_joins_the_profiles_own():
    spawner = GPUSlurmSpawner(req_options="--exclusive")
    spawner._constrain("cuda12.4|cuda12.6")
    assert spawner.req_options == "--exclusive --constraint=cuda12.4|cuda12.6"
    spawner = GPUSlurmSpawner(req_options="--constraint=ib|opa")
    spawner._constrain("cuda12.4")
    assert spawner.req_options == "--constraint=(cuda12.4)&(ib|opa)"


def test_cuda_maps_are_checked_when_configured():
    with pytest.raises(TraitError, match=r"slurm_driver_cuda\['a100'\]: 'new' is not a CUDA requirement"):
        GPUSlurmSpawner(slurm_driver_cuda={"a100": "new"})
    with pytest.raises(TraitError, match=r"environment_cuda\['torch'\]"):
        GPUSlurmSpawner(environment_cuda={"torch": "cuda"})


JOB = {"partition": "gpu", "time": "8:00:00", "gres": "gpu:a100:2", "qos": "normal", "account": "",
       "cpus": "64", "memory": "8G", "constraint": ""}


@pytest.mark.parametrize("said, sentence", [
    ("sbatch: error: Batch job submission failed: Invalid partition name specified",
     "Slurm refused the job: Invalid partition name specified. Slurm has no partition gpu. "
     "Ask an admin to fix the profile."),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "Slurm refused the job: Requested node configuration is not available. No node of partition gpu has what "
     "the job asks for (64 CPUs, 8G memory, GPUs gpu:a100:2). Pick another profile, or ask an admin "
     "to fix this one."),
    ("sbatch: warning: something\nsbatch: error: QOSMaxSubmitJobPerUserLimit\n"
     "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's "
     "size and/or time limits)",
     "Slurm refused the job: Job violates accounting/QOS policy (job submit limit, user's size and/or time "
     "limits). Your Slurm account or QOS limits (QOS normal, account -) do not allow this job now: too many "
     "jobs, GPUs or too long a time limit. Stop another server, ask for fewer GPUs, or ask an admin about your "
     "limits."),
    ("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
     "Slurm refused the job: Requested time limit is invalid (missing or exceeds some limit). The time limit "
     "8:00:00 is longer than partition gpu allows. Ask an admin for a profile with a shorter time limit."),
    ("sbatch: error: Batch job submission failed: Something new",
     "Slurm refused the job: Something new. Ask an admin what it means for this profile."),
    ("", "Slurm refused the job: sbatch failed without saying why. Ask an admin what it means for this profile."),
])
def test_sbatch_refusals_in_plain_words(said, sentence):
    assert submit_refusal(said, JOB) == (409, sentence)


def test_sbatch_not_reaching_slurm_is_not_a_refusal():
    said = "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
    assert submit_refusal(said, JOB) == (503, "Slurm did not take the job: Unable to contact slurm controller "
                                              "(connect failure). Try again in a while; if this goes on, ask an "
                                              "admin whether Slurm's controller is up.")


def test_a_job_without_a_partition_names_slurms_default():
    said = "sbatch: error: Batch job submission failed: Requested node configuration is not available"
    assert submit_refusal(said, {"memory": "100G", "gres": "gpu:2"})[1] == (
        "Slurm refused the job: Requested node configuration is not available. No node of partition (Slurm's "
        "default) has what the job asks for (100G memory, GPUs gpu:2). Pick another profile, or ask an admin to "
        "fix this one.")
