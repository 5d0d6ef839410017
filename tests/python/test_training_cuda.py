"""The training operators on torch CUDA tensors (the CUDA backend), bfloat16 included: each against
the float64 references of training_refs.py and against torch's own operators and autograd, the
same call on torch CPU tensors (the CPU executor) for small shapes, bitwise-identical weight
gradients, and the mean cross-entropy captured in a CUDA graph (its count of rows stays on the
device)."""
import numpy as np
import pytest
import training_refs as ref

torch = pytest.importorskip("torch")
import tile  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(37, 1537), (4, 8, 4096), (2, 32768), (3, 262144), (1024, 4096)]


def make(shape, dtype, seed=0, scale=1.0, mean=0.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * scale + mean).to(dtype)


def synced(t):
    torch.cuda.synchronize()
    return t


def small(shape):
    return int(np.prod(shape)) <= 200000


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward(dtype, shape, log):
    x = make(shape, torch.float32, 1, 2.0)
    y = (torch.log_softmax if log else torch.softmax)(x, -1).to(dtype)
    dy = make(shape, dtype, 2)
    fn = tile.log_softmax_backward if log else tile.softmax_backward
    dx = synced(fn(y, dy))
    want, mag = (ref.log_softmax_backward if log else ref.softmax_backward)(y, dy)
    ref.assert_close(dx, want, mag, name="dx")
    # torch's autograd of the same forward, in float32.
    xr = x.clone().requires_grad_()
    (torch.log_softmax if log else torch.softmax)(xr, -1).backward(dy.float())
    if dtype == torch.float32:
        torch.testing.assert_close(dx, xr.grad, rtol=1e-4, atol=1e-5)
    if small(shape):
        cpu = fn(y.cpu(), dy.cpu())
        ref.assert_close(cpu, want, mag, name="dx on the CPU executor")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_backward(dtype, shape):
    x, dy = make(shape, dtype, 3, 2.0, 0.5), make(shape, dtype, 4)
    w = make(shape[-1:], torch.float32, 5, 0.5, 1.0)
    y, rstd = tile.rms_norm(x, weight=w, return_rstd=True)
    dx, dw = tile.rms_norm_backward(dy, x, w, rstd)
    synced(dx)
    assert dx.dtype == dtype and dw.dtype == torch.float32
    (want, mag), (dw_want, dw_mag) = ref.rms_norm_backward(dy, x, w, rstd)
    ref.assert_close(dx, want, mag, name="dx")
    rows = int(np.prod(shape[:-1]))
    ref.assert_close(dw, dw_want, dw_mag, ulps=512 + rows, name="dweight")
    # torch's autograd of RMSNorm in float64.
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    (xr * torch.rsqrt((xr * xr).mean(-1, keepdim=True) + 1e-6) * wr).backward(dy.double())
    ref.assert_close(dx, ref.f64(xr.grad), mag, ulps=4096, name="dx against autograd")
    ref.assert_close(dw, ref.f64(wr.grad), dw_mag, ulps=4096 + rows, name="dweight against autograd")
    dx2, dw2 = tile.rms_norm_backward(dy, x, None, rstd)
    assert dw2 is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm_backward(dtype, shape):
    x, dy = make(shape, dtype, 6, 2.0, 0.5), make(shape, dtype, 7)
    w, b = make(shape[-1:], dtype, 8, 0.5, 1.0), make(shape[-1:], dtype, 9, 0.5)
    _, mean, rstd = tile.layer_norm(x, weight=w, bias=b, return_stats=True)
    dx, dw, db = tile.layer_norm_backward(dy, x, w, b, mean, rstd)
    synced(dx)
    assert dw.dtype == dtype and db.dtype == dtype
    (want, mag), (dw_want, dw_mag), (db_want, db_mag) = ref.layer_norm_backward(dy, x, w, mean, rstd)
    rows = int(np.prod(shape[:-1]))
    ref.assert_close(dx, want, mag, name="dx")
    ref.assert_close(dw, dw_want, dw_mag, ulps=512 + rows, name="dweight")
    ref.assert_close(db, db_want, db_mag, ulps=512 + rows, name="dbias")
    xr, wr, br = x.double().requires_grad_(), w.double().requires_grad_(), b.double().requires_grad_()
    torch.nn.functional.layer_norm(xr, shape[-1:], wr, br, 1e-5).backward(dy.double())
    ref.assert_close(dx, ref.f64(xr.grad), mag, ulps=4096, name="dx against autograd")
    ref.assert_close(db, ref.f64(br.grad), db_mag, ulps=512 + rows, name="dbias against autograd")


@pytest.mark.parametrize("x_dtype,res_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                               (torch.float16, torch.float32), (torch.float32, torch.float32)])
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_add_rms_norm_forward_and_backward(x_dtype, res_dtype, shape):
    x, res = make(shape, x_dtype, 10), make(shape, res_dtype, 11, 2.0, 0.3)
    w = make(shape[-1:], x_dtype, 12, 0.5, 1.0)
    y, r_out, rstd = tile.fused_add_rms_norm(x, res, weight=w, return_rstd=True)
    synced(y)
    assert y.dtype == x_dtype and r_out.dtype == res_dtype
    h = ref.f64(x) + ref.f64(res)
    y_want, rstd_want = ref.rms_norm(h, w)
    hm = np.abs(ref.f64(x)) + np.abs(ref.f64(res))
    ref.assert_close(y, y_want, hm * rstd_want[..., None] * np.abs(ref.f64(w)), name="y")
    ref.assert_close(r_out, h, hm, name="residual_out")
    # In place: the same values over x and residual.
    xi, ri = x.clone(), res.clone()
    yi, roi = tile.fused_add_rms_norm(xi, ri, weight=w, in_place=True)
    assert yi.data_ptr() == xi.data_ptr() and roi.data_ptr() == ri.data_ptr()
    assert torch.equal(synced(xi), y) and torch.equal(ri, r_out)
    # The backward of both outputs.
    dy, dres = make(shape, x_dtype, 13), make(shape, res_dtype, 14)
    dx, dr, dw = tile.fused_add_rms_norm_backward(dy, dres, r_out, w, rstd)
    synced(dx)
    (want, mag), (dw_want, dw_mag) = ref.rms_norm_backward(dy, r_out, w, rstd, dres)
    ref.assert_close(dx, want, mag, name="dx")
    ref.assert_close(dr, want, mag, name="dresidual")
    ref.assert_close(dw, dw_want, dw_mag, ulps=512 + int(np.prod(shape[:-1])), name="dweight")


def ce_inputs(shape, dtype, seed, ignore_index=-100):
    z = make(shape, dtype, seed, 3.0)
    rows = int(np.prod(shape[:-1]))
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    t = torch.randint(0, shape[-1], (rows,), generator=g, device="cuda")
    t[0], t[-1] = 0, shape[-1] - 1
    t[1::7] = ignore_index
    return z, t.reshape(shape[:-1])


OPTIONS = [{}, {"label_smoothing": 0.1}, {"z_loss": 1e-4}, {"softcap": 30.0, "label_smoothing": 0.05},
           {"ignore_index": 5}]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 1537), (4, 8, 32000), (16, 128256)])
def test_cross_entropy(shape, dtype, reduction, options):
    check_cross_entropy(shape, dtype, reduction, options)


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_at_262144_classes(dtype, reduction):
    check_cross_entropy((3, 262144), dtype, reduction, {"softcap": 30.0, "label_smoothing": 0.1, "z_loss": 1e-4})


def check_cross_entropy(shape, dtype, reduction, options):
    z, t = ce_inputs(shape, dtype, 20, options.get("ignore_index", -100))
    loss, lse = tile.cross_entropy(z, t, reduction=reduction, return_lse=True, **options)
    synced(loss)
    want, mag, lse_want, _ = ref.cross_entropy(z, t, reduction, **options)
    rows = int(np.prod(shape[:-1]))
    ref.assert_close(loss, want, mag, ulps=512 + rows, name="loss")
    ref.assert_close(lse, lse_want, np.abs(lse_want) + 1, name="lse")
    if not options.get("z_loss") and not options.get("softcap"):
        # torch's own definition, label smoothing included, on float32 logits.
        tl = torch.nn.functional.cross_entropy(z.float().reshape(-1, shape[-1]), t.reshape(-1), reduction=reduction,
                                               label_smoothing=options.get("label_smoothing", 0.0),
                                               ignore_index=options.get("ignore_index", -100))
        torch.testing.assert_close(loss.reshape(tl.shape), tl, rtol=1e-4, atol=1e-4)
    dloss = make(shape[:-1] if reduction == "none" else (), torch.float32, 21, 1.0, 0.5)
    g = synced(tile.cross_entropy_backward(dloss, z, t, lse, reduction=reduction, **options))
    g_want, g_mag = ref.cross_entropy_grad(dloss, z, t, reduction, saved_lse=lse, **options)
    ref.assert_close(g, g_want, g_mag, name="dlogits")
    zc = z.clone()
    fused = synced(tile.cross_entropy_fused(zc, t, reduction=reduction, dloss=dloss, **options))
    f_want, f_mag = ref.cross_entropy_grad(dloss, z, t, reduction, **options)
    ref.assert_close(zc, f_want, f_mag, name="fused dlogits")
    ref.assert_close(fused, want, mag, ulps=512 + rows, name="fused loss")
    if small(shape):
        cpu = tile.cross_entropy(z.cpu(), t.cpu(), reduction=reduction, **options)
        ref.assert_close(cpu, want, mag, ulps=512 + rows, name="loss on the CPU executor")


def test_cross_entropy_matches_torch_autograd_with_z_loss_and_softcap():
    z, t = ce_inputs((64, 50257), torch.bfloat16, 30)
    zr = z.double().requires_grad_()
    capped = 30.0 * torch.tanh(zr / 30.0)
    lse = torch.logsumexp(capped, -1)
    valid = t != -100
    per_row = torch.nn.functional.cross_entropy(capped, t, reduction="none", label_smoothing=0.1) + 1e-4 * lse * lse
    (per_row * valid).sum().div(valid.sum()).backward()
    zc = z.clone()
    loss = tile.cross_entropy_fused(zc, t, label_smoothing=0.1, z_loss=1e-4, softcap=30.0)
    torch.testing.assert_close(synced(loss).double(), (per_row * valid).sum() / valid.sum(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(zc.double(), zr.grad, rtol=1.6e-2, atol=1e-7)


def test_weight_gradients_are_bitwise_identical_from_run_to_run():
    x, dy = make((8192, 4096), torch.bfloat16, 40), make((8192, 4096), torch.bfloat16, 41)
    w = make((4096,), torch.float32, 42, 0.5, 1.0)
    _, rstd = tile.rms_norm(x, weight=w, return_rstd=True)
    first = tile.rms_norm_backward(dy, x, w, rstd)[1].clone()
    for _ in range(5):
        assert torch.equal(tile.rms_norm_backward(dy, x, w, rstd)[1], first)
    z, t = ce_inputs((4096, 32000), torch.bfloat16, 43)
    loss = tile.cross_entropy(z, t).clone()
    for _ in range(5):
        assert torch.equal(tile.cross_entropy(z, t), loss)


def test_mean_cross_entropy_in_a_cuda_graph():
    """The fused mean form counts its rows on the device: capture it, replay it on new targets."""
    z, t = ce_inputs((256, 32000), torch.bfloat16, 50)
    logits = z.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tile.cross_entropy_fused(logits.clone(), t)            # compiled and loaded before capture
    torch.cuda.current_stream().wait_stream(stream)
    # Captured on the warm-up's stream; any other would do as well, since each call's workspace
    # comes from torch's allocator (test_torch_compile.py captures on fresh streams).
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        loss = tile.cross_entropy_fused(logits, t)
    for seed in (51, 52):
        z2, t2 = ce_inputs((256, 32000), torch.bfloat16, seed)
        logits.copy_(z2)
        t.copy_(t2)
        graph.replay()
        synced(loss)
        want, mag, _, _ = ref.cross_entropy(z2, t2, "mean")
        ref.assert_close(loss, want, mag, ulps=1024, name="loss")
        g_want, g_mag = ref.cross_entropy_grad(None, z2, t2, "mean")
        ref.assert_close(logits, g_want, g_mag, name="dlogits")
