"""A batchspawner site's settings with gpu-slurm: honoured, joined with the GPU choices, or refused at start.

A setting gpu-slurm would have to drop or fight is refused when the spawner is
configured (``TraitError``), and by :func:`gpuspawner.hub.setup.configure` as the hub
loads its configuration (``SystemExit``), with a sentence naming the setting and saying
what to do; the same setting beside CPU-only profiles is honoured as SlurmSpawner does.
(What reaches sbatch for real is checked against the test cluster in
``test_slurm_batchspawner_site.py``.)
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.backends.slurm.capacity import parse_gres
from gpuspawner.backends.slurm.settings import gpu_asks, gpu_gres, join_gres, sbatch_options
from gpuspawner.backends.slurm.spawner import GPUSlurmSpawner
from gpuspawner.hub.setup import check_spawner

CPU_ONLY = [{"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]}]

SCRIPT_ASKING_FOR_A_GPU = """#!/bin/bash
#SBATCH --partition={partition}
#SBATCH --gres=gpu:1
{cmd}
"""


def site(profiles=None, **slurm_spawner) -> Config:
    """A site's configuration: its SlurmSpawner settings, gpu-slurm, and GPU profiles (None: the defaults)."""
    c = Config()
    c.JupyterHub.spawner_class = "gpu-slurm"
    for name, value in slurm_spawner.items():
        setattr(c.SlurmSpawner, name, value)
    if profiles is not None:
        c.GPUSpawnerMixin.gpu_profiles = profiles
    return c


REFUSED = [
    ({"req_gres": "gpu:1"}, "c.SlurmSpawner.req_gres = 'gpu:1' asks Slurm for GPUs for every server (gpu:1)"),
    ({"req_gres": "nvme:1,shard:2"}, "Remove shard:2 from it (other GRES in req_gres are kept"),
    ({"req_ngpus": "1"}, "c.SlurmSpawner.req_ngpus = '1' asks for GPUs for every server"),
    ({"req_options": "--exclusive -G 2"}, "c.SlurmSpawner.req_options = '--exclusive -G 2' asks Slurm for GPUs "
                                          "for every server (-G 2)"),
    ({"batch_script": SCRIPT_ASKING_FOR_A_GPU}, "c.SlurmSpawner.batch_script asks Slurm for GPUs for every server "
                                                "(#SBATCH --gres=gpu:1)"),
    ({"req_cluster": "gpu2"}, "c.SlurmSpawner.req_cluster = 'gpu2' sends jobs to another cluster"),
    ({"req_options": "--clusters=gpu2"}, "c.SlurmSpawner.req_options (--clusters=gpu2) sends jobs to another cluster"),
]


@pytest.mark.parametrize("configured, sentence", REFUSED)
def test_a_site_setting_that_fights_the_gpu_choices_stops_the_hub_with_a_sentence_naming_it(configured, sentence):
    with pytest.raises(TraitError) as refused:
        GPUSlurmSpawner(config=site(**configured))
    assert sentence in str(refused.value), refused.value
    assert "beside GPU profiles" in str(refused.value) or "another cluster" in str(refused.value)
    with pytest.raises(SystemExit) as stopped:
        check_spawner(site(**configured))
    assert sentence in str(stopped.value), stopped.value
    # beside profiles without GPUs the site's setting is honoured, as SlurmSpawner honours it
    spawner = GPUSlurmSpawner(config=site(CPU_ONLY, **configured))
    assert all(getattr(spawner, name) == value for name, value in configured.items())
    check_spawner(site(CPU_ONLY, **configured))


@pytest.mark.parametrize("command, why", [
    ("sbatch --parsable | tail -n 1", "'|' follows sbatch's options"),
    ("qsub", "it runs no sbatch"),
])
def test_a_submit_command_gpu_slurm_cannot_add_its_options_to_is_refused(command, why):
    for profiles in (None, CPU_ONLY):  # the job's name and comment go there too, GPUs or not
        with pytest.raises(TraitError) as refused:
            GPUSlurmSpawner(config=site(profiles, batch_submit_cmd=command))
        assert f"c.SlurmSpawner.batch_submit_cmd = {command!r}: gpu-slurm adds each job's options" in str(refused.value)
        assert why in str(refused.value)


@pytest.mark.parametrize("configured", [
    {"req_gres": "nvme:1"},  # joined with each server's GPU request
    {"req_options": "--exclusive --constraint=ib"},
    {"batch_script": "#!/bin/bash\n#SBATCH --gres={gres}\n{cmd}\n"},
    {"batch_script": "#!/bin/bash\n{% if gres %}#SBATCH --gres={{gres}}\n{% endif %}{{cmd}}\n"},
    {"batch_submit_cmd": "/opt/slurm/bin/sbatch --parsable --qos=interactive"},
    {"exec_prefix": "ssh -o BatchMode=yes {username}@login", "batch_query_cmd": "squeue -h -j {job_id} -o '%T %B'",
     "batch_cancel_cmd": "scancel {job_id}"},
])
def test_settings_that_compose_with_the_gpu_choices_are_honoured(configured):
    spawner = GPUSlurmSpawner(config=site(**configured))
    assert all(getattr(spawner, name) == value for name, value in configured.items())
    check_spawner(site(**configured))


OTHER_GRES = st.from_regex(r"(nvme|lscratch|fpga)(:[a-z0-9]{1,6})?:[1-9]", fullmatch=True)
GPU_REQUEST = st.builds(lambda kind, n: f"gpu:{kind}:{n}" if kind else f"gpu:{n}",
                        st.sampled_from(["", "a100", "t4", "h100"]), st.integers(1, 8))


@settings(max_examples=80, deadline=None)
@given(site_gres=st.lists(OTHER_GRES, max_size=3), gpus=GPU_REQUEST)
def test_the_gpu_request_joins_the_sites_other_gres_and_slurm_counts_only_it(site_gres, gpus):
    joined = join_gres(",".join(site_gres), gpus)
    assert joined.split(",") == [*site_gres, gpus]
    assert gpu_gres(joined) == [gpus]
    assert sum(parse_gres(joined).values()) == int(gpus.rsplit(":", 1)[1])
    assert gpu_asks(f"--mem=1G --gres={joined}") == [f"--gres={joined}"]
    assert gpu_asks(f"--mem=1G --gres={','.join(site_gres)}") == []


TRAITS = ["req_partition", "req_runtime", "req_qos", "req_account", "req_reservation", "req_nprocs", "req_memory"]
VALUE = st.sampled_from(["", "gpu", "8:00:00", "4", "16G", "interactive"])


@settings(max_examples=80, deadline=None)
@given(configured=st.fixed_dictionaries(dict.fromkeys(TRAITS, VALUE)),
       chosen=st.fixed_dictionaries(dict.fromkeys(TRAITS, VALUE)), gres=st.sampled_from(["", "gpu:t4:1"]))
def test_sbatch_gets_exactly_what_the_choice_changed(configured, chosen, gres):
    options = sbatch_options(["--nodes=1"], chosen, configured, gres, "")
    flags = dict(o.split("=", 1) for o in options[1:])
    assert options[0] == "--nodes=1"
    expected = {flag: chosen[t] for t, flag in zip(TRAITS, ["--partition", "--time", "--qos", "--account",
                                                             "--reservation", "--cpus-per-task", "--mem"], strict=True)
                if chosen[t] and chosen[t] != configured[t]}
    assert flags == {**expected, **({"--gres": gres} if gres else {})}
