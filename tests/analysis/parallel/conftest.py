"""One local Dask cluster for the package's tests: starting one (a scheduler, two nannies and their
workers) costs seconds of CPU, and the tests only submit to it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def dask_cluster():
    """The address of a 2-worker local Dask cluster, started when first asked for."""
    distributed = pytest.importorskip("distributed")
    from analysis.parallel.dask_run import LOCAL_SCHEDULER

    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, scheduler_kwargs=LOCAL_SCHEDULER
    )
    yield cluster.scheduler_address
    cluster.close()
