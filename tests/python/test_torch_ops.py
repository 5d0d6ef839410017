"""The torch.library custom ops (torch.ops.tile.*): torch.library.opcheck for each — schema
and declared mutations, autograd registration, fake implementation against the real one,
AOT dispatch with dynamic shapes — on CPU tensors (CPU backend) and, marked gpu, on CUDA
tensors. The backward operators are the package's, else training_reference.py's."""
import pytest

torch = pytest.importorskip("torch")

import tile  # noqa: E402
from training_reference import training_ops  # noqa: E402,F401

ops = torch.ops.tile
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch sees no CUDA device")])]


def rand(*shape, device, dtype=torch.float32, grad=False, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g) * scale).to(dtype).to(device)
    return t.requires_grad_() if grad else t


def samples(device):
    """(op, args) pairs: each custom op, with and without inputs requiring grad where it has a
    formula, with optional operands present and absent."""
    r = lambda *s, **k: rand(*s, device=device, **k)  # noqa: E731
    x = r(4, 3, 40, scale=2.0)
    xg = r(4, 3, 40, grad=True, seed=1)
    w, b = r(40, seed=2), r(40, seed=3)
    wg, bg = r(40, grad=True, seed=4), r(40, grad=True, seed=5)
    rows = (4, 3)
    rstd = torch.rand(rows, device=device) + 0.5
    mean = torch.randn(rows, device=device)
    y = torch.softmax(x, -1)
    out = [
        (ops.softmax, (x,)), (ops.softmax, (xg,)), (ops.softmax, (x, torch.bfloat16, None)),
        (ops.softmax, (x, None, '{"workers_per_program":32}')),
        (ops.log_softmax, (x,)), (ops.log_softmax, (xg,)),
        (ops.softmax_out, (x, torch.empty_like(x))), (ops.log_softmax_out, (x, torch.empty_like(x))),
        (ops.softmax_out, (x.clone(), None)),           # in place: filled in below
        (ops.rms_norm, (x, None, 1e-6)), (ops.rms_norm, (xg, wg, 1e-5)), (ops.rms_norm, (x, w, None, torch.bfloat16)),
        (ops.rms_norm_out, (x, w, 1e-6, torch.empty_like(x), torch.empty(rows, device=device))),
        (ops.rms_norm_out, (x, None, 1e-6, torch.empty_like(x), None)),
        (ops.layer_norm, (x, w, b, 1e-5)), (ops.layer_norm, (xg, wg, bg, 1e-5)), (ops.layer_norm, (xg, None, bg, 1e-5)),
        (ops.layer_norm, (x, None, None, None)),
        (ops.layer_norm_out, (x, w, b, 1e-5, torch.empty_like(x), torch.empty(rows, device=device),
                              torch.empty(rows, device=device))),
        (ops.softmax_backward, (y, r(4, 3, 40, seed=6))), (ops.log_softmax_backward, (y.log(), r(4, 3, 40, seed=7))),
        (ops.softmax_backward, (y, r(4, 3, 40, seed=6), torch.bfloat16)),
        (ops.rms_norm_backward, (r(4, 3, 40, seed=8), x, w, rstd)),
        (ops.rms_norm_backward, (r(4, 3, 40, seed=8), x, None, rstd)),
        (ops.layer_norm_backward, (r(4, 3, 40, seed=9), x, w, b, mean, rstd)),
        (ops.layer_norm_backward, (r(4, 3, 40, seed=9), x, None, b, mean, rstd)),
        (ops.fused_add_rms_norm, (x, r(4, 3, 40, seed=10), w, 1e-6)),
        (ops.fused_add_rms_norm, (xg, r(4, 3, 40, grad=True, seed=11), wg, 1e-6)),
        (ops.fused_add_rms_norm_, (x.clone(), r(4, 3, 40, seed=12), w, 1e-6)),
        (ops.fused_add_rms_norm_backward, (r(4, 3, 40, seed=13), r(4, 3, 40, seed=14),
                                           x, w, rstd, torch.float32)),
    ]
    logits, logits_g = r(12, 33, scale=3.0), r(12, 33, grad=True, seed=15, scale=3.0)
    target = torch.tensor([0, 32, 5, -100, 7, 1, 2, 3, 4, 5, 6, -100], device=device)
    for reduction in ("mean", "sum", "none"):
        out.append((ops.cross_entropy, (logits, target, -100, reduction, 0.0, 0.0, None)))
        out.append((ops.cross_entropy, (logits_g, target, -100, reduction, 0.1, 1e-4, 20.0)))
        lse = torch.logsumexp(logits, -1)
        dloss = torch.randn(12 if reduction == "none" else (), device=device)
        out.append((ops.cross_entropy_backward, (dloss, logits, target, lse, -100, reduction, 0.0, 0.0, None)))
    in_place = out[8][1][0]
    out[8] = (ops.softmax_out, (in_place, in_place))
    return out


def ids(device):
    return [f"{op._name.split('::')[1]}-{i}" for i, (op, _) in enumerate(samples(device))]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_every_op(training_ops, device):
    failures = []
    for i, (op, args) in enumerate(samples(device)):
        try:
            result = torch.library.opcheck(op, args)
        except Exception as e:  # noqa: BLE001 - collected, with the op, for one report
            failures.append(f"{i} {op}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            continue
        bad = {k: v for k, v in result.items() if v != "SUCCESS"}
        if bad:
            failures.append(f"{i} {op}: {bad}")
    assert not failures, "\n".join(failures)


def test_every_operator_has_a_custom_op():
    names = {"softmax", "log_softmax", "rms_norm", "layer_norm", "softmax_out", "log_softmax_out", "rms_norm_out",
             "layer_norm_out", "softmax_backward", "log_softmax_backward", "rms_norm_backward", "layer_norm_backward",
             "fused_add_rms_norm", "fused_add_rms_norm_", "fused_add_rms_norm_backward", "cross_entropy",
             "cross_entropy_backward"}
    for name in names:
        assert isinstance(getattr(ops, name).default, torch._ops.OpOverload)


def test_declared_mutations():
    def mutated(op):
        return [a.name for a in op.default._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert mutated(ops.softmax_out) == ["out"]
    assert mutated(ops.rms_norm_out) == ["out", "rstd"]
    assert mutated(ops.layer_norm_out) == ["out", "mean", "rstd"]
    assert mutated(ops.fused_add_rms_norm_) == ["x", "residual"]
    for name in ("softmax", "rms_norm", "layer_norm", "fused_add_rms_norm", "cross_entropy", "rms_norm_backward"):
        assert mutated(getattr(ops, name)) == [], name


@pytest.mark.parametrize("device", DEVICES)
def test_custom_op_results_equal_the_direct_path(device):
    x = rand(5, 70, device=device, scale=3.0)
    w, b = rand(70, device=device, seed=1), rand(70, device=device, seed=2)
    torch.testing.assert_close(ops.softmax(x), tile.softmax(x), rtol=0, atol=0)
    y, rstd = ops.rms_norm(x, w, 1e-6)
    y2, rstd2 = tile.rms_norm(x, weight=w, return_rstd=True)
    torch.testing.assert_close((y, rstd), (y2, rstd2), rtol=0, atol=0)
    got = ops.layer_norm(x, w, b, 1e-5)
    want = tile.layer_norm(x, weight=w, bias=b, return_stats=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    out = torch.empty_like(x)
    ops.log_softmax_out(x, out)
    torch.testing.assert_close(out, tile.log_softmax(x), rtol=0, atol=0)
