"""Drop-in torch.nn modules on Tile's operators, and a patch for Hugging Face transformers models.

:class:`RMSNorm`, :class:`LayerNorm` and :class:`CrossEntropyLoss` subclass torch.nn's classes:
the same constructor arguments and defaults, the same parameters, state_dict keys and repr,
so weights load across both ways and ``isinstance(m, torch.nn.RMSNorm)`` holds; only forward
runs Tile. :class:`FusedAddRMSNorm` is an RMSNorm whose forward also adds a residual first
(vLLM's fused_add_rms_norm). :func:`patch_transformers` swaps these into a transformers model.

Inputs whose layout Tile cannot read as rows (a last dimension of stride other than 1, leading
dimensions that do not flatten to one row stride) are copied to a contiguous tensor first, as
torch's own modules accept any layout; the functions of ``tile`` never copy.
"""
import re

import torch
import torch.nn.functional as F

if isinstance(torch.Tensor, type):              # not in a docs build, where torch is a stand-in
    from . import _torch_ops

__all__ = ["RMSNorm", "LayerNorm", "FusedAddRMSNorm", "CrossEntropyLoss", "patch_transformers",
           "causal_lm_loss", "masked_lm_loss"]

ROUNDINGS = ("fused", "cast_then_weight")


def _tile():
    import tile
    return tile


def _check_rounding(cls, rounding):
    if rounding not in ROUNDINGS:
        raise ValueError(f"tile.nn.{cls}: argument 'rounding': expected 'fused' or 'cast_then_weight', got {rounding!r}")
    return rounding


def _readable(x):
    """True when Tile reads x as rows without a copy."""
    if x.is_contiguous():
        return True
    if x.dim() == 0 or (x.shape[-1] > 1 and x.stride(-1) != 1):
        return False
    stride = None
    for size, s in zip(reversed(x.shape[:-1]), reversed(x.stride()[:-1])):
        if size == 1:
            continue
        if stride is not None and s != stride:
            return False
        stride = s * size
    return True


def _rows(cls, x, normalized_shape):
    """x as (..., prod(normalized_shape)) rows Tile reads, after torch's shape check."""
    k = len(normalized_shape)
    if x.dim() < k or tuple(x.shape[x.dim() - k:]) != tuple(normalized_shape):
        raise ValueError(f"tile.nn.{cls}: argument 'input': expected shape [*, {', '.join(map(str, normalized_shape))}]"
                         f" (normalized_shape={list(normalized_shape)}), got shape {list(x.shape)}")
    if k > 1:
        x = x.flatten(x.dim() - k)
    return x if _readable(x) else x.contiguous()


def _flat(p):
    return p if p is None or p.dim() == 1 else p.reshape(-1)


def _eps(eps, x):
    # torch.nn.RMSNorm's eps=None: the machine epsilon of the input's dtype.
    return torch.finfo(x.dtype).eps if eps is None else eps


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm on Tile: ``x * rsqrt(mean(x^2) + eps) * weight`` over the last
    ``len(normalized_shape)`` dimensions.

    Arguments as torch.nn.RMSNorm (eps=None is ``torch.finfo(x.dtype).eps``), plus:

    rounding
        ``"fused"`` (the default, torch.nn.RMSNorm's): normalise and multiply by the weight in
        float32, then round once to x's dtype. ``"cast_then_weight"`` (Hugging Face's
        LlamaRMSNorm): normalise in float32, round to x's dtype, then multiply by the weight
        with torch's type promotion — a second pass over the output, for results that match
        those models bit for bit in the rounding order.
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None, *,
                 rounding="fused"):
        super().__init__(normalized_shape, eps, elementwise_affine, device=device, dtype=dtype)
        self.rounding = _check_rounding(type(self).__name__, rounding)

    def forward(self, x):
        shape = x.shape
        rows = _rows(type(self).__name__, x, self.normalized_shape)
        eps = _eps(self.eps, x)
        if self.rounding == "cast_then_weight" and self.weight is not None:
            y = _tile().rms_norm(rows, eps=eps).reshape(shape)
            return self.weight * y
        return _tile().rms_norm(rows, weight=_flat(self.weight), eps=eps).reshape(shape)

    def extra_repr(self):
        extra = super().extra_repr()
        return extra if self.rounding == "fused" else f"{extra}, rounding={self.rounding!r}"


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm on Tile: ``(x - mean) * rsqrt(var + eps) * weight + bias`` over the
    last ``len(normalized_shape)`` dimensions. Arguments as torch.nn.LayerNorm (eps=None is
    its default, 1e-5)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__(normalized_shape, 1e-5 if eps is None else eps, elementwise_affine, bias, device=device,
                         dtype=dtype)

    def forward(self, x):
        shape = x.shape
        rows = _rows(type(self).__name__, x, self.normalized_shape)
        return _tile().layer_norm(rows, weight=_flat(self.weight), bias=_flat(self.bias), eps=self.eps).reshape(shape)


class FusedAddRMSNorm(RMSNorm):
    """An RMSNorm that adds a residual first, in one pass: ``forward(x, residual)`` returns
    ``(y, residual_out)`` with ``residual_out = x + residual`` and ``y = rms_norm(residual_out)
    * weight`` (tile.fused_add_rms_norm). Without a residual it returns ``(rms_norm(x), x)``.

    Constructor as :class:`RMSNorm`, plus in_place (default False): overwrite residual with
    the sum and x with y and return them (vLLM's contract; refuses inputs that require grad).
    The weight and state_dict are RMSNorm's. normalized_shape must be one dimension.
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None, *,
                 rounding="fused", in_place=False):
        super().__init__(normalized_shape, eps, elementwise_affine, device=device, dtype=dtype, rounding=rounding)
        if len(self.normalized_shape) != 1:
            raise ValueError(f"tile.nn.FusedAddRMSNorm: argument 'normalized_shape': expected one dimension, got "
                             f"{list(self.normalized_shape)}")
        self.in_place = bool(in_place)

    def forward(self, x, residual=None):
        if residual is None:
            return super().forward(x), x
        cls = type(self).__name__
        x, residual = _rows(cls, x, self.normalized_shape), _rows(cls, residual, self.normalized_shape)
        eps = _eps(self.eps, x)
        if self.rounding == "cast_then_weight" and self.weight is not None:
            if self.in_place:
                raise ValueError("tile.nn.FusedAddRMSNorm: in_place=True needs rounding='fused' (the weight is "
                                 "applied in a second pass)")
            y, residual_out = _torch_ops.call("fused_add_rms_norm", x, residual, None, eps)
            return self.weight * y, residual_out
        return _torch_ops.call("fused_add_rms_norm", x, residual, self.weight, eps, in_place=self.in_place)

    def extra_repr(self):
        return super().extra_repr() + (", in_place=True" if self.in_place else "")


class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss on Tile (tile.cross_entropy), for class-index targets.

    Arguments as torch.nn.CrossEntropyLoss — ignore_index, reduction (and the legacy
    size_average / reduce), label_smoothing — except weight, which must be None (Tile has no
    per-class weights), plus Tile's z_loss (default 0) and softcap (default None). Inputs
    (C,), (N, C) or (N, C, d1, ...) as torch's: classes along dimension 1; the last layout is
    copied with the classes last. The loss is float32.
    """

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0, *, z_loss=0.0, softcap=None):
        if weight is not None:
            raise ValueError("tile.nn.CrossEntropyLoss: argument 'weight': expected None (Tile's cross_entropy has no "
                             "per-class weights), got a tensor")
        super().__init__(None, size_average, ignore_index, reduce, reduction, label_smoothing)
        self.z_loss, self.softcap = float(z_loss), softcap

    def forward(self, input, target):
        if target.is_floating_point():
            raise TypeError("tile.nn.CrossEntropyLoss: argument 'target': expected class indices (int32 or int64; "
                            f"Tile has no class-probability targets), got dtype {target.dtype}")
        unbatched = input.dim() == 1
        logits = input.unsqueeze(0) if unbatched else input
        target = target.unsqueeze(0) if unbatched else target
        if logits.dim() > 2:
            logits = logits.movedim(1, -1)
        if not _readable(logits):
            logits = logits.contiguous()
        loss = _torch_ops.call("cross_entropy", logits, target, ignore_index=self.ignore_index, reduction=self.reduction,
                           label_smoothing=self.label_smoothing, z_loss=self.z_loss, softcap=self.softcap)
        return loss.squeeze(0) if unbatched and self.reduction == "none" else loss

    def extra_repr(self):
        parts = []
        if self.z_loss:
            parts.append(f"z_loss={self.z_loss}")
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap}")
        return ", ".join(parts)


# ---- Hugging Face transformers ----

def _loss_sum_divided(logits, target, num_items_in_batch, ignore_index):
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = _torch_ops.call("cross_entropy", logits, target, ignore_index=ignore_index, reduction=reduction)
    if reduction == "sum":
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                   **kwargs):
    """transformers' ForCausalLMLoss on tile.cross_entropy: labels shifted left by one (or
    shift_labels as given), the mean over the tokens not ignored, or the sum divided by
    num_items_in_batch. The logits are read in their own dtype (transformers first copies them
    to float32; Tile accumulates in float32 either way)."""
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    logits = logits.reshape(-1, vocab_size)
    target = shift_labels.reshape(-1).to(logits.device)
    return _loss_sum_divided(logits, target, num_items_in_batch, ignore_index)


def masked_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, **kwargs):
    """transformers' ForMaskedLMLoss on tile.cross_entropy (no shift)."""
    logits = logits.reshape(-1, vocab_size)
    target = labels.reshape(-1).to(logits.device)
    return _loss_sum_divided(logits, target, num_items_in_batch, ignore_index)


_LOSSES = {"ForCausalLM": causal_lm_loss, "ForMaskedLM": masked_lm_loss}


def _llama_rms_norm(m):
    """A transformers RMSNorm written like LlamaRMSNorm (the convention of the models copied from
    it: a `variance_epsilon`, a weight of one dimension, weight * (normalised x in x's dtype))."""
    w = getattr(m, "weight", None)
    return (type(m).__name__.endswith("RMSNorm") and isinstance(w, torch.nn.Parameter) and w.dim() == 1
            and isinstance(getattr(m, "variance_epsilon", None), (int, float)))


def _replacement(m, rounding):
    """The tile.nn module for m, sharing m's parameters, or (None, why it is left as is)."""
    if type(m) in (RMSNorm, LayerNorm, FusedAddRMSNorm):
        return None, None
    if type(m) is torch.nn.LayerNorm:
        new = LayerNorm(m.normalized_shape, m.eps, m.elementwise_affine, m.bias is not None, device="meta")
        new.weight, new.bias = m.weight, m.bias
    elif type(m) is torch.nn.RMSNorm:
        new = RMSNorm(m.normalized_shape, m.eps, m.elementwise_affine, device="meta")
        new.weight = m.weight
    elif _llama_rms_norm(m):
        new = RMSNorm(m.weight.shape[0], float(m.variance_epsilon), device="meta", rounding=rounding)
        new.weight = m.weight
    elif type(m).__name__.endswith(("RMSNorm", "LayerNorm")):
        return None, (f"{type(m).__name__}: not written like LlamaRMSNorm (no variance_epsilon, or a weight of "
                      "another shape) nor a torch.nn.LayerNorm / RMSNorm; its arithmetic is not known")
    else:
        return None, None
    new.train(m.training)
    return new, None


def patch_transformers(model, *, rms_norm=True, layer_norm=True, loss=True, rounding="cast_then_weight"):
    """Swaps a Hugging Face transformers model's norms and loss for Tile's, in place.

    - rms_norm: every module written like LlamaRMSNorm (a class name ending in RMSNorm with a
      ``variance_epsilon`` and a one-dimensional weight — Llama, Mistral, Qwen2/3, Phi-3 and
      the other models copied from it) becomes a :class:`RMSNorm` with that eps and
      ``rounding`` (default ``"cast_then_weight"``, LlamaRMSNorm's order: normalise in
      float32, round to the input's dtype, then multiply by the weight); torch.nn.RMSNorm
      modules become :class:`RMSNorm` with torch's rounding.
    - layer_norm: every torch.nn.LayerNorm becomes a :class:`LayerNorm`.
    - loss: a model whose ``loss_type`` (or class name) is ForCausalLM or ForMaskedLM gets
      ``model.loss_function`` = :func:`causal_lm_loss` or :func:`masked_lm_loss`.

    The new modules share the old ones' Parameter objects (optimizer state and state_dict keys
    are unchanged) and their training mode; hooks registered on an old module are not carried
    over. Modules of other arithmetic (Gemma's ``1 + weight``, T5's cast to the weight's dtype,
    ...) are left as they are and listed. Duck-typed: transformers itself is not imported.

    Returns a dict: rms_norm and layer_norm (the names of the modules replaced), loss (the loss
    type patched, or None) and skipped (name -> why).
    """
    _check_rounding("patch_transformers", rounding)
    report = {"rms_norm": [], "layer_norm": [], "loss": None, "skipped": {}}
    done = {}

    def visit(parent, prefix):
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            full = f"{prefix}.{name}" if prefix else name
            if id(child) in done:
                new = done[id(child)]
            else:
                new, why = _replacement(child, rounding)
                if why:
                    report["skipped"][full] = why
                kind = "layer_norm" if isinstance(new, LayerNorm) else "rms_norm"
                if new is not None and not (rms_norm if kind == "rms_norm" else layer_norm):
                    new = None
                done[id(child)] = new
            if new is not None:
                setattr(parent, name, new)
                report["layer_norm" if isinstance(new, LayerNorm) else "rms_norm"].append(full)
            else:
                visit(child, full)

    visit(model, "")
    if loss:
        kind = getattr(model, "loss_type", None)
        if kind not in _LOSSES:
            found = re.search("|".join(_LOSSES), type(model).__name__)
            kind = found.group(0) if found else None
        if kind is not None and hasattr(model, "loss_function"):
            try:
                model.loss_function = _LOSSES[kind]
                report["loss"] = kind
            except AttributeError as e:          # a read-only property
                report["skipped"]["loss_function"] = f"cannot be set on {type(model).__name__} ({e})"
        elif hasattr(model, "loss_function"):
            report["skipped"]["loss_function"] = (f"loss type {getattr(model, 'loss_type', None)!r} of "
                                                  f"{type(model).__name__}: only ForCausalLM and ForMaskedLM are "
                                                  f"patched")
    return report

