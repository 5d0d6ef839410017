"""The Python package on the CUDA backend (torch CUDA tensors), against a float64 torch reference."""
import re

import pytest

torch = pytest.importorskip("torch")
import tile  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]

OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm"]
NORMS = ["rms_norm", "layer_norm"]
# Output dtype -> (rtol, atol relative to the row's largest |reference|).
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 8e-3)}


def reference(op, x, weight=None, bias=None, eps=None):
    x = x.double()
    if op in ("softmax", "log_softmax"):
        shifted = x - x.amax(dim=-1, keepdim=True)
        log_sum = shifted.exp().sum(dim=-1, keepdim=True).log()
        return (shifted - log_sum).exp() if op == "softmax" else shifted - log_sum
    if op == "rms_norm":
        eps = tile.RMS_NORM_EPS if eps is None else eps
        y = x / ((x * x).mean(dim=-1, keepdim=True) + eps).sqrt()
    else:
        eps = tile.LAYER_NORM_EPS if eps is None else eps
        centred = x - x.mean(dim=-1, keepdim=True)
        y = centred / ((centred * centred).mean(dim=-1, keepdim=True) + eps).sqrt()
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def assert_close(got, want):
    rtol, atol = TOLERANCE[got.dtype]
    got = got.double()
    bound = rtol * want.abs() + atol * want.abs().amax(dim=-1, keepdim=True)
    err = (got - want).abs()
    bad = err > bound
    assert not bad.any(), f"{int(bad.sum())} mismatches; worst excess {float((err - bound).max())}"


def make(shape, dtype, seed=0, scale=3.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * scale).to(dtype)


def call(op, x, weight=None, bias=None, **kw):
    if op == "softmax":
        return tile.softmax(x, **kw)
    if op == "log_softmax":
        return tile.log_softmax(x, **kw)
    if op == "rms_norm":
        return tile.rms_norm(x, weight=weight, **kw)
    return tile.layer_norm(x, weight=weight, bias=bias, **kw)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(37, 1537), (4, 8, 4096), (3, 1, 50), (1, 262144)])
def test_matches_reference(op, dtype, shape):
    x = make(shape, dtype)
    weight = make(shape[-1], dtype, seed=1, scale=1.0) if op in NORMS else None
    bias = make(shape[-1], dtype, seed=2, scale=1.0) if op == "layer_norm" else None
    y = call(op, x, weight, bias)
    assert y.device == x.device and y.dtype == dtype and y.shape == x.shape
    torch.cuda.synchronize()
    assert_close(y, reference(op, x, weight, bias))


@pytest.mark.parametrize("op", NORMS)
def test_bf16_input_with_fp32_weight(op):
    x = make((64, 2048), torch.bfloat16)
    w = make(2048, torch.float32, seed=1)
    b = make(2048, torch.float32, seed=2) if op == "layer_norm" else None
    y = call(op, x, w, b)
    assert y.dtype == torch.bfloat16
    torch.cuda.synchronize()
    assert_close(y, reference(op, x, w, b))
    y32 = call(op, x, w, b, dtype=torch.float32)
    torch.cuda.synchronize()
    assert y32.dtype == torch.float32
    assert_close(y32.to(torch.bfloat16), reference(op, x, w, b))


def test_parameter_weight_requiring_grad():
    x = make((8, 512), torch.float32)
    w = torch.nn.Parameter(make(512, torch.float32, seed=1))
    y = tile.rms_norm(x, weight=w)
    torch.cuda.synchronize()
    assert_close(y, reference("rms_norm", x, w.detach()))


def test_non_default_stream():
    x = make((256, 3000), torch.float16)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    y = torch.full_like(x, float("nan"))
    torch.cuda.synchronize()
    tile.softmax(x, out=y, stream=s)                 # explicit torch.cuda.Stream
    s.synchronize()
    assert_close(y, reference("softmax", x))
    y2 = torch.full_like(x, float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.stream(s):                       # torch's current stream
        tile.log_softmax(x, out=y2)
    s.synchronize()
    assert_close(y2, reference("log_softmax", x))
    y3 = torch.full_like(x, float("nan"))
    torch.cuda.synchronize()
    record = tile.run("softmax", x, out=y3, stream=s.cuda_stream)   # raw handle
    s.synchronize()
    assert_close(y3, reference("softmax", x))
    assert record["arch"].startswith("sm_") and len(record["cubin_sha256"]) == 64


def test_cuda_graph_capture_and_replay():
    x = make((128, 4096), torch.float32)
    y = torch.empty_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tile.softmax(x, out=y)                       # warm-up: compile and load outside capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    y.fill_(float("nan"))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):                   # captures on its own side stream
        tile.softmax(x, out=y)
    torch.cuda.synchronize()
    assert torch.isnan(y).all(), "the launch ran during capture instead of being recorded"
    for seed in (5, 6):
        x.copy_(make(x.shape, torch.float32, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(y, reference("softmax", x))


@pytest.mark.parametrize("op", OPS)
def test_out_of_place_and_in_place(op):
    x = make((33, 1000), torch.bfloat16)
    weight = make(1000, torch.bfloat16, seed=1) if op in NORMS else None
    want = reference(op, x, weight)
    out = torch.empty_like(x)
    assert call(op, x, weight, out=out) is out
    torch.cuda.synchronize()
    assert_close(out, want)
    assert call(op, x, weight, out=x) is x
    torch.cuda.synchronize()
    assert_close(x, want)


def test_strided_slice_and_3d_view():
    wide = make((16, 1200), torch.float32)
    before = wide.clone()
    x = wide[:, :1000]
    out_wide = torch.full((16, 1200), -7.0, device="cuda")
    tile.layer_norm(x, out=out_wide[:, :1000])
    torch.cuda.synchronize()
    assert_close(out_wide[:, :1000], reference("layer_norm", x))
    assert (out_wide[:, 1000:] == -7.0).all()
    assert torch.equal(wide, before)
    base = make((2, 6, 512), torch.bfloat16)
    v = base[:, :, :384]
    y = tile.softmax(v)
    torch.cuda.synchronize()
    assert_close(y, reference("softmax", v))


def test_mixed_devices_are_rejected():
    x = make((4, 64), torch.float32)
    with pytest.raises(ValueError, match=r"argument 'out': expected an array on cuda:\d like x, got one on cpu"):
        tile.softmax(x, out=torch.empty(4, 64))
    with pytest.raises(ValueError, match=r"argument 'weight': expected an array on cuda:\d like x, got one on cpu"):
        tile.rms_norm(x, weight=torch.ones(64))
    with pytest.raises(ValueError, match=r"argument 'x': expected a contiguous last dimension"):
        tile.softmax(x.t())
    with pytest.raises(ValueError, match=r"argument 'x': expected dtype float32, float64, float16 or bfloat16, got int32"):
        tile.softmax(torch.ones(4, 8, dtype=torch.int32, device="cuda"))


def test_device_info_and_plan():
    x = make((8, 700), torch.bfloat16)
    info = tile.device_info(x.device.index)
    assert info["arch"] == f"sm_{info['cc_major']}{info['cc_minor']}"
    assert info["sm_count"] > 0
    record = tile.run("softmax", x, plan={"programs_per_group": 2, "workers_per_program": 64})
    assert record["plan"]["programs_per_group"] == 2 and record["threads_per_group"] == 128
    assert record["arch"] == info["arch"] and record["backend"] == "cuda"
    assert record["plan"] == tile.plan("softmax", x, plan={"programs_per_group": 2, "workers_per_program": 64})
    torch.cuda.synchronize()
    assert_close(record["out"], reference("softmax", x))
    tile.clear_kernel_caches()
    first = tile.run("softmax", x)                   # lowered again; compiled or read from disk
    assert first["cache_origin"] in ("compiled", "disk")
    assert first["compile_options"][0].startswith("-arch=sm_")
    assert tile.run("softmax", x)["cache_origin"] == "launch-cache"
    torch.cuda.synchronize()
    assert_close(first["out"], reference("softmax", x))


# The torch fast path: torch CUDA tensors cross as plain integers (tile._tile.launch_raw).

@pytest.fixture
def fast_path_only(monkeypatch):
    """Makes the DLPack launch fail, so that a call that succeeds took the fast path."""
    def dlpack_launch(*args, **kwargs):
        raise AssertionError("took the DLPack path (tile._tile.launch)")
    monkeypatch.setattr(tile._tile, "launch", dlpack_launch)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_out", [True, False], ids=["out", "allocated"])
@pytest.mark.parametrize("shape", [(37, 1537), (2, 4, 4096)])
def test_fast_path_matches_reference(op, dtype, with_out, shape, fast_path_only):
    x = make(shape, dtype)
    weight = make(shape[-1], dtype, seed=1, scale=1.0) if op in NORMS else None
    bias = make(shape[-1], dtype, seed=2, scale=1.0) if op == "layer_norm" else None
    out = torch.full_like(x, float("nan")) if with_out else None
    y = call(op, x, weight, bias, out=out)
    assert y is out if with_out else (y.dtype == dtype and y.shape == x.shape and y.is_contiguous())
    torch.cuda.synchronize()
    assert_close(y, reference(op, x, weight, bias))
    record = tile.run(op, x, out=out, weight=weight, bias=bias)
    assert record["backend"] == "cuda" and record["cache_origin"] == "launch-cache"
    torch.cuda.synchronize()
    assert_close(record["out"], reference(op, x, weight, bias))


def test_fast_path_layouts_and_dtypes(fast_path_only):
    wide = make((16, 1200), torch.float32)
    x = wide[:, :1000]                               # strided rows, written into a strided slice
    out_wide = torch.full((16, 1200), -7.0, device="cuda")
    w = torch.nn.Parameter(make(1000, torch.float32, seed=1))
    # out= writes no autograd graph: a weight that requires grad is refused, never dropped.
    with pytest.raises(RuntimeError, match="requires grad"):
        tile.layer_norm(x, weight=w, out=out_wide[:, :1000])
    with torch.no_grad():                            # no gradient wanted: read as it is
        tile.layer_norm(x, weight=w, out=out_wide[:, :1000])
    torch.cuda.synchronize()
    assert_close(out_wide[:, :1000], reference("layer_norm", x, w.detach()))
    assert (out_wide[:, 1000:] == -7.0).all()
    xb = make((8, 2048), torch.bfloat16)
    y32 = tile.rms_norm(xb, weight=make(2048, torch.float32, seed=1), dtype="float32")
    assert y32.dtype == torch.float32
    y16 = torch.empty(8, 2048, device="cuda", dtype=torch.float16)
    assert tile.softmax(xb, out=y16, dtype=torch.float16) is y16
    torch.cuda.synchronize()
    assert_close(y16, reference("softmax", xb))
    assert tile.softmax(torch.empty(0, 64, device="cuda")).shape == (0, 64)


@pytest.mark.parametrize("op", OPS)
def test_fast_path_on_a_non_default_stream(op, fast_path_only):
    x = make((256, 3072), torch.bfloat16)
    weight = make(3072, torch.bfloat16, seed=1, scale=1.0) if op in NORMS else None
    want = reference(op, x, weight)
    call(op, x, weight)                              # compile and load first: the host must not lag
    s = torch.cuda.Stream()                          # torch's pool streams do not wait for stream 0
    for how in ("current", "explicit"):
        y = torch.full_like(x, float("nan"))
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            # Long work ahead on s: a launch that went to another stream would finish first.
            if hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(100_000_000)
            if how == "current":
                call(op, x, weight, out=y)
            else:
                call(op, x, weight, out=y, stream=s)
        early = y.clone()                            # on the default stream, not ordered after s
        s.synchronize()
        torch.cuda.synchronize()
        if hasattr(torch.cuda, "_sleep"):
            assert torch.isnan(early).all(), f"{how}: the launch did not go on stream s"
        assert_close(y, want)


def outcome(fn):
    try:
        fn()
    except Exception as e:                           # noqa: BLE001 - the type and message are compared
        return type(e), str(e)
    return None


def test_fast_path_errors_match_the_dlpack_path():
    x = make((4, 64), torch.float32)
    bf = make((4, 64), torch.bfloat16)
    cases = [  # (op, x, out, weight, bias, plan, stream, dtype, message pattern)
        ("softmax", x.t(), None, None, None, None, None, None,
         r"softmax: argument 'x': expected a contiguous last dimension \(stride 1\), got shape \(64, 4\)"),
        ("softmax", x, torch.empty(4, 32, device="cuda"), None, None, None, None, None,
         r"softmax: argument 'out': expected shape \(4, 64\) like x, got shape \(4, 32\)"),
        ("softmax", x, torch.empty(4, 128, device="cuda")[:, ::2], None, None, None, None, None,
         r"softmax: argument 'out': expected a contiguous last dimension"),
        ("rms_norm", x, None, torch.ones(63, device="cuda"), None, None, None, None,
         r"rms_norm: argument 'weight': expected shape \(64,\) with stride 1"),
        ("layer_norm", x, None, torch.ones(64, device="cuda"), torch.ones(64, device="cuda", dtype=torch.int32),
         None, None, None, r"layer_norm: argument 'bias': expected dtype float32, float64, float16 or bfloat16, got int32"),
        ("softmax", torch.ones(4, 8, dtype=torch.int32, device="cuda"), None, None, None, None, None, None,
         r"softmax: argument 'x': expected dtype float32, float64, float16 or bfloat16, got int32"),
        ("softmax", x, torch.empty(4, 64, device="cuda", dtype=torch.float64), None, None, None, None, None,
         r"softmax: argument 'out': expected a float dtype other than float64 like x \(float32\), or every float "
         r"operand in float64, got float64"),
        ("softmax", x, None, None, None, None, None, torch.float64,
         r"softmax: argument 'out': expected a float dtype other than float64 like x \(float32\)"),
        ("softmax", x, torch.empty(4, 64), None, None, None, None, None,
         r"softmax: argument 'out': expected an array on cuda:\d like x, got one on cpu"),
        ("rms_norm", x, None, torch.ones(64), None, None, None, None,
         r"rms_norm: argument 'weight': expected an array on cuda:\d like x, got one on cpu"),
        ("softmax", x, None, None, None, None, None, "int8", r"softmax: argument 'dtype': expected float32"),
        ("softmax", bf, torch.empty_like(bf), None, None, None, None, "float32",
         r"softmax: argument 'dtype': expected None or out's dtype torch.bfloat16"),
        ("softmax", x, None, None, None, 3, None, None, r"softmax: argument 'plan': expected a dict"),
        ("softmax", x, None, None, None, {"warps": 2}, None, None,
         r"softmax: argument 'plan.warps': expected a known plan field"),
        ("softmax", x, None, None, None, None, "default", None, r"softmax: argument 'stream': expected an int"),
        ("rms_norm", x, [[1.0]], None, None, None, None, None,
         r"rms_norm: argument 'out': expected an array exporting DLPack"),
    ]
    for op, a, out, w, b, plan, stream, dtype, pattern in cases:
        got = outcome(lambda: tile.run(op, a, out=out, weight=w, bias=b, plan=plan, stream=stream, dtype=dtype))
        want = outcome(lambda: tile._launch_dlpack(op, a, out, w, b, None, plan, stream, dtype, True))
        assert got is not None and got == want, (pattern, got, want)
        assert got[0] in (ValueError, TypeError) and re.search(pattern, got[1]), (pattern, got)
    with pytest.raises(ValueError) as info:
        tile.softmax(torch.ones(4, 8, dtype=torch.int32, device="cuda"))
    assert info.value.__context__ is None            # not raised inside the fast path's handler
    with pytest.raises(ValueError, match=r"softmax: argument 'dim': expected -1 or 1"):
        tile.softmax(x, dim=0)
    with pytest.raises(ValueError, match=r"rms_norm: argument 'eps': expected 0 or a finite positive value"):
        tile.rms_norm(x, eps=-1.0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_fast_path_on_another_device():
    x = make((8, 512), torch.float32).to("cuda:1")
    torch.cuda.set_device(0)
    y = tile.softmax(x)                              # makes cuda:1 current for the launch
    assert y.device == x.device and torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert_close(y, reference("softmax", x))
    with pytest.raises(ValueError, match=r"softmax: argument 'out': expected an array on cuda:1 like x, "
                                         r"got one on cuda:0"):
        tile.softmax(x, out=torch.empty(8, 512, device="cuda:0"))


# ---- replays: a repeated call with other data pointers skips straight to the launch ----

@pytest.mark.parametrize("op", OPS)
def test_replayed_calls_read_their_own_arrays(op):
    # The first call resolves the launch; the next ones, on other tensors of the same layout and
    # alignment, replay it and must read and write their own memory.
    xs = [make((37, 1537), torch.float16, seed=s) for s in range(3)]
    w = make(1537, torch.float32, seed=7) if op in NORMS else None
    b = make(1537, torch.float32, seed=8) if op == "layer_norm" else None
    ys = [torch.full_like(x, float("nan")) for x in xs]
    for _ in range(2):
        for x, y in zip(xs, ys):
            call(op, x, w, b, out=y)
    torch.cuda.synchronize()
    for x, y in zip(xs, ys):
        assert_close(y, reference(op, x, w, b))


def test_a_replayed_call_still_refuses_overlap():
    # The pointers are checked on every call: an out= overlapping x, in a layout seen before, is
    # refused with bind's message, not launched.
    buf = make((2, 64, 512), torch.float32)
    tile.softmax(buf[0], out=buf[1])                 # resolves (64, 512) into another tensor
    with pytest.raises(ValueError, match="overlap"):
        tile.softmax(buf[0], out=buf.view(-1)[256:256 + 64 * 512].view(64, 512))  # half a row past x
    torch.cuda.synchronize()


def test_replays_are_forgotten_with_the_kernel_caches():
    from tile import _log
    x = make((16, 777), torch.float32)
    tile.softmax(x)
    tile.clear_kernel_caches()
    with _log.collect() as events:
        tile.softmax(x)                              # lowered and loaded again, not replayed
    assert events and events[0]["cache_origin"] in ("compiled", "memory", "disk")
