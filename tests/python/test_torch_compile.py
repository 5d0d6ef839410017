"""torch.compile with Tile's operators: fullgraph=True compiles with no graph break (forward and
backward, CPU tensors, aot_eager and inductor), with dynamic shapes, out= forms and
tile.nn modules, and when tile was imported before torch; marked gpu: CUDA graphs —
mode="reduce-overhead" (inference and training steps), and manual captures after tile.precompile
with no warm-up call, of every training operator that needs a workspace (taken from torch's
allocator) among them, replayed bitwise like the eager call and checked in float64."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tile  # noqa: E402
import training_refs as ref  # noqa: E402
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
        # A training loop under cudagraph trees marks each step, so the previous step's graph
        # outputs may be overwritten (torch's documented contract for reduce-overhead training),
        # and drops the gradients (set_to_none): the previous step's, graph outputs, are dead.
        torch.compiler.cudagraph_mark_step_begin()
        model.zero_grad(set_to_none=True)
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
def test_capture_of_a_program_reducing_over_rows_on_another_stream():
    # A program of one's own with a reduction over the rows has a second kernel and needs a
    # workspace: precompiled on the current stream, captured on another, its workspace from torch.
    p = tile.RowProgram("column_sums")
    x = p.row_in("x")
    out = p.col_out("sums", "f32")
    p.store(out, p.reduce1(tile.Axis.rows, tile.monoid.sum(), p.load(x)))
    a = torch.randn(300, 500, device="cuda")
    sums = torch.empty(500, device="cuda")
    assert p.workspace_bytes(x=a, sums=sums) > 0
    built = tile.precompile(p, x=a, sums=sums)
    assert [e["op"] for e in built] == ["column_sums"], built
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.Stream()):
        p(x=a, sums=sums)
    a.copy_(torch.randn_like(a))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(sums, a.double().sum(0).float(), rtol=1e-5, atol=1e-4)


# ---- capture of the training operators that need a workspace, after tile.precompile only ----

def _cuda(shape, dtype, seed, scale=1.0, mean=0.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * scale + mean).to(dtype)


def _targets(rows, cols, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.randint(0, cols, (rows,), generator=g, device="cuda")
    t[1::7] = -100                               # ignored rows: the mean divides by the count
    return t


class _Case:
    """A training operator reducing over the rows (so it needs a workspace): its static input
    tensors, `fill(seed)` writing new values into them, `call()` the captured call, and
    `check(outputs)` against the float64 references for the values filled last."""

    def __init__(self, name, rows=96, cols=1536):
        self.name, self.rows, self.cols = name, rows, cols
        shape, r = (rows, cols), (rows,)
        bf16, f32 = torch.bfloat16, torch.float32
        if name in ("rms_norm_backward", "layer_norm_backward", "fused_add_rms_norm_backward"):
            self.dy, self.x = torch.empty(shape, dtype=bf16, device="cuda"), torch.empty(shape, dtype=bf16, device="cuda")
            self.w, self.b = torch.empty(cols, dtype=f32, device="cuda"), torch.empty(cols, dtype=f32, device="cuda")
            self.mean, self.rstd = torch.empty(r, dtype=f32, device="cuda"), torch.empty(r, dtype=f32, device="cuda")
            self.dres = torch.empty(shape, dtype=f32, device="cuda")
        else:
            self.z, self.t = torch.empty(shape, dtype=bf16, device="cuda"), torch.empty(r, dtype=torch.int64, device="cuda")
            self.lse, self.dloss = torch.empty(r, dtype=f32, device="cuda"), torch.empty((), dtype=f32, device="cuda")
            self.logits = torch.empty_like(self.z)   # the fused form's: overwritten by dlogits
        self.fill(0)

    def fill(self, seed):
        shape = (self.rows, self.cols)
        if hasattr(self, "dy"):
            self.dy.copy_(_cuda(shape, torch.bfloat16, seed + 1))
            self.x.copy_(_cuda(shape, torch.bfloat16, seed + 2, 2.0, 0.5))
            self.w.copy_(_cuda(self.cols, torch.float32, seed + 3, 0.5, 1.0))
            self.b.copy_(_cuda(self.cols, torch.float32, seed + 4, 0.5))
            self.mean.copy_(_cuda(self.rows, torch.float32, seed + 5, 0.1))
            self.rstd.copy_(_cuda(self.rows, torch.float32, seed + 6, 0.1, 1.0).abs())
            self.dres.copy_(_cuda(shape, torch.float32, seed + 7))
        else:
            self.z.copy_(_cuda(shape, torch.bfloat16, seed + 1, 3.0))
            self.t.copy_(_targets(self.rows, self.cols, seed + 2))
            self.logits.copy_(self.z)
            self.lse.copy_(torch.logsumexp(self.z.float(), -1))
            self.dloss.fill_(0.5 + seed)

    def call(self):
        n = self.name
        if n == "rms_norm_backward":
            return tile.rms_norm_backward(self.dy, self.x, self.w, self.rstd)
        if n == "layer_norm_backward":
            return tile.layer_norm_backward(self.dy, self.x, self.w, self.b, self.mean, self.rstd)
        if n == "fused_add_rms_norm_backward":
            return tile.fused_add_rms_norm_backward(self.dy, self.dres, self.x, self.w, self.rstd)
        if n in ("cross_entropy_sum", "cross_entropy_mean"):
            return tile.cross_entropy(self.z, self.t, reduction=n.split("_")[-1], label_smoothing=0.1, return_lse=True)
        if n == "cross_entropy_backward_mean":
            return (tile.cross_entropy_backward(self.dloss, self.z, self.t, self.lse, reduction="mean",
                                                label_smoothing=0.1),)
        assert n == "cross_entropy_fused_mean"
        return tile.cross_entropy_fused(self.logits, self.t, dloss=self.dloss, label_smoothing=0.1), self.logits

    def check(self, outs):
        n, rows = self.name, self.rows
        if n in ("rms_norm_backward", "fused_add_rms_norm_backward"):
            dres = self.dres if n.startswith("fused") else None
            (want, mag), (dw_want, dw_mag) = ref.rms_norm_backward(self.dy, self.x, self.w, self.rstd, dres)
            for got in outs[:-1]:
                ref.assert_close(got, want, mag, name=f"{n} dx")
            ref.assert_close(outs[-1], dw_want, dw_mag, ulps=512 + rows, name=f"{n} dweight")
        elif n == "layer_norm_backward":
            (want, mag), (dw_want, dw_mag), (db_want, db_mag) = ref.layer_norm_backward(
                self.dy, self.x, self.w, self.mean, self.rstd)
            ref.assert_close(outs[0], want, mag, name="dx")
            ref.assert_close(outs[1], dw_want, dw_mag, ulps=512 + rows, name="dweight")
            ref.assert_close(outs[2], db_want, db_mag, ulps=512 + rows, name="dbias")
        elif n.startswith("cross_entropy_backward"):
            want, mag = ref.cross_entropy_grad(self.dloss, self.z, self.t, "mean", saved_lse=self.lse,
                                               label_smoothing=0.1)
            ref.assert_close(outs[0], want, mag, name="dlogits")
        else:
            reduction = n.split("_")[-1]
            want, mag, lse_want, _ = ref.cross_entropy(self.z, self.t, reduction, label_smoothing=0.1)
            ref.assert_close(outs[0], want, mag, ulps=512 + rows, name="loss")
            if n.startswith("cross_entropy_fused"):
                g_want, g_mag = ref.cross_entropy_grad(self.dloss, self.z, self.t, reduction, label_smoothing=0.1)
                ref.assert_close(outs[1], g_want, g_mag, name="fused dlogits")
            else:
                ref.assert_close(outs[1], lse_want, np.abs(lse_want) + 1, name="lse")


TRAINING_CAPTURES = ["rms_norm_backward", "layer_norm_backward", "fused_add_rms_norm_backward", "cross_entropy_sum",
                     "cross_entropy_mean", "cross_entropy_backward_mean", "cross_entropy_fused_mean"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
@pytest.mark.parametrize("name", TRAINING_CAPTURES)
def test_capture_of_a_training_operator_after_precompile_only(name, monkeypatch):
    # Kernels built by precompile alone; the capture on a stream no call has used (the library
    # has no workspace of its own there, and allocates none during a capture), with the
    # workspace each call needs from torch: on the Python paths through tile._call's allocator;
    # where tile._torch_C takes the call (cross_entropy), through at::empty, which a successful
    # capture then proves, since the library's own would have raised.
    tile.clear_kernel_caches()
    case = _Case(name)
    built = tile.precompile(case.call)
    assert built and all(e["kernel"] for e in built), built
    asked = []
    allocate = tile._call.torch_workspace
    monkeypatch.setattr(tile._call, "torch_workspace", lambda n, d, s: (asked.append(n), allocate(n, d, s))[1])
    case.fill(10)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    taken_before = tile._ext.counters()["calls"] if tile._ext is not None else 0
    with torch.cuda.graph(graph, stream=stream):
        captured = case.call()
    by_extension = tile._ext is not None and tile._ext.counters()["calls"] > taken_before
    if not by_extension:
        assert asked and all(n > 0 for n in asked), "no workspace was taken from torch during the capture"
    for seed in (20, 30):
        case.fill(seed)
        graph.replay()
        torch.cuda.synchronize()
        replayed = [o.clone() for o in captured]
        case.check(replayed)                     # float64 references of this seed's values
        case.fill(seed)                          # the fused form overwrote its logits
        eager = case.call()
        torch.cuda.synchronize()
        for i, (a, b) in enumerate(zip(replayed, eager)):
            assert a.dtype == b.dtype and a.shape == b.shape, (i, a.dtype, b.dtype, a.shape, b.shape)
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), \
                f"{name}: output {i} of the replay differs from the eager call"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_capture_with_the_librarys_own_workspace_explains_the_way_out(monkeypatch):
    # A caller that passes no workspace (here: the torch allocation switched off) cannot have
    # the library allocate one during capture: the error says what to do, before recording.
    tile.clear_kernel_caches()
    case = _Case("rms_norm_backward")
    tile.precompile(case.call)
    monkeypatch.setattr(tile._training._program("rms_norm_backward")[1], "may_need_workspace", False)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"CUDA-graph capture: kernel tile_rms_norm_backward\w* needs a workspace "
                                         r"of \d+ bytes on the capturing stream.*CallOptions::workspace"):
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            case.call()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_reduce_overhead_training_against_float64():
    # A training step of every operator that needs a workspace, compiled with CUDA graphs:
    # gradients against float64 autograd of the same step.
    torch.manual_seed(0)
    rows, cols = 64, 512
    w = torch.randn(cols, device="cuda") * 0.5 + 1.0
    b = torch.randn(cols, device="cuda") * 0.5
    x = torch.randn(rows, cols, device="cuda")
    res = torch.randn(rows, cols, device="cuda")
    t = torch.randint(0, cols, (rows,), device="cuda")
    t[::9] = -100

    def step(x, res, w, b, t):
        h, r = tile.fused_add_rms_norm(x, res, w, 1e-6)
        h = tile.layer_norm(h, weight=w, bias=b)
        h = tile.rms_norm(h + r, weight=w)
        return tile.cross_entropy(h, t, label_smoothing=0.1)

    def reference(x, res, w, b, t):
        s = x + res
        h = s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6) * w
        h = torch.nn.functional.layer_norm(h, (cols,), w, b, 1e-5)
        h = h + s
        h = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6) * w
        return torch.nn.functional.cross_entropy(h, t, label_smoothing=0.1)

    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    leaves = [a.clone().requires_grad_() for a in (x, res, w, b)]
    for _ in range(4):                           # warm-up runs, then recorded, then replayed
        for a in leaves:
            a.grad = None
        loss = compiled(*leaves, t)
        loss.backward()
    got = [loss.detach().clone()] + [a.grad.clone() for a in leaves]
    want_leaves = [a.double().requires_grad_() for a in (x, res, w, b)]
    want = reference(*want_leaves, t)
    want.backward()
    torch.testing.assert_close(got[0].double(), want.detach(), rtol=1e-5, atol=1e-5)
    for name, g, a in zip(("x", "residual", "weight", "bias"), got[1:], want_leaves):
        torch.testing.assert_close(g.double(), a.grad, rtol=1e-4, atol=1e-5, msg=f"d{name}")
