"""One private Slurm cluster (slurmctld, slurmd, munged) per test session, stopped by pid."""

from __future__ import annotations

import os

import pytest

from needs import missing
from slurmcluster import SlurmCluster, absent_programs


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A one-node cluster with GPUs ``gpu:a100:2,gpu:t4:2`` on device files ``c 195 0..3``."""
    absent = absent_programs()
    if absent:
        missing(f"needs Slurm and munge ({', '.join(absent)} absent; scripts/setup installs slurm-wlm and munge)")
    if os.geteuid() != 0:
        missing("the private Slurm cluster needs root (slurmd runs the jobs; device files are made with mknod)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), {"a100": 2, "t4": 2})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
