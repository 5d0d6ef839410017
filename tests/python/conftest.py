"""pytest setup for the tests of the Python package `tile`.

The package is imported from the build folder: put the folder holding tile/ on PYTHONPATH
(CTest's python.cpu / python.gpu do; by hand, e.g. PYTHONPATH=build/ci/python pytest tests/python).
"""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs torch and a CUDA device")
