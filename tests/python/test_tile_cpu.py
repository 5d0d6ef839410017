"""The Python package on the CPU backend (numpy arrays), against a float64 numpy reference."""
import numpy as np
import pytest

import tile

OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm"]
NORMS = ["rms_norm", "layer_norm"]
# Output dtype -> (rtol, atol relative to the row's largest |reference|).
TOLERANCE = {np.float32: (2e-5, 2e-5), np.float16: (2e-3, 1e-3)}


def reference(op, x, weight=None, bias=None, eps=None):
    """float64 reference over the last dimension; inputs are read as the values they hold."""
    x = np.asarray(x, dtype=np.float64)
    if op in ("softmax", "log_softmax"):
        shifted = x - x.max(axis=-1, keepdims=True)
        log_sum = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        return np.exp(shifted - log_sum) if op == "softmax" else shifted - log_sum
    if op == "rms_norm":
        eps = tile.RMS_NORM_EPS if eps is None else eps
        y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    else:
        eps = tile.LAYER_NORM_EPS if eps is None else eps
        centred = x - x.mean(axis=-1, keepdims=True)
        y = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * np.asarray(weight, dtype=np.float64)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)
    return y


def assert_close(got, want):
    rtol, atol = TOLERANCE[got.dtype.type]
    got = got.astype(np.float64)
    scale = np.abs(want).max(axis=-1, keepdims=True)
    err = np.abs(got - want)
    bound = rtol * np.abs(want) + atol * scale
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"at {worst}: got {got[worst]}, want {want[worst]} (bound {bound[worst]})"


def make(shape, dtype, seed=0, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def call(op, x, weight=None, bias=None, **kw):
    if op == "softmax":
        return tile.softmax(x, **kw)
    if op == "log_softmax":
        return tile.log_softmax(x, **kw)
    if op == "rms_norm":
        return tile.rms_norm(x, weight=weight, **kw)
    return tile.layer_norm(x, weight=weight, bias=bias, **kw)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(5, 37), (3, 4, 1537), (2, 1, 3, 256), (7, 1), (1000,)])
def test_matches_reference(op, dtype, shape):
    x = make(shape, dtype)
    weight = make(shape[-1], dtype, seed=1, scale=1.0) if op in NORMS else None
    bias = make(shape[-1], dtype, seed=2, scale=1.0) if op == "layer_norm" else None
    y = call(op, x, weight, bias)
    assert isinstance(y, np.ndarray) and y.shape == x.shape and y.dtype == x.dtype
    assert_close(y, reference(op, x, weight, bias))


@pytest.mark.parametrize("op", NORMS)
def test_norms_without_weight_and_with_custom_eps(op):
    x = make((9, 130), np.float32, scale=0.01)
    assert_close(call(op, x, eps=1e-2), reference(op, x, eps=1e-2))
    assert_close(call(op, x), reference(op, x))


def test_mixed_dtypes():
    x = make((6, 300), np.float16)
    w = make(300, np.float32, seed=1)
    b = make(300, np.float32, seed=2)
    y = tile.layer_norm(x, weight=w, bias=b, dtype="float32")
    assert y.dtype == np.float32
    assert_close(y, reference("layer_norm", x, w, b))
    y16 = tile.rms_norm(make((6, 300), np.float32), weight=w, dtype=np.float16)
    assert y16.dtype == np.float16


@pytest.mark.parametrize("op", OPS)
def test_strided_slice_without_copy(op):
    rows, cols, width = 11, 70, 96
    wide_x = np.full((rows, width), 99.0, dtype=np.float32)
    wide_x[:, :cols] = make((rows, cols), np.float32)
    wide_y = np.full((rows, width), -7.0, dtype=np.float32)
    x, out = wide_x[:, :cols], wide_y[:, :cols]
    assert not x.flags.c_contiguous
    weight = make(cols, np.float32, seed=1) if op in NORMS else None
    x_before = wide_x.copy()
    y = call(op, x, weight, out=out)
    assert y is out
    assert_close(wide_y[:, :cols], reference(op, x_before[:, :cols], weight))
    assert (wide_y[:, cols:] == -7.0).all(), "padding of out was written"
    assert (wide_x == x_before).all(), "x was written"


def test_in_place_on_a_slice():
    wide = make((8, 50), np.float32)
    before = wide.copy()
    v = wide[:, :40]
    assert tile.softmax(v, out=v) is v
    assert_close(wide[:, :40], reference("softmax", before[:, :40]))
    assert (wide[:, 40:] == before[:, 40:]).all()


def test_3d_view_with_collapsible_strides():
    # (B, T, C) view of a (B, T, S) buffer: strides (T*S, S, 1) flatten to rows of stride S.
    base = make((3, 5, 64), np.float16)
    x = base[:, :, :48]
    assert x.strides == (5 * 64 * 2, 64 * 2, 2)
    y = tile.log_softmax(x)
    assert_close(y, reference("log_softmax", x))
    assert tile.plan("log_softmax", x)["workers_per_program"] >= 1


def test_explicit_out_and_dtype():
    x = make((4, 33), np.float32)
    out = np.empty((4, 33), np.float16)
    assert tile.softmax(x, out=out) is out
    assert_close(out, reference("softmax", x))
    assert tile.softmax(x, out=out, dtype="float16") is out


def test_plan_is_honoured():
    x = make((10, 500), np.float32)
    request = {"programs_per_group": 2, "workers_per_program": 64}
    plan = tile.plan("rms_norm", x, plan=request)
    assert plan["programs_per_group"] == 2
    assert plan["workers_per_program"] == 64
    assert plan["width_mode"] == "exact"
    record = tile.run("rms_norm", x, plan=request)
    assert record["plan"] == plan
    assert record["threads_per_group"] == 128
    assert record["groups"] == 5
    assert record["backend"] == "cpu"
    assert record["arch"] == "" and record["cubin_sha256"] == ""
    assert record["source_sha256"] == "" and len(record["ir_sha256"]) == 64  # the CPU runs the IR
    assert record["bytes_loaded"] > 0
    assert record["cache_origin"] == "" and record["compile_options"] == []
    assert_close(record["out"], reference("rms_norm", x))
    assert tile.plan("rms_norm", x, plan='{"programs_per_group": 2, "workers_per_program": 64}') == plan


def test_record_counts_vector_and_scalar_accesses():
    # 3001 columns: an odd stride. As is, every access is one element; peeled, rows keep
    # 4-element vectors and only their heads and tails are single elements.
    x = make((16, 3001), np.float32)
    as_is = tile.run("softmax", x)
    assert as_is["plan"]["vector_elems"] == 1
    assert as_is["vector_accesses"] == 0 and as_is["scalar_accesses"] >= 2 * 16 * 3001
    peeled = tile.run("softmax", x, plan={"row_head": "peel"})
    assert peeled["plan"]["vector_elems"] == 4 and peeled["plan"]["row_head"] == "peel"
    assert peeled["vector_accesses"] >= 2 * 16 * (3001 // 4 - 1)
    assert peeled["scalar_accesses"] <= 2 * 16 * 2 * 3
    assert_close(peeled["out"], reference("softmax", x))


def test_columns_loaded_once_serve_every_row_block():
    # 8 groups looping over 300 rows of 4096: the weight is loaded once a group, not once a row,
    # and the output is the same to the bit.
    x = make((300, 4096), np.float32)
    weight = make(4096, np.float32)
    plan = {"grid_limit": 8, "workers_per_program": 256}
    ahead = tile.run("rms_norm", x, weight=weight, plan=plan)
    once = tile.run("rms_norm", x, weight=weight, plan=dict(plan, column_loads="once"))
    assert once["plan"]["column_loads"] == "once" and ahead["plan"]["column_loads"] == "ahead"
    stripes = once["plan"]["stripes"]
    assert ahead["vector_accesses"] - once["vector_accesses"] == (300 - 8) * stripes * 256
    assert np.array_equal(once["out"], ahead["out"])
    assert_close(once["out"], reference("rms_norm", x, weight))
    with pytest.raises(ValueError, match="plan.column_loads.*\"once\" only for groups that loop over row blocks"):
        tile.run("rms_norm", x, weight=weight, plan={"column_loads": "once"})
    with pytest.raises(ValueError, match='plan.*column_loads.*"ahead", "with_row" or "once"'):
        tile.run("rms_norm", x, weight=weight, plan={"column_loads": "never"})


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_printed_plan_given_back_launches_the_same_kernel(op, dtype):
    # The policy's plans over a sweep of shapes, and plans resolved from partial requests: each,
    # given back as a dict or as its JSON, resolves to itself and to the same source afresh.
    import json
    checked = 0
    for rows, cols, pad in [(1, 1, 0), (7, 31, 1), (300, 100, 0), (4, 1537, 3), (2, 4096, 0), (3, 10000, 0),
                            (2, 40000, 8)]:
        x = make((rows, cols + pad), dtype)[:, :cols]
        weight = make(cols, np.float32) if op in NORMS else None
        for request in [None, {"caching": "reread"}, {"programs_per_group": 2}, {"vector_elems": 1},
                        {"workers_per_program": 64, "stripe_unroll": 2, "caching": "reread"}]:
            try:
                plan = tile.plan(op, x, weight=weight, plan=request)
            except ValueError:
                continue                        # a request this shape cannot take
            tile.clear_kernel_caches()
            source = tile.source(op, x, weight=weight, plan=request)
            for given in (plan, json.dumps(plan)):
                tile.clear_kernel_caches()
                assert tile.plan(op, x, weight=weight, plan=given) == plan
                tile.clear_kernel_caches()
                assert tile.source(op, x, weight=weight, plan=given) == source
            record = tile.run(op, x, weight=weight, plan=plan)
            assert record["plan"] == plan
            assert_close(record["out"], reference(op, x, weight))
            checked += 1
    assert checked >= 25


def test_introspection():
    x = make((3, 200), np.float16)
    w = make(200, np.float32)
    plan = tile.plan("layer_norm", x, weight=w)
    record = tile.run("layer_norm", x, weight=w)
    assert record["plan"] == plan
    source = tile.source("layer_norm", x, weight=w)
    assert record["kernel_name"] in source and "__global__" in source
    assert record["kernel_name"] in tile.ir("layer_norm", x, weight=w)


def test_rows_zero():
    x = np.empty((0, 16), np.float32)
    assert tile.softmax(x).shape == (0, 16)


def test_library_info():
    info = tile.build_info()
    assert info["version"].count(".") == 2
    assert info["library"].endswith(".so")
    assert isinstance(info["git_commit"], str)
    assert tile.cache_dir() is None or isinstance(tile.cache_dir(), str)
    tile.clear_kernel_caches()
    if info["cuda"]:
        assert tile.nvrtc_version().count(".") == 1
    else:  # built with TILE_WITH_CUDA=OFF: the CUDA-only functions say so
        assert not tile.driver_available()
        assert tile.cache_dir() is None
        for fn in (tile.nvrtc_version, tile.nvrtc_library, tile.device_info):
            with pytest.raises(RuntimeError, match=r"no CUDA backend: Tile was built without CUDA \(TILE_WITH_CUDA=OFF\)"):
                fn()
        # A CUDA tensor as launch_raw takes it (device 0); nothing is launched, so host memory serves.
        x, y = np.ones((2, 8), np.float32), np.empty((2, 8), np.float32)
        f32 = tile._tile.RAW_DTYPE_CODES["float32"]
        with pytest.raises(RuntimeError, match="softmax: no CUDA backend: Tile was built without CUDA"):
            tile._tile.launch_raw(tile._tile.Program.builtin("softmax"),
                                  {"x": (x.ctypes.data, (2, 8), (8, 1), f32, 0), "y": (y.ctypes.data, (2, 8), (8, 1), f32, 0)})
    if not tile.driver_available():
        with pytest.raises(RuntimeError, match="no CUDA driver|built without CUDA"):
            tile.device_info()


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    x = torch.randn(5, 3, 100, dtype=torch.bfloat16)
    w = torch.randn(100, dtype=torch.float32, requires_grad=True)
    y = tile.rms_norm(x, weight=w)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.device == x.device
    assert y.requires_grad                      # w requires grad: the custom op's autograd (test_torch_*.py)
    want = reference("rms_norm", x.float().numpy(), w.detach().numpy())
    err = np.abs(y.detach().float().numpy() - want) - (1.6e-2 * np.abs(want) + 8e-3 * np.abs(want).max(-1, keepdims=True))
    assert (err <= 0).all()
