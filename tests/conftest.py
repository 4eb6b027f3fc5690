import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# A test never reads or writes the user's own store or the shipped results by default (quantbench.store.home):
# a home of its own for the whole session, and no shipped store unless a test names one.
os.environ["QUANTBENCH_HOME"] = tempfile.mkdtemp(prefix="quantbench-test-home-")
os.environ["QUANTBENCH_SHIPPED"] = ""
# Several workers and their children share two cores. OpenMP threads that spin while they wait starve the others
# (the default model's 2-thread build took 40 minutes beside two busy workers instead of 3), and a second thread
# per process buys nothing when every core already has a process: the tests run one OpenMP thread each, waiting
# passively (14% less CPU than two passive threads for test_planted's runs, the same wall time). Set only once
# the default models are built: the build, alone on the machine, trains with its own 2 threads, and a passive
# wait there costs a quarter of each step (0.38-0.39 s against 0.31 s here; CI measured 0.73 s with it). The
# default models' builds set their own thread count, so their bytes do not depend on these.
TEST_THREADS = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}


def _test_threads() -> None:
    for key, value in TEST_THREADS.items():
        os.environ.setdefault(key, value)


def pytest_configure(config):
    """Before any worker starts, build the default models most tests read (text, then omni) once, with the machine
    to themselves: a build beside busy workers is many times slower. A no-op once they are in $QUANTBENCH_CACHE.
    Then the workers (started after this) and every child inherit TEST_THREADS."""
    if os.environ.get("PYTEST_XDIST_WORKER") or config.option.collectonly or config.option.help:
        _test_threads()
        return
    from quantbench.make.fixture import default_model_dir
    from quantbench.make.omni_fixture import omni_default_model_dir

    default_model_dir(progress=True)
    omni_default_model_dir(progress=True)
    _test_threads()


_MAIN = sys.modules["__main__"]


@pytest.fixture(autouse=True)
def _main_module_restored():
    """Streamlit's AppTest leaves the app's script as __main__: a process spawned afterwards (`load --processes`)
    would run that script instead of its target, die, and leave its parent blocked writing to it (a test hung CI)."""
    yield
    sys.modules["__main__"] = _MAIN


@pytest.fixture(scope="session")
def fixture_model_dir() -> Path:
    """The trained default model, from the normal cache (built once, minutes on 2 cores, when absent)."""
    from quantbench.make.fixture import default_model_dir

    return default_model_dir(progress=False)


@pytest.fixture(scope="session")
def made_elsewhere(tmp_path_factory) -> dict[str, Path]:
    """Checkpoints made by transformers, auto-round and ModelOpt themselves (tests/elsewhere.py), once a test run:
    under pytest-xdist the workers share one build (the first to take the lock makes it, the others read it)."""
    from filelock import FileLock

    from tests.elsewhere import make

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # xdist gives each worker a folder under this run's own
    out, done = root / "elsewhere", root / "elsewhere.json"
    with FileLock(str(root / "elsewhere.lock")):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)  # what a failed build left
            paths = make(out)
            done.write_text(json.dumps({name: str(path) for name, path in paths.items()}))
    return {name: Path(path) for name, path in json.loads(done.read_text()).items()}


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium through Playwright (never `playwright install`: no browser downloads here)."""
    from playwright.sync_api import sync_playwright

    from tests.streamlit_server import ARGS, CHROMIUM

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    from tests.streamlit_server import VIEWPORT, WAIT_MS

    p = browser.new_page(viewport=VIEWPORT)
    p.set_default_timeout(WAIT_MS)
    yield p
    p.close()
