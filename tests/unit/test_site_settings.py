"""A site's own settings on the GPU classes: composed with gpuspawner's, or refused with a sentence.

The hub-level journeys (a real hub, its form and REST API, containers) are in
tests/integration/test_site_hooks.py and tests/docker/test_docker_drop_in.py; here the
rules themselves, on spawner objects built from configuration as the hub builds them.
"""

from __future__ import annotations

import pytest
from tornado import web
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.backends.docker.spawner import GPUDockerSpawner
from gpuspawner.backends.local.spawner import GPULocalProcessSpawner
from gpuspawner.backends.startup import refusal_at_start
from gpuspawner.backends.swarm.spawner import GPUSwarmSpawner

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU", "gpu_counts": [1, 2], "default": True},
]
FORM = {"profile": ["gpu"], "gpus-gpu": ["2"], "gpu_model-gpu": ["any"], "gpus-cpu": ["0"], "flavor": ["mint"],
        "image-size": ["large"]}


def config(**sections) -> Config:
    c = Config()
    c.GPUSpawnerMixin.gpu_profiles = PROFILES
    for name, values in sections.items():
        for key, value in values.items():
            setattr(getattr(c, name), key, value)
    return c


# ------------------------------------------------------------ options_from_form


def test_without_a_site_function_the_form_is_read_by_gpuspawner_alone():
    spawner = GPULocalProcessSpawner(config=config())
    assert spawner.run_options_from_form({k: v for k, v in FORM.items() if k != "flavor" and k != "image-size"}) == {
        "profile": "gpu", "gpus": 2, "gpu_model": "any"}
    assert spawner.site_reads_options() is False


def test_a_site_function_reads_the_other_fields_and_its_keys_are_added():
    seen = []

    def theirs(formdata):
        seen.append(sorted(formdata))
        return {"flavor": formdata["flavor"][0]}

    spawner = GPULocalProcessSpawner(config=config(Spawner={"options_from_form": theirs}))
    assert spawner.options_from_form is theirs  # the trait is the site's, as JupyterHub documents it
    assert spawner.run_options_from_form(FORM) == {"profile": "gpu", "gpus": 2, "gpu_model": "any", "flavor": "mint"}
    assert seen == [["flavor", "image-size"]]  # never gpuspawner's own fields
    assert spawner.options_from_query(FORM)["flavor"] == "mint"
    assert spawner.site_reads_options() is True


def test_the_sites_key_wins_where_both_give_one():
    spawner = GPULocalProcessSpawner(config=config(Spawner={"options_from_form": lambda form: {"gpus": 1}}))
    assert spawner.run_options_from_form(FORM)["gpus"] == 1


def test_jupyterhubs_simple_form_reader_gets_the_sites_fields():
    spawner = GPULocalProcessSpawner(config=config(Spawner={"options_from_form": "simple"}))
    assert spawner.run_options_from_form(FORM) == {"profile": "gpu", "gpus": 2, "gpu_model": "any",
                                                   "flavor": "mint", "image-size": "large"}


def test_a_malformed_gpu_field_is_a_400_whoever_reads_the_rest():
    spawner = GPULocalProcessSpawner(config=config(Spawner={"options_from_form": lambda form: {}}))
    with pytest.raises(web.HTTPError) as info:
        spawner.run_options_from_form({"profile": ["gpu"], "gpus-gpu": ["two"]})
    assert info.value.status_code == 400 and info.value.log_message % info.value.args == (
        "gpus: 'two' is not a whole number from 0 to 9999")


# ------------------------------------------------------------ DockerSpawner's form


def test_dockerspawners_picker_is_still_dockerspawners():
    spawner = GPUDockerSpawner(config=config())
    spawner.allowed_images = {"1.0": "jupyterhub/singleuser:1.0", "1.1": "jupyterhub/singleuser:1.1"}
    assert 'name="image"' in spawner._default_options_form()  # DockerSpawner's own method, untouched
    assert spawner.options_form == spawner._render_options_form  # the form users get: the GPU choices, picker inside
    assert spawner.offered_images() == spawner.allowed_images


# ------------------------------------------------------------ refused, never dropped


@pytest.mark.parametrize("section, key, value, named", [
    ("DockerSpawner", "extra_host_config",
     {"device_requests": [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]},
     "DockerSpawner.extra_host_config gives containers GPUs besides their own (the GPU device request "),
    ("DockerSpawner", "extra_host_config", {"devices": ["/dev/nvidia0:/dev/nvidia0"]},
     "DockerSpawner.extra_host_config gives containers GPUs besides their own (the device /dev/nvidia0)"),
    ("DockerSpawner", "extra_create_kwargs", {"environment": {"NVIDIA_VISIBLE_DEVICES": "0"}},
     "DockerSpawner.extra_create_kwargs gives containers GPUs besides their own (NVIDIA_VISIBLE_DEVICES=0)"),
    ("Spawner", "environment", {"NVIDIA_VISIBLE_DEVICES": "all"},
     "Spawner.environment gives containers GPUs besides their own (NVIDIA_VISIBLE_DEVICES=all)"),
])
@pytest.mark.parametrize("cls", [GPUDockerSpawner, GPUSwarmSpawner])
def test_settings_that_would_give_other_gpus_are_refused_naming_them(cls, section, key, value, named):
    c = config(**{section: {key: value}})
    with pytest.raises(TraitError) as info:
        cls(config=c)
    assert str(info.value).startswith(named)
    assert "so it refuses this setting rather than ignore it" in str(info.value)
    assert refusal_at_start(cls, c) == f"{cls.__name__}: {info.value}"  # what stops the hub at start


def test_swarm_gpu_reservations_in_configuration_are_refused():
    c = config(SwarmSpawner={"extra_resources_spec": {"generic_resources": {"NVIDIA-GPU": 1}}})
    refusal = refusal_at_start(GPUSwarmSpawner, c)
    assert refusal is not None and refusal.startswith(
        "GPUSwarmSpawner: SwarmSpawner.extra_resources_spec reserves GPUs (NVIDIA-GPU=1)")


@pytest.mark.parametrize("section, label", [
    ({}, "org.gpuspawner.gpu-model"),
    ({"GPUSwarmSpawner": {"gpu_model_label": "gpu"}}, "gpu"),
])
def test_a_swarm_constraint_on_the_gpu_model_label_is_refused(section, label):
    c = config(SwarmSpawner={"extra_placement_spec": {"constraints": [f"node.labels.{label} == NVIDIA A100",
                                                                       "node.role == worker"]}}, **section)
    refusal = refusal_at_start(GPUSwarmSpawner, c)
    assert refusal is not None and f"constrains the GPU model label (node.labels.{label} == NVIDIA A100)" in refusal
    fine = config(SwarmSpawner={"extra_placement_spec": {"constraints": ["node.role == worker"]}}, **section)
    assert refusal_at_start(GPUSwarmSpawner, fine) is None


def test_settings_the_gpu_classes_honour_pass():
    c = config(DockerSpawner={"extra_host_config": {"cpuset_cpus": "0-3", "device_requests": [{"Driver": "fpga"}]},
                              "environment": {"LANG": "C.UTF-8"}, "remove": False,
                              "allowed_images": {"a": "x:1", "b": "x:2"}},
               SwarmSpawner={"extra_resources_spec": {"generic_resources": {"FPGA": 1}}})
    assert refusal_at_start(GPUDockerSpawner, c) is None
    assert refusal_at_start(GPUSwarmSpawner, c) is None
    # a callable is checked on each create, with what it returns (tests/docker/test_docker_drop_in.py)
    assert refusal_at_start(GPUDockerSpawner, config(DockerSpawner={"extra_host_config": lambda s: {}})) is None


def test_an_invalid_gpu_profile_is_refused_at_start_too():
    c = Config()
    c.GPUSpawnerMixin.gpu_profiles = [{"display_name": "x", "gpus": 1}]
    assert refusal_at_start(GPULocalProcessSpawner, c).startswith(
        "GPULocalProcessSpawner: Invalid GPU profile configuration: gpu_profiles[0]: unknown keys ['gpus']")


@pytest.mark.parametrize("profile", [
    {"display_name": "Torch", "gpu_counts": [1], "images": ["pytorch/pytorch:2.3"]},
    {"display_name": "Torch", "kubespawner_override": {"image": "pytorch/pytorch:2.3"}},
])
def test_gpu_local_refuses_a_profiles_images_which_it_could_not_run(profile):
    from gpuspawner.backends.local.spawner import GPULocalProcessSpawner, GPUSimpleLocalProcessSpawner

    for cls in (GPULocalProcessSpawner, GPUSimpleLocalProcessSpawner):
        with pytest.raises(TraitError, match="profile 'torch': 'images' .* needs a backend that runs images"):
            cls(gpu_profiles=[profile])
    assert GPUDockerSpawner(gpu_profiles=[profile]).profiles[0].images == ("pytorch/pytorch:2.3",)
