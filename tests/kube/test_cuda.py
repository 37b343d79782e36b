"""gpu-kube's node affinity for an image's CUDA requirement."""

from __future__ import annotations

from gpuspawner.backends.kube.cuda import cuda_affinity_terms, node_supports


def test_affinity_terms_match_the_same_nodes_as_the_comparison():
    """Evaluate the terms the way the scheduler does, against every driver version 10.0..13.9."""
    def matches(terms, labels):
        def ok(e):
            have = labels.get(e["key"])
            if have is None:
                return False
            if e["operator"] == "In":
                return have in e["values"]
            return int(have) > int(e["values"][0])  # Gt
        return any(all(ok(e) for e in term) for term in terms)

    for need in [(12, 0), (12, 4), (11, 8)]:
        terms = cuda_affinity_terms(need)
        for major in range(10, 14):
            for minor in range(10):
                labels = {"nvidia.com/cuda.driver.major": str(major), "nvidia.com/cuda.driver.minor": str(minor)}
                assert matches(terms, labels) == ((major, minor) >= need) == node_supports(labels, need)
    assert node_supports({}, (12, 0)) is None
