"""Fixtures for the whole suite."""

from __future__ import annotations

import gc
import json
import os
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests import gpu_traces
from tests.support import owned
from tests.support.recordings import Recordings, asked_together, record_plain_ddp

# Property tests check behaviour, not speed: on a loaded machine an example may take seconds, and
# hypothesis' deadline and too-slow health check would fail a correct test (speed has benchmark scripts).
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

# The scripts the tests start (run_nsys.sh) run with $PYTHON: make it the interpreter running the tests.
os.environ["PYTHON"] = sys.executable
# No analysis cache beside the traces the tests read (shared decompressed copies among them), in this
# process or the CLIs it starts; the cache's own tests (tests/analysis/cache/test_cache.py) turn it on.
os.environ["ANALYSIS_NO_CACHE"] = "1"

# The cyclic garbage collector spent about 2.4 s of the 30 s quick loop walking the objects that live
# for the whole session: the modules of torch, pandas and plotly that the test modules import and the
# collected tests. They are frozen (left out of every later collection) as each test module is
# collected, and young objects are collected every 10,000 allocations instead of 700. The tests' own
# garbage is still collected; the collector's time drops to about 0.4 s.
gc.set_threshold(10_000, 10, 10)


def pytest_collectreport(report):
    gc.freeze()


# The costs a bare `pytest` leaves out (pyproject.toml's markers say what each means).
COSTLY = ("ranks", "nsys", "browser", "pool", "real", "pages", "subprocess")


# The suite's workers (pytest-xdist, a test extra). The quick loop's tests run in this process and mostly
# wait on one core, so two workers, each taking whole files (a module's fixtures are made once), nearly
# halve it. The whole suite runs on two as well, by groups (`_group`): every module that starts training
# ranks or the real nsys, or reads the session's recordings, in one group that one worker runs, one module
# after another (two such modules at once would oversubscribe the two cores, and a recording is made once
# per worker that asks for it); the rest by file, on the other worker while those run.
WORKERS = 2
PROCESSES_GROUP = "processes"
SHARED_RUNS = ("nsys_recordings", "torch_recordings", "plain_ddp_run")  # the session fixtures that spawn ranks
GROUPS_FILE = "xdist_groups.json"  # in the controller's basetemp: worker gw0's {nodeid: group}


def pytest_addoption(parser):
    parser.addoption("--whole-suite", action="store_true", help=f"run the costly tests too ({', '.join(COSTLY)})")


def _bare(config) -> bool:
    """No files, -m or -k named: `pytest` or `pytest --whole-suite`."""
    bare = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.markexpr
    return bare and not config.option.keyword


def _quick_loop(config) -> bool:
    """A bare `pytest`: no files, -m, -k or --whole-suite named."""
    return _bare(config) and not config.getoption("whole_suite")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """A bare `pytest` (by file) or `pytest --whole-suite` (by group: --dist loadscope, `_group`) runs on
    WORKERS xdist workers when xdist is installed and -n was not given (`-n 0` runs it in this process);
    what a worker runs, it chooses itself (pytest_collection_modifyitems)."""
    numprocesses = getattr(config.option, "numprocesses", "absent")  # absent: xdist not installed or -p no:xdist
    if numprocesses is None and _bare(config) and not config.option.usepdb and "PYTEST_XDIST_WORKER" not in os.environ:
        config.option.numprocesses = WORKERS
        config.option.dist = "loadfile" if _quick_loop(config) else "loadscope"


def _starts_processes(item) -> bool:
    return any(item.get_closest_marker(m) for m in ("ranks", "nsys")) or any(
        f in getattr(item, "fixturenames", ()) for f in SHARED_RUNS
    )


def _group(items) -> dict[str, str]:
    """Each test's group: PROCESSES_GROUP for every test of a module with one test that starts ranks or
    nsys, else its file."""
    heavy = {item.module.__name__ for item in items if _starts_processes(item)}
    return {
        item.nodeid: PROCESSES_GROUP if item.module.__name__ in heavy else item.nodeid.split("::", 1)[0]
        for item in items
    }


def pytest_collection_modifyitems(config, items):
    """A bare `pytest` runs the quick loop: the tests with none of the COSTLY marks. Under --dist loadscope,
    worker gw0 writes the groups for the controller's scheduler (`pytest_xdist_make_scheduler`)."""
    if _quick_loop(config):
        quick = [item for item in items if not any(item.get_closest_marker(m) for m in COSTLY)]
        if len(quick) < len(items):
            kept = set(map(id, quick))
            config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
            items[:] = quick
    if os.environ.get("PYTEST_XDIST_WORKER") == "gw0" and getattr(config, "workerinput", {}).get("loadscope_groups"):
        target = Path(config.option.basetemp).parent / GROUPS_FILE
        partial = target.with_suffix(".partial")
        partial.write_text(json.dumps(_group(items)))
        partial.replace(target)


@pytest.hookimpl(optionalhook=True)  # xdist's hooks: absent without it
def pytest_configure_node(node):
    """Tell the workers to write the groups (only under --dist loadscope)."""
    node.workerinput["loadscope_groups"] = node.config.getvalue("dist") == "loadscope"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope by `_group`'s groups rather than by file (xdist's own loadgroup does not group
    under pytest 9, whose nodeids it can no longer rename)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    groups_file = config._tmp_path_factory.getbasetemp() / GROUPS_FILE

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # written by gw0 before it reported its collection, read after all did
                self.groups = json.loads(groups_file.read_text()) if groups_file.exists() else {}
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return GroupScheduling(config, log)


# Every process the suite starts carries a token (tests/support/owned.py): this session's, under which
# the module and session fixtures start theirs, or the running test's own.
SESSION = owned.new_token()
os.environ[owned.OWNER_ENV] = SESSION


@pytest.fixture(autouse=True)
def _ends_its_processes():
    """The processes a test started end with it: what still runs 3 s after it is stopped, with a warning."""
    token, before = owned.new_token(SESSION), owned.pids()
    os.environ[owned.OWNER_ENV] = token
    try:
        yield
    finally:
        os.environ[owned.OWNER_ENV] = SESSION
        if left := owned.end_all(token, below=True, among=owned.pids() - before):  # only one started since can carry it
            warnings.warn(f"stopped {len(left)} process(es) the test left running: {'; '.join(left)}", stacklevel=1)


def pytest_sessionfinish(session):
    """What the fixtures started and did not end, ended with the session (after a failure or Ctrl-C too).
    An xdist controller runs no test: what runs under its token is its workers, which end their own."""
    if not session.config.pluginmanager.has_plugin("dsession"):
        owned.end_all(SESSION, below=True, wait_s=0.5)


@pytest.fixture(scope="session")
def gpu_trace(request, tmp_path_factory):
    """gpu_trace("naive.sqlite") -> path of that real H100 trace, decompressed once into pytest's cache
    folder (.pytest_cache/d/gpu_h100, kept between runs; a temporary folder under -p no:cacheprovider)."""
    if not gpu_traces.available():
        pytest.skip("../shared/data/gpu_h100 not present")
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("gpu_h100") if cache is not None else tmp_path_factory.mktemp("gpu_h100")
    return lambda name: gpu_traces.decompress(name, folder)


@pytest.fixture(scope="session")
def gpu_h200_trace(request, tmp_path_factory):
    """gpu_h200_trace("fsdp_bf16.sqlite") -> path of that real H200 trace (../shared/data/gpu_h200),
    decompressed once into pytest's cache folder like gpu_trace's; skipped when the folder is absent."""
    if not gpu_traces.available(gpu_traces.GPU_H200):
        pytest.skip("../shared/data/gpu_h200 not present")
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("gpu_h200") if cache is not None else tmp_path_factory.mktemp("gpu_h200")
    return lambda name: gpu_traces.decompress(name, folder, gpu_traces.GPU_H200)


def _ahead(request, fixture: str, profiler: str) -> tuple[str, ...]:
    """What the session's modules that use `fixture` ask `profiler` for, when there are several of them."""
    users = {item.module.__name__ for item in request.session.items if fixture in getattr(item, "fixturenames", ())}
    return asked_together(profiler, users)


@pytest.fixture(scope="session")
def nsys_recordings(request, tmp_path_factory) -> Recordings:
    """nsys_recordings("naive", "overlap") -> the folder of their small CPU recordings under the real nsys,
    each made once for the session (tests/support/recordings.py); skipped without nsys."""
    from tests.support.nsys import NSYS

    if NSYS is None:
        pytest.skip("nsys not installed (bash scripts/install_nsys.sh)")
    return Recordings(tmp_path_factory.mktemp("nsys_recordings"), "nsys", _ahead(request, "nsys_recordings", "nsys"))


@pytest.fixture(scope="session")
def torch_recordings(request, tmp_path_factory) -> Recordings:
    """The same runs recorded with `--profiler torch` (no nsys): <impl>.rank<N>.json.gz."""
    return Recordings(
        tmp_path_factory.mktemp("torch_recordings"), "torch", _ahead(request, "torch_recordings", "torch")
    )


@pytest.fixture(scope="session")
def plain_ddp_run(tmp_path_factory) -> Path:
    """A two-rank plain PyTorch DDP job recorded with plain torch.profiler (tests/support/plain_ddp.py),
    once for the session: the folder of its plain_ddp.rank<N>.json and timer.rank<N>.json, and where nsys
    is installed plain_ddp.sqlite, the same run under a plain `nsys profile` (tests/support/recordings.py)."""
    return record_plain_ddp(tmp_path_factory.mktemp("plain_ddp"))


@pytest.fixture(scope="session")
def chromium():
    """One headless Chromium (tests.support.devtools.Browser, 1400 x 1000) for every page the session's
    tests open, started when first asked for; skipped without Chromium."""
    from tests.support.devtools import Browser, BrowserError

    try:
        browser = Browser(width=1400, height=1000)
    except BrowserError as err:
        pytest.skip(str(err))
    with browser:
        yield browser
