"""Row programs written in Python on torch CUDA tensors (the CUDA backend), bfloat16 included: each
result against an independent float64 computation, against program.reference and check, and
against the CPU executor's result for the same inputs (torch CPU tensors)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import tile  # noqa: E402
from programs import (f32, logsumexp, logsumexp_ref, rms_norm_gemma, rms_norm_gemma_ref,  # noqa: E402
                      softmax_temperature_mask, softmax_temperature_mask_ref, weight_gradient, weight_gradient_ref)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]

# Output dtype -> (rtol, atol relative to the row's largest |reference|, or to the sum of |terms|).
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 8e-3)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make(shape, dtype, seed=0, scale=2.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * scale).to(dtype)


def host(t):
    """The values a tensor holds, as float64 numpy (bf16 and f16 convert exactly)."""
    return t.detach().double().cpu().numpy()


def assert_close(got, want, scale):
    """|got - want| <= rtol |want| + atol scale, NaN exactly where want is NaN."""
    rtol, atol = TOLERANCE[got.dtype]
    torch.cuda.synchronize()
    got = host(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all(), "NaN where the reference has none, or none where it has"
    err = np.where(nan, 0, np.abs(got - want))
    bound = rtol * np.abs(np.where(nan, 0, want)) + atol * scale
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"at {worst}: got {got[worst]}, want {want[worst]} (bound {bound[worst]})"


def row_scale(want):
    return np.where(np.isfinite(want), np.abs(want), 0).max(axis=-1, keepdims=True)


def on_cpu(program, **operands):
    """The same call on the CPU executor, with torch CPU tensors (bfloat16 too)."""
    return program(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in operands.items()})


@pytest.fixture
def fast_path_only(monkeypatch):
    """Makes the DLPack launch fail, so that a call that succeeds took the raw-integer path (tests
    that also run the CPU executor, which takes the DLPack path, go without it)."""
    def dlpack_launch(*args, **kwargs):
        raise AssertionError("took the DLPack path (tile._tile.launch)")
    monkeypatch.setattr(tile._tile, "launch", dlpack_launch)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 1537), (4, 8, 4096), (2, 32768)])
def test_softmax_with_temperature_and_mask(dtype, shape):
    p = softmax_temperature_mask()
    x = make(shape, dtype)
    mask = torch.zeros(shape, device="cuda").masked_fill(torch.rand(shape, device="cuda") < 0.25, float("-inf")).to(dtype)
    mask[..., 0] = 0
    want = softmax_temperature_mask_ref(host(x), host(mask), 0.7)
    y = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    assert p(x=x, mask=mask, t=0.7, y=y) is y
    assert_close(y, want, row_scale(want))
    allocated = p(x=x, mask=mask, t=0.7)
    assert allocated.dtype == dtype and allocated.device == x.device and allocated.shape == x.shape
    assert_close(allocated, want, row_scale(want))
    if x.numel() <= 60000:                               # the float64 reference and the CPU executor are slow
        ref = p.reference(x=x, mask=mask, t=0.7)["y"]
        np.testing.assert_allclose(ref, want, rtol=1e-12, atol=1e-15)
        assert p.check(x=x, mask=mask, t=0.7, y=y)["ok"]
        assert_close(y, host(on_cpu(p, x=x, mask=mask, t=0.7)), row_scale(want))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_gemma_fp32_output_from_half_input(dtype, weight_dtype):
    p = rms_norm_gemma()
    x = make((64, 2048), dtype)
    w = make(2048, weight_dtype, seed=1, scale=0.5)
    want = rms_norm_gemma_ref(host(x), host(w))
    y = p(x=x, weight=w)
    assert y.dtype == torch.float32 and y.device == x.device
    assert_close(y, want, row_scale(want))
    y_cpu = on_cpu(p, x=x[:4], weight=w)
    assert y_cpu.dtype == torch.float32
    assert_close(y[:4], host(y_cpu), row_scale(want[:4]))
    assert p.check(x=x, weight=w, y=y)["ok"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 1000), (128, 8192), (1, 100000)])
def test_logsumexp_per_row(dtype, shape, fast_path_only):
    p = logsumexp()
    x = make(shape, dtype, scale=5.0)
    want = logsumexp_ref(host(x))
    lse = torch.full(shape[:-1], float("nan"), device="cuda")
    assert p(x=x, lse=lse) is lse
    rtol, atol = TOLERANCE[torch.float32]
    torch.cuda.synchronize()
    err = np.abs(host(lse) - want)
    assert (err <= rtol * np.abs(want) + atol * np.abs(host(x)).max(axis=-1)).all(), err.max()
    assert p.check(x=x, lse=lse)["ok"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", [(4096, 1024), (3, 4096), (1000, 37), (65536, 64)])
def test_weight_gradient_sums_over_rows(dtype, rows, cols, fast_path_only):
    p = weight_gradient()
    x, dy = make((rows, cols), dtype), make((rows, cols), dtype, seed=1)
    dw_want, db_want, dw_mag, db_mag = weight_gradient_ref(host(x), host(dy))
    dw, db = torch.full((cols,), float("nan"), device="cuda"), torch.full((cols,), float("nan"), device="cuda")
    got = p(x=x, dy=dy, dweight=dw, dbias=db)
    assert got[0] is dw and got[1] is db
    assert_close(dw, dw_want, dw_mag)
    assert_close(db, db_want, db_mag)
    again = p(x=x, dy=dy)                                # deterministic: bitwise the same on every run
    torch.cuda.synchronize()
    assert torch.equal(again[0], dw) and torch.equal(again[1], db)
    if rows * cols <= 1 << 20:                           # the float64 reference runs on the host
        assert p.check(x=x, dy=dy, dweight=dw, dbias=db)["ok"]


def test_integer_target_on_the_gpu(fast_path_only):
    p = tile.RowProgram("target_logit")
    x, target = p.row_in("x"), p.row_scalar_in("target", ["i32", "i64"])
    out = p.row_scalar_out("logit", optional=False)
    v = p.load(x)
    p.store(out, p.reduce1(tile.Axis.cols, tile.monoid.sum(), p.select(tile.eq(p.col_index(), p.load(target)), v, 0)))
    x_ = make((64, 50257), torch.float32)
    for dtype in (torch.int64, torch.int32):
        t = torch.randint(0, 50257, (64,), device="cuda", dtype=dtype)
        got = p(x=x_, target=t)
        torch.cuda.synchronize()
        assert torch.equal(got, x_.gather(1, t.long()[:, None])[:, 0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_statistics(dtype, fast_path_only):
    x = make((8, 3, 2048), dtype, scale=3.0)
    w = make(2048, dtype, seed=1)
    xd = host(x)
    rstd_want = 1 / np.sqrt((xd * xd).mean(-1) + f32(1e-6))
    y, rstd = tile.rms_norm(x, weight=w, return_rstd=True)
    assert rstd.dtype == torch.float32 and rstd.shape == x.shape[:-1] and y.dtype == dtype
    want = xd * rstd_want[..., None] * host(w)
    assert_close(y, want, row_scale(want))
    assert_close(rstd, rstd_want, 0)
    y, mean, rstd = tile.layer_norm(x, weight=w, return_stats=True)
    mean_want, rstd_want = xd.mean(-1), 1 / np.sqrt(xd.var(-1) + f32(1e-5))
    assert mean.dtype == torch.float32 and mean.shape == x.shape[:-1]
    assert_close(mean, mean_want, np.abs(xd).max(-1))
    assert_close(rstd, rstd_want, 0)
    want = (xd - mean_want[..., None]) * rstd_want[..., None] * host(w)
    assert_close(y, want, row_scale(want))


def test_program_errors_on_the_gpu():
    p = softmax_temperature_mask()
    x = make((4, 64), torch.float32)
    with pytest.raises(ValueError, match=r"softmax_temperature_mask: argument 'mask': expected an array on cuda:\d "
                                         r"like x, got one on cpu"):
        p(x=x, mask=torch.zeros(4, 64))
    with pytest.raises(ValueError, match=r"softmax_temperature_mask: argument 'mask': expected shape \(4, 64\) like x"):
        p(x=x, mask=torch.zeros(4, 63, device="cuda"))
    with pytest.raises(ValueError, match=r"softmax_temperature_mask: argument 'mask': expected dtype float32, float64, float16 "
                                         r"or bfloat16, got int32"):
        p(x=x, mask=torch.zeros(4, 64, device="cuda", dtype=torch.int32))
    with pytest.raises(ValueError, match=r"softmax_temperature_mask: argument 'z': expected one of the operands"):
        p(x=x, mask=torch.zeros(4, 64, device="cuda"), z=x)


def test_introspection_of_a_gpu_call():
    p = logsumexp()
    x = make((16, 3000), torch.bfloat16)
    record = p.run(x=x, plan={"programs_per_group": 2})
    assert record["backend"] == "cuda" and record["arch"].startswith("sm_") and record["plan"]["programs_per_group"] == 2
    assert record["plan"] == p.plan(x=x, plan={"programs_per_group": 2})
    assert record["kernel_name"] in p.source(x=x, plan=record["plan"])
    torch.cuda.synchronize()
    lse = record["outputs"]["lse"]
    assert p.check(x=x, lse=lse)["ok"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scalar_output_sums_over_rows_and_columns(dtype, fast_path_only):
    p = tile.RowProgram("sum_squares")
    x, total = p.row_in("x"), p.scalar_out("total")
    v = p.load(x)
    p.store(total, p.reduce1(tile.Axis.rows, tile.monoid.sum(), p.reduce1(tile.Axis.cols, tile.monoid.sum(), v * v)))
    x_ = make((65536, 300), dtype)
    want = (host(x_) ** 2).sum()
    out = torch.full((1,), float("nan"), device="cuda")
    assert p(x=x_, total=out) is out
    assert_close(out, np.array([want]), want)
    again = p(x=x_)
    torch.cuda.synchronize()
    assert torch.equal(again, out), "a second run gave other bits"
