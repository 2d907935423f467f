"""`pip install .` into a fresh venv (--system-site-packages, offline: --no-build-isolation
--no-index) builds the extension with the project's CMake and installs `sluice`; `pip wheel`
builds a wheel the same way. Slow (ctest python_packaging, label slow): it runs CMake."""

import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def _run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=1200, **kw)
    assert r.returncode == 0, " ".join(args) + "\n" + r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="module")
def env():
    # build-py-test/: the test's own CMake tree, at build/'s depth so that ccache hits.
    return dict(os.environ, SLUICE_BUILD_DIR="build-py-test", PYTHONPATH="",
                SLUICE_DATA_DIR="")


def test_packaging_pip_install_into_venv(tmp_path, env):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    py = str(venv / "bin" / "python")
    _run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", ROOT], env=env)
    out = _run([py, "-c", "import sluice, sluice.torch, os; "
                "p = sluice.Planner(cost='auto'); plan = p.plan([300] * 40); "
                "print(sluice.__file__); print(p.cost_model); print(plan.ok, plan.num_ranks)"],
               env=env, cwd=str(tmp_path))
    path, cost, result = out.strip().splitlines()
    assert path.startswith(str(venv)), path  # the installed copy, not the source tree
    assert "profiled" in cost and str(venv) in cost  # cost tables from the package's data
    assert result == "True 8"


def test_packaging_wheel(tmp_path, env):
    _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-index", "--no-deps",
          "-w", str(tmp_path), ROOT], env=env)
    (wheel,) = [f for f in os.listdir(tmp_path) if f.endswith(".whl")]
    assert wheel.startswith("sluice-") and "linux" in wheel
    names = zipfile.ZipFile(tmp_path / wheel).namelist()
    for want in ("sluice/__init__.py", "sluice/torch.py", "sluice/_pipeline.py",
                 "sluice/data/profiles/a100_gpt_6.7b.json", "sluice/data/lengths/mixture-4task.jsonl"):
        assert want in names, names
    assert any(n.startswith("sluice/_sluice") and n.endswith(".so") for n in names)
