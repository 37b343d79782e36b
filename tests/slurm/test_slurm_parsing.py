"""The pure Slurm readers on output recorded from a real slurmctld 22.05 (tests/slurm/fixtures)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuspawner.backends.slurm.capacity import (
    GresTypes,
    NeverFits,
    choose_type,
    gpu_availability,
    parse_gres,
    read_nodes,
)
from gpuspawner.backends.slurm.queue import (
    job_comment,
    parse_comment,
    read_jobs,
    reason_words,
    slurm_seconds,
    slurm_time,
    wait_words,
)
from gpuspawner.backends.slurm.spawner import slurm_memory
from gpuspawner.profiles import OptionsError, load_profiles

FIXTURES = Path(__file__).parent / "fixtures"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize("text, counts", [
    ("gpu:a100:2,gpu:t4:2", {"a100": 2, "t4": 2}),
    ("gpu:a100:2(IDX:0-1),gpu:t4:1(IDX:2)", {"a100": 2, "t4": 1}),
    ("gpu:a100:0(IDX:N/A),gpu:t4:0(IDX:N/A)", {"a100": 0, "t4": 0}),
    ("gpu:a100:2(IDX:0,2),mps:200", {"a100": 2}),
    ("gpu:4(S:0-1)", {"": 4}),
    ("", {}),
    ("(null)", {}),
])
def test_gres_strings(text, counts):
    assert parse_gres(text) == counts


def test_a_node_with_jobs_running_counts_free_per_type():
    nodes = read_nodes(recorded("sinfo-mixed.json"))
    assert [(n.name, n.partitions, n.in_service) for n in nodes] == [("vm", ("gpu",), True)]
    shown = {a.slug: a.label for a in gpu_availability(nodes, GresTypes())}
    assert shown == {"a100": "A100 (gpu:a100) - 0 of 2 free", "t4": "T4 (gpu:t4) - 1 of 2 free"}


def test_a_drained_node_is_out_of_service():
    nodes = read_nodes(recorded("sinfo-drained.json"))
    assert not nodes[0].in_service and nodes[0].reason == "maintenance"
    shown = {a.slug: a.label for a in gpu_availability(nodes, GresTypes())}
    assert shown["a100"] == "A100 (gpu:a100) - none usable: 2 of 2 unavailable"
    # a drained node may come back: a request it could run is not refused as never fitting
    assert choose_type(nodes, GresTypes(), ("a100",), 2) == "a100"


def test_other_partitions_are_not_counted():
    nodes = read_nodes(recorded("sinfo-idle.json"))
    assert gpu_availability(nodes, GresTypes(), ["debug"]) == []
    with pytest.raises(NeverFits, match="^No node in Slurm partition debug has GPUs.$"):
        choose_type(nodes, GresTypes(), (), 1, ["debug"])


def test_a_mapped_gres_type_is_offered_under_its_slug():
    nodes = read_nodes(recorded("sinfo-idle.json"))
    types = GresTypes({"tesla-t4": "t4"})
    assert {a.slug for a in gpu_availability(nodes, types)} == {"a100", "tesla-t4"}
    assert choose_type(nodes, types, ("tesla-t4",), 1) == "t4"


def test_any_model_goes_to_a_type_with_room_now():
    nodes = read_nodes(recorded("sinfo-mixed.json"))  # a100: 0 free, t4: 1 free
    assert choose_type(nodes, GresTypes(), (), 1) == "t4"
    assert choose_type(nodes, GresTypes(), ("a100", "t4"), 1) == "t4"
    assert choose_type(nodes, GresTypes(), ("a100", "t4"), 2) == "a100"  # nothing has 2 free: preference order


def test_never_fits_names_the_types_and_sizes_that_exist():
    nodes = read_nodes(recorded("sinfo-idle.json"))
    with pytest.raises(NeverFits) as e:
        choose_type(nodes, GresTypes(), ("a100",), 3, ["gpu"])
    assert str(e.value) == ("No node in Slurm partition gpu has 3 a100 GPUs; the most on one node: "
                            "a100 (up to 2 per node), t4 (up to 2 per node). Ask for fewer GPUs.")
    assert e.value.code == "exceeds_host_size"
    with pytest.raises(NeverFits) as e:
        choose_type(nodes, GresTypes(), ("h100",), 1, ["gpu"])
    assert str(e.value) == ("No node in Slurm partition gpu has h100 GPUs; the GPUs there: "
                            "a100 (up to 2 per node), t4 (up to 2 per node).")
    assert e.value.code == "no_matching_model"


def test_not_sinfo_output_is_an_error():
    with pytest.raises(ValueError):
        read_nodes('{"errors": []}')
    with pytest.raises(ValueError):
        read_jobs("[]")


def test_json_output_with_errors_is_not_an_empty_cluster():
    # what sinfo/squeue --json (22.05) print, with exit status 0, when slurmctld does not answer
    for read, key, command in ((read_nodes, "nodes", "sinfo"), (read_jobs, "jobs", "squeue")):
        with pytest.raises(ValueError, match=rf"^{command} --json answered with an error instead of a listing "
                                             r"\(Unspecified error\): is slurmctld up\?$"):
            read({"errors": [{"error": "Unspecified error", "errno": -1}], key: []})


def test_pending_job_in_words_with_its_place_and_slurms_estimate():
    jobs = read_jobs(recorded("squeue-one-pending.json"))
    assert [(j.id, j.state, j.reason, j.gpus) for j in jobs] == [
        ("1", "RUNNING", "None", "gres:gpu:a100:1"), ("2", "RUNNING", "None", "gres:gpu:a100:1"),
        ("3", "PENDING", "Resources", "gres:gpu:a100:1"), ("4", "RUNNING", "None", "gres:gpu:t4:1")]
    pending = jobs[2]
    # recorded without a time limit: Slurm's start time is a placeholder a year ahead, not an estimate
    assert wait_words(pending, jobs, now=pending.submit_time) == (
        "Waiting in Slurm's queue (job 3, partition gpu): the GPUs it needs are in use by other jobs; "
        "it starts when enough of them are released. It is 1st of 1 GPU job waiting in partition gpu.")
    data = json.loads(recorded("squeue-one-pending.json"))
    later = dict(data["jobs"][2], job_id=5, priority=data["jobs"][2]["priority"] - 1, state_reason="Priority",
                 start_time=pending.submit_time + 14 * 60)
    data["jobs"].append(later)
    jobs = read_jobs(data)
    words = wait_words(jobs[-1], jobs, now=pending.submit_time)
    when = time.strftime("%H:%M", time.localtime(pending.submit_time + 14 * 60))
    assert words == ("Waiting in Slurm's queue (job 5, partition gpu): jobs with a higher priority are ahead of it "
                     "in Slurm's queue. It is 2nd of 2 GPU jobs waiting in partition gpu. "
                     f"Slurm expects it to start in about 14 minutes ({when}).")


def test_unknown_reasons_are_given_as_slurm_says_them():
    assert reason_words("QOSMaxGRESPerUser").startswith("your QOS limit of GPUs per user is reached")
    assert reason_words("BadConstraints") == "Slurm's reason: BadConstraints"


def test_job_comment_ties_a_job_to_a_server():
    assert parse_comment(job_comment("hub1", "alice", "")) == ("hub1", "alice", "")
    assert parse_comment(job_comment("hub1", "alice", "big")) == ("hub1", "alice", "big")
    assert parse_comment(job_comment("hub1", "alice", "job/3f2a")) == ("hub1", "alice", "job/3f2a")


@pytest.mark.parametrize("raw, code", [
    (0, 0), (768, 3), (15, -15), (9, -9),  # Slurm 22.05: a wait status
    ({"status": ["EXITED"], "return_code": {"set": True, "number": 3}, "signal": {"id": {"set": False}}}, 3),
    ({"status": ["SIGNALED"], "return_code": {"set": True, "number": 0},
      "signal": {"id": {"set": True, "number": 15}, "name": "TERM"}}, -15),
])
def test_an_ended_jobs_exit_code(raw, code):
    data = json.loads(recorded("squeue-one-pending.json"))
    data["jobs"] = [dict(data["jobs"][0], job_state="FAILED", exit_code=raw)]
    assert read_jobs(data)[0].exit_code == code


def test_time_limits_as_slurm_writes_them():
    assert slurm_seconds("30") == 1800 and slurm_seconds("") is None and slurm_seconds("INFINITE") is None
    assert slurm_seconds(slurm_time(600)) == 600 and slurm_seconds(slurm_time(3 * 86400 + 1)) == 3 * 86400 + 1
    with pytest.raises(ValueError, match="not a Slurm time limit"):
        slurm_seconds("soon")
    assert parse_comment("hub=x user=u1") is None


@pytest.mark.parametrize("limit, mem", [("8G", "8G"), ("512M", "512M"), ("1.5G", "1536M"), (2**30, "1024M")])
def test_memory_as_sbatch_takes_it(limit, mem):
    assert slurm_memory(limit) == mem


def test_profiles_name_slurm_settings_and_nothing_else():
    (profile,) = load_profiles([{"display_name": "Long", "slurm": {"partition": "gpu", "time": "8:00:00"}}])
    assert profile.slurm == (("partition", "gpu"), ("time", "8:00:00"))
    with pytest.raises(OptionsError, match=r"slurm keys \['nodes'\] are unknown"):
        load_profiles([{"display_name": "X", "slurm": {"nodes": "2"}}])
    with pytest.raises(OptionsError, match="must be a Slurm name or time"):
        load_profiles([{"display_name": "X", "slurm": {"partition": "gpu; rm -rf /"}}])


def test_other_backends_refuse_slurm_settings():
    from traitlets import TraitError

    from gpuspawner.backends.local.spawner import GPUSimpleLocalProcessSpawner

    with pytest.raises(TraitError, match="profile 'long': 'slurm' settings are only applied by gpu-slurm"):
        GPUSimpleLocalProcessSpawner(gpu_profiles=[{"display_name": "Long", "slurm": {"time": "8:00:00"}}])


def test_gpu_slurm_refuses_the_hubs_queue():
    from traitlets import TraitError

    from gpuspawner.backends.slurm.spawner import GPUSlurmSpawner

    with pytest.raises(TraitError, match="profile 'q' sets 'queue': True, but gpu-slurm has no hub queue"):
        GPUSlurmSpawner(gpu_profiles=[{"slug": "q", "display_name": "Q", "gpu_counts": [1], "queue": True}])
    spawner = GPUSlurmSpawner(gpu_profiles=[{"display_name": "Long", "gpu_counts": [1], "slurm": {"time": "60"}}])
    assert spawner.profiles[0].slurm == (("time", "60"),)
