"""pytest setup for the tests of the Python package `tile`.

The package is imported from the build folder: put the folder holding tile/ on PYTHONPATH
(CTest's python.cpu / python.gpu do; by hand, e.g. PYTHONPATH=build/ci/python pytest tests/python).
"""
import os
import sys

# programs.py (the row programs the tests share) imports by name under every import mode,
# --import-mode=importlib (scripts/test_wheel.sh) included.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs torch and a CUDA device")
