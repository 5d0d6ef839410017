"""Runs the pytest tests of tests/python for one CTest test: `cpu` (not marked gpu, without the
argument errors), `errors` (test_tile_errors.py, not marked gpu) or `gpu` (every file).

The gpu run prints "[  SKIPPED ]" (CTest's skip pattern) and succeeds when torch, a CUDA
device or an extension built for this interpreter is missing; the cpu run fails instead.
"""
import glob
import os
import sys
import sysconfig


def skip(why):
    print(f"[  SKIPPED ] python.gpu: {why}")
    sys.exit(0)


def main():
    mode, package_dir = sys.argv[1], os.path.abspath(sys.argv[2])
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    if not os.path.isfile(os.path.join(package_dir, "tile", "__init__.py")):
        print(f"python.{mode}: no tile package in {package_dir} (the build's python folder, or TILE_PYTHONPATH)",
              file=sys.stderr)
        sys.exit(1)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = glob.glob(os.path.join(package_dir, "tile", "_tile*.so"))
    if mode == "gpu":
        if built and not any(b.endswith(suffix) for b in built):
            skip(f"the extension in {package_dir}/tile was built for another Python ({os.path.basename(built[0])}; "
                 f"this is {sys.version.split()[0]}): build it with scripts/build_python.sh")
        try:
            import torch
        except ImportError as e:
            skip(f"torch is not importable ({e})")
        if not torch.cuda.is_available():
            skip("torch sees no CUDA device")
    os.environ["PYTHONPATH"] = package_dir + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, package_dir)
    # Plugins installed beside the interpreter are not ours and may not match this pytest.
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    import pytest
    marker = "gpu" if mode == "gpu" else "not gpu"
    errors = os.path.join(tests_dir, "test_tile_errors.py")
    where = {"cpu": [tests_dir, "--ignore", errors], "errors": [errors]}.get(mode, [tests_dir])
    code = pytest.main(["-p", "no:cacheprovider", "-v", "-ra", "-m", marker, *where])
    sys.exit(int(code))


if __name__ == "__main__":
    main()
