"""torch.compile with Tile's operators: fullgraph=True compiles with no graph break (forward and
backward, CPU tensors, aot_eager and inductor), with dynamic shapes, out= forms and
tile.nn modules, and when tile was imported before torch; marked gpu: CUDA graphs —
mode="reduce-overhead", and a manual capture after tile.precompile with no warm-up call."""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import tile  # noqa: E402
from training_reference import training_ops  # noqa: E402,F401


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def block(x, residual, w, b, target):
    """A small transformer-like block over every operator."""
    h, residual = tile.fused_add_rms_norm(x, residual, w, 1e-6)
    h = tile.layer_norm(h, weight=w, bias=b)
    p = tile.softmax(h * 0.5) + tile.log_softmax(h, dtype=torch.float32).exp()
    h = tile.rms_norm(p, weight=w, eps=1e-5)
    return tile.cross_entropy(h.reshape(-1, h.shape[-1]), target, label_smoothing=0.05) + residual.mean()


def inputs(device="cpu", grad=True, rows=6, cols=48):
    g = torch.Generator().manual_seed(0)
    mk = lambda *s: torch.randn(s, generator=g).to(device).requires_grad_(grad)  # noqa: E731
    target = (torch.arange(rows * 2) * 7 % cols).to(device)
    return mk(2, rows, cols), mk(2, rows, cols), mk(cols), mk(cols), target


def grads(fn, args):
    args = [a.detach().clone().requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in args]
    loss = fn(*args)
    loss.backward()
    return loss.detach(), [a.grad for a in args if a.is_floating_point()]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fullgraph_forward_and_backward(training_ops, backend):
    args = inputs()
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    loss, g = grads(compiled, args)
    loss_eager, g_eager = grads(block, args)
    torch.testing.assert_close(loss, loss_eager, rtol=1e-5, atol=1e-6)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_fullgraph_inference_with_dynamic_shapes():
    def f(x, w):
        return tile.rms_norm(tile.softmax(x), weight=w) * 2
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    w = torch.randn(64)
    for rows in (3, 7, 1):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(compiled(x, w), f(x, w), rtol=0, atol=0)


def test_fullgraph_out_forms_and_plans():
    def f(x, w, y, rstd):
        tile.softmax(x, out=y)
        tile.rms_norm(y, weight=w, out=y, return_rstd=False)
        z = tile.layer_norm(x, plan={"workers_per_program": 32}, return_stats=True)[0]
        return y + z
    x, w = torch.randn(5, 40), torch.randn(40)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    y1, y2 = torch.empty(5, 40), torch.empty(5, 40)
    torch.testing.assert_close(compiled(x, w, y1, None), f(x, w, y2, None), rtol=0, atol=0)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)


def test_fullgraph_modules(training_ops):
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), tile.nn.RMSNorm(32), torch.nn.Linear(32, 32),
                                tile.nn.LayerNorm(32), torch.nn.Linear(32, 10))
    loss_fn = tile.nn.CrossEntropyLoss(label_smoothing=0.1)
    x, t = torch.randn(8, 32), torch.arange(8)

    def step(x, t):
        return loss_fn(model(x), t)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(x, t)
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    step(x, t).backward()
    for a, p in zip(got, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


def test_fullgraph_when_tile_is_imported_before_torch(tmp_path):
    # `import tile, torch` (as isort orders it): the custom ops exist before the first call,
    # which is traced. A fresh interpreter, since torch is loaded here already.
    script = tmp_path / "first_call_traced.py"
    script.write_text(textwrap.dedent("""
        import tile
        import torch
        assert tile._torch_api is not None, "the custom ops were not set up when torch was imported"
        f = torch.compile(lambda x: tile.softmax(x) * 2, fullgraph=True, backend="aot_eager")
        x = torch.randn(3, 20, requires_grad=True)
        y = f(x)
        assert y.requires_grad
        torch.testing.assert_close(y, torch.softmax(x, -1) * 2)
        print("ok")
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
    assert "RuntimeWarning" not in run.stderr, run.stderr


# ---- CUDA graphs (GPU) ----

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reduce_overhead_inference(dtype):
    tile.clear_kernel_caches()                   # the first calls compile: under warm-up, never capture

    def f(x, w, b):
        return tile.layer_norm(tile.rms_norm(x, weight=w), weight=w, bias=b) + tile.softmax(x)
    x = torch.randn(64, 1024, device="cuda", dtype=dtype)
    w, b = torch.randn(1024, device="cuda", dtype=dtype), torch.randn(1024, device="cuda", dtype=dtype)
    compiled = torch.compile(f, fullgraph=True, mode="reduce-overhead")
    for _ in range(4):                           # warm-up runs, then recorded, then replayed
        got = compiled(x, w, b).clone()
    torch.testing.assert_close(got, f(x, w, b))
    x.copy_(torch.randn_like(x))
    torch.testing.assert_close(compiled(x, w, b).clone(), f(x, w, b))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_reduce_overhead_training():
    if getattr(tile, "rms_norm_backward", None) is None or getattr(tile, "softmax_backward", None) is None:
        pytest.skip("tile.rms_norm_backward / tile.softmax_backward are not in this version of the package")
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), tile.nn.RMSNorm(256), torch.nn.Linear(256, 256)).cuda()

    def step(x):
        return tile.softmax(model(x)).square().sum()
    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    x = torch.randn(32, 256, device="cuda")
    for _ in range(4):
        model.zero_grad(set_to_none=False)
        compiled(x).backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    step(x).backward()
    for a, p in zip(got, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_manual_capture_after_precompile_needs_no_warm_up():
    tile.clear_kernel_caches()
    x = torch.randn(48, 3000, device="cuda")
    w = torch.randn(3000, device="cuda")
    y = torch.empty_like(x)
    built = tile.precompile(tile.rms_norm, x, weight=w, out=y)
    assert [e["op"] for e in built] == ["rms_norm"] and built[0]["kernel"]
    assert tile.precompile(tile.rms_norm, x, weight=w, out=y) == []    # loaded already: nothing to build
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):                    # no call before this one on the capture stream
        tile.rms_norm(x, weight=w, out=y)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, tile.rms_norm(x, weight=w), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_capture_without_precompile_raises_clearly():
    tile.clear_kernel_caches()
    x = torch.randn(8, 1111, device="cuda")
    y = torch.empty_like(x)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"CUDA-graph capture: kernel .* is not loaded on cuda:\d+ yet .*"
                                           r"tile\.precompile"):
        with torch.cuda.graph(g):
            tile.softmax(x, out=y)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_precompile_refused_during_capture():
    x = torch.randn(8, 64, device="cuda")
    tile.softmax(x)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"precompile: a CUDA-graph capture is underway"):
        with torch.cuda.graph(g):
            tile.precompile(tile.softmax, x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_capture_of_a_reduction_over_rows_uses_the_workspace_built_before():
    # A program reducing over the rows has a second phase and a workspace per stream: built
    # by precompile on the capture stream, and kept (never freed) when a larger call outgrows it.
    p = tile.RowProgram("column_sums")
    x = p.row_in("x")
    out = p.col_out("sums", "f32")
    p.store(out, p.reduce1(tile.Axis.rows, tile.monoid.sum(), p.load(x)))
    s = torch.cuda.Stream()
    a = torch.randn(300, 500, device="cuda")
    sums = torch.empty(500, device="cuda")
    with torch.cuda.stream(s):
        tile.precompile(p, x=a, sums=sums)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        p(x=a, sums=sums)
    with torch.cuda.stream(s):                   # outgrows the captured workspace on that stream
        p(x=torch.randn(3000, 500, device="cuda"), sums=torch.empty(500, device="cuda"))
    a.copy_(torch.randn_like(a))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(sums, a.double().sum(0).float(), rtol=1e-5, atol=1e-4)
