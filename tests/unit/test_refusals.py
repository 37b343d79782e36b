"""Refusals: one code enum, one table of sentences, every backend's refusal a PlacementError."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuspawner.backends.kube.capacity import GPU_RESOURCE, CapacityError, NodeGPUs, NodePool, place as kube_place
from gpuspawner.backends.slurm.capacity import GresTypes, NeverFits, SlurmNode, choose_type
from gpuspawner.gpu import model_slug
from gpuspawner.queue import WAITABLE, QueueTimeout
from gpuspawner.quota import Quota, QuotaError, check
from gpuspawner.refusals import SENTENCES, PlacementError, Refusal, refuse, words

PACKAGE = Path(__file__).resolve().parents[2] / "gpuspawner"
REFUSALS = {"PlacementError", "CapacityError", "NeverFits", "QuotaError", "QueueTimeout"}


def test_every_code_has_a_sentence_and_every_sentence_a_known_code():
    coded = {code for code, _ in SENTENCES.values() if code is not None}
    assert coded == set(Refusal)
    assert WAITABLE <= set(Refusal)
    assert {"none_free", "not_enough_on_one_host", "none_usable", "no_nvlink_set"} == set(WAITABLE)


def test_codes_are_the_strings_metrics_and_logs_always_had():
    assert Refusal.NONE_FREE == "none_free" and str(Refusal.NONE_FREE) == "none_free"
    assert f"{Refusal.QUOTA_USER}" == "quota_user" and "%s" % (Refusal.QUEUE_TIMEOUT,) == "queue_timeout"  # noqa: UP031 (logging formats so)
    assert "none_free" in WAITABLE
    error = PlacementError("x", code="exceeds_host_size")
    assert error.code is Refusal.EXCEEDS_HOST_SIZE
    with pytest.raises(ValueError, match="'no_such_code' is not a valid Refusal"):
        PlacementError("x", code="no_such_code")


def test_every_backends_refusal_is_a_placement_error_with_its_code():
    for cls in (CapacityError, NeverFits, QuotaError, QueueTimeout):
        assert issubclass(cls, PlacementError)
    name = "NVIDIA-A100-SXM4-80GB"
    a100 = NodePool(model_slug(name), "gpu", name, GPU_RESOURCE, name, allocatable=8, used=8)
    node = NodeGPUs("n1", True, None, None, (a100,))
    with pytest.raises(PlacementError) as kube:
        kube_place([node], ("a100",), 16)
    assert isinstance(kube.value, CapacityError) and kube.value.never
    assert (kube.value.code, kube.value.requested, kube.value.models) == ("exceeds_host_size", 16, ("a100",))
    with pytest.raises(PlacementError) as busy:
        kube_place([node], ("a100",), 1)
    assert busy.value.code in WAITABLE and not busy.value.never
    with pytest.raises(PlacementError) as slurm:
        choose_type([SlurmNode("n1", ("gpu",), "idle", gpus={"a100": 2})], GresTypes(), ("t4",), 1)
    assert isinstance(slurm.value, NeverFits) and slurm.value.code == "no_matching_model"
    assert (slurm.value.requested, slurm.value.models) == (1, ("t4",))
    with pytest.raises(PlacementError) as quota:
        check(Quota(user="ann", per_user=1), 2, {})
    assert isinstance(quota.value, QuotaError) and quota.value.code == "quota_user"


def test_sentences_are_filled_in_word_for_word():
    assert words("has_free", name="Tesla T4", free=2) == " Tesla T4 has 2 free."
    error = refuse("slurm_no_gpus", {"where": "in the Slurm cluster"}, NeverFits, requested=1)
    assert str(error) == "No node in the Slurm cluster has GPUs." and error.code == "no_gpus"
    with pytest.raises(AssertionError, match="fragment"):
        refuse("has_free", {"name": "x", "free": 1})


def test_no_refusal_is_worded_outside_the_table():
    """Refusals are made by refuse() from SENTENCES; no module builds one from its own sentence."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "refusals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in REFUSALS:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert found == []
