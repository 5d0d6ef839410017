"""tile._torch_C, the operators' C++ entry for torch tensors, on torch CPU tensors (the CPU
backend): where it is loaded, the eager calls of tile.softmax, log_softmax, rms_norm,
layer_norm, fused_add_rms_norm and cross_entropy go through it (its counters and its grad_fn types say so); its outputs and
gradients equal, bit for bit, those of the package's Python paths (the direct launch, the eager
autograd Function, the custom op) and float64 gradcheck passes through it; it refuses what
they refuse with the same messages, and leaves to them every call it does not take.

Skipped, saying why, where the extension is not loaded (not built, TILE_TORCH_EXTENSION=0, or
built for another torch). The CUDA cases (streams, replays) are in test_torch_ext_cuda.py."""
import contextlib

import pytest

torch = pytest.importorskip("torch")
from torch.autograd import gradcheck  # noqa: E402

import tile  # noqa: E402

pytestmark = pytest.mark.skipif(tile._ext is None,
                                reason=f"tile._torch_C: {tile.build_info()['torch_extension']}")

OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm"]
NODES = {"softmax": "TileSoftmaxBackward", "log_softmax": "TileLogSoftmaxBackward",
         "rms_norm": "TileRmsNormBackward", "layer_norm": "TileLayerNormBackward"}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def counters():
    return tile._ext.counters()


@contextlib.contextmanager
def python_paths(monkeypatch):
    """The call on the package's Python paths: the extension is not called."""
    with monkeypatch.context() as m:
        m.setattr(tile, "_ext", None)
        yield m


@contextlib.contextmanager
def taken(nodes=0):
    """The body's one call of an operator must go through the extension (and record `nodes`
    autograd nodes)."""
    before = counters()
    yield
    after = counters()
    assert after["calls"] == before["calls"] + 1, "the extension did not take the call"
    assert after["nodes"] == before["nodes"] + nodes


@contextlib.contextmanager
def not_taken():
    before = counters()
    yield
    assert counters()["calls"] == before["calls"], "the extension took a call it should leave to Python"


def rand(shape, dtype=torch.float32, seed=0, scale=2.0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_(requires_grad)


def call(op, x, w=None, b=None, **kw):
    if op in ("softmax", "log_softmax"):
        return getattr(tile, op)(x, **kw)
    if op == "rms_norm":
        return tile.rms_norm(x, weight=w, **kw)
    return tile.layer_norm(x, weight=w, bias=b, **kw)


def same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and u.shape == v.shape and u.device == v.device
        assert torch.equal(u, v), f"the two paths differ: max |diff| {float((u.double() - v.double()).abs().max())}"


def test_loaded_and_taking_the_eager_calls():
    assert tile.build_info()["torch_extension"] == "loaded"
    assert tile._ext.TORCH_VERSION == torch.__version__
    x, w, b = rand((4, 40)), rand(40, seed=1), rand(40, seed=2)
    for op in OPS:
        with taken():
            y = call(op, x, w, b)
        assert not y.requires_grad


@pytest.mark.parametrize("op", OPS)
def test_grad_fn_is_the_extensions_node(op):
    x, w, b = rand((3, 24), requires_grad=True), rand(24, seed=1), rand(24, seed=2)
    with taken(nodes=1):
        y = call(op, x, w, b)
    assert type(y.grad_fn).__name__ == NODES[op] == y.grad_fn.name()
    assert type(y.grad_fn) is getattr(tile._ext, NODES[op])
    before = counters()["backward"]
    y.sum().backward()
    assert counters()["backward"] == before + 1 and x.grad is not None


# ---- outputs: bit for bit the Python paths' ----

FORWARD_CASES = {
    "plain": dict(),
    "out": dict(out=True),
    "dtype": dict(dtype=torch.float32),
    "out_and_dtype": dict(out=True, dtype=True),
    "stats": dict(stats=True),
    "plan": dict(plan='{"workers_per_program": 32}'),
}


@pytest.mark.parametrize("case", sorted(FORWARD_CASES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_outputs_equal_the_python_paths(monkeypatch, op, dtype, case):
    spec = FORWARD_CASES[case]
    x = rand((2, 3, 67), dtype, 3)
    w, b = rand(67, dtype, 4, 1.0), rand(67, dtype, 5, 1.0)
    kw = {}
    if spec.get("dtype"):
        kw["dtype"] = torch.float32 if dtype != torch.float64 else torch.float64
    if "plan" in spec:
        kw["plan"] = spec["plan"]
    if spec.get("stats") and op in ("rms_norm", "layer_norm"):
        kw["return_rstd" if op == "rms_norm" else "return_stats"] = True
    outs = []
    for path in ("extension", "python"):
        args = dict(kw)
        if spec.get("out"):
            args["out"] = torch.full(x.shape, float("nan"), dtype=kw.get("dtype", dtype))
        with (taken() if path == "extension" else python_paths(monkeypatch)):
            y = call(op, x, w, b, **args)
        if "out" in args:
            assert (y[0] if isinstance(y, tuple) else y) is args["out"]
        outs.append(y)
    same(*outs)


@pytest.mark.parametrize("op", OPS)
def test_strided_rows_parameters_and_in_place(monkeypatch, op):
    # Rows of one stride inside a wider buffer, nn.Parameter weights, and out= x.
    base = rand((5, 96), torch.float32, 6)
    x = base[:, :80]
    w, b = torch.nn.Parameter(rand(80, seed=7)), torch.nn.Parameter(rand(80, seed=8))
    with torch.no_grad():
        with taken():
            got = call(op, x, w, b)
        with python_paths(monkeypatch):
            want = call(op, x, w, b)
    same(got, want)
    if op in ("softmax", "log_softmax"):
        y = x.clone()
        with taken():
            assert call(op, y, out=y) is y
        same(y, want)


# ---- gradients: bit for bit the eager Function's and the custom op's ----

def _gradients(op, inputs, dy_seed=40, **kw):
    leaves = [None if t is None else (t.detach().clone().requires_grad_(t.requires_grad)) for t in inputs]
    outs = call(op, *leaves, **kw)
    outs = outs if isinstance(outs, tuple) else (outs,)
    dys = [rand(o.shape, o.dtype, dy_seed + i) for i, o in enumerate(outs) if o.requires_grad]
    torch.autograd.backward([o for o in outs if o.requires_grad], dys)
    return outs, tuple(t.grad for t in leaves if t is not None and t.requires_grad), outs[0].grad_fn


def _three_paths(monkeypatch, op, inputs, **kw):
    with taken(nodes=1):
        ext = _gradients(op, inputs, **kw)
    assert type(ext[2]).__name__ == NODES[op]
    with python_paths(monkeypatch) as m:
        eager = _gradients(op, inputs, **kw)
        assert type(eager[2]).__name__.startswith("Eager_")
        m.setattr(tile._torch_api, "_plain_grad", lambda x: False)
        m.setattr(tile._torch_api, "eager_grad", lambda *arrays: False)
        custom = _gradients(op, inputs, **kw)
        assert type(custom[2]).__name__.startswith("GeneratedBackwardFor_tile_")
    for other in (eager, custom):
        same(tuple(ext[0]), tuple(other[0]))
        same(ext[1], other[1])


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_gradients_equal_the_python_paths(monkeypatch, op, dtype, out_dtype):
    if out_dtype is not None and dtype == torch.float64:
        out_dtype = torch.float64
    _three_paths(monkeypatch, op, [rand((3, 5, 67), dtype, 30, requires_grad=True)], dtype=out_dtype)


@pytest.mark.parametrize("grads", ["x", "weight", "both", "unweighted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rms_norm_gradients_equal_the_python_paths(monkeypatch, dtype, grads):
    x = rand((6, 4, 96), dtype, 31, requires_grad=grads != "weight")
    w = None if grads == "unweighted" else rand(96, dtype, 32, 1.0, requires_grad=grads != "x")
    _three_paths(monkeypatch, "rms_norm", [x, w], eps=1e-5, return_rstd=True)
    # an output dtype of its own: dx computed in it, then converted to x's dtype, on every path
    _three_paths(monkeypatch, "rms_norm", [x, w], dtype=torch.float64 if dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none", "parameters_alone"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_layer_norm_gradients_equal_the_python_paths(monkeypatch, dtype, affine):
    x = rand((5, 130), dtype, 33, requires_grad=affine != "parameters_alone")
    w = rand(130, dtype, 34, 1.0, requires_grad=True) if affine != "bias" and affine != "none" else None
    b = rand(130, dtype, 35, 1.0, requires_grad=True) if affine != "weight" and affine != "none" else None
    _three_paths(monkeypatch, "layer_norm", [x, w, b], return_stats=True)


@pytest.mark.parametrize("op", OPS)
def test_float64_gradcheck_through_the_extension(op):
    x = rand((3, 17), torch.float64, 50, requires_grad=True)
    w = rand(17, torch.float64, 51, 0.5, requires_grad=True) + 1.0
    b = rand(17, torch.float64, 52, 0.5, requires_grad=True)
    inputs = {"softmax": (x,), "log_softmax": (x,), "rms_norm": (x, w), "layer_norm": (x, w, b)}[op]
    with taken(nodes=1):
        y = call(op, *inputs)
    assert type(y.grad_fn).__name__ == NODES[op]
    assert gradcheck(lambda *a: call(op, *a), inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_statistics_are_not_differentiable_and_saved_tensors_are_checked():
    x, w = rand((4, 32), requires_grad=True), rand(32, seed=1, requires_grad=True)
    y, rstd = tile.rms_norm(x, weight=w, return_rstd=True)
    assert y.requires_grad and not rstd.requires_grad
    y2, mean, rstd2 = tile.layer_norm(x, weight=w, return_stats=True)
    assert not mean.requires_grad and not rstd2.requires_grad
    with torch.no_grad():
        w.mul_(2)                           # saved for the backward: modified in place
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_backward_twice_needs_retain_graph():
    x = rand((3, 16), requires_grad=True)
    y = tile.softmax(x)
    dy = rand((3, 16), seed=9)
    y.backward(dy, retain_graph=True)
    first = x.grad.clone()
    y.backward(dy)
    assert torch.equal(x.grad, 2 * first)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward(dy)


@pytest.mark.parametrize("op", OPS)
def test_double_backward_raises(op):
    x = rand((3, 16), requires_grad=True)
    y = call(op, x)
    assert type(y.grad_fn).__name__ == NODES[op]
    (g,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=rf"tile\.{op}_backward.*no autograd formula"):
        g.sum().backward()


def test_modules_and_precompile_take_it():
    norm = tile.nn.RMSNorm(48)
    x = rand((2, 48), requires_grad=True)
    with taken(nodes=1):
        y = norm(x)
    names, fn = [], y.grad_fn                   # the module may view its output
    while fn is not None:
        names.append(type(fn).__name__)
        fn = fn.next_functions[0][0] if fn.next_functions else None
    assert "TileRmsNormBackward" in names, names
    tile.precompile(tile.layer_norm, rand((2, 48)), weight=rand(48, seed=3), backward=True)


# ---- fused_add_rms_norm ----

FUSED_CASES = {
    "plain": dict(), "weighted": dict(weight=True), "return_rstd": dict(weight=True, return_rstd=True),
    "in_place": dict(weight=True, in_place=True), "in_place_rstd": dict(in_place=True, return_rstd=True),
    "eps_int": dict(eps=0), "plan": dict(plan='{"workers_per_program": 32}'),
    "residual_float32": dict(weight=True, residual_dtype=torch.float32),
}


@pytest.mark.parametrize("case", sorted(FUSED_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_fused_add_rms_norm_outputs_equal_the_python_path(monkeypatch, dtype, case):
    spec = dict(FUSED_CASES[case])
    residual_dtype = spec.pop("residual_dtype", dtype)
    if dtype == torch.float64:                  # a float64 call has every float operand in float64
        residual_dtype = dtype
    w = rand(48, dtype, 62, 1.0) if spec.pop("weight", False) else None
    outs = []
    for path in ("extension", "python"):
        x, r = rand((3, 5, 48), dtype, 60), rand((3, 5, 48), residual_dtype, 61)
        with (taken() if path == "extension" else python_paths(monkeypatch)):
            got = tile.fused_add_rms_norm(x, r, w, **spec)
        if spec.get("in_place"):
            assert got[0] is x and got[1] is r
        outs.append(got)
    same(*outs)


def _fused_gradients(inputs, dys):
    leaves = [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    y, residual_out = tile.fused_add_rms_norm(*leaves, eps=1e-5)
    torch.autograd.backward([y, residual_out], dys)
    return (y, residual_out), tuple(t.grad for t in leaves if t is not None and t.requires_grad), y.grad_fn


@pytest.mark.parametrize("grads", ["all", "x", "residual", "weight", "unweighted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rms_norm_gradients_equal_the_python_paths(monkeypatch, dtype, grads):
    x = rand((7, 48), dtype, 36, requires_grad=grads in ("all", "x", "unweighted"))
    r = rand((7, 48), dtype, 37, requires_grad=grads in ("all", "residual", "unweighted"))
    w = None if grads == "unweighted" else rand(48, dtype, 38, 1.0, requires_grad=grads in ("all", "weight"))
    dys = [rand((7, 48), dtype, 70), rand((7, 48), dtype, 71)]
    with taken(nodes=1):
        ext = _fused_gradients([x, r, w], dys)
    assert type(ext[2]).__name__ == "TileFusedAddRmsNormBackward"
    with python_paths(monkeypatch) as m:
        eager = _fused_gradients([x, r, w], dys)
        assert type(eager[2]).__name__.startswith("Eager_")
        m.setattr(tile._torch_api, "eager_grad", lambda *arrays: False)
        custom = _fused_gradients([x, r, w], dys)
        assert type(custom[2]).__name__.startswith("GeneratedBackwardFor_tile_")
    for other in (eager, custom):
        same(tuple(o.detach() for o in ext[0]), tuple(o.detach() for o in other[0]))
        same(ext[1], other[1])


def test_fused_add_rms_norm_gradient_of_one_output_and_gradcheck():
    x, r = rand((3, 17), torch.float64, 80, requires_grad=True), rand((3, 17), torch.float64, 81, requires_grad=True)
    w = (rand(17, torch.float64, 82, 0.5) + 1.0).requires_grad_()
    y, _ = tile.fused_add_rms_norm(x, r, w)
    y.sum().backward()                          # residual_out's gradient: zeros, as a Function gets
    assert x.grad is not None and torch.equal(x.grad, r.grad)
    assert gradcheck(lambda *a: tile.fused_add_rms_norm(*a), (x, r, w), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_fused_add_rms_norm_module_takes_it():
    norm = tile.nn.FusedAddRMSNorm(48)
    x, r = rand((2, 48), requires_grad=True), rand((2, 48), seed=1)
    with taken(nodes=1):
        y, residual_out = norm(x, r)
    assert type(y.grad_fn).__name__ == "TileFusedAddRmsNormBackward"


# ---- errors: the Python paths' ----

def _bad_calls():
    x = rand((4, 16))
    xg = rand((4, 16), requires_grad=True)
    w = rand(16, seed=1)
    return {
        "dim": lambda: tile.softmax(x, dim=0),
        "dim_grad": lambda: tile.log_softmax(xg, dim=0),
        "out_dtype": lambda: tile.softmax(x, out=torch.empty(4, 16), dtype=torch.bfloat16),
        "out_shape": lambda: tile.softmax(x, out=torch.empty(4, 15)),
        "out_grad": lambda: tile.softmax(xg, out=torch.empty(4, 16)),
        "out_grad_weight": lambda: tile.rms_norm(x, weight=w.clone().requires_grad_(), out=torch.empty(4, 16)),
        "out_grad_bias": lambda: tile.layer_norm(x, bias=w.clone().requires_grad_(), out=torch.empty(4, 16)),
        "weight_shape": lambda: tile.rms_norm(x, weight=rand(15)),
        "weight_strided": lambda: tile.layer_norm(x, weight=rand(32)[::2]),
        "bias_precision": lambda: tile.layer_norm(x, bias=rand(16, torch.float64)),
        "float64_x": lambda: tile.rms_norm(rand((4, 16), torch.float64), weight=w),
        "columns_strided": lambda: tile.softmax(rand((16, 4)).t()),
        "rows_overlap": lambda: tile.softmax(torch.as_strided(rand(64), (4, 16), (8, 1))),
        "out_overlaps_x": lambda: (lambda b: tile.softmax(b[:, :16], out=b[:, 1:]))(rand((4, 17))),
        "eps_negative": lambda: tile.rms_norm(x, eps=-1.0),
        "eps_tiny": lambda: tile.layer_norm(x, eps=1e-50),
        "eps_huge_int": lambda: tile.rms_norm(x, eps=10 ** 400),
        "plan_json": lambda: tile.softmax(x, plan="{not json"),
        "plan_field": lambda: tile.softmax(x, plan='{"no_such_field": 1}'),
        "stats_grad_out": lambda: tile.layer_norm(xg, out=torch.empty(4, 16), return_stats=True),
        "fused_in_place_grad": lambda: tile.fused_add_rms_norm(x, xg, in_place=True),
        "fused_in_place_grad_weight": lambda: tile.fused_add_rms_norm(x, x.clone(), w.clone().requires_grad_(),
                                                                      in_place=True),
        "fused_residual_shape": lambda: tile.fused_add_rms_norm(x, rand((4, 15))),
        "fused_weight_shape": lambda: tile.fused_add_rms_norm(x, x.clone(), rand(15)),
        "fused_eps": lambda: tile.fused_add_rms_norm(x, x.clone(), eps=-1.0),
        "fused_precision": lambda: tile.fused_add_rms_norm(x, rand((4, 16), torch.float64)),
    }


def _outcome(fn):
    try:
        fn()
    except Exception as e:              # noqa: BLE001 - the type and message are compared
        return type(e), str(e)
    return None


CE_OPTIONS = {
    "plain": {},
    "smoothing": {"label_smoothing": 0.1},
    "z_loss_softcap": {"z_loss": 1e-3, "softcap": 30.0},
    "ignore_7": {"ignore_index": 7},
}


def ce_inputs(rows, cols, dtype, seed=0, ignore_index=-100, device="cpu"):
    """Logits and int64 targets: targets at both ends of the row and one ignored row."""
    logits = rand((rows, cols), dtype, seed, scale=3.0).to(device)
    g = torch.Generator().manual_seed(seed + 1)
    target = torch.randint(0, cols, (rows,), generator=g)
    target[0], target[1], target[2] = 0, cols - 1, ignore_index
    return logits, target.to(device)


def ce_step(logits, target, dloss, **kw):
    """The loss and the gradient of the logits, through the package's default path."""
    leaf = logits.detach().clone().requires_grad_()
    loss = tile.cross_entropy(leaf, target, **kw)
    loss.backward(dloss)
    return loss.detach(), leaf.grad


def check_cross_entropy(monkeypatch, dtype, reduction, options, rows, cols, device):
    """cross_entropy through the extension (forward with its lse, and a step with its node)
    equals the Python paths bit for bit."""
    kw = dict(CE_OPTIONS[options], reduction=reduction)
    logits, target = ce_inputs(rows, cols, dtype, ignore_index=kw.get("ignore_index", -100), device=device)
    stat = torch.float64 if dtype == torch.float64 else torch.float32
    dloss = (rand(rows, stat, 9) if reduction == "none" else torch.tensor(0.75, dtype=stat)).to(device)
    with taken():
        got = tile.cross_entropy(logits, target, return_lse=True, **kw)
    with taken(nodes=1):
        ext = ce_step(logits, target, dloss, **kw)
    with taken(nodes=1):
        assert type(tile.cross_entropy(logits.clone().requires_grad_(), target, **kw).grad_fn).__name__ == \
            "TileCrossEntropyBackward"
    with python_paths(monkeypatch):
        want = tile.cross_entropy(logits, target, return_lse=True, **kw)
        eager = ce_step(logits, target, dloss, **kw)
    same(got, want)
    same(ext, eager)


@pytest.mark.parametrize("options", sorted(CE_OPTIONS))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_cross_entropy_equals_the_python_paths(monkeypatch, dtype, reduction, options):
    check_cross_entropy(monkeypatch, dtype, reduction, options, 9, 77, "cpu")


def test_cross_entropy_float64_gradcheck_through_the_extension():
    logits, target = ce_inputs(4, 13, torch.float64, seed=4)
    for kw in ({}, {"reduction": "none", "label_smoothing": 0.2}, {"reduction": "sum", "softcap": 5.0, "z_loss": 0.1}):
        x = logits.clone().requires_grad_()
        assert type(tile.cross_entropy(x, target, **kw).grad_fn).__name__ == "TileCrossEntropyBackward"
        assert gradcheck(lambda z: tile.cross_entropy(z, target, **kw), (x,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_cross_entropy_lse_is_not_differentiable_and_double_backward_raises():
    logits, target = ce_inputs(4, 13, torch.float32, seed=5)
    x = logits.clone().requires_grad_()
    loss, lse = tile.cross_entropy(x, target, return_lse=True)
    assert loss.requires_grad and not lse.requires_grad
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"tile\.cross_entropy_backward.*no autograd formula"):
        g.pow(2).sum().backward()


@pytest.mark.parametrize("case", sorted(_bad_calls()))
def test_errors_equal_the_python_paths(monkeypatch, case):
    fn = _bad_calls()[case]
    # The extension raises these itself: the Python paths must not be reached.
    with monkeypatch.context() as m:
        def unreachable(*args, **kwargs):
            raise AssertionError("the call went to the Python paths")
        m.setattr(tile, "_launch", unreachable)
        m.setattr(tile._torch_api, "softmax", unreachable)
        m.setattr(tile._torch_api, "rms_norm", unreachable)
        m.setattr(tile._torch_api, "layer_norm", unreachable)
        m.setattr(tile._torch_api, "TRAINING", {})
        m.setattr(tile._torch_api, "_training", unreachable)
        m.setattr(tile._training, "_run", unreachable)
        got = _outcome(fn)
    with python_paths(monkeypatch):
        want = _outcome(fn)
    assert want is not None, "the Python paths accept this call"
    assert got == want


# ---- what it leaves to the Python paths ----

class Subclass(torch.Tensor):
    pass


def _left_calls():
    x = rand((4, 16))
    return {
        "numpy": lambda: tile.softmax(x.numpy()),
        "stream": lambda: tile.softmax(x, stream=0),
        "plan_dict": lambda: tile.softmax(x, plan={"workers_per_program": 32}),
        "dtype_name": lambda: tile.softmax(x, dtype="float32"),
        "subclass": lambda: tile.softmax(x.as_subclass(Subclass)),
        "subclass_weight": lambda: tile.rms_norm(x, weight=rand(16).as_subclass(Subclass)),
        "integer_x": lambda: tile.softmax(torch.ones(4, 16, dtype=torch.int32)),
        "empty_rows": lambda: tile.rms_norm(rand((0, 16)), return_rstd=True),
        "empty_columns": lambda: tile.layer_norm(rand((4, 0)), return_stats=True),
        "zero_dim": lambda: tile.softmax(torch.tensor(1.0)),
        "eps_numpy": lambda: tile.rms_norm(x, eps=__import__("numpy").float32(1e-5)),
        "eps_bool": lambda: tile.rms_norm(x, eps=True),
        "dim_float": lambda: tile.softmax(x, dim=-1.0),
        "neg_view": lambda: tile.softmax(x._neg_view()),
        "vmap": lambda: torch.func.vmap(tile.softmax)(rand((2, 4, 16))),
        "functorch_grad": lambda: torch.func.grad(lambda t: tile.softmax(t).pow(2).sum())(rand((4, 16))),
        "forward_ad": lambda: _dual_softmax(x),
        "fused_return_rstd_grad": lambda: tile.fused_add_rms_norm(x.clone().requires_grad_(), x, return_rstd=True),
        "fused_plan_grad": lambda: tile.fused_add_rms_norm(x.clone().requires_grad_(), x, plan=None),
        "fused_stream": lambda: tile.fused_add_rms_norm(x, x.clone(), stream=0),
        "fused_unknown_argument": lambda: tile.fused_add_rms_norm(x, x.clone(), alpha=1.0),
        "fused_eps_none": lambda: tile.fused_add_rms_norm(x, x.clone(), eps=None),
        "fused_numpy": lambda: tile.fused_add_rms_norm(x.numpy(), x.numpy().copy()),
        # cross_entropy: a host target out of range is the Python path's to name.
        "cross_entropy_target_range": lambda: tile.cross_entropy(x, torch.tensor([0, 3, -100, 16])),
        "cross_entropy_negative_target": lambda: tile.cross_entropy(x, torch.tensor([0, -3, 1, 15])),
        "cross_entropy_one_dimensional": lambda: tile.cross_entropy(x[0], torch.tensor(3)),
        "cross_entropy_float_target": lambda: tile.cross_entropy(x, torch.tensor([0.0, 3, 1, 15])),
        "cross_entropy_target_shape": lambda: tile.cross_entropy(x, torch.tensor([0, 3, 1])),
        "cross_entropy_reduction": lambda: tile.cross_entropy(x, torch.tensor([0, 3, 1, 15]), reduction="avg"),
        "cross_entropy_smoothing_range": lambda: tile.cross_entropy(x, torch.tensor([0, 3, 1, 15]),
                                                                    label_smoothing=1.5),
        "cross_entropy_negative_softcap": lambda: tile.cross_entropy(x, torch.tensor([0, 3, 1, 15]), softcap=-1.0),
        "cross_entropy_negative_z_loss": lambda: tile.cross_entropy(x, torch.tensor([0, 3, 1, 15]), z_loss=-0.5),
        "cross_entropy_bool_ignore": lambda: tile.cross_entropy(x, torch.tensor([0, 3, 1, 15]), ignore_index=True),
        "cross_entropy_plan_grad": lambda: tile.cross_entropy(x.clone().requires_grad_(), torch.tensor([0, 3, 1, 15]),
                                                              plan=None),
        "cross_entropy_empty_rows": lambda: tile.cross_entropy(rand((0, 16)), torch.zeros(0, dtype=torch.long)),
        **_LEFT_NAMED,
    }


if hasattr(torch.Tensor, "refine_names"):          # named tensors (gone in later torch versions)
    _LEFT_NAMED = {"named": lambda: tile.softmax(rand((4, 16)).refine_names("rows", "cols"))}
else:
    _LEFT_NAMED = {}


def _dual_softmax(x):
    import torch.autograd.forward_ad as fwad
    with fwad.dual_level():
        return tile.softmax(fwad.make_dual(x.clone().requires_grad_(), torch.ones_like(x)))


def _run(fn):
    try:
        return "returned", fn()
    except Exception as e:              # noqa: BLE001 - the type and message are compared
        return "raised", (type(e), str(e))


def _tensors(result):
    items = result if isinstance(result, tuple) else (result,)
    return [torch.as_tensor(t).detach() for t in items]


@pytest.mark.parametrize("case", sorted(_left_calls()))
def test_calls_it_leaves_to_the_python_paths(monkeypatch, case):
    fn = _left_calls()[case]
    with not_taken():
        got = _run(fn)
    with python_paths(monkeypatch):
        want = _run(fn)
    assert got[0] == want[0]
    if got[0] == "raised":
        assert got == want
        return
    for a, b in zip(_tensors(got[1]), _tensors(want[1]), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_calls_under_no_grad_and_inference_mode_record_no_node():
    x = rand((3, 16), requires_grad=True)
    with torch.no_grad(), taken(nodes=0):
        assert not tile.softmax(x).requires_grad
    with torch.inference_mode(), taken(nodes=0):
        assert not tile.layer_norm(rand((3, 16))).requires_grad
    with torch.no_grad(), taken():                 # out= is allowed without grad mode
        tile.softmax(x, out=torch.empty(3, 16))


def test_clear_kernel_caches_keeps_it_working():
    x = rand((3, 16))
    y = tile.softmax(x)
    tile.clear_kernel_caches()
    with taken():
        assert torch.equal(tile.softmax(x), y)


@pytest.mark.parametrize("op", OPS)
def test_calls_take_the_python_paths_while_compile_reports_are_wanted(op):
    # The extension reports no JIT compile: while tile.precompile collects, or the "tile" logger
    # reports at INFO (TILE_LOG), calls take the paths that do; otherwise the extension again.
    import logging
    from tile import _log
    x = rand((3, 40))
    w = rand((40,), seed=1) if "norm" in op else None
    with not_taken(), _log.collect():
        call(op, x, w)
    level = _log.logger.level
    _log.logger.setLevel(logging.INFO)
    try:
        with not_taken():
            call(op, x, w)
    finally:
        _log.logger.setLevel(level)
    if not _log.logger.isEnabledFor(logging.INFO):
        with taken():
            call(op, x, w)
