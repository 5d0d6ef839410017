"""Tests of bench/audit.py, the independent checker of a saved `tile-repeat/1` run.

A valid run is synthesised from bench/SCHEMA.md by make_run.py (3 cases, two native variants
and a torch_eager baseline, 4 rounds ABBA, 9 samples, sources/ holding the .cu files). The
audit must pass it; every deliberately broken copy must fail with exit 1 and a message naming
the problem. The audit runs as a subprocess so the CLI and its exit codes are what is tested.
"""

import copy
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

import make_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AUDIT = os.path.join(REPO, "bench", "audit.py")

SOFTMAX = "softmax-37x1537"
RMS = "rms_norm-4096x4096"
LN = "layer_norm-8x65536"
N_RECORDS = 3 * 3 * 4


def load_audit():
    spec = importlib.util.spec_from_file_location("tile_bench_audit", AUDIT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


audit_mod = load_audit()

_VALID = make_run.build_run()


@pytest.fixture
def run():
    """A fresh (doc, sources) pair of the valid run, free to break."""
    doc, sources = _VALID
    return copy.deepcopy(doc), dict(sources)


class Result:
    def __init__(self, proc, verdict):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.verdict = verdict

    @property
    def failed_checks(self):
        return {c["name"] for c in self.verdict["checks"] if c["status"] == "FAIL"}

    def problems(self, check):
        for c in self.verdict["checks"]:
            if c["name"] == check:
                return c["problems"]
        raise KeyError(check)

    def status(self, check):
        for c in self.verdict["checks"]:
            if c["name"] == check:
                return c["status"]
        raise KeyError(check)

    def __repr__(self):
        return "rc=%s\n%s%s" % (self.rc, self.out, self.err)


def invoke(path, *args):
    """bench/audit.py as a subprocess; returns (CompletedProcess, JSON verdict or None)."""
    out_json = os.path.join(os.path.dirname(os.path.abspath(path)), "verdict.json")
    if os.path.exists(out_json):
        os.remove(out_json)
    proc = subprocess.run([sys.executable, AUDIT, str(path), "--json", out_json] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=120)
    verdict = None
    if os.path.exists(out_json):
        with open(out_json) as f:
            verdict = json.load(f)
    return Result(proc, verdict)


def audit_run(tmp_path, doc, sources, *args, folder="run"):
    path = make_run.write_run(str(tmp_path / folder), doc, sources)
    return invoke(path, *args)


def find_record(doc, case, variant, rnd):
    hits = [r for r in doc["records"] if (r["case"], r["variant"], r["round"]) == (case, variant, rnd)]
    assert len(hits) == 1
    return hits[0]


def artifact(doc, variant, case, rnd):
    hits = [e for e in doc["artifacts"][variant][case] if e["round"] == rnd]
    assert len(hits) == 1
    return hits[0]


def assert_fails(res, check, pattern, only=None):
    """Exit 1, `check` failed with a problem matching `pattern` (also printed), and, when `only`
    is given, exactly those checks failed."""
    assert res.rc == 1, res
    assert res.verdict is not None and res.verdict["verdict"] == "FAIL", res
    assert check in res.failed_checks, res
    assert any(re.search(pattern, p) for p in res.problems(check)), (pattern, res.problems(check))
    listed = [l[4:] for l in res.out.splitlines() if l.startswith("  - ")]
    assert any(re.search(pattern, l) for l in listed), res
    last = res.out.strip().splitlines()[-1]
    assert re.fullmatch(r"audit: FAIL \(\d+ problems?\)", last), last
    assert last == "audit: FAIL (%d problem%s)" % (res.verdict["problems"], "" if res.verdict["problems"] == 1 else "s")
    if only is not None:
        assert res.failed_checks == set(only), res


# --------------------------------------------------------------------------------------------
# The valid run.


def test_valid_run_passes(tmp_path, run):
    res = audit_run(tmp_path, *run)
    assert res.rc == 0, res
    assert res.out.strip().splitlines()[-1] == "audit: PASS (%d records, 4 rounds, 3 variants, 3 cases)" % N_RECORDS
    assert res.verdict["verdict"] == "PASS" and res.verdict["problems"] == 0
    names = [c["name"] for c in res.verdict["checks"]]
    for name in ("schema", "oracle", "coverage", "samples", "order", "artifacts", "sources",
                 "statistics", "summary", "config"):
        assert name in names
        assert res.status(name) == "PASS", res
        assert "%s" % name in res.out
    # the sources were really hashed: 2 native variants x 3 cases
    assert [c["checked"] for c in res.verdict["checks"] if c["name"] == "sources"] == [6]
    for line in res.out.splitlines()[1:-1]:
        assert re.match(r"^\w+ +PASS +\d+ checked, 0 problems", line), line


def test_valid_run_has_the_brief_shape(run):
    doc, sources = run
    cfg = doc["config"]
    assert cfg["rounds"] == 4 and cfg["samples"] == 9
    assert [v["kind"] for v in cfg["variants"]] == ["native", "native", "torch_eager"]
    assert cfg["order"][1] == cfg["order"][0][::-1] and cfg["order"][2] == cfg["order"][0]
    assert len(sources) == 6
    for name, data in sources.items():
        assert name == hashlib.sha256(data).hexdigest() + ".cu"


def test_cpu_backend_run_passes(tmp_path):
    doc, sources = make_run.build_run(backend="cpu")
    res = audit_run(tmp_path, doc, sources)
    assert res.rc == 0, res


def test_even_sample_count_and_odd_rounds_pass(tmp_path):
    doc, sources = make_run.build_run(rounds=3, samples=8, seed=7)
    res = audit_run(tmp_path, doc, sources)
    assert res.rc == 0, res
    assert "audit: PASS (27 records, 3 rounds, 3 variants, 3 cases)" in res.out


def test_two_variants_five_rounds_pass(tmp_path):
    variants = [v for v in make_run.DEFAULT_VARIANTS if v["name"] != "candidate"]
    doc, sources = make_run.build_run(variants=variants, rounds=5, seed=3)
    res = audit_run(tmp_path, doc, sources)
    assert res.rc == 0, res


# --------------------------------------------------------------------------------------------
# Each broken copy is caught, with exit 1 and a message naming it.


def test_missing_round(tmp_path, run):
    doc, sources = run
    doc["records"] = [r for r in doc["records"] if r["round"] != 3]
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "coverage", r"round 3: no records at all \(all 9 case/variant pairs missing\)",
                 only={"coverage"})
    # the summary cannot be recomputed as it was made; it says so rather than listing 36 entries
    assert re.search(r"^summary +PASS +0 checked, 0 problems .*\(36 entries not recomputed", res.out, re.M), res


def test_missing_single_record(tmp_path, run):
    doc, sources = run
    doc["records"].remove(find_record(doc, SOFTMAX, "candidate", 2))
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "coverage", r"^record softmax-37x1537/candidate/round 2: missing$")
    assert len(res.problems("coverage")) == 1
    assert res.failed_checks == {"coverage"}, res
    assert re.search(r"^summary +PASS +32 checked, 0 problems .*\(4 entries not recomputed", res.out, re.M), res


def test_duplicate_record(tmp_path, run):
    doc, sources = run
    doc["records"].append(copy.deepcopy(find_record(doc, LN, "torch", 0)))
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "coverage", r"record layer_norm-8x65536/torch/round 0: 2 records, expected exactly one")


def test_wrong_sample_count(tmp_path, run):
    doc, sources = run
    rec = find_record(doc, RMS, "policy", 1)
    rec["families"]["latency"]["samples"].pop()
    make_run.resummarise(doc)  # statistics and summary consistent: only the count is wrong
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "samples", r"record rms_norm-4096x4096/policy/round 1: latency has 8 samples, expected 9",
                 only={"samples"})


def test_wrong_sample_count_without_recomputing(tmp_path, run):
    doc, sources = run
    find_record(doc, RMS, "policy", 1)["families"]["throughput"]["samples"].append(99.0)
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "samples", r"throughput has 10 samples, expected 9")
    assert "statistics" in res.failed_checks  # max 99 no longer matches


def test_changed_source_hash_in_one_round(tmp_path, run):
    doc, sources = run
    e = artifact(doc, "candidate", SOFTMAX, 2)
    old = e["source_sha256"]
    new = hashlib.sha256(b"another source").hexdigest()
    e["source_sha256"] = new
    e["source_file"] = "sources/%s.cu" % new
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "artifacts",
                 r"artifact candidate/softmax-37x1537 round 2: source_sha256 \"%s\" differs from round 0's \"%s\""
                 % (new, old))
    assert "sources" in res.failed_checks  # and the file it names is not there
    assert res.failed_checks <= {"artifacts", "sources"}, res


def test_changed_source_hash_only_the_hash(tmp_path, run):
    doc, sources = run
    e = artifact(doc, "policy", LN, 3)
    e["source_sha256"] = "0" * 64
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "artifacts", r"artifact policy/layer_norm-8x65536 round 3: source_sha256 \"0{64}\" differs")
    assert_fails(res, "artifacts", r"round 3: source_file .* expected \"sources/0{64}\.cu\"")
    assert_fails(res, "sources", r"does not match source_sha256 \"0{64}\"")


def test_changed_cubin_hash(tmp_path, run):
    doc, sources = run
    artifact(doc, "policy", RMS, 1)["cubin_sha256"] = hashlib.sha256(b"other cubin").hexdigest()
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "artifacts", r"artifact policy/rms_norm-4096x4096 round 1: cubin_sha256 \"[0-9a-f]{64}\" "
                                   r"differs from round 0's", only={"artifacts"})


def test_changed_plan_in_one_round(tmp_path, run):
    doc, sources = run
    plan = artifact(doc, "candidate", LN, 3)["plan"]
    plan["stripes"] += 1
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "artifacts",
                 r"artifact candidate/layer_norm-8x65536 round 3: plan differs from round 0's: stripes \d+ vs \d+$",
                 only={"artifacts"})


def test_resolved_plan_contradicts_the_request(tmp_path, run):
    doc, sources = run
    for e in doc["artifacts"]["candidate"][SOFTMAX]:
        e["plan"]["workers_per_program"] = 64
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "artifacts", r"candidate/softmax-37x1537 round 0: plan workers_per_program is 64, "
                                   r"but config.variants requests 128", only={"artifacts"})


def test_missing_artifact_round(tmp_path, run):
    doc, sources = run
    doc["artifacts"]["policy"][SOFTMAX].pop()
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "artifacts", r"artifact policy/softmax-37x1537: no entry for round 3", only={"artifacts"})


def test_artifacts_for_a_torch_variant(tmp_path, run):
    doc, sources = run
    doc["artifacts"]["torch"] = copy.deepcopy(doc["artifacts"]["policy"])
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "artifacts", r"variant \"torch\" is torch_eager; artifacts are for native variants only")


def test_failed_oracle(tmp_path, run):
    doc, sources = run
    oracle = find_record(doc, LN, "candidate", 0)["oracle"]
    oracle.update(passed=False, mismatches=12, max_abs_error=0.25)
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "oracle", r"record layer_norm-8x65536/candidate/round 0: oracle failed .*mismatches 12",
                 only={"oracle"})


def test_oracle_passed_with_mismatches(tmp_path, run):
    doc, sources = run
    find_record(doc, SOFTMAX, "policy", 1)["oracle"]["mismatches"] = 3
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "oracle", r"oracle passed with 3 mismatches", only={"oracle"})


def test_doctored_median(tmp_path, run):
    doc, sources = run
    fam = find_record(doc, SOFTMAX, "candidate", 2)["families"]["throughput"]
    true_median = fam["median"]
    fam["median"] = 12.5
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "statistics",
                 r"^record softmax-37x1537/candidate/round 2: throughput median 12.5 stored, %s recomputed$"
                 % re.escape(format(true_median, ".12g")), only={"statistics"})


@pytest.mark.parametrize("stat", ["min", "max", "mean"])
def test_doctored_min_max_mean(tmp_path, run, stat):
    doc, sources = run
    fam = find_record(doc, RMS, "torch", 3)["families"]["gpu_time"]
    fam[stat] *= 1.001
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "statistics", r"record rms_norm-4096x4096/torch/round 3: gpu_time %s .* stored, .* recomputed"
                 % stat, only={"statistics"})


def test_doctored_summary_entry(tmp_path, run):
    doc, sources = run
    ent = [s for s in doc["summary"] if (s["case"], s["variant"], s["family"]) == (RMS, "candidate", "latency")][0]
    ent["median"] *= 0.97
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "summary", r"^summary rms_norm-4096x4096/candidate/latency: median .* stored, .* recomputed "
                                 r"from 4 round medians$", only={"summary"})


def test_missing_summary_entry(tmp_path, run):
    doc, sources = run
    doc["summary"] = [s for s in doc["summary"]
                      if (s["case"], s["variant"], s["family"]) != (LN, "torch", "stream_time")]
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "summary", r"summary layer_norm-8x65536/torch/stream_time: missing", only={"summary"})


def test_order_not_abba(tmp_path, run):
    doc, sources = run
    order = doc["config"]["order"]
    order[1] = order[0][1:] + order[0][:1]  # a rotation, not the reverse
    for rec in doc["records"]:  # positions follow the (wrong) order, so only ABBA is broken
        rec["position"] = order[rec["round"]].index(rec["variant"])
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "order", r"^order round 1 is \[.*\], not the reverse of round 0 \[.*\]", only={"order"})


def test_order_lacks_a_variant(tmp_path, run):
    doc, sources = run
    doc["config"]["order"] = [o[:-1] if r % 2 == 0 else o[1:] for r, o in enumerate(doc["config"]["order"])]
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "order", r"order round 0 lacks variant \"torch\"")


def test_position_inconsistent_with_order(tmp_path, run):
    doc, sources = run
    rec = find_record(doc, RMS, "candidate", 1)
    assert rec["position"] == 1
    rec["position"] = 2
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "order", r"^record rms_norm-4096x4096/candidate/round 1: position 2, but \"candidate\" is at "
                               r"index 1 of round 1's order", only={"order"})


@pytest.mark.parametrize("bad,what", [
    (float("nan"), r"NaN \(not finite\)"),
    (float("inf"), r"Infinity \(not finite\)"),
    (-0.5, r"-0\.5 \(not positive\)"),
    (0.0, r"0 \(not positive\)"),
    (None, r"null \(not a number\)"),
])
def test_non_finite_or_non_positive_sample(tmp_path, run, bad, what):
    doc, sources = run
    find_record(doc, LN, "policy", 2)["families"]["stream_time"]["samples"][4] = bad
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "samples", r"record layer_norm-8x65536/policy/round 2: stream_time sample 4 is %s" % what)
    assert res.failed_checks <= {"samples", "statistics", "summary"}, res


def test_source_file_content_does_not_match(tmp_path, run):
    doc, sources = run
    name = artifact(doc, "candidate", RMS, 0)["source_file"].split("/")[1]
    sources[name] = sources[name] + b"// edited after the run\n"
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "sources", r"sources/%s\.cu \(artifact candidate/rms_norm-4096x4096 round 0\): content SHA-256 "
                                 r"[0-9a-f]{64} does not match" % re.escape(name[:-3]), only={"sources"})


def test_source_file_missing(tmp_path, run):
    doc, sources = run
    name = artifact(doc, "policy", SOFTMAX, 0)["source_file"].split("/")[1]
    del sources[name]
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "sources", r"sources/%s\.cu \(artifact policy/softmax-37x1537 round 0\): file not found at "
                 % re.escape(name[:-3]), only={"sources"})


def test_unknown_variant_in_a_record(tmp_path, run):
    doc, sources = run
    find_record(doc, SOFTMAX, "torch", 1)["variant"] = "mystery"
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "coverage", r"record softmax-37x1537/mystery/round 1: unknown variant \"mystery\"")
    assert_fails(res, "coverage", r"record softmax-37x1537/torch/round 1: missing")


def test_unknown_case_and_round_out_of_range(tmp_path, run):
    doc, sources = run
    find_record(doc, SOFTMAX, "torch", 1)["case"] = "softmax-1x1"
    find_record(doc, LN, "policy", 2)["round"] = 4
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "coverage", r"record softmax-1x1/torch/round 1: unknown case \"softmax-1x1\"")
    assert_fails(res, "coverage", r"record layer_norm-8x65536/policy/round 4: round 4 outside \[0, 4\)")


def test_family_not_in_config(tmp_path, run):
    doc, sources = run
    doc["config"]["families"].remove("stream_time")
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "samples", r"family \"stream_time\" is not in config.families")
    assert_fails(res, "summary", r"summary .*/stream_time: family \"stream_time\" is not in config.families")


def test_family_absent_from_a_record(tmp_path, run):
    doc, sources = run
    del find_record(doc, RMS, "policy", 0)["families"]["latency"]
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "samples", r"record rms_norm-4096x4096/policy/round 0: family latency absent")


def test_cpu_backend_with_gpu_samples(tmp_path):
    doc, sources = make_run.build_run(backend="cpu")
    cuda_doc, _ = make_run.build_run(backend="cuda")
    doc["records"][0]["families"]["gpu_time"] = cuda_doc["records"][0]["families"]["gpu_time"]
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "samples", r"gpu_time has measurements on the cpu backend")


def test_duplicate_variant_names(tmp_path, run):
    doc, sources = run
    doc["config"]["variants"].append(copy.deepcopy(doc["config"]["variants"][0]))
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "config", r"variant name \"policy\" is declared more than once", only={"config"})


def test_wrong_schema_string(tmp_path, run):
    doc, sources = run
    doc["schema"] = "tile-repeat/2"
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "schema", r"schema is \"tile-repeat/2\", expected \"tile-repeat/1\"", only={"schema"})


def test_missing_schema_and_not_an_object(tmp_path, run):
    doc, sources = run
    del doc["schema"]
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "schema", r"no 'schema' field")
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]")
    res = invoke(path)
    assert_fails(res, "schema", r"document is a list, not a JSON object")


def test_listing_is_capped_at_50_per_check(tmp_path, run):
    doc, sources = run
    for rec in doc["records"]:
        for fam in rec["families"].values():
            fam["median"] += 1.0
    res = audit_run(tmp_path, doc, sources)
    n = N_RECORDS * 4
    assert_fails(res, "statistics", r"median .* stored")
    assert len(res.problems("statistics")) == n  # the JSON verdict lists them all
    listed = [l for l in res.out.splitlines() if l.startswith("  - record ")]
    assert len(listed) == 50
    assert "  ... and %d more" % (n - 50) in res.out.splitlines()
    assert re.search(r"^statistics +FAIL +%d checked, %d problems" % (n, n), res.out, re.M)
    assert res.out.strip().splitlines()[-1] == "audit: FAIL (%d problems)" % n


# --------------------------------------------------------------------------------------------
# Sources folder handling and unreadable input.


def test_no_sources_folder_is_skipped_unless_required(tmp_path, run):
    doc, _ = run
    path = make_run.write_run(str(tmp_path / "nosrc"), doc, None)
    res = invoke(path)
    assert res.rc == 0, res
    assert res.status("sources") == "SKIP"
    assert re.search(r"^sources +SKIP .*skipped: no sources folder at", res.out, re.M)
    res = invoke(path, "--require-sources")
    assert_fails(res, "sources", r"no sources folder at .*--require-sources", only={"sources"})


def test_sources_option_points_elsewhere(tmp_path, run):
    doc, sources = run
    path = make_run.write_run(str(tmp_path / "a"), doc, sources)
    elsewhere = tmp_path / "kept_sources"
    shutil.move(os.path.join(os.path.dirname(path), "sources"), str(elsewhere))
    res = invoke(path, "--sources", str(elsewhere), "--require-sources")
    assert res.rc == 0, res
    assert res.status("sources") == "PASS"
    # and a tampered file there is caught
    name = sorted(os.listdir(str(elsewhere)))[0]
    (elsewhere / name).write_bytes(b"tampered")
    res = invoke(path, "--sources", str(elsewhere))
    assert_fails(res, "sources", r"does not match source_sha256", only={"sources"})


def test_source_file_escaping_the_run_folder(tmp_path, run):
    doc, sources = run
    artifact(doc, "policy", RMS, 2)["source_file"] = "../../etc/passwd"
    res = audit_run(tmp_path, doc, sources)
    assert_fails(res, "sources", r"not a relative path inside the run folder")


def test_missing_file_is_unreadable(tmp_path):
    res = invoke(tmp_path / "nope.json")
    assert res.rc == 2, res
    assert "cannot read" in res.err
    assert res.verdict["verdict"] == "UNREADABLE"


def test_invalid_json_is_unreadable(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"schema": "tile-repeat/1", ')
    res = invoke(path)
    assert res.rc == 2, res
    assert "invalid JSON" in res.err


def test_json_verdict_lists_checks_and_problems(tmp_path, run):
    doc, sources = run
    find_record(doc, SOFTMAX, "policy", 0)["oracle"]["passed"] = False
    res = audit_run(tmp_path, doc, sources)
    v = res.verdict
    assert v["verdict"] == "FAIL" and v["problems"] == 1
    assert v["counts"] == {"records": N_RECORDS, "rounds": 4, "variants": 3, "cases": 3}
    oracle = [c for c in v["checks"] if c["name"] == "oracle"][0]
    assert oracle["rule"] == "2" and oracle["status"] == "FAIL" and oracle["checked"] == N_RECORDS
    assert oracle["problems"][0].startswith("record softmax-37x1537/policy/round 0: oracle failed")


# --------------------------------------------------------------------------------------------
# Direct calls: the statistics and the tolerance.


def test_median_rule():
    assert audit_mod.median([3.0, 1.0, 2.0]) == 2.0
    assert audit_mod.median([4.0, 1.0, 3.0, 2.0]) == 2.5  # mean of the two middle values
    assert audit_mod.median([5.0]) == 5.0
    assert audit_mod.mean([1.0, 2.0, 4.0]) == pytest.approx(7.0 / 3.0, rel=1e-15)
    with pytest.raises(ValueError):
        audit_mod.median([])


def test_tolerance():
    assert audit_mod.close(1.0, 1.0 + 5e-10)
    assert not audit_mod.close(1.0, 1.0 + 5e-9)
    assert audit_mod.close(0.0, 5e-13)
    assert not audit_mod.close(0.0, 5e-12)


def test_direct_audit_within_and_beyond_tolerance(run):
    doc, _ = run
    v = audit_mod.audit(doc)  # no path: the sources check finds no folder and skips
    assert v.passed, "\n".join(v.lines())
    fam = doc["records"][0]["families"]["throughput"]
    fam["mean"] *= 1 + 1e-11
    assert audit_mod.audit(doc).passed
    fam["mean"] *= 1 + 1e-7
    v = audit_mod.audit(doc)
    assert not v.passed
    assert v.final_line == "audit: FAIL (1 problem)"


def test_direct_audit_of_garbage_does_not_crash():
    for doc in (None, 3, "x", [], {}, {"schema": "tile-repeat/1", "config": [], "records": {}},
                {"schema": "tile-repeat/1", "config": {"cases": [None], "variants": [{"name": 1}],
                                                       "rounds": "4", "order": "ABBA"},
                 "records": [None, {"case": 1}], "summary": [3], "artifacts": {"x": []}}):
        v = audit_mod.audit(doc)
        assert not v.passed
        assert v.problem_count > 0
        assert not any("could not complete" in p for c in v.checks for p in c.problems), v.lines()
