"""Tests of bench/plot_sweep.py, the figures and markdown tables of a `tile-sweep/1` document.

A small synthetic sweep (2 operators x 2 dtypes x 3 N, copy at 1 ms everywhere, so every time is
a known fraction of copy) is written to a temporary folder. Its markdown must carry the hand-
computed numbers: Tile / best peer per point, their geometric mean and minimum, the 95/90/85 %
counts, the oracle failure and the peer error with their messages, the unsupported peer and the
torch.compile first-call range. The SVG tests need matplotlib (skipped, visibly, without it):
one file per (op, dtype), byte-identical when written twice. Bad inputs exit 2 with a message.
The script runs as a subprocess so the CLI and its exit codes are what is tested.
"""

import json
import math
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "plot_sweep.py")

PLAN = {"workers_per_program": 128, "programs_per_group": 2, "vector_elems": 8, "stripes": 4,
        "caching": "registers", "cache_format": "f32", "tail": "predicate"}
ERR = "err"      # the peer raised
ORACLE = "oracle"  # the entry failed the float64 oracle

# (op, dtype, n): (tile ms, torch_eager ms, torch_compile ms, triton_row ms); copy is 1 ms.
TIMES = {
    ("softmax", "bf16", 1024): (1.25, 2.0, 1.5, 1.0),
    ("softmax", "bf16", 4096): (1.0, 2.0, 1.5, 1.1),
    ("softmax", "bf16", 65536): (1.04, 1.3, 1.2, ERR),
    ("rms_norm", "bf16", 1024): (ORACLE, 1.2, 1.5, 1.0),
    ("rms_norm", "bf16", 4096): (1.08, 1.5, 1.25, 1.35),
    ("rms_norm", "bf16", 65536): (1.15, 1.2, 1.4, 1.3),
    ("softmax", "f32", 1024): (2.0, 1.0, 1.5, 1.1),
    ("softmax", "f32", 4096): (1.0, 1.5, 1.0, 1.2),
    ("softmax", "f32", 65536): (1.25, 1.25, 1.6, 1.5),
    ("rms_norm", "f32", 1024): (1.6, 1.2, 1.0, 1.4),
    ("rms_norm", "f32", 4096): (1.0, 2.0, 2.0, 2.0),
    ("rms_norm", "f32", 65536): (1.1, 1.1, 1.21, 1.3),
}
# best peer ms / Tile ms at every point where both have a time, worked out by hand.
RATIOS = [1.0 / 1.25, 1.1, 1.2 / 1.04, 1.25 / 1.08, 1.2 / 1.15, 0.5, 1.0, 1.0, 1.0 / 1.6, 2.0, 1.0]
PEERS = ["torch_eager", "torch_compile", "triton_row", "liger"]


def timed_entry(ms, extra=None):
    e = {"oracle": {"passed": True, "mismatches": 0, "max_abs_error": 1e-6}, "ms": ms,
         "launches_per_batch": 10, "gbs": 1e9 / ms / 1e6, "pct_of_copy": 100.0 * 1.0 / ms}
    e.update(extra or {})
    return e


def build_sweep():
    points = []
    for i, ((op, dtype, n), (tile, eager, comp, triton)) in enumerate(TIMES.items()):
        impls = {}
        if tile == ORACLE:
            impls["tile"] = {"plan": PLAN, "oracle": {"passed": False, "mismatches": 7, "max_abs_error": 0.5},
                             "error": "failed the float64 oracle; not timed"}
        else:
            impls["tile"] = timed_entry(tile, {"plan": PLAN})
        impls["torch_eager"] = timed_entry(eager, {"first_call_s": 0.001, "note": "torch"})
        impls["torch_compile"] = timed_entry(comp, {"first_call_s": 0.5 + 0.25 * i, "note": "compile"})
        if triton == ERR:
            impls["triton_row"] = {"first_call_s": 0.2, "error": "RuntimeError: boom | at launch"}
        else:
            impls["triton_row"] = timed_entry(triton, {"first_call_s": 0.2, "note": "triton"})
        impls["liger"] = {"unsupported": "liger_kernel is not importable (No module named 'liger_kernel')"}
        points.append({"op": op, "dtype": dtype, "n": n, "rows": 2**20 // n, "bytes": 10**9,
                       "copy": {"ms": 1.0, "gbs": 1000.0}, "impls": impls})
    return {"schema": "tile-sweep/1", "created": "2026-01-01T00:00:00+00:00", "gpu": "Synthetic GPU",
            "torch": "0.0", "tile": {"version": "0.1.0", "git_commit": "0" * 40, "git_dirty": False},
            "method": "synthetic", "config": {"ops": ["softmax", "rms_norm"], "dtypes": ["bf16", "f32"],
                                              "ns": [1024, 4096, 65536], "peers": PEERS},
            "points": points}


def write_json(tmp_path, doc, name="sweep.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=1))
    return path


def invoke(*args):
    return subprocess.run([sys.executable, SCRIPT] + [str(a) for a in args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=300)


@pytest.fixture
def markdown(tmp_path):
    src = write_json(tmp_path, build_sweep())
    md = tmp_path / "out" / "sweep.md"
    proc = invoke(src, "--markdown", md)
    assert proc.returncode == 0, proc.stderr
    return md.read_text(encoding="utf-8")


def table_row(text, dtype, op, n):
    """The cells of the (op, N) row in the dtype's table."""
    section = text.split(f"## {dtype}\n", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 2 and cells[0] == op and cells[1] == str(n):
            return cells
    raise AssertionError(f"no row for {op} {dtype} N={n}")


def test_markdown_geomean_and_min(markdown):
    gm = math.exp(sum(math.log(r) for r in RATIOS) / len(RATIOS))
    m = re.search(r"geometric mean over (\d+) of (\d+) points: \*\*([0-9.]+)\*\*", markdown)
    assert m, markdown
    assert (int(m.group(1)), int(m.group(2))) == (len(RATIOS), len(TIMES))
    assert m.group(3) == f"{gm:.2f}" == "0.98"
    m = re.search(r"Minimum Tile / best peer: \*\*([0-9.]+)\*\* at (\S+) (\S+) N=(\d+) \(best peer ([^)]+)\)",
                  markdown)
    assert m, markdown
    assert m.groups() == ("0.50", "softmax", "f32", "1024", "torch eager")
    assert "Maximum Tile / best peer: 2.00 at rms_norm f32 N=4096" in markdown
    assert "Tile at least as fast as the best peer: 8 of 11 points" in markdown


def test_markdown_thresholds(markdown):
    assert "(of 11 timed, 12 in all): ≥ 95 %: 4, ≥ 90 %: 6, ≥ 85 %: 7" in markdown
    assert "≥ 95 % by dtype: bf16 2/5, f32 2/6" in markdown


def test_markdown_table_cells(markdown):
    header = next(l for l in markdown.splitlines() if l.startswith("| op |"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "op", "N", "rows", "copy GB/s", "Tile %", "torch eager %", "torch.compile %", "Triton (row) %",
        "Tile / best", "best peer", "Tile plan"]
    assert table_row(markdown, "bf16", "softmax", 1024) == [
        "softmax", "1024", "1024", "1000", "80.0", "50.0", "66.7", "100.0", "0.80", "Triton (row)",
        "w128 p2 v8 s4 registers"]
    # A row split over a cluster names its groups and merge.
    sys.path.insert(0, os.path.dirname(SCRIPT))
    from plot_sweep import plan_text
    assert plan_text({"workers_per_program": 256, "programs_per_group": 1, "vector_elems": 8, "stripes": 8,
                      "caching": "registers", "ctas_per_program": 8, "merge": "combine"}) == \
        "w256 p1 v8 s8 registers c8 combine"
    # The erroring peer shows as an error; the best peer is then the fastest of the others.
    assert table_row(markdown, "bf16", "softmax", 65536)[4:10] == [
        "96.2", "76.9", "83.3", "error", "1.15", "torch.compile"]
    # Tile failing the oracle: no percentage, no ratio.
    assert table_row(markdown, "bf16", "rms_norm", 1024)[4:10] == ["error", "83.3", "66.7", "100.0", "—", "—"]
    assert table_row(markdown, "f32", "rms_norm", 65536)[4:9] == ["90.9", "90.9", "82.6", "76.9", "1.00"]
    assert "Liger %" not in markdown
    assert "Not shown (no numbers at any point of this dtype): Liger." in markdown


def test_markdown_failures_and_first_call(markdown):
    assert "Errors and oracle failures (2):" in markdown
    assert ("  - rms_norm bf16 N=1024 Tile: failed the float64 oracle; not timed "
            "(oracle: 7 mismatches, max abs error 0.5)") in markdown
    assert "  - softmax bf16 N=65536 Triton (row): RuntimeError: boom \\| at launch" in markdown
    assert ("  - Liger at all 12 points: liger_kernel is not importable (No module named 'liger_kernel')"
            in markdown)
    assert "torch.compile first-call (compile) time: 0.500 – 3.25 s over 12 points." in markdown
    assert re.search(r"^\| torch\.compile \| 0\.500 \(softmax bf16 N=1024\) \| [0-9.]+ \| "
                     r"3\.25 \(rms_norm f32 N=65536\) \| 12 \|$", markdown, re.M), markdown


def test_markdown_is_deterministic(tmp_path):
    src = write_json(tmp_path, build_sweep())
    for name in ("a.md", "b.md"):
        assert invoke(src, "--markdown", tmp_path / name).returncode == 0
    assert (tmp_path / "a.md").read_bytes() == (tmp_path / "b.md").read_bytes()


def test_svgs_exist_and_are_deterministic(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -r requirements-dev.txt)")
    src = write_json(tmp_path, build_sweep())
    for d in ("a", "b"):
        proc = invoke(src, "--svg-dir", tmp_path / d)
        assert proc.returncode == 0, proc.stderr
    expected = {f"{op}-{dtype}.svg" for op in ("softmax", "rms_norm") for dtype in ("bf16", "f32")}
    assert set(os.listdir(tmp_path / "a")) == expected
    for name in sorted(expected):
        a = (tmp_path / "a" / name).read_bytes()
        assert a == (tmp_path / "b" / name).read_bytes(), name
        text = a.decode("utf-8")
        assert text.lstrip().startswith("<?xml") and "<svg" in text, name
        assert "Tile" in text and "Triton (row)" in text and "% of same-run copy bandwidth" in text, name
        assert "Liger" not in text, name  # no numbers: no line, no legend entry
        assert "<dc:date>" not in text, name


def test_missing_file(tmp_path):
    proc = invoke(tmp_path / "nope.json", "--markdown", tmp_path / "x.md")
    assert proc.returncode == 2
    assert "no such file" in proc.stderr
    assert not (tmp_path / "x.md").exists()


@pytest.mark.parametrize("mutate, pattern", [
    (lambda d: d.update(schema="tile-repeat/1"), r"schema is 'tile-repeat/1', expected 'tile-sweep/1'"),
    (lambda d: d.pop("schema"), r"schema is None"),
    (lambda d: d.update(points=[]), r"'points' must be a non-empty list"),
    (lambda d: d["points"][3].pop("copy"), r"points\[3\]: 'copy' missing"),
    (lambda d: d["points"][1]["impls"]["tile"].update(ms=-1), r"points\[1\]: impls.tile.ms"),
    (lambda d: d["points"].append(dict(d["points"][0])), r"a second point for softmax bf16 N=1024"),
])
def test_bad_document(tmp_path, mutate, pattern):
    doc = build_sweep()
    mutate(doc)
    proc = invoke(write_json(tmp_path, doc), "--markdown", tmp_path / "x.md", "--svg-dir", tmp_path / "svg")
    assert proc.returncode == 2, proc.stderr
    assert re.search(pattern, proc.stderr), proc.stderr
    assert not (tmp_path / "x.md").exists() and not (tmp_path / "svg").exists()


def test_not_json(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text("{not json")
    proc = invoke(path, "--markdown", tmp_path / "x.md")
    assert proc.returncode == 2 and "not JSON" in proc.stderr, proc.stderr
    path.write_text("[1, 2]")
    proc = invoke(path, "--markdown", tmp_path / "x.md")
    assert proc.returncode == 2 and "top level is list" in proc.stderr, proc.stderr


def test_nothing_to_do(tmp_path):
    proc = invoke(write_json(tmp_path, build_sweep()))
    assert proc.returncode == 2 and "nothing to do" in proc.stderr


def test_error_messages_lose_terminal_colour_codes():
    from plot_sweep import one_line
    assert one_line("\x1b[91m\x1b[1merror[X]:\x1b[0m launch\n  failed") == "error[X]: launch failed"


def build_shaped_graph_sweep():
    """Two row counts of one N (a --shapes run) timed as CUDA graphs (an empty-kernel line)."""
    points = []
    for rows, (copy_ms, empty_ms, tile_ms, peer_ms) in ((1, (0.002, 0.001, 0.003, 0.004)),
                                                        (64, (0.004, 0.001, 0.005, 0.0025))):
        points.append({"op": "softmax", "dtype": "bf16", "n": 4096, "rows": rows, "bytes": 16384 * rows,
                       "copy": {"ms": copy_ms, "gbs": 16384 * rows / copy_ms / 1e6}, "empty": {"ms": empty_ms},
                       "impls": {"tile": {**timed_entry(tile_ms, {"plan": PLAN}), "pct_of_copy": 100 * copy_ms / tile_ms},
                                 "liger": {**timed_entry(peer_ms, {"first_call_s": 0.1}),
                                           "pct_of_copy": 100 * copy_ms / peer_ms}}})
    return {"schema": "tile-sweep/1", "created": "2026-01-01T00:00:00+00:00", "gpu": "Synthetic GPU",
            "torch": "0.0", "tile": {"version": "0.1.0", "git_commit": "0" * 40, "git_dirty": False},
            "method": "synthetic", "config": {"ops": ["softmax"], "dtypes": ["bf16"], "peers": ["liger"],
                                              "shapes": [[1, 4096], [64, 4096]], "graph": True},
            "points": points}


def test_shaped_graph_run_has_rows_and_microsecond_columns(tmp_path):
    src = write_json(tmp_path, build_shaped_graph_sweep())
    md = tmp_path / "seed.md"
    proc = invoke(src, "--markdown", md)
    assert proc.returncode == 0, proc.stderr
    text = md.read_text(encoding="utf-8")
    header = next(l for l in text.splitlines() if l.startswith("| op |"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "op", "N", "rows", "copy GB/s", "copy µs", "empty µs", "Tile µs", "Tile %", "Liger %", "Tile / best",
        "best peer", "Tile / copy", "Tile / empty", "Tile plan"]
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in text.splitlines() if l.startswith("| softmax |")]
    assert [r[2] for r in rows] == ["1", "64"]
    assert rows[0][4:] == ["2.00", "1.00", "3.00", "66.7", "50.0", "1.33", "Liger", "1.50", "3.00",
                           "w128 p2 v8 s4 registers"]
    assert rows[1][4:13] == ["4.00", "1.00", "5.00", "80.0", "160.0", "0.50", "Liger", "1.25", "5.00"]
    assert "Minimum Tile / best peer: **0.50** at softmax bf16 N=4096 rows=64 (best peer Liger)" in text
    assert "- Tile's time over the copy's: 1.25 (softmax bf16 N=4096 rows=64) to 1.50 (softmax bf16 N=4096 rows=1)" in text
    assert "- Tile's time over the empty kernel's: 3.00 (softmax bf16 N=4096 rows=1) to 5.00" in text
    # One point per N is what a figure draws: a shaped run is refused there, and nothing is written.
    proc = invoke(src, "--markdown", tmp_path / "x.md", "--svg-dir", tmp_path / "svg")
    assert proc.returncode == 2 and "several row counts for one N" in proc.stderr, proc.stderr
    assert not (tmp_path / "x.md").exists() and not (tmp_path / "svg").exists()
    # The same rows twice is still a duplicate; an empty line must hold a time.
    doc = build_shaped_graph_sweep()
    doc["points"].append(dict(doc["points"][0]))
    proc = invoke(write_json(tmp_path, doc, "dup.json"), "--markdown", tmp_path / "y.md")
    assert proc.returncode == 2 and "a second point for softmax bf16 N=4096 rows=1" in proc.stderr, proc.stderr
    doc = build_shaped_graph_sweep()
    doc["points"][1]["empty"] = {"ms": 0}
    proc = invoke(write_json(tmp_path, doc, "empty.json"), "--markdown", tmp_path / "z.md")
    assert proc.returncode == 2 and "points[1]: empty.ms" in proc.stderr, proc.stderr
