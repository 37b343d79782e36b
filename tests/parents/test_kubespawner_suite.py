"""kubespawner 7.1.0's own tests, unmodified, with GPUKubeSpawner in KubeSpawner's place (issue 26).

Their folder (``../shared/parents/kubespawner-7.1.0/tests``) runs in a pytest
subprocess per mode (:func:`parentsuite.run_suite`): ``parent`` (KubeSpawner
itself, the baseline), ``cpu`` (GPUKubeSpawner with one CPU-only GPU profile
beside the profile_list each test sets) and ``default`` (GPUKubeSpawner with
gpuspawner's default profiles, which apply where a test sets no profile_list).
What they need here and what JupyterHub 6 changed under them is adapted by
:mod:`kubeparent` and the environment, never by editing their files: the sync
``kubernetes`` client (test extras), and a kubeconfig whose server is
``https://127.0.0.1:1``, so their ``kube_client`` fixture finds no cluster and
skips its 20 cluster tests. The other 187 must pass in every mode; a failure that
is only a test artefact would have to be listed in docs/compatibility.md.

The CPU-only profile of the ``cpu`` mode is named ``gpuspawner-cpu``: their
test_profile.py names a profile of its own ``cpu``, and two profiles with one slug
are refused at hub start (a user's ``"profile": "cpu"`` would be ambiguous).
"""

from __future__ import annotations

import pytest

from needs import module
from parentsuite import MODES, parent_tests, run_suite, unexpected

SECTION = "KubeSpawner (gpu-kube)"
TITLE = "kubespawner 7.1.0, its 187 cluster-free tests"
CLUSTER_FREE = 187
NEED_A_CLUSTER = 20
CPU_ONLY = [{"slug": "gpuspawner-cpu", "display_name": "CPU only", "gpu_counts": [0]}]

NO_CLUSTER = """\
apiVersion: v1
kind: Config
clusters:
- name: none
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: none
  user: {token: none}
contexts:
- name: none
  context: {cluster: none, user: none, namespace: kubespawner-test}
current-context: none
"""


@pytest.fixture(scope="module")
def suite():
    module("kubernetes", "kubespawner's tests need the sync kubernetes client (pip install -e '.[test]')")
    return parent_tests("kubespawner-7.1.0")


@pytest.mark.parametrize("mode", MODES)
def test_kubespawner_suite(suite, mode, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(NO_CLUSTER)
    result = run_suite(
        TITLE, suite, mode,
        targets=[("kubespawner", "KubeSpawner")],
        gpu_class="gpuspawner.spawners.kube:GPUKubeSpawner",
        defaults={"gpu_profiles": CPU_ONLY} if mode == "cpu" else None,
        extra_plugins=("kubeparent",),
        env={"KUBECONFIG": str(kubeconfig)},
        workdir=tmp_path,
        timeout=600,
    )
    failures = unexpected(result, SECTION)
    assert failures == [], "\n".join(failures) + "\n\n" + result.output
    assert len(result.skipped) == NEED_A_CLUSTER, "\n".join(result.skipped) + "\n\n" + result.output
    assert (len(result.passed), result.total) == (CLUSTER_FREE, CLUSTER_FREE + NEED_A_CLUSTER), result.output
