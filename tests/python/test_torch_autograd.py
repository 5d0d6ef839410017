"""Autograd through Tile's operators on torch CPU tensors (CPU backend): gradients equal torch's
own operators' gradients; nothing that requires grad yields a None or silently missing
gradient; the forms that cannot differentiate raise.

The backward operators are the package's where it has them, else the float64 stand-ins of
training_reference.py (test_backward_operators_of_the_package says which, as a skip)."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tile  # noqa: E402
from training_reference import NAMES, training_ops  # noqa: E402,F401

DTYPES = [torch.float32, torch.bfloat16]
# Gradient tolerance by dtype of x: (rtol, atol relative to the largest |reference|).
TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (3e-2, 1e-2)}


def close(got, want, dtype):
    rtol, atol = TOL[dtype]
    got, want = got.double(), want.double()
    bound = rtol * want.abs() + atol * want.abs().max().clamp(min=1e-30)
    excess = (got - want).abs() - bound
    assert excess.max() <= 0, f"worst excess {float(excess.max())}"


def leaf(shape, dtype, seed, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).requires_grad_()


def twin(t):
    return t.detach().clone().requires_grad_()


@pytest.fixture
def python_paths(monkeypatch):
    """The package's Python paths alone, for the tests about them: tile._torch_C, where it was
    built, is not called (test_torch_ext.py checks it against these paths)."""
    monkeypatch.setattr(tile, "_ext", None)


def test_backward_operators_of_the_package():
    missing = [n for n in NAMES if getattr(tile, n, None) is None]
    if missing:
        pytest.skip(f"not in this version of the package (the gradient tests use float64 stand-ins): "
                    f"{', '.join('tile.' + n for n in missing)}")


def test_training_operators_of_the_package_are_differentiable():
    # Each one the package defines is wrapped at import (the loop at the end of tile/__init__.py
    # must come after every definition): its torch calls then differentiate and trace.
    for name in tile._TRAINING:
        fn = getattr(tile, name, None)
        assert fn is None or hasattr(fn, "_tile_direct"), f"tile.{name} is not wrapped: its gradients would be lost"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_gradients_match_torch(training_ops, op, dtype):
    x = leaf((3, 5, 67), dtype, 0)
    dy = torch.randn(3, 5, 67, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = getattr(tile, op)(x)
    assert y.grad_fn is not None and y.dtype == dtype
    y.backward(dy)
    x2 = twin(x)
    getattr(torch, op)(x2.float(), -1).to(dtype).backward(dy)
    close(x.grad, x2.grad, dtype)


def test_softmax_gradient_with_output_dtype(training_ops):
    # y in float32 from bfloat16 x: the gradient comes back in x's dtype.
    x = leaf((4, 33), torch.bfloat16, 2)
    y = tile.softmax(x, dtype=torch.float32)
    assert y.dtype == torch.float32
    (y * y).sum().backward()
    x2 = twin(x)
    y2 = torch.softmax(x2.float(), -1)
    (y2 * y2).sum().backward()
    assert x.grad.dtype == torch.bfloat16
    close(x.grad, x2.grad, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_gradients_match_torch(training_ops, dtype, weighted):
    x = leaf((6, 4, 96), dtype, 3)
    w = leaf(96, dtype, 4, 1.0) if weighted else None
    dy = torch.randn(6, 4, 96, generator=torch.Generator().manual_seed(5)).to(dtype)
    y, rstd = tile.rms_norm(x, weight=w, eps=1e-5, return_rstd=True)
    assert not rstd.requires_grad                     # a statistic, not differentiable
    y.backward(dy)
    x2 = twin(x)
    w2 = twin(w) if weighted else None
    F.rms_norm(x2.float(), (96,), w2.float() if weighted else None, 1e-5).to(dtype).backward(dy)
    close(x.grad, x2.grad, dtype)
    if weighted:
        assert w.grad is not None and w.grad.dtype == dtype
        close(w.grad, w2.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_layer_norm_gradients_match_torch(training_ops, dtype, affine):
    x = leaf((5, 130), dtype, 6)
    w = leaf(130, dtype, 7, 1.0) if affine in ("both", "weight") else None
    b = leaf(130, dtype, 8, 1.0) if affine in ("both", "bias") else None
    dy = torch.randn(5, 130, generator=torch.Generator().manual_seed(9)).to(dtype)
    y, mean, rstd = tile.layer_norm(x, weight=w, bias=b, return_stats=True)
    assert not mean.requires_grad and not rstd.requires_grad
    y.backward(dy)
    x2, w2, b2 = twin(x), (twin(w) if w is not None else None), (twin(b) if b is not None else None)
    F.layer_norm(x2.float(), (130,), None if w2 is None else w2.float(), None if b2 is None else b2.float(),
                 1e-5).to(dtype).backward(dy)
    close(x.grad, x2.grad, dtype)
    for p, p2 in ((w, w2), (b, b2)):
        if p is not None:
            assert p.grad is not None
            close(p.grad, p2.grad, dtype)


def test_weight_alone_requires_grad(training_ops):
    # x frozen, weight trained: the custom-op path runs and only the weight gets a gradient.
    x = torch.randn(8, 40)
    w = leaf(40, torch.float32, 10)
    tile.rms_norm(x, weight=w).sum().backward()
    w2 = twin(w)
    F.rms_norm(x, (40,), w2, 1e-6).sum().backward()
    close(w.grad, w2.grad, torch.float32)
    assert x.grad is None


@pytest.mark.parametrize("weighted", [True, False])
def test_fused_add_rms_norm_gradients(training_ops, monkeypatch, weighted):
    x, r = leaf((7, 48), torch.float32, 11), leaf((7, 48), torch.float32, 12)
    w = leaf(48, torch.float32, 13, 1.0) if weighted else None
    dy, ds = torch.randn(7, 48), torch.randn(7, 48)
    x2, r2, w2 = twin(x), twin(r), (twin(w) if weighted else None)
    s2 = x2 + r2
    y2 = F.rms_norm(s2, (48,), w2, 1e-6)
    torch.autograd.backward([y2, s2], [dy, ds])
    for fused_backward in (True, False):         # the package's fused backward, or rms_norm_backward + the sum
        if not fused_backward and "fused_add_rms_norm_backward" in training_ops:
            monkeypatch.delattr(tile, "fused_add_rms_norm_backward")
        if not fused_backward and "fused_add_rms_norm_backward" not in training_ops:
            continue
        for t in (x, r, w):
            if t is not None:
                t.grad = None
        y, s = tile.fused_add_rms_norm(x, r, w, 1e-6)
        torch.autograd.backward([y, s], [dy, ds])
        close(x.grad, x2.grad, torch.float32)
        close(r.grad, r2.grad, torch.float32)
        if weighted:
            close(w.grad, w2.grad, torch.float32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_gradients_match_torch(training_ops, reduction, label_smoothing):
    logits = leaf((9, 37), torch.float32, 14)
    target = torch.tensor([0, 36, 5, -100, 7, 7, 20, -100, 1])
    loss = tile.cross_entropy(logits, target, reduction=reduction, label_smoothing=label_smoothing)
    logits2 = twin(logits)
    loss2 = F.cross_entropy(logits2, target, reduction=reduction, label_smoothing=label_smoothing)
    assert loss.dtype == torch.float32 and loss.shape == loss2.shape
    close(loss.detach(), loss2.detach(), torch.float32)
    g = torch.randn(loss.shape)
    loss.backward(g)
    loss2.backward(g)
    close(logits.grad, logits2.grad, torch.float32)


def test_cross_entropy_z_loss_and_softcap(training_ops):
    logits = leaf((6, 50), torch.float32, 15, 6.0)
    target = torch.tensor([1, 2, 3, 49, 0, 10])
    tile.cross_entropy(logits, target, z_loss=1e-3, softcap=5.0).backward()
    logits2 = twin(logits)
    capped = 5.0 * torch.tanh(logits2 / 5.0)
    lse = torch.logsumexp(capped, -1)
    (F.cross_entropy(capped, target) + 1e-3 * (lse * lse).mean()).backward()
    close(logits.grad, logits2.grad, torch.float32)


# ---- nothing silently dropped ----

CALLS = {
    "softmax": lambda x, w, b: tile.softmax(x),
    "log_softmax": lambda x, w, b: tile.log_softmax(x),
    "rms_norm": lambda x, w, b: tile.rms_norm(x, weight=w),
    "layer_norm": lambda x, w, b: tile.layer_norm(x, weight=w, bias=b),
    "rms_norm_return_rstd": lambda x, w, b: tile.rms_norm(x, weight=w, return_rstd=True)[0],
    "layer_norm_return_stats": lambda x, w, b: tile.layer_norm(x, weight=w, bias=b, return_stats=True)[0],
    "fused_add_rms_norm": lambda x, w, b: sum(tile.fused_add_rms_norm(x, x * 0.5, w)),
    "cross_entropy": lambda x, w, b: tile.cross_entropy(x * w, torch.arange(x.shape[0]) % x.shape[1]),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_input_requiring_grad_gets_a_gradient(training_ops, call):
    x, w, b = leaf((4, 24), torch.float32, 16), leaf(24, torch.float32, 17), leaf(24, torch.float32, 18)
    out = CALLS[call](x, w, b)
    assert out.requires_grad and out.grad_fn is not None
    out.sum().backward()
    used = {"softmax": (x,), "log_softmax": (x,), "layer_norm": (x, w, b), "layer_norm_return_stats": (x, w, b)}
    for t in used.get(call, (x, w)):
        assert t.grad is not None, f"{call}: an input that requires grad got no gradient"
        assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "rms_norm", "layer_norm"])
def test_missing_backward_raises_naming_it(op, monkeypatch, python_paths):
    name = f"{op}_backward"
    monkeypatch.setattr(tile, name, None, raising=False)
    x = leaf((3, 16), torch.float32, 19)
    y = getattr(tile, op)(x)
    assert y.requires_grad
    with pytest.raises(NotImplementedError, match=rf"tile\.{name} is not available .* the gradient of tile\.{op}"):
        y.sum().backward()


def test_missing_training_forward_raises(monkeypatch):
    monkeypatch.setattr(tile, "cross_entropy", None, raising=False)
    with pytest.raises(NotImplementedError, match=r"tile\.cross_entropy is not available"):
        tile.nn.CrossEntropyLoss()(torch.randn(3, 5, requires_grad=True), torch.tensor([0, 1, 2]))


def test_out_and_in_place_forms_refuse_grad(training_ops):
    x = leaf((3, 16), torch.float32, 20)
    w = leaf(16, torch.float32, 21)
    with pytest.raises(RuntimeError, match=r"softmax: argument 'x': a call with out= is not differentiable"):
        tile.softmax(x, out=torch.empty(3, 16))
    with pytest.raises(RuntimeError, match=r"rms_norm: argument 'weight': a call with out= is not differentiable"):
        tile.rms_norm(x.detach(), weight=w, out=torch.empty(3, 16))
    with pytest.raises(RuntimeError, match=r"layer_norm: argument 'weight': a call with out= is not differentiable"):
        tile.layer_norm(x.detach(), weight=w, out=torch.empty(3, 16))
    with pytest.raises(RuntimeError, match=r"layer_norm: argument 'bias': a call with out= is not differentiable"):
        tile.layer_norm(x.detach(), bias=w, out=torch.empty(3, 16))
    with pytest.raises(RuntimeError, match=r"fused_add_rms_norm: argument 'x': the in-place form"):
        tile.fused_add_rms_norm(x, torch.randn(3, 16), in_place=True)
    with torch.no_grad():                          # allowed without grad mode
        y = tile.softmax(x, out=torch.empty(3, 16))
    assert not y.requires_grad


def test_run_and_row_programs_refuse_grad():
    x = leaf((3, 16), torch.float32, 22)
    with pytest.raises(RuntimeError, match=r"argument 'x': tile\.run \(a launch record\) is not differentiable"):
        tile.run("softmax", x)
    with pytest.raises(RuntimeError, match=r"softmax: argument 'x': row programs are not differentiable"):
        tile.builtin("softmax")(x=x)
    with torch.no_grad():
        tile.builtin("softmax")(x=x)
    tile.builtin("softmax")(x=x.detach())


def test_which_path_a_call_takes(monkeypatch, python_paths):
    # No custom op is dispatched on the direct and eager autograd paths (the op would raise here;
    # nn.Parameter is eager too); a tensor subclass as x still takes it.
    def boom(*args, **kwargs):
        raise AssertionError("the custom op was called")
    monkeypatch.setattr(tile._torch_api, "_softmax", boom)
    x = torch.randn(3, 16, requires_grad=True)
    with torch.no_grad():
        assert not tile.softmax(x).requires_grad
    assert not tile.softmax(x.detach()).requires_grad
    y = tile.softmax(x)
    assert type(y.grad_fn).__name__.startswith("Eager_softmax")
    assert type(tile.softmax(torch.nn.Parameter(x.detach())).grad_fn).__name__.startswith("Eager_softmax")

    class Subclass(torch.Tensor):
        pass
    with pytest.raises(AssertionError, match="the custom op was called"):
        tile.softmax(x.detach().as_subclass(Subclass).requires_grad_())


# ---- the eager autograd path against the custom op's registered autograd ----

def _custom_op_path(monkeypatch):
    # Both tests of the eager path: the common call's (_plain_grad) and the general one's.
    monkeypatch.setattr(tile, "_ext", None)
    monkeypatch.setattr(tile._torch_api, "_plain_grad", lambda x: False)
    monkeypatch.setattr(tile._torch_api, "eager_grad", lambda *arrays: False)


def _both_paths(monkeypatch, call, inputs, grads_of):
    """Runs call(*twins of inputs) on the eager autograd path, then on the custom-op path, each
    followed by a backward with the same output gradients; returns (outputs, gradients) of each."""
    monkeypatch.setattr(tile, "_ext", None)       # the eager path of _torch_ops, not tile._torch_C
    results = []
    for path in ("eager", "custom op"):
        if path == "custom op":
            _custom_op_path(monkeypatch)
        leaves = [None if t is None else (twin(t) if t.requires_grad else t) for t in inputs]
        outs = call(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        name = type(outs[0].grad_fn).__name__
        assert name.startswith("Eager_") if path == "eager" else name.startswith("GeneratedBackwardFor_tile_"), name
        diff = [o for o in outs if o.requires_grad]
        torch.autograd.backward(diff, [grads_of(o, i) for i, o in enumerate(diff)])
        results.append(([o.detach() for o in outs], [None if t is None else t.grad for t in leaves]))
    return results


def _bitwise(eager, custom):
    (outs_e, grads_e), (outs_c, grads_c) = eager, custom
    for a, b in zip(outs_e + grads_e, outs_c + grads_c):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), "the two paths differ"


def _dy(o, i):
    return torch.randn(o.shape, generator=torch.Generator().manual_seed(40 + i)).to(o.dtype)


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_eager_softmax_matches_the_custom_op_bitwise(training_ops, monkeypatch, op, dtype, out_dtype):
    x = leaf((3, 5, 67), dtype, 30)
    _bitwise(*_both_paths(monkeypatch, lambda x: getattr(tile, op)(x, dtype=out_dtype), [x], _dy))


@pytest.mark.parametrize("weighted,grads", [(True, "x"), (True, "weight"), (True, "both"), (False, "x")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_eager_rms_norm_matches_the_custom_op_bitwise(training_ops, monkeypatch, dtype, weighted, grads):
    x = leaf((6, 4, 96), dtype, 31).requires_grad_(grads != "weight")
    w = leaf(96, dtype, 32, 1.0).requires_grad_(grads != "x") if weighted else None
    _bitwise(*_both_paths(monkeypatch, lambda x, w: tile.rms_norm(x, weight=w, eps=1e-5, return_rstd=True), [x, w],
                          _dy))


@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_eager_layer_norm_matches_the_custom_op_bitwise(training_ops, monkeypatch, dtype, affine):
    x = leaf((5, 130), dtype, 33)
    w = leaf(130, dtype, 34, 1.0) if affine in ("both", "weight") else None
    b = leaf(130, dtype, 35, 1.0) if affine in ("both", "bias") else None
    _bitwise(*_both_paths(monkeypatch, lambda x, w, b: tile.layer_norm(x, weight=w, bias=b, return_stats=True),
                          [x, w, b], _dy))


def test_eager_layer_norm_parameters_alone(training_ops, monkeypatch):
    # x frozen, nn.Parameter weight and bias (tile.nn's modules): the eager path, same gradients.
    x = torch.randn(4, 40)
    w, b = torch.nn.Parameter(torch.randn(40)), torch.nn.Parameter(torch.randn(40))
    _bitwise(*_both_paths(monkeypatch, lambda x, w, b: tile.layer_norm(x, weight=w, bias=b), [x, w, b], _dy))


@pytest.mark.parametrize("weighted", [True, False])
def test_eager_fused_add_rms_norm_matches_the_custom_op_bitwise(training_ops, monkeypatch, weighted):
    x, r = leaf((7, 48), torch.float32, 36), leaf((7, 48), torch.float32, 37)
    w = leaf(48, torch.float32, 38, 1.0) if weighted else None
    _bitwise(*_both_paths(monkeypatch, lambda x, r, w: tile.fused_add_rms_norm(x, r, w, 1e-6), [x, r, w], _dy))


@pytest.mark.parametrize("options", [dict(reduction="mean"), dict(reduction="sum", label_smoothing=0.1),
                                     dict(reduction="none"), dict(z_loss=1e-3, softcap=5.0)])
def test_eager_cross_entropy_matches_the_custom_op_bitwise(training_ops, monkeypatch, options):
    logits = leaf((9, 37), torch.float32, 39, 4.0)
    target = torch.tensor([0, 36, 5, -100, 7, 7, 20, -100, 1])
    _bitwise(*_both_paths(monkeypatch, lambda lg, t: tile.cross_entropy(lg, t, **options), [logits, target], _dy))


@pytest.mark.parametrize("path", ["eager", "custom op"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "rms_norm", "layer_norm"])
def test_double_backward_raises(training_ops, monkeypatch, python_paths, op, path):
    if path == "custom op":
        _custom_op_path(monkeypatch)
    x = leaf((3, 16), torch.float32, 23)
    y = getattr(tile, op)(x)
    (g,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=rf"tile\.{op}_backward.*no autograd formula"):
        g.sum().backward()


@pytest.mark.parametrize("path", ["eager", "custom op"])
def test_missing_backward_raises_on_both_paths(monkeypatch, python_paths, path):
    if path == "custom op":
        _custom_op_path(monkeypatch)
    monkeypatch.setattr(tile, "rms_norm_backward", None, raising=False)
    y = tile.rms_norm(leaf((3, 16), torch.float32, 41), weight=leaf(16, torch.float32, 42))
    with pytest.raises(NotImplementedError, match=r"tile\.rms_norm_backward is not available"):
        y.sum().backward()


# ---- the package's own backward operators on the GPU ----

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "rms_norm", "layer_norm"])
def test_gradients_on_the_gpu_match_torch(op, dtype):
    if getattr(tile, f"{op}_backward", None) is None:
        pytest.skip(f"tile.{op}_backward is not in this version of the package")
    x = leaf((64, 3000), dtype, 24).cuda().detach().requires_grad_()
    w = leaf(3000, dtype, 25, 1.0).cuda().detach().requires_grad_()
    b = leaf(3000, dtype, 26, 1.0).cuda().detach().requires_grad_()
    dy = torch.randn(64, 3000, device="cuda").to(dtype)
    calls = {"softmax": (lambda x: tile.softmax(x), lambda x: torch.softmax(x.float(), -1)),
             "log_softmax": (lambda x: tile.log_softmax(x), lambda x: torch.log_softmax(x.float(), -1)),
             "rms_norm": (lambda x: tile.rms_norm(x, weight=w), lambda x: F.rms_norm(x.float(), (3000,), w2.float(),
                                                                                      1e-6)),
             "layer_norm": (lambda x: tile.layer_norm(x, weight=w, bias=b),
                            lambda x: F.layer_norm(x.float(), (3000,), w2.float(), b2.float(), 1e-5))}
    w2, b2 = twin(w), twin(b)
    ours, theirs = calls[op]
    ours(x).backward(dy)
    x2 = twin(x)
    theirs(x2).to(dtype).backward(dy)
    close(x.grad, x2.grad, dtype)
    if op in ("rms_norm", "layer_norm"):
        close(w.grad, w2.grad, dtype)
    if op == "layer_norm":
        close(b.grad, b2.grad, dtype)
