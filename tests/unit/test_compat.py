"""CUDA compatibility: image requirements against the host driver (pure)."""

import pytest

from gpuspawner.compat import (
    HostCuda,
    check_image,
    host_cuda,
    image_requirements,
    min_cuda,
    parse_requirement,
)
from gpuspawner.gpu import GPU

CUDA_12_2_IMAGE = [
    "PATH=/usr/bin",
    "NVIDIA_REQUIRE_CUDA=cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471",
    "CUDA_VERSION=12.2.2",
]
HOST_12_4 = HostCuda("gpu-host-1", (12, 4), "550.54.15")


def gpus(cuda=12040, driver="550.54.15", host="gpu-host-1"):
    return (GPU(host, 0, "GPU-a", "Tesla T4", cuda_driver_version=cuda, driver_version=driver),)


def test_host_cuda_reads_nvml_numbers():
    assert host_cuda(gpus()) == HOST_12_4
    assert host_cuda(gpus(cuda=11080)) == HostCuda("gpu-host-1", (11, 8), "550.54.15")
    assert host_cuda(gpus(cuda=None, driver=None)) == HostCuda("gpu-host-1", None, None)


def test_older_cuda_image_runs():
    assert check_image("cuda:12.2", image_requirements(CUDA_12_2_IMAGE), HOST_12_4) is None


def test_newer_cuda_image_is_refused_naming_both_versions():
    env = ["NVIDIA_REQUIRE_CUDA=cuda>=12.6 brand=tesla,driver>=470,driver<471"]
    message = check_image("pytorch:cu126", image_requirements(env), HOST_12_4)
    assert message.startswith(
        "Image pytorch:cu126 needs CUDA 12.6 but the driver on host gpu-host-1 supports CUDA 12.4 at most"
    )
    assert "550.54.15" in message


def test_forward_compatibility_alternative_counts():
    # a 470 datacenter driver may run a CUDA 12.2 image through the image's compat package
    host = HostCuda("h", (11, 4), "470.223.02")
    assert check_image("cuda:12.2", image_requirements(CUDA_12_2_IMAGE), host) is None
    host = HostCuda("h", (11, 4), "460.1")
    assert "needs CUDA 12.2" in check_image("cuda:12.2", image_requirements(CUDA_12_2_IMAGE), host)


@pytest.mark.parametrize("env, labels, needed", [
    (["CUDA_VERSION=12.6.1"], {}, "12.6"),
    ([], {"com.nvidia.cuda.version": "12.8.0"}, "12.8"),
])
def test_cuda_version_fallbacks(env, labels, needed):
    message = check_image("img", image_requirements(env, labels), HOST_12_4)
    assert f"needs CUDA {needed} but" in message
    assert check_image("img", image_requirements(env, labels), HostCuda("h", (13, 0), None)) is None


def test_no_requirement_or_disabled_check_passes():
    assert image_requirements(["PATH=/bin"]) == ()
    assert image_requirements(["NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=true"]) == ()
    assert check_image("plain", (), HOST_12_4) is None


def test_unknown_host_facts_never_refuse():
    reqs = image_requirements(["NVIDIA_REQUIRE_CUDA=cuda>=12.6"])
    assert check_image("img", reqs, HostCuda("h", None, None)) is None
    reqs = image_requirements(["NVIDIA_REQUIRE_CUDA=arch>=9.0"])
    assert check_image("img", reqs, HOST_12_4) is None


def test_other_requirements_are_anded():
    env = ["NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_DRIVER=driver>=555"]
    message = check_image("img", image_requirements(env), HOST_12_4)
    assert message is not None and "driver>=555" in message and "NVIDIA_REQUIRE_DRIVER" in message


def test_driver_precision_follows_the_constraint():
    assert check_image("i", image_requirements(["NVIDIA_REQUIRE_X=driver>=550"]), HOST_12_4) is None
    assert check_image("i", image_requirements(["NVIDIA_REQUIRE_X=driver<550"]), HOST_12_4) is not None


def test_unreadable_requirement_is_an_error():
    with pytest.raises(ValueError, match="cuda~12"):
        parse_requirement("cuda~12")


@pytest.mark.parametrize("text, version", [
    ("12.4", (12, 4)), ("12", (12, 0)), ("11.8.0", (11, 8)), ("cuda>=12.2", (12, 2)),
    ("cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471", (12, 4)),
])
def test_min_cuda_reads_versions_and_expressions(text, version):
    assert min_cuda(text) == version


@pytest.mark.parametrize("text", ["", "latest", "brand=tesla", 12.4, None, "cuda<12"])
def test_min_cuda_refuses_what_is_not_a_cuda_requirement(text):
    with pytest.raises(ValueError, match="CUDA requirement"):
        min_cuda(text)
