"""Empty inputs, tile.precompile and JIT-compile reports with torch tensors; marked gpu: the
reports of real NVRTC compiles, precompile of backward kernels and calls on a second device."""
import logging

import pytest

torch = pytest.importorskip("torch")

import tile  # noqa: E402
from training_reference import training_ops  # noqa: E402,F401

cuda = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")]
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(4, 0), (0, 16), (0, 0), (2, 0, 8)])
def test_empty_inputs_match_torch(device, shape):
    x = torch.ones(shape, device=device)
    cols = shape[-1]
    torch.testing.assert_close(tile.softmax(x), torch.softmax(x, -1))
    torch.testing.assert_close(tile.log_softmax(x), torch.log_softmax(x, -1))
    w = torch.ones(cols, device=device)
    y, rstd = tile.rms_norm(x, weight=w, return_rstd=True)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (cols,), w))
    assert rstd.shape == shape[:-1]
    y, mean, rstd = tile.layer_norm(x, weight=w, bias=w, return_stats=True)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (cols,), w, w))
    assert mean.shape == rstd.shape == shape[:-1] and (cols != 0 or rstd.isnan().all())


def test_empty_inputs_differentiate(training_ops):
    x = torch.ones(3, 0, requires_grad=True)
    w = torch.ones(0, requires_grad=True)
    tile.rms_norm(x, weight=w).sum().backward()
    assert x.grad.shape == (3, 0) and w.grad.shape == (0,)
    x = torch.ones(0, 8, requires_grad=True)
    w = torch.ones(8, requires_grad=True)
    tile.layer_norm(x, weight=w, bias=w).sum().backward()
    assert x.grad.shape == (0, 8) and torch.equal(w.grad, torch.zeros(8))   # a sum over no rows
    torch.testing.assert_close(tile.cross_entropy(torch.ones(0, 5), torch.ones(0, dtype=torch.long)),
                               torch.nn.functional.cross_entropy(torch.ones(0, 5), torch.ones(0, dtype=torch.long)),
                               equal_nan=True)


def test_precompile_with_backward(training_ops):
    x = torch.randn(4, 32)
    w = torch.randn(32)
    assert tile.precompile(tile.rms_norm, x, weight=w, backward=True) == []   # the CPU backend compiles nothing
    assert x.grad is None and not x.requires_grad                             # the arrays given are untouched
    with pytest.raises(ValueError, match=r"returned no differentiable output"):
        tile.precompile(lambda x: tile.softmax(x).detach(), torch.ones(3, 4), backward=True)


# ---- GPU ----

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_compile_reports(caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path))       # an empty disk cache: a real compile
    tile.clear_kernel_caches()
    x = torch.randn(16, 4099, device="cuda")
    with caplog.at_level(logging.INFO, logger="tile"):
        tile.softmax(x)
        tile.softmax(x)                                        # loaded: no report
        tile.clear_kernel_caches()
        tile.softmax(x)                                        # from the disk cache: a hit
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "compiled with NVRTC (cache miss)" in lines[0] and "read from the disk cache (cache hit)" in lines[1]
    for line in lines:
        assert line.startswith("softmax: kernel ") and " ms for sm_" in line and '"workers_per_program":' in line


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_precompile_reports_forward_and_backward_kernels():
    if getattr(tile, "rms_norm_backward", None) is None:
        pytest.skip("tile.rms_norm_backward is not in this version of the package")
    tile.clear_kernel_caches()
    x, w = torch.randn(32, 2048, device="cuda"), torch.randn(2048, device="cuda")
    built = tile.precompile(tile.rms_norm, x, weight=w, backward=True)
    assert [e["op"] for e in built][:1] == ["rms_norm"] and len(built) >= 2, built
    assert all(e["kernel"] and e["compile_ms"] >= 0 for e in built)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_second_device_has_its_own_kernels_and_stream():
    tile.clear_kernel_caches()
    results = []
    for d in (0, 1):
        x = torch.randn(8, 3000, device=f"cuda:{d}")
        with torch.cuda.device(0):                              # the call makes x's device current
            y = tile.rms_norm(x)
        built = tile.precompile(tile.rms_norm, x)             # loaded on that device already
        assert built == []
        results.append((y, torch.nn.functional.rms_norm(x, (3000,), eps=1e-6)))
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    for y, want in results:
        torch.testing.assert_close(y, want, rtol=2e-5, atol=2e-5)
