"""The TensorFlow notebook image under gpu-docker: its conventions and the benchmark notebook.

The image is built by images/build.py on the private engine from the
mmdebstrap base and a host wheelhouse with CPU TensorFlow (cached under
build/images by content). A real JupyterHub starts a server from it with two
of four stand-in GPUs; the benchmark notebook shipped in ~/examples is run in
that container with ``jupyter nbconvert --execute``, as a user would run it.
"""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.docker

NOTEBOOK = "/home/jovyan/examples/gpu-benchmark.ipynb"


def test_tensorflow_image_follows_docker_stacks_and_declares_cuda(engine, tensorflow_image):
    config = engine.client.images.get(tensorflow_image).attrs["Config"]
    assert config["User"] in ("1000", "jovyan")
    assert config["WorkingDir"] == "/home/jovyan"
    assert config["Cmd"] == ["jupyterhub-singleuser"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["NVIDIA_REQUIRE_CUDA"] == "cuda>=12.3"
    assert config["Labels"]["com.nvidia.cuda.version"] == "12.3"
    out = engine.client.containers.run(
        tensorflow_image, ["sh", "-c", "id -u; id -un; echo $HOME; ls ~/examples; "
                           "jupyter labextension list 2>&1 | grep -i gpuspawner; "
                           "jupyter server extension list 2>&1 | grep -i gpuspawner.monitor"],
        remove=True, network=engine.network,
    ).decode()
    out = re.sub(r"\x1b\[[0-9;]*m", "", out)  # jupyter colours its lists
    lines = out.splitlines()
    assert lines[:4] == ["1000", "jovyan", "/home/jovyan", "gpu-benchmark.ipynb"], out
    assert re.search(r"gpuspawner.*enabled.*OK", out), out  # the monitor's JupyterLab extension
    assert re.search(r"gpuspawner\.monitor.*enabled", out), out  # and its server extension


def test_benchmark_notebook_runs_in_a_gpu_docker_server(docker_hub, tensorflow_image):
    hub = docker_hub(gpus=4, image=tensorflow_image)
    hub.add_users("tess")
    r = hub.spawn("tess", {"profile": "gpu", "gpus": 2, "gpu_model": "any"})
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{hub.log()}"
    hub.wait_ready("tess", timeout=300)
    container = hub.container("tess")
    given = container.labels["org.gpuspawner.gpus"].split(",")
    assert len(given) == 2

    # a terminal in the server sees its environment (the engine's), as the notebook kernel does
    result = container.exec_run(
        ["sh", "-c", "export $(tr '\\0' '\\n' < /proc/1/environ | grep ^NVIDIA_VISIBLE_DEVICES=); "
                     f"GPU_BENCHMARK_SIZE=600 jupyter nbconvert --to notebook --execute --stdout {NOTEBOOK}"],
        demux=True,
    )
    stdout, stderr = (part.decode() if part else "" for part in result.output)
    assert result.exit_code == 0, stderr[-4000:]
    executed = json.loads(stdout)
    printed = "".join(
        "".join(o.get("text", "")) for cell in executed["cells"] if cell["cell_type"] == "code"
        for o in cell["outputs"] if o.get("output_type") == "stream" and o.get("name") == "stdout"
    )
    assert re.search(r"^TensorFlow 2\.\d+\.\d+: 600 x 600 float32 matrix product, best of 3$", printed, re.M), printed
    assert re.search(r"^CPU: \d+\.\d{4} s$", printed, re.M), printed
    assert "No GPU visible to TensorFlow: ran on CPU only" in printed
    assert "Speedup" not in printed  # no GPU time to compare with: nothing invented
    shown = re.search(r"NVIDIA_VISIBLE_DEVICES\): (\S+)", printed).group(1)
    assert shown.split(",") == given
    errors = [o for cell in executed["cells"] if cell["cell_type"] == "code" for o in cell["outputs"]
              if o.get("output_type") == "error"]
    assert errors == []


HUB_CHECK = """
import json, sys
from importlib.metadata import entry_points, version
import pycurl, jupyterhub_idle_culler, oauthenticator, nativeauthenticator, firstuseauthenticator, psycopg2, pymysql
from tornado.httpclient import AsyncHTTPClient
AsyncHTTPClient.configure("tornado.curl_httpclient.CurlAsyncHTTPClient")  # as z2jh's hub config does
from traitlets.config import Config
from gpuspawner.backends.kube.profiles import check_entries, combined_entries
import yaml
values = yaml.safe_load(sys.stdin)
spawner = entry_points(group="jupyterhub.spawners")[values["hub"]["config"]["JupyterHub"]["spawner_class"]].load()
profiles = check_entries(combined_entries([], values["singleuser"]["profileList"]))
print(json.dumps({"python": sys.executable, "jupyterhub": version("jupyterhub"),
                  "kubespawner": version("jupyterhub-kubespawner"), "spawner": spawner.__name__,
                  "profiles": [p.slug for p in profiles]}))
"""


def test_hub_image_builds_offline_on_the_z2jh_layout_and_loads_gpu_kube(engine):
    """images/hub/Dockerfile on a stand-in of z2jh's hub image (images/z2jh-hub-standin), from host wheels."""
    from pathlib import Path

    tag = engine.build_image("gpuspawner-hub:test", "hub")
    config = engine.client.images.get(tag).attrs["Config"]
    assert config["User"] == "1000"  # z2jh's jovyan, not root
    assert config["Cmd"] == ["jupyterhub", "--config", "/usr/local/etc/jupyterhub/jupyterhub_config.py"]  # kept
    assert config["WorkingDir"] == "/srv/jupyterhub"
    values = (Path(__file__).resolve().parents[2] / "helm" / "z2jh-values.yaml").read_text()
    container = engine.client.containers.create(
        tag, ["sh", "-c", "id -un; python3 -c \"$CHECK\" < /tmp/values.yaml"],
        environment={"CHECK": HUB_CHECK}, network=engine.network)
    try:
        import io
        import tarfile

        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo("values.yaml")
            info.size = len(values.encode())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(values.encode()))
        container.put_archive("/tmp", archive.getvalue())
        container.start()
        assert container.wait(timeout=120)["StatusCode"] == 0, container.logs().decode()[-3000:]
        lines = container.logs(stderr=False).decode().splitlines()
    finally:
        container.remove(force=True)
    assert lines[0] == "jovyan"
    loaded = json.loads(lines[-1])
    assert loaded["python"].startswith("/opt/z2jh-python/")  # the base image's own environment
    assert (loaded["jupyterhub"], loaded["kubespawner"]) == ("5.5.0", "7.0.0")  # held at the base's versions
    assert loaded["spawner"] == "GPUKubeSpawner"
    assert loaded["profiles"] == ["cpu", "gpu", "mig", "shared"]
