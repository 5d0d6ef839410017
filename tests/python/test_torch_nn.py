"""tile.nn: the modules against torch.nn's (constructor semantics, state_dict both ways,
outputs, gradients of every parameter) and patch_transformers on stand-in modules written
like transformers' (LlamaRMSNorm, a Gemma-style RMSNorm it must leave alone, nn.LayerNorm, a
ForCausalLM loss_function property); marked gpu: a real transformers Llama built from a config."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tile  # noqa: E402
import tile.nn as tnn  # noqa: E402
from training_reference import training_ops  # noqa: E402,F401

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}


def rand(*shape, dtype=torch.float32, seed=0, scale=2.0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def randomize(m, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return m


# ---- constructor semantics and state_dict ----

CONSTRUCTIONS = [
    (tnn.RMSNorm, torch.nn.RMSNorm, (64,), {}),
    (tnn.RMSNorm, torch.nn.RMSNorm, ([4, 16],), {"eps": 1e-5}),
    (tnn.RMSNorm, torch.nn.RMSNorm, (64,), {"elementwise_affine": False}),
    (tnn.RMSNorm, torch.nn.RMSNorm, (64,), {"dtype": torch.bfloat16}),
    (tnn.LayerNorm, torch.nn.LayerNorm, (64,), {}),
    (tnn.LayerNorm, torch.nn.LayerNorm, (64,), {"bias": False}),
    (tnn.LayerNorm, torch.nn.LayerNorm, ((4, 16),), {"elementwise_affine": False, "eps": 1e-3}),
    (tnn.LayerNorm, torch.nn.LayerNorm, (64,), {"dtype": torch.bfloat16}),
]


@pytest.mark.parametrize("ours,theirs,args,kwargs", CONSTRUCTIONS)
def test_constructor_and_state_dict_match_torch(ours, theirs, args, kwargs):
    a, b = ours(*args, **kwargs), theirs(*args, **kwargs)
    assert isinstance(a, theirs)
    assert repr(a) == repr(b)
    assert (a.normalized_shape, a.eps, a.elementwise_affine) == (b.normalized_shape, b.eps, b.elementwise_affine)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].shape == sb[k].shape and sa[k].dtype == sb[k].dtype
        torch.testing.assert_close(sa[k], sb[k])
    randomize(b, 1)
    a.load_state_dict(b.state_dict())            # torch -> tile
    randomize(a, 2)
    b.load_state_dict(a.state_dict())            # tile -> torch
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k])


def test_eps_none_means_torch_default():
    assert tnn.RMSNorm(8).eps is None             # torch.finfo(x.dtype).eps at call time, as torch's
    assert tnn.LayerNorm(8, eps=None).eps == 1e-5
    assert tnn.FusedAddRMSNorm(8).eps is None


@pytest.mark.parametrize("ours,theirs,args,kwargs", CONSTRUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_matches_torch(ours, theirs, args, kwargs, dtype):
    a = randomize(ours(*args, **kwargs), 3)
    b = theirs(*args, **kwargs)
    b.load_state_dict(a.state_dict())
    x = rand(3, 5, 64, dtype=dtype, seed=4).reshape(3, 5, *a.normalized_shape)
    got = a(x)
    want = b.float()(x.float()).to(dtype)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, want, **TOL[dtype])


def test_inputs_tile_cannot_read_as_rows_are_copied():
    m = randomize(tnn.LayerNorm(32), 5)
    x = rand(32, 6, seed=6).t()                   # a transposed view: the last dimension has stride 6
    torch.testing.assert_close(m(x), torch.nn.functional.layer_norm(x, (32,), m.weight, m.bias), **TOL[torch.float32])
    wide = rand(6, 40, seed=7)[:, :32]            # rows of one stride: read in place
    torch.testing.assert_close(m(wide), torch.nn.functional.layer_norm(wide, (32,), m.weight, m.bias),
                               **TOL[torch.float32])


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"tile\.nn\.RMSNorm: argument 'input': expected shape \[\*, 64\]"):
        tnn.RMSNorm(64)(torch.randn(3, 63))


def test_every_parameter_gets_a_gradient(training_ops):
    x = rand(4, 2, 32, seed=8).requires_grad_()
    for m in (tnn.RMSNorm(32), tnn.LayerNorm(32), tnn.RMSNorm([2, 32]), tnn.LayerNorm([2, 32]),
              tnn.RMSNorm(32, rounding="cast_then_weight")):
        randomize(m, 9)
        ref = type(m).__mro__[1](m.normalized_shape)
        ref.load_state_dict(m.state_dict())
        m(x).square().sum().backward()
        got = {n: p.grad for n, p in m.named_parameters()}
        gx = x.grad
        x.grad = None
        ref(x).square().sum().backward()
        for n, p in ref.named_parameters():
            assert got[n] is not None, f"{m}: {n} got no gradient"
            torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(gx, x.grad, rtol=1e-4, atol=1e-4)
        x.grad = None


# ---- the Llama rounding order ----

class LlamaRMSNorm(torch.nn.Module):
    """Written as transformers' LlamaRMSNorm."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(torch.nn.Module):
    """Written as transformers' GemmaRMSNorm: (1 + weight), another arithmetic."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
def test_cast_then_weight_is_llamas_rounding_order(weight_dtype):
    llama = randomize(LlamaRMSNorm(256, eps=1e-5), 10).to(weight_dtype)
    m = tnn.RMSNorm(256, eps=1e-5, rounding="cast_then_weight", dtype=weight_dtype)
    m.load_state_dict(llama.state_dict())
    x = rand(16, 256, dtype=torch.bfloat16, seed=11)
    got, want = m(x), llama(x)
    assert got.dtype == want.dtype               # bf16 * fp32 weight promotes, as in transformers
    # x * rstd rounds to bf16 before the weight in both: equal but where Tile's rstd (float32,
    # computed another way) puts a product on the other side of a bf16 rounding boundary.
    normalised = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    ulp = (normalised.float().abs() * 2.0 ** -7).clamp(min=2.0 ** -133)
    assert ((got.float() - want.float()).abs() <= ulp * llama.weight.float().abs() + 1e-6).all()
    assert (got == want).float().mean() > 0.99
    fused = tnn.RMSNorm(256, eps=1e-5, dtype=weight_dtype)
    fused.load_state_dict(llama.state_dict())
    assert fused(x).dtype == torch.bfloat16      # torch.nn.RMSNorm's order: one rounding, x's dtype


# ---- FusedAddRMSNorm and CrossEntropyLoss (on the package's operators or the stand-ins) ----

def test_fused_add_rms_norm_module(training_ops):
    m = randomize(tnn.FusedAddRMSNorm(48, eps=1e-6), 12)
    x, r = rand(5, 48, seed=13), rand(5, 48, seed=14)
    y, s = m(x, r)
    torch.testing.assert_close(s, x + r)
    torch.testing.assert_close(y, F.rms_norm(x + r, (48,), m.weight, 1e-6), **TOL[torch.float32])
    y0, same = m(x)
    assert same is x
    torch.testing.assert_close(y0, F.rms_norm(x, (48,), m.weight, 1e-6), **TOL[torch.float32])
    m.in_place = True
    xi, ri = x.clone(), r.clone()
    with torch.no_grad():
        yi, si = m(xi, ri)
    assert yi is xi and si is ri
    torch.testing.assert_close(ri, x + r)
    torch.testing.assert_close(xi, y.detach(), **TOL[torch.float32])
    assert list(m.state_dict()) == ["weight"]


@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")
def test_cross_entropy_loss_matches_torch(training_ops):
    logits = rand(10, 17, seed=15)
    target = torch.tensor([0, 16, 3, -100, 5, 5, 1, 2, 3, 4])
    for kwargs in ({}, {"reduction": "sum"}, {"reduction": "none"}, {"label_smoothing": 0.2},
                   {"ignore_index": 5}, {"size_average": False}):
        if "ignore_index" in kwargs:
            target = torch.where(target == -100, 5, target)
        got = tnn.CrossEntropyLoss(**kwargs)(logits, target)
        want = torch.nn.CrossEntropyLoss(**kwargs)(logits, target)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # (N, C, d): classes along dimension 1, as torch's
    logits3, target3 = rand(4, 17, 6, seed=16), torch.randint(0, 17, (4, 6), generator=torch.Generator().manual_seed(1))
    for reduction in ("mean", "none"):
        torch.testing.assert_close(tnn.CrossEntropyLoss(reduction=reduction)(logits3, target3),
                                   F.cross_entropy(logits3, target3, reduction=reduction), rtol=1e-5, atol=1e-6)
    # (C,) with a 0-d target
    torch.testing.assert_close(tnn.CrossEntropyLoss(reduction="none")(logits[0], target[0]),
                               F.cross_entropy(logits[0], target[0], reduction="none"), rtol=1e-5, atol=1e-6)


def test_cross_entropy_loss_refuses_what_tile_cannot_do():
    with pytest.raises(ValueError, match=r"tile\.nn\.CrossEntropyLoss: argument 'weight': expected None"):
        tnn.CrossEntropyLoss(weight=torch.ones(5))
    with pytest.raises(TypeError, match=r"argument 'target': expected class indices"):
        tnn.CrossEntropyLoss()(torch.randn(3, 5), torch.rand(3, 5))
    assert "z_loss=0.001" in repr(tnn.CrossEntropyLoss(z_loss=1e-3))


# ---- patch_transformers on stand-in modules ----

class Layer(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(d, eps=1e-5)
        self.proj = torch.nn.Linear(d, d)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=1e-5)

    def forward(self, h):
        return h + self.post_attention_layernorm(self.proj(self.input_layernorm(h)))


class TinyForCausalLM(torch.nn.Module):
    """The parts of a transformers model the patch reads: module names, loss_type and the
    loss_function property with its setter (PreTrainedModel's)."""

    def __init__(self, d=64, vocab=50, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList(Layer(d) for _ in range(layers))
        self.norm = LlamaRMSNorm(d, eps=1e-5)
        self.gemma_like = GemmaRMSNorm(d)
        self.ln = torch.nn.LayerNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.loss_type = "ForCausalLM"
        self.vocab = vocab

    @property
    def loss_function(self):
        return getattr(self, "_loss_function", None) or self.reference_loss

    @loss_function.setter
    def loss_function(self, value):
        self._loss_function = value

    @staticmethod
    def reference_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, **kwargs):
        # transformers' ForCausalLMLoss
        labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()
        logits, labels = logits.float().view(-1, vocab_size), labels.view(-1)
        reduction = "sum" if num_items_in_batch is not None else "mean"
        loss = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction=reduction)
        return loss / num_items_in_batch if reduction == "sum" else loss

    def forward(self, ids, labels=None, **kwargs):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        logits = self.lm_head(self.ln(self.gemma_like(self.norm(h))))
        loss = None if labels is None else self.loss_function(logits, labels, self.vocab, **kwargs)
        return logits, loss


def test_patch_transformers_on_stand_ins(training_ops):
    torch.manual_seed(0)
    model = TinyForCausalLM()
    randomize(model, 17)
    reference = TinyForCausalLM()
    reference.load_state_dict(model.state_dict())
    params = {n: p for n, p in model.named_parameters()}
    report = tnn.patch_transformers(model)
    assert sorted(report["rms_norm"]) == sorted(["layers.0.input_layernorm", "layers.0.post_attention_layernorm",
                                                 "layers.1.input_layernorm", "layers.1.post_attention_layernorm",
                                                 "norm"])
    assert report["layer_norm"] == ["ln"] and report["loss"] == "ForCausalLM"
    assert list(report["skipped"]) == ["gemma_like"] and "not written like LlamaRMSNorm" in report["skipped"]["gemma_like"]
    assert isinstance(model.norm, tnn.RMSNorm) and model.norm.rounding == "cast_then_weight"
    assert isinstance(model.gemma_like, GemmaRMSNorm)
    assert model.norm.eps == 1e-5
    for n, p in model.named_parameters():        # the same Parameter objects, the same names
        assert params[n] is p
    assert list(model.state_dict()) == list(reference.state_dict())
    ids = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[0, :4] = -100
    for kwargs in ({}, {"num_items_in_batch": torch.tensor(29)}):
        logits, loss = model(ids, labels, **kwargs)
        want_logits, want_loss = reference(ids, labels, **kwargs)
        torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-5)
        loss.backward()
        want_loss.backward()
        for (n, p), q in zip(model.named_parameters(), reference.parameters()):
            assert p.grad is not None, n
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=n)
        model.zero_grad()
        reference.zero_grad()


def test_patch_transformers_options():
    model = TinyForCausalLM()
    report = tnn.patch_transformers(model, rms_norm=False, loss=False, rounding="fused")
    assert report["rms_norm"] == [] and report["layer_norm"] == ["ln"] and report["loss"] is None
    assert isinstance(model.norm, LlamaRMSNorm)
    again = tnn.patch_transformers(model)        # patching twice replaces only what is left
    assert again["layer_norm"] == [] and len(again["rms_norm"]) == 5
    with pytest.raises(ValueError, match=r"argument 'rounding': expected 'fused' or 'cast_then_weight'"):
        tnn.patch_transformers(model, rounding="llama")


# ---- a real transformers model (GPU machine) ----

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_patch_transformers_llama():
    transformers = pytest.importorskip("transformers")
    if getattr(tile, "rms_norm_backward", None) is None or getattr(tile, "cross_entropy", None) is None:
        pytest.skip("tile.rms_norm_backward / tile.cross_entropy are not in this version of the package")
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).cuda().to(torch.bfloat16)
    reference = transformers.LlamaForCausalLM(config).cuda().to(torch.bfloat16)
    reference.load_state_dict(model.state_dict())
    report = tnn.patch_transformers(model)
    assert len(report["rms_norm"]) == 2 * 2 + 1 and report["loss"] == "ForCausalLM", report
    ids = torch.randint(0, 512, (2, 64), device="cuda")
    out, want = model(input_ids=ids, labels=ids), reference(input_ids=ids, labels=ids)
    # bf16 through two layers: a product on the other side of a rounding boundary moves on, so
    # the logits are compared as a whole.
    err = (out.logits.float() - want.logits.float()).norm() / want.logits.float().norm()
    assert err < 1e-2, f"relative logits error {float(err)}"
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-2, atol=1e-3)
    out.loss.backward()
    want.loss.backward()
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.grad is not None, n
        err = (p.grad.float() - q.grad.float()).norm() / q.grad.float().norm().clamp(min=1e-12)
        assert err < 5e-2, f"{n}: relative gradient error {float(err)}"
