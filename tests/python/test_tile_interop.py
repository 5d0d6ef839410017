"""Arrays of other frameworks through DLPack: torch CPU tensors on the CPU backend (any machine
with torch); marked gpu: JAX and CuPy arrays on the CUDA backend, each skipped visibly where
the package is not installed. Results against float64 numpy references."""
import numpy as np
import pytest

import tile


def softmax64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def rms_norm64(x, w, eps=1e-6):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * np.asarray(w, np.float64)


def check(got, want, rtol, atol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    bound = rtol * np.abs(want) + atol * np.abs(want).max(-1, keepdims=True)
    assert (np.abs(got - want) <= bound).all(), float((np.abs(got - want) - bound).max())


# ---- torch CPU tensors (DLPack, CPU backend) ----

def test_torch_cpu_tensors_through_dlpack():
    torch = pytest.importorskip("torch")
    base = torch.randn(6, 5, 300, generator=torch.Generator().manual_seed(0)) * 3
    x = base[:, :, :257]                          # rows of stride 300: read in place
    w = torch.randn(257, dtype=torch.bfloat16)
    y = tile.rms_norm(x, weight=w)
    assert y.dtype == torch.float32 and y.is_contiguous()
    check(y.numpy(), rms_norm64(x.numpy(), w.float().numpy()), 2e-5, 2e-5)
    xb = x.to(torch.bfloat16)
    out = torch.empty_like(xb)
    assert tile.softmax(xb, out=out) is out
    check(out.float().numpy(), softmax64(xb.float().numpy()), 1.6e-2, 8e-3)
    inplace = x.clone()
    tile.log_softmax(inplace, out=inplace)
    check(inplace.numpy(), np.log(softmax64(x.numpy())), 2e-5, 2e-5)
    y32 = tile.layer_norm(xb, dtype=torch.float32)
    assert y32.dtype == torch.float32
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected a contiguous last dimension"):
        tile.softmax(x.transpose(1, 2))


# ---- JAX and CuPy (GPU) ----

@pytest.mark.gpu
def test_jax_arrays():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    torch = pytest.importorskip("torch")         # an output Tile may write, and the synchronize
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax sees no GPU")
    rng = np.random.default_rng(1)
    host = (rng.standard_normal((37, 1537)) * 3).astype(np.float32)
    x = jax.device_put(jnp.asarray(host), jax.devices("gpu")[0])
    w = jax.device_put(jnp.asarray(rng.standard_normal(1537).astype(np.float32)), jax.devices("gpu")[0])
    x.block_until_ready()
    # JAX arrays are immutable: outputs come from a framework whose arrays may be written.
    out = torch.empty(37, 1537, device="cuda")
    tile.softmax(x, out=out)
    tile.rms_norm(x, weight=w, out=(y := torch.empty(37, 1537, device="cuda")))
    torch.cuda.synchronize()
    check(out.cpu().numpy(), softmax64(host), 2e-5, 2e-5)
    check(y.cpu().numpy(), rms_norm64(host, np.asarray(w)), 2e-5, 2e-5)
    xb = x.astype(jnp.bfloat16)
    xb.block_until_ready()
    ob = torch.empty(37, 1537, device="cuda", dtype=torch.bfloat16)
    tile.softmax(xb, out=ob)
    torch.cuda.synchronize()
    check(ob.float().cpu().numpy(), softmax64(np.asarray(xb.astype(jnp.float32))), 1.6e-2, 8e-3)


@pytest.mark.gpu
def test_cupy_arrays():
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"cupy sees no GPU ({e})")
    rng = np.random.default_rng(2)
    host = (rng.standard_normal((64, 4096)) * 3).astype(np.float16)
    x = cp.asarray(host)
    w = cp.asarray(rng.standard_normal(4096).astype(np.float32))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        y = cp.empty_like(x)
        tile.rms_norm(x, weight=w, out=y, stream=stream.ptr)
        s = cp.empty((64, 4096), cp.float32)
        tile.softmax(x, out=s, stream=stream.ptr)
        stream.synchronize()
    check(cp.asnumpy(y), rms_norm64(host, cp.asnumpy(w)), 2e-3, 1e-3)
    check(cp.asnumpy(s), softmax64(host), 2e-5, 2e-5)
    z = cp.asarray(host)                          # in place, on the legacy default stream
    tile.log_softmax(z, out=z)
    cp.cuda.Device().synchronize()
    check(cp.asnumpy(z), np.log(softmax64(host)), 2e-3, 1e-3)
    with pytest.raises(TypeError, match=r"softmax: argument 'out': expected an output array when x is neither"):
        tile.softmax(x)
