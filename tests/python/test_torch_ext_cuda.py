"""tile._torch_C on torch CUDA tensors (marked gpu): outputs and gradients equal, bit for bit,
those of the package's Python paths (the four operators, fused_add_rms_norm and
cross_entropy); a repeated call is replayed, one reducing over the rows too; the launches go to the
current stream of the tensors' device (a CUDA-graph capture records them, forward and
backward), on that device whichever is current; errors are the Python paths'.

Skipped, saying why, without a CUDA device or where the extension is not loaded."""
import pytest

torch = pytest.importorskip("torch")
from torch.autograd import gradcheck  # noqa: E402

import tile  # noqa: E402
from test_torch_ext import CE_OPTIONS, NODES, _outcome, call, ce_step, check_cross_entropy, python_paths, same, taken  # noqa: E402
from test_torch_ext import ce_inputs as _ce_inputs  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
    pytest.mark.skipif(tile._ext is None, reason=f"tile._torch_C: {tile.build_info()['torch_extension']}"),
]

OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SHAPES = [(37, 1537), (4, 4096), (2, 3, 1100), (1, 16384)]


def rand(shape, dtype=torch.float32, seed=0, scale=2.0, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


def step(op, x, w, b, dy):
    """Forward and backward with x, w and b requiring grad: (outputs, gradients)."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    y = call(op, *leaves)
    y.backward(dy)
    return (y.detach(),), tuple(t.grad for t in leaves if t.grad is not None)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_outputs_and_gradients_equal_the_python_paths(monkeypatch, op, dtype, shape):
    x, w, b = rand(shape, dtype, 1), rand(shape[-1], dtype, 2, 1.0), rand(shape[-1], dtype, 3, 1.0)
    dy = rand(shape, dtype, 4)
    with taken():
        y = call(op, x, w, b)
    with taken(nodes=1):
        ext = step(op, x, w, b, dy)
    with python_paths(monkeypatch):
        want = call(op, x, w, b)
        eager = step(op, x, w, b, dy)
    same(y, want)
    same(ext[0], eager[0])
    same(ext[1], eager[1])


def _fused_step(x, r, w, dys):
    leaves = [t.detach().clone().requires_grad_() for t in (x, r, w)]
    outs = tile.fused_add_rms_norm(*leaves)
    torch.autograd.backward(outs, dys)
    return tuple(o.detach() for o in outs), tuple(t.grad for t in leaves)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_equals_the_python_path(monkeypatch, dtype, shape):
    x, r, w = rand(shape, dtype, 1), rand(shape, dtype, 2), rand(shape[-1], dtype, 3, 1.0)
    dys = [rand(shape, dtype, 4), rand(shape, dtype, 5)]
    with taken():
        got = tile.fused_add_rms_norm(x, r, w, return_rstd=True)
    with taken(nodes=1):
        ext = _fused_step(x, r, w, dys)
    with python_paths(monkeypatch):
        want = tile.fused_add_rms_norm(x, r, w, return_rstd=True)
        eager = _fused_step(x, r, w, dys)
    same(got, want)
    same(ext[0], eager[0])
    same(ext[1], eager[1])


@pytest.mark.parametrize("op", OPS)
def test_repeated_calls_are_replayed(monkeypatch, op):
    # Other tensors of the same shapes, dtypes and alignment: the first call's launch again.
    shape = (8, 2048)
    call(op, rand(shape), rand(2048, seed=1), rand(2048, seed=2))
    before = tile._ext.counters()["replays"]
    x, w, b = rand(shape, seed=5), rand(2048, seed=6), rand(2048, seed=7)
    with taken():
        y = call(op, x, w, b)
    assert tile._ext.counters()["replays"] == before + 1
    with python_paths(monkeypatch):
        same(y, call(op, x, w, b))
    # A row start 4 bytes off the 16-byte boundary is another call (its plan and checks differ).
    base = rand((8, 2049), seed=8)
    with taken():
        y = call(op, base[:, 1:], w, b)
    with python_paths(monkeypatch):
        same(y, call(op, base[:, 1:], w, b))


def test_softmax_backward_is_replayed_too():
    x = rand((16, 1024)).requires_grad_()
    dy = rand((16, 1024), seed=1)
    tile.softmax(x).backward(dy)
    before = tile._ext.counters()["replays"]
    tile.softmax(x).backward(dy)                 # the forward and the backward replayed
    assert tile._ext.counters()["replays"] == before + 2


def test_backward_reducing_over_the_rows_is_replayed():
    # rms_norm's backward sums dweight over the rows (two kernels and a workspace): replayed,
    # with its workspace from torch's allocator, bit for bit the full path's.
    x, w, dy = rand((64, 2048)).requires_grad_(), rand(2048, seed=1).requires_grad_(), rand((64, 2048), seed=2)
    tile.rms_norm(x, weight=w).backward(dy)
    first = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    before = tile._ext.counters()["replays"]
    tile.rms_norm(x, weight=w).backward(dy)      # the forward and the backward replayed
    assert tile._ext.counters()["replays"] == before + 2
    same((x.grad, w.grad), first)


def ce_inputs(rows, cols, dtype, seed=0, ignore_index=-100):
    return _ce_inputs(rows, cols, dtype, seed, ignore_index, "cuda")


@pytest.mark.parametrize("options", sorted(CE_OPTIONS))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_equals_the_python_paths(monkeypatch, dtype, reduction, options):
    check_cross_entropy(monkeypatch, dtype, reduction, options, 37, 1537, "cuda")


def test_cross_entropy_forward_and_backward_are_replayed(monkeypatch):
    logits, target = ce_inputs(64, 5000, torch.bfloat16)
    ce_step(logits, target, None)
    before = tile._ext.counters()["replays"]
    other, other_target = ce_inputs(64, 5000, torch.bfloat16, seed=3)
    got = ce_step(other, other_target, None)      # the mean (two kernels) and its backward
    assert tile._ext.counters()["replays"] == before + 2
    with python_paths(monkeypatch):
        same(got, ce_step(other, other_target, None))


def test_cross_entropy_float64_gradcheck_on_the_gpu():
    logits, target = ce_inputs(5, 300, torch.float64, seed=4)
    for kw in ({}, {"reduction": "none", "label_smoothing": 0.2}, {"reduction": "sum", "softcap": 5.0, "z_loss": 0.1}):
        x = logits.clone().requires_grad_()
        assert tile.cross_entropy(x, target, **kw).grad_fn.name() == "TileCrossEntropyBackward"
        assert gradcheck(lambda z: tile.cross_entropy(z, target, **kw), (x,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_cross_entropy_is_captured_forward_and_backward(monkeypatch):
    # The mean's count stays on the device: forward and backward capture, and a replay on new
    # logits and targets gives their loss and gradient.
    logits, target = ce_inputs(48, 3000, torch.float32, seed=5)
    x = logits.clone().requires_grad_()
    tile.precompile(lambda z: tile.cross_entropy(z, target), x, backward=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            tile.cross_entropy(x, target).backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        loss = tile.cross_entropy(x, target)
        loss.backward()
    new_logits, new_target = ce_inputs(48, 3000, torch.float32, seed=6)
    with torch.no_grad():
        x.copy_(new_logits)
        target.copy_(new_target)
    graph.replay()
    torch.cuda.synchronize()
    with python_paths(monkeypatch):
        want = ce_step(new_logits, new_target, None)
    same((loss.detach().clone(), x.grad.clone()), want)


# Calls with logits and targets (made in the test: collection must not touch the device).
CE_LEFT_CALLS = {
    "one_dimensional": lambda z, t: tile.cross_entropy(z[0], t[0]),
    "target_on_the_cpu": lambda z, t: tile.cross_entropy(z, t.cpu()),
    "float_target": lambda z, t: tile.cross_entropy(z, t.float()),
    "target_shape": lambda z, t: tile.cross_entropy(z, t[:3]),
    "reduction": lambda z, t: tile.cross_entropy(z, t, reduction="avg"),
    "label_smoothing_range": lambda z, t: tile.cross_entropy(z, t, label_smoothing=1.5),
    "negative_softcap": lambda z, t: tile.cross_entropy(z, t, softcap=-1.0),
    "negative_z_loss": lambda z, t: tile.cross_entropy(z, t, z_loss=-0.5),
    "bool_ignore_index": lambda z, t: tile.cross_entropy(z, t, ignore_index=True),
    "plan_with_grad": lambda z, t: tile.cross_entropy(z.clone().requires_grad_(), t, plan=None),
    "empty_rows": lambda z, t: tile.cross_entropy(z[:0], t[:0]),
}


@pytest.mark.parametrize("case", sorted(CE_LEFT_CALLS))
def test_cross_entropy_calls_it_leaves_to_the_python_paths(monkeypatch, case):
    logits, target = ce_inputs(4, 64, torch.float32)
    fn = lambda: CE_LEFT_CALLS[case](logits, target)  # noqa: E731
    before = tile._ext.counters()["calls"]
    got = _outcome(fn)
    assert tile._ext.counters()["calls"] == before, "the extension took a call it should leave to Python"
    with python_paths(monkeypatch):
        assert got == _outcome(fn)


@pytest.mark.parametrize("op", OPS)
def test_the_current_stream_is_used_forward_and_backward(monkeypatch, op):
    # Launches on any stream but the capturing (current) one would not be recorded, or would
    # break the capture: after a replay with new inputs, the outputs are the new ones'.
    shape = (32, 3000)
    x = rand(shape, seed=10).requires_grad_()
    w = rand(3000, seed=11, scale=1.0).requires_grad_()
    b = rand(3000, seed=12, scale=1.0).requires_grad_()
    dy = rand(shape, seed=13)
    tile.precompile(lambda *a: call(op, *a), x, w, b, backward=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                # warm up on the stream the capture uses
        for _ in range(2):
            call(op, x, w, b).backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    for t in (x, w, b):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        y = call(op, x, w, b)
        y.backward(dy)
    with torch.no_grad():
        x.copy_(rand(shape, seed=20))
        dy.copy_(rand(shape, seed=21))
    graph.replay()
    torch.cuda.synchronize()
    got = (y.detach().clone(), x.grad.clone())
    with python_paths(monkeypatch):
        want = step(op, x.detach(), w.detach(), b.detach(), dy)
    same(got[0], want[0][0])
    same(got[1], want[1][0])


def test_a_stream_of_its_own_orders_the_call(monkeypatch):
    # On a stream kept busy by a long kernel, x is overwritten and then normalised: a launch on
    # any other stream would read x before the copy (torch's streams do not wait for each other).
    x, new = rand((64, 4096), seed=30), rand((64, 4096), seed=31)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        x.copy_(new)
        with taken():
            y = tile.softmax(x)
    s.synchronize()
    with python_paths(monkeypatch):
        same(y, tile.softmax(new))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_another_device_than_the_current_one(monkeypatch):
    x, w = rand((8, 1000), device="cuda:1"), rand(1000, seed=1, device="cuda:1")
    with torch.cuda.device(0):
        with taken():
            y = tile.rms_norm(x, weight=w)
        assert torch.cuda.current_device() == 0
    with python_paths(monkeypatch):
        same(y, tile.rms_norm(x, weight=w))


@pytest.mark.parametrize("op", OPS)
def test_float64_gradcheck_on_the_gpu(op):
    x = rand((3, 1100), torch.float64, 40).requires_grad_()
    w = (rand(1100, torch.float64, 41, 0.5) + 1.0).requires_grad_()
    b = rand(1100, torch.float64, 42, 0.5).requires_grad_()
    inputs = {"softmax": (x,), "log_softmax": (x,), "rms_norm": (x, w), "layer_norm": (x, w, b)}[op]
    assert type(call(op, *inputs).grad_fn).__name__ == NODES[op]
    assert gradcheck(lambda *a: call(op, *a), inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)


CUDA_ERRORS = {
    "weight_on_the_cpu": lambda: tile.rms_norm(rand((4, 64)), weight=rand(64, device="cpu")),
    "out_on_the_cpu": lambda: tile.softmax(rand((4, 64)), out=torch.empty(4, 64)),
    "x_on_the_cpu_out_on_cuda": lambda: tile.softmax(rand((4, 64), device="cpu"), out=rand((4, 64))),
    "out_shape": lambda: tile.layer_norm(rand((4, 64)), out=rand((4, 63))),
    "precision": lambda: tile.layer_norm(rand((4, 64), torch.float64), weight=rand(64)),
}


@pytest.mark.parametrize("case", sorted(CUDA_ERRORS))
def test_errors_equal_the_python_paths(monkeypatch, case):
    got = _outcome(CUDA_ERRORS[case])
    with python_paths(monkeypatch):
        want = _outcome(CUDA_ERRORS[case])
    assert want is not None and got == want
