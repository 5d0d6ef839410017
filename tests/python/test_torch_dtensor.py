"""Tile's torch operators and modules under torch.distributed, on the CPU with a gloo process
group of one rank: DTensor arguments raise a TypeError naming the operator and the argument
(the ops have no sharding rule); FSDP2 (fully_shard), which hands the modules plain
all-gathered tensors, trains with Tile's modules and gives torch's gradients."""
import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor  # noqa: E402

import tile  # noqa: E402
import tile.nn as tnn  # noqa: E402
from training_reference import training_ops  # noqa: E402,F401


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{store}")
    try:
        yield DeviceMesh("cpu", [0])
    finally:
        dist.destroy_process_group()


def rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def expect_refusal(op, arg, fn):
    with pytest.raises(TypeError) as e:
        fn()
    text = str(e.value)
    assert text.startswith(f"{op}: argument '{arg}': expected a torch.Tensor, got a DTensor"), text
    assert f"{arg}.to_local()" in text and f"{arg}.full_tensor()" in text, text


def test_dtensor_arguments_raise_naming_the_operator_and_argument(mesh, training_ops):
    x, w = rand(6, 32), rand(32, seed=1)
    dx = distribute_tensor(x, mesh, [Shard(0)])
    dw = distribute_tensor(w, mesh, [Replicate()])
    target = torch.tensor([0, 3, 31, 7, 1, 2])
    dt = distribute_tensor(target, mesh, [Shard(0)])
    expect_refusal("softmax", "x", lambda: tile.softmax(dx))
    expect_refusal("log_softmax", "x", lambda: tile.log_softmax(dx))
    expect_refusal("rms_norm", "x", lambda: tile.rms_norm(dx, weight=w))
    expect_refusal("rms_norm", "weight", lambda: tile.rms_norm(x, weight=dw.requires_grad_()))
    expect_refusal("layer_norm", "x", lambda: tile.layer_norm(dx))
    expect_refusal("cross_entropy", "logits", lambda: tile.cross_entropy(dx, target))
    expect_refusal("cross_entropy", "target", lambda: tile.cross_entropy(x, dt))
    expect_refusal("fused_add_rms_norm", "residual", lambda: tile.fused_add_rms_norm(x, dx, weight=w))
    expect_refusal("softmax_backward", "dy", lambda: tile.softmax_backward(tile.softmax(x), dx))
    # The modules reach the same check.
    expect_refusal("rms_norm", "x", lambda: tnn.RMSNorm(32)(dx))
    expect_refusal("cross_entropy", "logits", lambda: tnn.CrossEntropyLoss()(dx, target))


def test_local_shards_of_a_dtensor_run(mesh):
    x = rand(6, 32)
    dx = distribute_tensor(x, mesh, [Shard(0)])
    torch.testing.assert_close(tile.softmax(dx.to_local()), torch.softmax(x, -1), rtol=2e-6, atol=2e-7)


class Block(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)
        self.norm = norm(32, eps=1e-5)
        self.head = torch.nn.Linear(32, 11)

    def forward(self, x):
        return self.head(self.norm(torch.relu(self.proj(x))))


def test_fully_shard_trains_with_tile_modules(mesh):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    ours = Block(tnn.RMSNorm)
    theirs = Block(torch.nn.RMSNorm)
    theirs.load_state_dict(ours.state_dict())
    fully_shard(ours, mesh=mesh)
    x, target = rand(8, 32, seed=2), torch.arange(8) % 11
    loss = tnn.CrossEntropyLoss()(ours(x), target)
    loss.backward()
    ref = torch.nn.functional.cross_entropy(theirs(x), target)
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert type(p.grad).__name__ == "DTensor"            # FSDP2's sharded gradient
        torch.testing.assert_close(p.grad.full_tensor(), grads[name].grad, rtol=1e-5, atol=1e-6)
