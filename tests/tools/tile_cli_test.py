#!/usr/bin/env python3
"""The `tile` command (tools/tile_main.cpp): every bad command line is refused with exit status 2
and a message naming the command and the option, before any memory is allocated (the refusals run
under an 8 GiB address-space limit, so a shape allocated before its check fails the test);
no input crashes it; every command has --help; a valid CPU run passes the float64 oracle; a build
without CUDA (TILE_WITH_CUDA=0 in the environment, as CTest sets it) runs on the CPU and refuses
the GPU commands, saying why.

Usage: tile_cli_test.py PATH_TO_TILE
"""

import os
import resource
import signal
import subprocess
import sys
import unittest

TILE = None

# (arguments, option the message must name)
USAGE_ERRORS = [
    (["run", "--shape", "4611686018427387905x4"], "--shape"),
    (["run", "--shape", "99999999999999999999x4"], "--shape"),
    (["run", "--shape", "3x4611686018427387904"], "--shape"),
    (["run", "--shape", "10x4", "--stride", "-1"], "--stride"),
    (["run", "--shape=10x4", "--stride=-1"], "--stride"),
    (["run", "--shape", "10x4", "--stride", "3"], "--stride"),
    (["run", "--shape", "10x4", "--stride", "99999999999999999999"], "--stride"),
    (["run", "--shape", "2x4", "--stride", "4611686018427387904"], "--shape, --stride"),
    (["run", "--shape", "4x8x3"], "--shape"),
    (["run", "--shape", "4x8garbage"], "--shape"),
    (["run", "--shape", "-1x4"], "--shape"),
    (["run", "--shape", "4x0"], "--shape"),
    (["run", "--shape", "x4"], "--shape"),
    (["run", "--shape", "200000x20000"], "--shape"),
    (["run", "--dtype", "f16", "--shape", "1x2305843009213693952"], "--shape"),  # 64 GB of host buffers: over the limit
    (["run", "--shape"], "--shape"),
    (["run", "--shap", "4x8"], "--shap"),
    (["run", "--show", "bogus"], "--show"),
    (["run", "--show", "plan,,ir"], "--show"),
    (["run", "--op", "softmaxx"], "--op"),
    (["run", "--dtype", "f8"], "--dtype"),
    (["run", "--out-dtype", "int8"], "--out-dtype"),
    (["run", "--weight-dtype", ""], "--weight-dtype"),
    (["run", "--backend", "gpu"], "--backend"),
    (["run", "--seed", "-1"], "--seed"),
    (["run", "--seed", "18446744073709551616"], "--seed"),
    (["run", "--seed", "1e3"], "--seed"),
    (["run", "--plan", "{"], "--plan"),
    (["run", "--plan", '{"stripes": "many"}'], "--plan"),
    (["run", "--plan", '{"no_such_field": 1}'], "--plan"),
    (["run", "--op", "softmax", "--op", "rms_norm"], "--op"),
    (["run", "stray"], "stray"),
    (["run", "bench"], "bench"),  # one command per call
    (["run", "--no-weight=3"], "no-weight"),
    (["run", "--op", "--shape", "2x3"], "--op: expected one of"),  # --op takes '--shape' as its value
    (["run", "--op", "softmax", "--weight-dtype", "f16"], "--weight-dtype: expected no weight dtype"),
    (["run", "--op", "rms_norm", "--no-weight", "--weight-dtype", "f16"], "--weight-dtype: expected no weight dtype"),
    (["run", "--op", "log_softmax", "--no-weight"], "--no-weight: expected a norm"),
    (["run", "--op", "rms_norm", "--no-weight", "--no-weight"], "--no-weight"),  # flags once, as options
    (["run", "--dtype", "i32"], "--dtype: expected one of f32, f64, f16, bf16, got 'i32'"),  # no operator's x
    (["run", "--out-dtype", "i64"], "--out-dtype"),
    (["bench", "--host", "--host"], "--host"),
    (["tune", "--dtype", "i64"], "--dtype"),
    (["bench", "--shape", "4x8x3"], "--shape"),
    (["bench", "--shape", "4611686018427387905x4"], "--shape"),
    (["bench", "--shape", "1x2", "3x4"], "3x4"),
    (["bench", "--shape", "0x64"], "--shape"),  # nothing to time
    (["bench", "--plan", "[]"], "--plan"),
    (["bench", "--host", "--shape", "4x8"], "--host"),
    (["bench", "--op", "softmx"], "--op"),
    (["bench", "--dtype", "f8"], "--dtype"),
    (["bench", "--host", "--op", "softmax"], "--host"),
    (["bench", "--shap", "4x8"], "--shap"),
    (["tune", "--shape", "99999999999999999999x4"], "--shape"),
    (["tune", "--shape", "3x4611686018427387904"], "--shape"),
    (["tune", "--shape", "0x64"], "--shape"),
    (["tune", "--op", "bogus"], "--op"),
    (["tune", "--dtype", "f8"], "--dtype"),
    (["tune", "--out", "/nonexistent-folder/tune.json"], "--out"),
    (["tune", "--out", ""], "--out"),
    (["tune", "--out", "/"], "--out"),
    (["tune", "--plan", "{}"], "--plan"),
    (["--shap"], "--shap"),
    (["frob"], "frob"),
]


def limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def tile(args, limited=False):
    return subprocess.run([TILE, *args], capture_output=True, text=True, timeout=120,
                          preexec_fn=limit_address_space if limited else None)


class TileCli(unittest.TestCase):
    def assert_no_signal(self, proc, args):
        if proc.returncode < 0:
            self.fail(f"tile {' '.join(args)} died of {signal.Signals(-proc.returncode).name}: {proc.stderr}")

    def test_usage_errors_exit_2_naming_the_option(self):
        for args, option in USAGE_ERRORS:
            with self.subTest(args=args):
                proc = tile(args, limited=True)
                self.assert_no_signal(proc, args)
                self.assertEqual(proc.returncode, 2, f"tile {' '.join(args)}: {proc.stdout}{proc.stderr}")
                first_line = proc.stderr.splitlines()[0] if proc.stderr else ""
                command = args[0] if args[0] in ("run", "bench", "tune") else ""
                self.assertTrue(first_line.startswith(f"tile {command}".rstrip() + ":"), first_line)
                self.assertIn(option, first_line)
                self.assertEqual(proc.stdout, "", "nothing runs before the command line is checked")
                for leak in ("stoll", "stoull", "bad_alloc", "max_size", "terminate"):
                    self.assertNotIn(leak, proc.stderr)

    def test_messages_say_what_was_expected_and_given(self):
        proc = tile(["run", "--shape", "4x8x3"])
        self.assertIn("--shape: expected RxC", proc.stderr)
        self.assertIn("got '4x8x3'", proc.stderr)
        proc = tile(["run", "--shape", "10x4", "--stride", "-1"])
        self.assertIn("--stride: expected an integer from cols = 4 to 2^63 - 1, got '-1'", proc.stderr)
        proc = tile(["run", "--shape", "4611686018427387905x4"])
        self.assertIn("fit in 16 GiB", proc.stderr)
        self.assertIn("2^63 bytes or more", proc.stderr)
        proc = tile(["run", "--show", "bogus"])
        self.assertIn("--show: expected a comma list of plan, ir, source, check, got 'bogus'", proc.stderr)

    def test_help_exits_0(self):
        for args in (["--help"], ["-h"], ["run", "--help"], ["bench", "--help"], ["tune", "--help"]):
            with self.subTest(args=args):
                proc = tile(args)
                self.assert_no_signal(proc, args)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertIn("Usage: tile", proc.stdout)
        self.assertIn("--shape RxC", tile(["run", "--help"]).stdout)
        self.assertIn("--host", tile(["bench", "--help"]).stdout)
        self.assertIn("--out FILE", tile(["tune", "--help"]).stdout)

    def test_no_command_prints_help_and_exits_2(self):
        proc = tile([])
        self.assertEqual(proc.returncode, 2)
        self.assertIn("missing command", proc.stderr)
        self.assertIn("Usage: tile", proc.stderr)

    def test_valid_cpu_run_passes_the_oracle(self):
        args = ["run", "--backend", "cpu", "--op", "layer_norm", "--shape", "37x1537", "--dtype", "bf16",
                "--weight-dtype", "f32"]
        proc = tile(args)
        self.assert_no_signal(proc, args)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(proc.stdout.startswith(
            "tile run: layer_norm 37x1537 (row stride 1537), x bf16, y bf16, backend cpu\n"), proc.stdout)
        self.assertIn("\nplan {", proc.stdout)
        self.assertIn("extern \"C\" __global__", proc.stdout)  # the CUDA source, shown by default
        self.assertIn("oracle (float64): PASS, 56869 elements", proc.stdout)
        self.assertIn("memory outside the output rows: untouched", proc.stdout)

    def test_strided_run_with_every_show_item(self):
        args = ["run", "--backend=cpu", "--op", "rms_norm", "--shape", "5x100", "--stride", "128", "--seed",
                "18446744073709551615", "--show", "plan,ir,source,check", "--plan", '{"programs_per_group":2}']
        proc = tile(args)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("5x100 (row stride 128)", proc.stdout)
        self.assertIn('"programs_per_group":2', proc.stdout)
        self.assertIn("oracle (float64): PASS, 500 elements", proc.stdout)
        proc = tile(["run", "--backend", "cpu", "--shape", "3x64", "--show", "check"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("\nplan {", proc.stdout)
        self.assertIn("oracle (float64): PASS, 192 elements", proc.stdout)

    def test_build_without_cuda_runs_on_the_cpu_and_refuses_gpu_commands(self):
        if os.environ.get("TILE_WITH_CUDA") != "0":
            self.skipTest("built with CUDA (TILE_WITH_CUDA=ON)")
        proc = tile(["run", "--shape", "3x64", "--show", "source,check"])  # auto: the CPU backend
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("backend cpu\n", proc.stdout)
        self.assertIn("extern \"C\" __global__", proc.stdout)  # the source needs no CUDA toolkit
        self.assertIn("oracle (float64): PASS, 192 elements", proc.stdout)
        why = "no CUDA backend: Tile was built without CUDA (TILE_WITH_CUDA=OFF)"
        for args, message in ((["run", "--backend", "cuda", "--shape", "3x64"], f"tile run: softmax: {why}"),
                              (["bench", "--shape", "4x8"], f"tile bench: {why}; tile bench times GPU kernels"),
                              (["tune"], f"tile tune: {why}; tile tune times GPU kernels")):
            with self.subTest(args=args):
                proc = tile(args)
                self.assertEqual(proc.returncode, 1, proc.stderr)
                self.assertTrue(proc.stderr.startswith(message), proc.stderr)


if __name__ == "__main__":
    TILE = sys.argv.pop(1)
    unittest.main(verbosity=2)
