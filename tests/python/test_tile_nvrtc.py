"""Where the package finds NVRTC at run time, and that the CPU backend never needs it.

Each case runs a fresh interpreter: NVRTC is searched for once per process."""
import os
import subprocess
import sys
import textwrap

import pytest

import tile

# A build without CUDA (TILE_WITH_CUDA=OFF) has no NVRTC to find; test_tile_cpu.py checks what it says.
pytestmark = pytest.mark.skipif(not tile.build_info()["cuda"], reason="built without CUDA (TILE_WITH_CUDA=OFF)")

def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=120)


def test_cpu_backend_runs_without_nvrtc():
    code = """
        import numpy as np
        import tile
        x = np.random.default_rng(0).standard_normal((3, 200)).astype(np.float32)
        y = tile.softmax(x)
        ref = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
        ref /= ref.sum(-1, keepdims=True)
        assert np.abs(y - ref).max() < 1e-6, np.abs(y - ref).max()
        assert "libnvrtc" not in open("/proc/self/maps").read(), "a CPU run loaded NVRTC"
        try:
            tile.nvrtc_version()
        except RuntimeError as e:
            print(e)
        else:
            raise AssertionError("nvrtc_version() returned without NVRTC")
    """
    r = run_python(code, TILE_NVRTC_LIBRARY="/nonexistent/libnvrtc.so.13")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("no NVRTC found; looked in:\n  TILE_NVRTC_LIBRARY=/nonexistent/libnvrtc.so.13: "), r.stdout
    assert "nothing else was tried" in r.stdout


def test_nvrtc_library_names_the_loaded_file():
    path = tile.nvrtc_library()
    assert os.path.isfile(path) and os.path.basename(path).startswith("libnvrtc"), path
    assert os.path.realpath(path) in open("/proc/self/maps").read()
    assert tile.nvrtc_version().split(".")[0] == path.rsplit(".so.", 1)[1], (path, tile.nvrtc_version())


def test_nvidia_wheel_on_sys_path_comes_before_the_toolkit(tmp_path):
    # The layout of the nvidia-cuda-nvrtc wheel (nvidia-cuda-nvrtc-cu12 before CUDA 13), linked to
    # the NVRTC found now, in a folder on sys.path.
    major = int(tile.nvrtc_version().split(".")[0])
    lib = tmp_path / "nvidia" / (f"cu{major}" if major >= 13 else "cuda_nvrtc") / "lib"
    lib.mkdir(parents=True)
    (lib / f"libnvrtc.so.{major}").symlink_to(tile.nvrtc_library())
    path = os.pathsep.join(p for p in [str(tmp_path), os.environ.get("PYTHONPATH")] if p)
    r = run_python("import tile; print(tile.nvrtc_library())", PYTHONPATH=path, TILE_NVRTC_LIBRARY="")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(lib / f"libnvrtc.so.{major}")
