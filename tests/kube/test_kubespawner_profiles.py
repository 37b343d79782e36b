"""KubeSpawner's documented profile behaviour, run against KubeSpawner and GPUKubeSpawner alike.

What a zero-to-jupyterhub admin relies on (kubespawner's ``profile_list`` help):
list, dict and callable ``profile_list``; form fields ``profile`` and
``profile-option-<slug>--<option>``; ``profile_options`` with ``choices`` and
``unlisted_choice`` (its ``{value}`` and ``validation_regex``); REST user_options
of the same names; overrides merged in order (configuration, the profile's
``kubespawner_override``, each chosen option's), dicts merged recursively and a
``None`` value removing a key. Each test runs on both spawners and asserts the
same outcome; every pod is checked against the Kubernetes OpenAPI schema.
Each spawner's own start-time step is taken: KubeSpawner's ``load_user_options``,
GPUKubeSpawner's ``reserve_gpus`` (which applies the profile the same way, then the GPU).
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from kubespawner import KubeSpawner
from tornado import web
from traitlets import TraitError
from traitlets.config import Config

from forms import Checked, Fields, form_of
from gpuspawner.backends.kube.dev.cluster import gpu_node
from gpuspawner.backends.kube.spawner import GPUKubeSpawner
from kubefixtures import nodes_added
from profiles import env, gpu_limits, validate_pod

SPAWNERS = [KubeSpawner, GPUKubeSpawner]

DEMO = {
    "display_name": "Demo",
    "slug": "demo",
    "description": "A profile with options",
    "profile_options": {
        "image": {
            "display_name": "Image",
            "choices": {
                "base": {"display_name": "Base", "kubespawner_override": {"image": "jupyter/base-notebook:2024"}},
                "minimal": {"display_name": "Minimal", "default": True,
                            "kubespawner_override": {"image": "jupyter/minimal-notebook:2024",
                                                     "environment": {"FLAVOUR": "minimal"}}},
            },
            "unlisted_choice": {
                "enabled": True,
                "display_name": "Other image",
                "validation_regex": "^jupyter/.+:.+$",
                "validation_message": "Must be jupyter/<name>:<tag>",
                "kubespawner_override": {"image": "{value}", "extra_labels": {"custom-image": "yes"}},
            },
        },
        "size": {
            "display_name": "Size",
            "choices": {
                "small": {"display_name": "Small", "kubespawner_override": {"cpu_limit": 1.0}},
                "large": {"display_name": "Large", "kubespawner_override": {"cpu_limit": 4.0,
                                                                            "node_selector": {"size": "large"}}},
            },
        },
    },
    "kubespawner_override": {
        "default_url": "/lab",
        "environment": {"PROFILE": "demo", "REMOVED": None},
        "node_selector": {"pool": "users"},
        "tolerations": [{"key": "users", "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [{"name": "shared", "emptyDir": {}}],
        "volume_mounts": [{"name": "shared", "mountPath": "/shared"}],
        "extra_resource_guarantees": {"example.com/fpga": "1"},
        "extra_resource_limits": {"example.com/fpga": "1"},
    },
}
PLAIN = {"display_name": "Plain", "slug": "plain", "default": True,
         "kubespawner_override": {"image": "jupyter/scipy-notebook:2024", "mem_limit": "2G"}}
PROFILE_LIST = [PLAIN, DEMO]


@pytest.fixture
def make(request):
    """Spawners of a hub configured as given: in ``cluster``'s namespace where the test uses the cluster, else
    with no API server behind their address (only configured and asked for forms and manifests)."""
    cluster = request.getfixturevalue("cluster") if "cluster" in request.fixturenames else None
    url = cluster.url if cluster else request.getfixturevalue("offline_hub")

    def make(cls, profile_list=PROFILE_LIST, **settings):
        config = Config()
        config.KubeSpawner.namespace = cluster.namespace if cluster else "jhub"
        config.KubeSpawner.image = "quay.io/jupyter/base-notebook:2024-05-27"
        config.KubeSpawner.k8s_api_host = url
        config.KubeSpawner.environment = {"CONFIGURED": "yes", "REMOVED": "no"}
        config.KubeSpawner.profile_list = profile_list
        for key, value in settings.items():
            setattr(config.KubeSpawner, key, value)
        return cls(_mock=True, config=config)

    return make


async def pod_for(spawner, options: dict) -> dict:
    """JupyterHub's path: user_options set, apply_user_options run, then the spawner's start-time step."""
    spawner.user_options = options
    await spawner._run_apply_user_options(options)
    if isinstance(spawner, GPUKubeSpawner):
        await spawner.reserve_gpus()
    else:
        await spawner.load_user_options()
    return validate_pod(spawner, await spawner.get_pod_manifest())


async def refused(spawner, options: dict) -> str:
    """The refusal's message (KubeSpawner raises ValueError/KeyError; GPUKubeSpawner HTTP 400)."""
    with pytest.raises((ValueError, KeyError, web.HTTPError)) as info:
        await pod_for(spawner, options)
    if isinstance(info.value, web.HTTPError):
        assert info.value.status_code == 400
    return str(info.value)


def container(pod: dict) -> dict:
    return pod["spec"]["containers"][0]


@pytest.fixture(params=SPAWNERS, ids=lambda c: c.__name__)
def cls(request):
    return request.param


@pytest.mark.parametrize("shape", ["list", "dict", "callable", "async-callable"])
async def test_form_fields_for_each_profile_list_shape(make, cls, shape):
    if shape == "list":
        value = PROFILE_LIST
    elif shape == "dict":
        value = {"b-demo": DEMO, "a-plain": PLAIN}  # shown in the order of the keys
    elif shape == "callable":
        value = lambda spawner: PROFILE_LIST  # noqa: E731
    else:
        async def value(spawner):
            return PROFILE_LIST
    fields = Fields(await form_of(make(cls, value)))
    assert fields.radios["profile"] == ["plain", "demo"]
    assert fields.selects["profile-option-demo--image"] == ["base", "minimal", "unlisted-choice"]
    assert fields.selects["profile-option-demo--size"] == ["small", "large"]
    assert "profile-option-demo--image--unlisted-choice" in fields.inputs


async def test_form_data_become_the_same_user_options(make, cls):
    spawner = make(cls)
    form = {"profile": ["demo"], "profile-option-demo--image": ["base"], "profile-option-demo--size": ["large"],
            "profile-option-plain--image": ["ignored: another profile's field"]}
    assert spawner.options_from_form(form) == {"profile": "demo", "image": "base", "size": "large"}
    form = {"profile": ["demo"], "profile-option-demo--image--unlisted-choice": ["jupyter/r-notebook:2024"]}
    assert spawner.options_from_form(form) == {"profile": "demo", "image--unlisted-choice": "jupyter/r-notebook:2024"}


async def test_overrides_merge_in_order(make, cls):
    pod = await pod_for(make(cls), {"profile": "demo", "image": "minimal", "size": "large"})
    c = container(pod)
    assert c["image"] == "jupyter/minimal-notebook:2024"  # the choice's override
    e = env(pod)
    assert (e["CONFIGURED"], e["PROFILE"], e["FLAVOUR"]) == ("yes", "demo", "minimal")  # dicts merge
    assert "REMOVED" not in e  # None removes a configured key
    assert pod["spec"]["nodeSelector"] == {"pool": "users", "size": "large"}
    assert {"key": "users", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert {"name": "shared", "emptyDir": {}} in pod["spec"]["volumes"]
    assert {"name": "shared", "mountPath": "/shared"} in c["volumeMounts"]
    assert c["resources"]["limits"]["example.com/fpga"] == "1"
    assert c["resources"]["requests"]["example.com/fpga"] == "1"
    assert float(c["resources"]["limits"]["cpu"]) == 4
    assert e["JUPYTERHUB_DEFAULT_URL"] == "/lab"


async def test_defaults_without_options(make, cls):
    pod = await pod_for(make(cls), {})
    assert container(pod)["image"] == "jupyter/scipy-notebook:2024"  # the default profile
    assert container(pod)["resources"]["limits"]["memory"] == 2 * 1024**3
    pod = await pod_for(make(cls), {"profile": "demo"})
    assert container(pod)["image"] == "jupyter/minimal-notebook:2024"  # the option's default choice
    assert float(container(pod)["resources"]["limits"]["cpu"]) == 1  # the first choice when none is default


async def test_unlisted_choice_fills_value_and_is_checked(make, cls):
    pod = await pod_for(make(cls), {"profile": "demo", "image--unlisted-choice": "jupyter/r-notebook:2024"})
    assert container(pod)["image"] == "jupyter/r-notebook:2024"
    assert pod["metadata"]["labels"]["custom-image"] == "yes"
    await refused(make(cls), {"profile": "demo", "image--unlisted-choice": "evil.example/miner:1"})


async def test_unlisted_choice_must_be_enabled(make, cls):
    await refused(make(cls), {"profile": "demo", "size--unlisted-choice": "huge"})


async def test_unknown_profile_or_choice_is_refused(make, cls):
    message = await refused(make(cls), {"profile": "nope"})
    assert "nope" in message
    await refused(make(cls), {"profile": "demo", "image": "no-such-choice"})


async def test_profile_without_default_the_first_is_default(make, cls):
    first = {"display_name": "First", "kubespawner_override": {"image": "jupyter/first:1"}}
    second = {"display_name": "Second", "kubespawner_override": {"image": "jupyter/second:1"}}
    spawner = make(cls, [first, second])
    assert Fields(await form_of(spawner)).radios["profile"] == ["first", "second"]  # slugs from display names
    assert container(await pod_for(spawner, {}))["image"] == "jupyter/first:1"
    assert container(await pod_for(make(cls, [first, second]), {"profile": "second"}))["image"] == "jupyter/second:1"


# ------------------------------------------------------------------ gpu-kube only: GPUs beside the options


async def test_gpu_choices_appear_beside_a_profiles_options(make, cluster):
    gpu = {**DEMO, "slug": "gpu", "display_name": "GPU", "gpu_models": ["a100", "h100"], "gpu_counts": [1, 2]}
    spawner = make(GPUKubeSpawner, [PLAIN, gpu])
    fields = Fields(await form_of(spawner))
    assert fields.selects["profile-option-gpu--gpus"] == ["1", "2"]
    assert "a100-sxm4-80gb" in fields.selects["profile-option-gpu--gpu_model"]
    assert fields.selects["profile-option-gpu--size"] == ["small", "large"]
    options = spawner.options_from_form({"profile": ["gpu"], "profile-option-gpu--gpus": ["2"],
                                         "profile-option-gpu--gpu_model": ["a100-sxm4-80gb"],
                                         "profile-option-gpu--size": ["large"]})
    assert options == {"profile": "gpu", "gpus": 2, "gpu_model": "a100-sxm4-80gb", "size": "large"}
    pod = await pod_for(spawner, options)
    assert gpu_limits(pod) == {"nvidia.com/gpu": "2"}
    assert pod["spec"]["nodeSelector"] == {"pool": "users", "size": "large",
                                           "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert container(pod)["resources"]["limits"]["example.com/fpga"] == "1"  # the profile's other resources stay


@pytest.mark.parametrize("resource, model, product", [
    ("nvidia.com/gpu", None, "NVIDIA-A100-SXM4-80GB"),
    ("nvidia.com/mig-1g.10gb", "mig-1g-10gb-a100-sxm4-80gb", "NVIDIA-A100-SXM4-80GB"),
    ("nvidia.com/gpu.shared", "shared-t4", "Tesla-T4"),
])
async def test_kubespawner_style_gpu_entries_keep_their_gpu(make, cluster, resource, model, product):
    entry = {"display_name": "GPU", "slug": "gpu",
             "kubespawner_override": {"extra_resource_limits": {resource: 1}, "environment": {"KEPT": "1"}}}
    spawner = make(GPUKubeSpawner, [PLAIN, entry])
    options = {"profile": "gpu", **({"gpu_model": model} if model else {})}
    pod = await pod_for(spawner, options)
    assert gpu_limits(pod) == {resource: "1"}
    assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == product
    assert env(pod)["KEPT"] == "1"


async def test_a_gpu_from_an_options_choice_is_checked_and_applied(make, cluster):
    entry = {"display_name": "Pick", "slug": "pick", "profile_options": {"accel": {"display_name": "Accelerator",
             "choices": {"none": {"display_name": "None"},
                         "mig": {"display_name": "MIG 1g", "kubespawner_override": {
                             "extra_resource_limits": {"nvidia.com/mig-1g.10gb": "1"}}}}}}}
    spawner = make(GPUKubeSpawner, [entry])
    pod = await pod_for(spawner, {"profile": "pick", "accel": "none"})
    assert gpu_limits(pod) == {} and env(pod)["NVIDIA_VISIBLE_DEVICES"] == "void"
    await spawner.stop(now=True)
    pod = await pod_for(spawner, {"profile": "pick", "accel": "mig"})
    assert gpu_limits(pod) == {"nvidia.com/mig-1g.10gb": "1"}


@pytest.mark.parametrize("apply_hook", ["gpuspawner's", "none (JupyterHub before 5.3, or the admin's own)"])
async def test_no_stale_choice_between_spawns(make, cluster, apply_hook):
    gpu = {"display_name": "GPU", "slug": "gpu", "gpu_models": ["any"], "gpu_counts": [1, 2],
           "kubespawner_override": {"environment": {"GPU_PROFILE": "1"}, "node_selector": {"pool": "gpu"}}}
    settings = {} if apply_hook == "gpuspawner's" else {"apply_user_options": {}}
    spawner = make(GPUKubeSpawner, [PLAIN, gpu], **settings)
    pod = await pod_for(spawner, {"profile": "plain"})
    assert gpu_limits(pod) == {}
    await spawner.stop(now=True)
    pod = await pod_for(spawner, {"profile": "gpu", "gpus": 2})
    assert gpu_limits(pod) == {"nvidia.com/gpu": "2"} and env(pod)["GPU_PROFILE"] == "1"
    await spawner.stop(now=True)
    pod = await pod_for(spawner, {"profile": "plain"})
    assert gpu_limits(pod) == {} and "GPU_PROFILE" not in env(pod)
    assert pod["spec"].get("nodeSelector") in (None, {})
    assert env(pod)["CONFIGURED"] == "yes" and env(pod)["REMOVED"] == "no"  # configured values back


@pytest.mark.parametrize("profile_list, named", [
    ([{"display_name": "X", "kubespawner_override": {}, "html": "<b>"}], "html"),
    ([{"display_name": "X", "profile_options": {"gpus": {"choices": {"1": {}}}}}], "gpus"),
    ([{"display_name": "X", "profile_options": {"o": {"choices": {"a": {"kubespawner_overide": {}}}}}}],
     "choices 'a'"),
    ([{"display_name": "X", "profile_options": {"o": {"unlisted_choice": {"enabled": True,
                                                                         "validation_regex": "("}}}}], "regex"),
    ([{"display_name": "X", "kubespawner_override": {"extra_resource_limits": {"nvidia.com/gpu": "two"}}}],
     "nvidia.com/gpu"),
    ([PLAIN, PLAIN], "repeated"),
])
def test_what_gpu_kube_cannot_honour_stops_it_naming_the_key(make, profile_list, named):
    with pytest.raises(Exception, match="Invalid profile_list") as info:
        make(GPUKubeSpawner, profile_list)
    assert named in str(info.value)


def test_kubespawner_form_templates_are_refused_not_ignored(make):
    with pytest.raises(Exception, match="profile_form_template"):
        make(GPUKubeSpawner, profile_form_template="<form></form>")


# ------------------------------------------------------------------ loading options as KubeSpawner 7.1 does


async def loaded(spawner, options: dict):
    """KubeSpawner 7.1's step on its own: user_options set, load_user_options() run, nothing started."""
    spawner.user_options = options
    await spawner.load_user_options()
    return spawner


async def test_load_user_options_applies_the_profile_before_start(make, cls):
    spawner = await loaded(make(cls), {"profile": "demo", "image": "base", "size": "large"})
    assert spawner.image == "jupyter/base-notebook:2024"
    assert spawner.cpu_limit == 4.0 and spawner.default_url == "/lab"
    assert spawner.node_selector == {"pool": "users", "size": "large"}
    assert spawner.environment == {"CONFIGURED": "yes", "PROFILE": "demo"}  # merged; None removed a key
    pod = validate_pod(spawner, await spawner.get_pod_manifest())  # what the progress page and admins read
    assert container(pod)["image"] == "jupyter/base-notebook:2024"


async def test_options_load_again_from_the_settings_before_the_last_load(make):
    spawner = await loaded(make(GPUKubeSpawner), {"profile": "demo", "image": "minimal", "size": "large"})
    assert spawner.environment["FLAVOUR"] == "minimal" and spawner.cpu_limit == 4.0
    await loaded(spawner, {"profile": "plain"})  # KubeSpawner would keep demo's merged settings (its issue 546)
    assert spawner.image == "jupyter/scipy-notebook:2024" and spawner.mem_limit == 2 * 1024**3
    assert spawner.environment == {"CONFIGURED": "yes", "REMOVED": "no"}
    assert spawner.cpu_limit is None and spawner.node_selector == {} and spawner.default_url == ""


async def test_refused_options_are_a_400_and_the_valueerror_kubespawner_raises(make):
    spawner = make(GPUKubeSpawner)
    for options in ({"profile": "demo", "image--unlisted-choice": "evil.example/miner:1"},
                    {"profile": "nope"}, {"profile": "demo", "image": "no-such-choice"}):
        with pytest.raises(ValueError) as info:
            await loaded(spawner, options)
        assert isinstance(info.value, web.HTTPError) and info.value.status_code == 400
    assert spawner.image == "quay.io/jupyter/base-notebook:2024-05-27"  # nothing was applied


async def test_a_start_applies_the_profile_once_and_the_pod_has_it(make, cluster):
    calls = []

    def labels(spawner):
        calls.append(spawner.user_options["profile"])
        return {"applied": str(len(calls))}

    gpu = {"display_name": "GPU", "slug": "gpu", "gpu_models": ["any"], "gpu_counts": [1],
           "kubespawner_override": {"extra_labels": labels, "environment": {"GPU_PROFILE": "1"}}}
    spawner = make(GPUKubeSpawner, [PLAIN, gpu])
    spawner.user_options = {"profile": "gpu", "gpus": 1}
    await spawner._run_apply_user_options(spawner.user_options)
    await asyncio.wait_for(spawner.start(), 60)
    assert calls == ["gpu"]  # reserve_gpus loaded the options; KubeSpawner's _start did not load them again
    assert cluster.made_pods() == [spawner.pod_name]  # one pod, as the API server holds it
    pod = cluster.pod(spawner.pod_name)
    assert pod["metadata"]["labels"]["applied"] == "1"
    assert gpu_limits(pod) == {"nvidia.com/gpu": "1"}
    assert env(pod)["GPU_PROFILE"] == "1" and env(pod)["CONFIGURED"] == "yes"
    await spawner.stop(now=True)
    assert spawner.extra_labels == {} and "GPU_PROFILE" not in spawner.environment  # undone at stop


async def test_a_site_profile_list_keeps_its_default_beside_gpu_profiles(make):
    first = {"display_name": "First", "kubespawner_override": {"image": "jupyter/first:1"}}
    second = {"display_name": "Second", "kubespawner_override": {"image": "jupyter/second:1"}}
    cpu = [{"slug": "gpu-cpu", "display_name": "CPU only", "gpu_counts": [0]}]
    spawner = make(GPUKubeSpawner, [first, second], gpu_profiles=cpu)
    assert container(await pod_for(spawner, {}))["image"] == "jupyter/first:1"  # as KubeSpawner picks
    assert Checked(await form_of(spawner)).radios["profile"] == "first"
    marked = [{**c, "default": True} for c in cpu]  # a GPU profile marked default is the default
    assert Checked(await form_of(make(GPUKubeSpawner, [first, second], gpu_profiles=marked))).radios["profile"] == (
        "gpu-cpu")


async def test_a_sites_options_from_form_wins_and_its_options_are_checked(make):
    def site_form(formdata):
        return {"profile": formdata["flavour"][0], "size": "large"}

    spawner = make(GPUKubeSpawner, options_from_form=site_form)
    options = spawner.run_options_from_form({"flavour": ["demo"]})
    assert options == {"profile": "demo", "size": "large"}
    assert float(container(await pod_for(spawner, options))["resources"]["limits"]["cpu"]) == 4
    options = spawner.run_options_from_form({"flavour": ["nope"]})
    assert "nope" in await refused(make(GPUKubeSpawner, options_from_form=site_form), options)
    simple = make(GPUKubeSpawner, options_from_form="simple")  # JupyterHub's named parsers too
    assert simple.run_options_from_form({"profile": ["demo"], "size": ["large"]}) == {"profile": "demo",
                                                                                       "size": "large"}


# ------------------------------------------------------------------ the form pre-selects the last choice


async def test_the_form_preselects_the_last_choice(make, cluster):
    # the site's large user nodes, where the choice below runs (A100s, an FPGA, in the users pool)
    with nodes_added(cluster.kube, gpu_node("gpu-users-large", gpus=2, resources={"example.com/fpga": 1},
                                            labels={"pool": "users", "size": "large"})):
        await form_preselects_the_last_choice(make)


async def form_preselects_the_last_choice(make):
    gpu = {**DEMO, "slug": "gpu", "display_name": "GPU", "gpu_models": ["a100", "h100"], "gpu_counts": [1, 2]}
    spawner = make(GPUKubeSpawner, [PLAIN, gpu])
    form = {"profile": ["gpu"], "profile-option-gpu--gpus": ["2"], "profile-option-gpu--gpu_model": ["a100-sxm4-80gb"],
            "profile-option-gpu--image": ["unlisted-choice"],
            "profile-option-gpu--image--unlisted-choice": ["jupyter/r-notebook:2024"],
            "profile-option-gpu--size": ["large"]}
    spawner.user_options = spawner.run_options_from_form(form)
    await spawner._run_apply_user_options(spawner.user_options)
    await asyncio.wait_for(spawner.start(), 60)
    await spawner.stop(now=True)
    for shown in (spawner, make(GPUKubeSpawner, [PLAIN, gpu])):  # the same object, and a new one after a restart
        shown.user_options = spawner.user_options  # JupyterHub keeps them in its database
        checked = Checked(await form_of(shown))
        assert checked.radios["profile"] == "gpu"
        assert checked.selected["profile-option-gpu--gpus"] == "2"
        assert checked.selected["profile-option-gpu--gpu_model"] == "a100-sxm4-80gb"
        assert checked.selected["profile-option-gpu--image"] == "unlisted-choice"
        assert checked.texts["profile-option-gpu--image--unlisted-choice"] == "jupyter/r-notebook:2024"
        assert checked.selected["profile-option-gpu--size"] == "large"
    # a saved choice the profile no longer offers falls back to that option's default; a profile that is
    # gone, to the default profile (KubeSpawner 7.1 drops every saved choice when one is invalid)
    changed = make(GPUKubeSpawner, [PLAIN, {**gpu, "profile_options": {"size": DEMO["profile_options"]["size"]}}])
    changed.user_options = {**spawner.user_options, "size": "huge"}
    checked = Checked(await form_of(changed))
    assert checked.radios["profile"] == "gpu"
    assert checked.selected["profile-option-gpu--size"] == "small"
    assert checked.selected["profile-option-gpu--gpus"] == "2"
    gone = make(GPUKubeSpawner, [PLAIN, DEMO])
    gone.user_options = spawner.user_options
    assert Checked(await form_of(gone)).radios["profile"] == "plain"


# ------------------------------------------------------------------ settings gpu-kube would replace: refused at start

GPU_CHOICES = [{"display_name": "GPU", "slug": "gpu", "gpu_models": ["any"], "gpu_counts": [1, 2]}]


@pytest.mark.parametrize("profile_list, settings, named", [
    (PROFILE_LIST, {"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "environment['NVIDIA_VISIBLE_DEVICES']"),
    (PROFILE_LIST, {"environment": {"NVIDIA_DRIVER_CAPABILITIES": "all"}}, "NVIDIA_DRIVER_CAPABILITIES"),
    (GPU_CHOICES, {"extra_resource_limits": {"nvidia.com/gpu": "1"}}, "extra_resource_limits['nvidia.com/gpu']"),
    ([], {"extra_resource_guarantees": {"nvidia.com/mig-1g.10gb": "1"}}, "extra_resource_guarantees"),
    (GPU_CHOICES, {"node_selector": {"nvidia.com/gpu.product": "Tesla-T4"}}, "node_selector['nvidia.com/gpu.product']"),
    (PROFILE_LIST, {"node_selector": {"nvidia.com/gpu.product": "Tesla-T4"}}, "without a GPU resource"),
    (PROFILE_LIST, {"gpu_profiles": [{"display_name": "CPU", "slug": "c", "gpu_counts": [0]}],
                    "extra_resource_limits": {"nvidia.com/gpu": "1"}}, "a profile with GPU choices"),
])
async def test_settings_gpu_kube_would_replace_stop_it_naming_them(make, profile_list, settings, named):
    with pytest.raises(TraitError, match="gpu-kube cannot honour c.KubeSpawner") as info:
        make(GPUKubeSpawner, profile_list, **settings)
    assert named in str(info.value)


async def test_a_class_level_gpu_beside_kubespawner_style_profiles_is_honoured(make, cluster):
    selector = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    spawner = make(GPUKubeSpawner, PROFILE_LIST, extra_resource_limits={"nvidia.com/gpu": "1"}, node_selector=selector)
    pod = await pod_for(spawner, {"profile": "plain"})  # every server asks for it, as with KubeSpawner
    assert gpu_limits(pod) == {"nvidia.com/gpu": "1"} and pod["spec"]["nodeSelector"] == selector


# ------------------------------------------------------------------ any sequence of loads: only the last one counts

CHOSEN = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"profile": st.sampled_from(["plain", "demo", "nope"])}),
    st.fixed_dictionaries({"profile": st.just("demo")},
                          optional={"image": st.sampled_from(["base", "minimal", "nope"]),
                                    "size": st.sampled_from(["small", "large"]),
                                    "image--unlisted-choice": st.sampled_from(["jupyter/x:1", "evil.example/x:1"])}),
)


def configured(spawner) -> dict:
    """Every setting; a method of the spawner itself (its default form, parser, hook) as the function."""
    values = {name: getattr(spawner, name) for name in spawner.trait_names(config=True)}
    return {k: v.__func__ if getattr(v, "__self__", None) is spawner else v for k, v in values.items()}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=st.lists(CHOSEN, min_size=1, max_size=5))
async def test_after_any_loads_the_settings_are_those_of_the_last_accepted_options(make, cluster, sequence):
    """Refused options change nothing; accepted ones replace all an earlier load applied (no stale settings)."""
    spawner, last = make(GPUKubeSpawner), None
    for options in sequence:
        before = configured(spawner)
        try:
            await loaded(spawner, options)
        except ValueError:
            assert configured(spawner) == before
        else:
            last = options
    fresh = make(GPUKubeSpawner)
    if last is not None:
        await loaded(fresh, last)
    assert configured(spawner) == configured(fresh)
    await spawner.stop(now=True)  # and a stop undoes the last load
    assert configured(spawner) == configured(make(GPUKubeSpawner))
