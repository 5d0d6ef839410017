#!/usr/bin/env python3
"""Independent audit of a saved benchmark run (schema ``tile-repeat/1``).

    python bench/audit.py RUN.json [--sources DIR] [--require-sources] [--json OUT]

The audit shares nothing with the runner (``bench/repeat.py``) but ``bench/SCHEMA.md``: it
re-derives every statistic from the raw samples and checks the rules stated there, plus the
consistency of the document with itself (declared cases and variants, round indices, families,
the source files the artifacts name).

Output: one line per check group (PASS / FAIL / SKIP with counts), each problem listed
specifically (at most 50 lines per group, then a count of the rest), and a final line
``audit: PASS (N records, R rounds, V variants, C cases)`` or ``audit: FAIL (k problems)``.

Exit status: 0 pass, 1 any failure (a wrong schema string included), 2 unreadable input
(missing or unreadable file, invalid JSON).

Pure standard library; Python >= 3.8.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
from datetime import datetime

SCHEMA = "tile-repeat/1"
FAMILIES = ("throughput", "latency", "gpu_time", "stream_time")
STATS = ("median", "min", "max", "mean")
KINDS = ("native", "torch_eager")
BACKENDS = ("cuda", "cpu")
REL_TOL = 1e-9
ABS_TOL = 1e-12
LIST_CAP = 50

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_UNREADABLE = 2

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


# --------------------------------------------------------------------------------------------
# Statistics, exactly as SCHEMA.md and the audit's brief define them.


def median(values):
    """Median; of an even count, the mean of the two middle values."""
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("median of no values")
    mid = n // 2
    if n % 2:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2.0


def mean(values):
    """Arithmetic mean (summed without rounding drift)."""
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)


def close(stored, recomputed):
    """Relative tolerance 1e-9, absolute 1e-12 near zero."""
    return math.isclose(stored, recomputed, rel_tol=REL_TOL, abs_tol=ABS_TOL)


# --------------------------------------------------------------------------------------------
# Small helpers.


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_finite(x):
    return is_num(x) and math.isfinite(x)


def is_hex64(x):
    return isinstance(x, str) and _HEX64.match(x) is not None


def show(x, limit=80):
    """A value as it appears in a message."""
    if is_num(x):
        if isinstance(x, float):
            if math.isnan(x):
                return "NaN"
            if math.isinf(x):
                return "Infinity" if x > 0 else "-Infinity"
        return format(x, ".12g")
    try:
        text = json.dumps(x, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def type_name(x):
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "a boolean"
    if is_int(x):
        return "an integer"
    if isinstance(x, float):
        return "a number"
    if isinstance(x, str):
        return "a string"
    if isinstance(x, list):
        return "a list"
    if isinstance(x, dict):
        return "an object"
    return type(x).__name__


def plural(n, word, many=None):
    return "%d %s" % (n, word if n == 1 else (many or word + "s"))


def parse_time(text):
    """ISO-8601 time (a trailing Z accepted), or None."""
    if not isinstance(text, str) or not text:
        return None
    t = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    # Python < 3.11 accepts only 3 or 6 fraction digits: normalise to 6.
    m = re.match(r"^(.*[T ]\d\d:\d\d:\d\d)\.(\d+)(.*)$", t)
    if m:
        t = "%s.%s%s" % (m.group(1), (m.group(2) + "000000")[:6], m.group(3))
    try:
        return datetime.fromisoformat(t)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# Check groups.


class Check:
    """One check group: how many things it examined and what it found wrong."""

    def __init__(self, name, rule, title):
        self.name = name
        self.rule = rule  # "1".."6" for SCHEMA.md's rules, "" for the audit's own checks
        self.title = title
        self.checked = 0
        self.problems = []
        self.skip_reason = None
        self.skip_is_failure = False
        self.info = None  # a remark on what was not examined

    def fail(self, message):
        self.problems.append(message)

    def skip(self, reason, failure=True):
        self.skip_reason = reason
        self.skip_is_failure = failure

    @property
    def status(self):
        if self.problems:
            return "FAIL"
        if self.skip_reason is not None:
            return "SKIP"
        return "PASS"

    def as_json(self):
        out = {
            "name": self.name,
            "rule": self.rule,
            "title": self.title,
            "status": self.status,
            "checked": self.checked,
            "problems": list(self.problems),
        }
        if self.skip_reason is not None:
            out["skipped"] = self.skip_reason
        if self.info is not None:
            out["info"] = self.info
        return out


class Run:
    """The document with the parts the checks share, validated once."""

    def __init__(self, doc, path, sources_dir, require_sources):
        self.doc = doc
        self.path = path
        self.run_dir = os.path.dirname(os.path.abspath(path)) if path else None
        self.sources_dir = sources_dir
        self.require_sources = require_sources
        self.notes = []
        # Filled by check_document / check_config; None where unusable.
        self.config = None
        self.case_ids = None  # ordered unique case ids
        self.variants = None  # ordered {name: kind}
        self.requested_plans = {}  # native variant -> requested plan fields (a dict)
        self.rounds = None
        self.samples = None
        self.families = None
        self.backend = None
        self.records = []  # [(index, record)] with usable case/variant/round
        self.usable = set()  # indices of those records
        self.all_records = []  # [(index, record)] every record that is an object
        self.summary = []  # [(index, entry)] with usable case/variant/family
        self.artifacts = None


def record_label(rec):
    return "record %s/%s/round %d" % (rec["case"], rec["variant"], rec["round"])


def label_of(run, i, rec):
    return record_label(rec) if i in run.usable else "records[%d]" % i


def check_schema(run):
    c = Check("schema", "1", "schema string")
    c.checked = 1
    doc = run.doc
    if not isinstance(doc, dict):
        c.fail("document is %s, not a JSON object" % type_name(doc))
    elif "schema" not in doc:
        c.fail("no 'schema' field (expected %s)" % show(SCHEMA))
    elif doc["schema"] != SCHEMA:
        c.fail("schema is %s, expected %s" % (show(doc["schema"]), show(SCHEMA)))
    return c


TOP_FIELDS = (
    ("schema", str),
    ("created", str),
    ("finished", str),
    ("provenance", dict),
    ("config", dict),
    ("artifacts", dict),
    ("records", list),
    ("summary", list),
)


def check_document(run):
    c = Check("document", "", "top-level fields, record and summary entry shapes")
    doc = run.doc
    if not isinstance(doc, dict):
        c.skip("the document is not a JSON object (see schema)")
        return c
    c.checked = 1
    for key, typ in TOP_FIELDS:
        if key not in doc:
            c.fail("missing top-level field '%s'" % key)
        elif not isinstance(doc[key], typ):
            c.fail("top-level '%s' is %s, expected %s" % (key, type_name(doc[key]), type_name(typ())))
    if isinstance(doc.get("config"), dict):
        run.config = doc["config"]
    if isinstance(doc.get("artifacts"), dict):
        run.artifacts = doc["artifacts"]

    records = doc.get("records")
    if isinstance(records, list):
        for i, rec in enumerate(records):
            c.checked += 1
            where = "records[%d]" % i
            if not isinstance(rec, dict):
                c.fail("%s is %s, not an object" % (where, type_name(rec)))
                continue
            run.all_records.append((i, rec))
            usable = True
            for key, ok, want in (
                ("case", lambda v: isinstance(v, str), "a string"),
                ("variant", lambda v: isinstance(v, str), "a string"),
                ("round", is_int, "an integer"),
                ("position", is_int, "an integer"),
                ("oracle", lambda v: isinstance(v, dict), "an object"),
                ("families", lambda v: isinstance(v, dict), "an object"),
            ):
                if key not in rec:
                    c.fail("%s: missing '%s'" % (where, key))
                    usable = usable and key not in ("case", "variant", "round")
                elif not ok(rec[key]):
                    c.fail("%s: '%s' is %s, expected %s" % (where, key, show(rec[key]), want))
                    usable = usable and key not in ("case", "variant", "round")
            if usable:
                run.records.append((i, rec))
                run.usable.add(i)

    summary = doc.get("summary")
    if isinstance(summary, list):
        for i, ent in enumerate(summary):
            c.checked += 1
            where = "summary[%d]" % i
            if not isinstance(ent, dict):
                c.fail("%s is %s, not an object" % (where, type_name(ent)))
                continue
            usable = True
            for key in ("case", "variant", "family"):
                if not isinstance(ent.get(key), str):
                    c.fail("%s: '%s' is %s, expected a string" % (where, key, show(ent.get(key))))
                    usable = False
            for key in ("median", "round_min", "round_max"):
                if key not in ent:
                    c.fail("%s: missing '%s'" % (where, key))
                elif not is_num(ent[key]):
                    c.fail("%s: '%s' is %s, expected a number" % (where, key, show(ent[key])))
            if usable:
                run.summary.append((i, ent))
    return c


def check_config(run):
    c = Check("config", "", "declared cases, variants (unique names), rounds, samples, families")
    cfg = run.config
    if cfg is None:
        c.skip("no usable config object")
        return c

    cases = cfg.get("cases")
    if not isinstance(cases, list) or not cases:
        c.fail("config.cases is %s, expected a non-empty list" % show(cases))
    else:
        ids = []
        for i, case in enumerate(cases):
            c.checked += 1
            where = "config.cases[%d]" % i
            if not isinstance(case, dict):
                c.fail("%s is %s, not an object" % (where, type_name(case)))
                continue
            cid = case.get("id")
            if not isinstance(cid, str) or not cid:
                c.fail("%s: 'id' is %s, expected a non-empty string" % (where, show(cid)))
                continue
            where = "case %s" % cid
            if cid in ids:
                c.fail("%s: declared more than once" % where)
                continue
            ids.append(cid)
            for key in ("op", "dtype"):
                if not isinstance(case.get(key), str) or not case.get(key):
                    c.fail("%s: '%s' is %s, expected a non-empty string" % (where, key, show(case.get(key))))
            for key in ("rows", "cols"):
                if not is_int(case.get(key)) or case.get(key) < 1:
                    c.fail("%s: '%s' is %s, expected a positive integer" % (where, key, show(case.get(key))))
        run.case_ids = ids

    variants = cfg.get("variants")
    if not isinstance(variants, list) or not variants:
        c.fail("config.variants is %s, expected a non-empty list" % show(variants))
    else:
        kinds = {}
        for i, var in enumerate(variants):
            c.checked += 1
            where = "config.variants[%d]" % i
            if not isinstance(var, dict):
                c.fail("%s is %s, not an object" % (where, type_name(var)))
                continue
            name = var.get("name")
            if not isinstance(name, str) or not name:
                c.fail("%s: 'name' is %s, expected a non-empty string" % (where, show(name)))
                continue
            if name in kinds:
                c.fail("variant name %s is declared more than once (config.variants[%d])" % (show(name), i))
                continue
            kind = var.get("kind")
            if kind not in KINDS:
                c.fail("variant %s: kind %s, expected one of %s" % (name, show(kind), ", ".join(KINDS)))
            kinds[name] = kind
            if "plan" not in var:
                c.fail("variant %s: missing 'plan' (plan fields, \"policy\" or null)" % name)
            else:
                plan = var["plan"]
                if isinstance(plan, dict):
                    run.requested_plans[name] = plan
                elif plan is not None and plan != "policy":
                    c.fail("variant %s: plan is %s, expected plan fields, \"policy\" or null" % (name, show(plan)))
        run.variants = kinds

    for key, minimum in (("rounds", 1), ("samples", 1)):
        c.checked += 1
        v = cfg.get(key)
        if not is_int(v) or v < minimum:
            c.fail("config.%s is %s, expected an integer >= %d" % (key, show(v), minimum))
        else:
            setattr(run, key, v)
    for key, positive in (("warmup_ms", False), ("target_sample_ms", True)):
        c.checked += 1
        v = cfg.get(key)
        if not is_finite(v) or v < 0 or (positive and v == 0):
            c.fail("config.%s is %s, expected a finite %s number"
                   % (key, show(v), "positive" if positive else "non-negative"))

    fams = cfg.get("families")
    c.checked += 1
    if not isinstance(fams, list) or not fams:
        c.fail("config.families is %s, expected a non-empty list" % show(fams))
    else:
        seen = []
        for f in fams:
            if not isinstance(f, str):
                c.fail("config.families lists %s, expected a family name" % show(f))
            elif f in seen:
                c.fail("config.families lists %s more than once" % show(f))
            else:
                if f not in FAMILIES:
                    c.fail("config.families lists unknown family %s (known: %s)" % (show(f), ", ".join(FAMILIES)))
                seen.append(f)
        run.families = seen
    return c


def check_provenance(run):
    c = Check("provenance", "", "provenance fields, backend, gpu, times")
    doc = run.doc
    if not isinstance(doc, dict):
        c.skip("document is not an object")
        return c

    for key in ("created", "finished"):
        c.checked += 1
        if key in doc and isinstance(doc[key], str) and parse_time(doc[key]) is None:
            c.fail("%s %s is not an ISO-8601 time" % (key, show(doc[key])))
    t0, t1 = parse_time(doc.get("created")), parse_time(doc.get("finished"))
    if t0 is not None and t1 is not None:
        try:
            if t1 < t0:
                c.fail("finished %s is before created %s" % (show(doc["finished"]), show(doc["created"])))
        except TypeError:
            c.fail("created and finished mix times with and without a UTC offset")

    prov = doc.get("provenance")
    if not isinstance(prov, dict):
        c.skip("no provenance object")
        return c

    def want(obj, where, key, ok, what):
        c.checked += 1
        if not isinstance(obj, dict):
            return None
        if key not in obj:
            c.fail("%s: missing '%s'" % (where, key))
            return None
        if not ok(obj[key]):
            c.fail("%s.%s is %s, expected %s" % (where, key, show(obj[key]), what))
            return None
        return obj[key]

    s = lambda v: isinstance(v, str)
    s_or_null = lambda v: v is None or isinstance(v, str)
    d = lambda v: isinstance(v, dict)
    str_list = lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)
    load3 = lambda v: isinstance(v, list) and len(v) == 3 and all(is_finite(x) and x >= 0 for x in v)
    procs = lambda v: isinstance(v, list) and all(
        isinstance(p, dict) and is_int(p.get("pid")) and isinstance(p.get("name"), str) for p in v)
    clocks = lambda v: isinstance(v, dict) and is_int(v.get("sm_mhz")) and is_int(v.get("mem_mhz"))

    backend = want(prov, "provenance", "backend", lambda v: v in BACKENDS, "one of " + ", ".join(BACKENDS))
    run.backend = backend
    want(prov, "provenance", "command", lambda v: str_list(v) and len(v) > 0, "a non-empty list of strings")
    host = want(prov, "provenance", "host", d, "an object")
    if host is not None:
        want(host, "provenance.host", "hostname", s, "a string")
        want(host, "provenance.host", "cpu_count", lambda v: is_int(v) and v >= 1, "a positive integer")
        want(host, "provenance.host", "load_before", load3, "three non-negative load averages")
        want(host, "provenance.host", "load_after", load3, "three non-negative load averages")

    c.checked += 1
    if "gpu" not in prov:
        c.fail("provenance: missing 'gpu' (null on the cpu backend)")
    else:
        gpu = prov["gpu"]
        if backend == "cpu" and gpu is not None:
            c.fail("provenance.gpu is %s on the cpu backend, expected null" % type_name(gpu))
        elif backend == "cuda" and not isinstance(gpu, dict):
            c.fail("provenance.gpu is %s on the cuda backend, expected an object" % show(gpu))
        elif isinstance(gpu, dict):
            g = "provenance.gpu"
            want(gpu, g, "name", s, "a string")
            want(gpu, g, "uuid", s, "a string")
            want(gpu, g, "sm_count", lambda v: is_int(v) and v >= 1, "a positive integer")
            want(gpu, g, "driver", s, "a string")
            want(gpu, g, "clocks_before", clocks, "{sm_mhz: int, mem_mhz: int}")
            want(gpu, g, "clocks_after", clocks, "{sm_mhz: int, mem_mhz: int}")
            want(gpu, g, "throttle_reasons_before", str_list, "a list of strings")
            want(gpu, g, "throttle_reasons_after", str_list, "a list of strings")
            before = want(gpu, g, "other_processes_before", procs, "a list of {pid, name}")
            after = want(gpu, g, "other_processes_after", procs, "a list of {pid, name}")
            if (before or after) and prov.get("refused_or_marked") is None:
                run.notes.append("other GPU processes were present (%d before, %d after) but the run is not marked"
                                 % (len(before or []), len(after or [])))

    versions = want(prov, "provenance", "versions", d, "an object")
    if versions is not None:
        for key in ("python", "numpy", "tile"):
            want(versions, "provenance.versions", key, s, "a string")
        for key in ("torch", "nvrtc", "cuda_driver"):  # nvrtc: null in a build without CUDA
            want(versions, "provenance.versions", key, s_or_null, "a string or null")
    lib = want(prov, "provenance", "library", d, "an object")
    if lib is not None:
        want(lib, "provenance.library", "path", s, "a string")
        want(lib, "provenance.library", "sha256", is_hex64, "a SHA-256 (64 lowercase hex digits)")
    git = want(prov, "provenance", "git", d, "an object")
    if git is not None:
        want(git, "provenance.git", "commit", s, "a string")
        want(git, "provenance.git", "dirty", lambda v: isinstance(v, bool), "a boolean")
    marked = want(prov, "provenance", "refused_or_marked", s_or_null, "null or a string")
    if isinstance(marked, str):
        run.notes.append("run is marked: %s" % marked)
    return c


def check_oracle(run):
    c = Check("oracle", "2", "every record's oracle passed")
    for i, rec in run.all_records:
        oracle = rec.get("oracle")
        if not isinstance(oracle, dict):
            continue  # reported by the document check
        c.checked += 1
        label = label_of(run, i, rec)
        passed = oracle.get("passed")
        if passed is not True:
            detail = []
            for key in ("mismatches", "checked", "max_abs_error", "max_rel_error"):
                if key in oracle:
                    detail.append("%s %s" % (key, show(oracle[key])))
            c.fail("%s: oracle failed (passed %s%s)"
                   % (label, show(passed), "; " + ", ".join(detail) if detail else ""))
            continue
        if not is_int(oracle.get("checked")) or oracle["checked"] < 1:
            c.fail("%s: oracle.checked is %s, expected a positive integer" % (label, show(oracle.get("checked"))))
        mism = oracle.get("mismatches")
        if not is_int(mism) or mism < 0:
            c.fail("%s: oracle.mismatches is %s, expected a non-negative integer" % (label, show(mism)))
        elif mism > 0:
            c.fail("%s: oracle passed with %d mismatches" % (label, mism))
        for key in ("max_abs_error", "max_rel_error"):
            v = oracle.get(key)
            if not is_num(v) or math.isnan(v) or v < 0:
                c.fail("%s: oracle.%s is %s, expected a non-negative number" % (label, key, show(v)))
        if not is_hex64(oracle.get("output_sha256")):
            c.fail("%s: oracle.output_sha256 is %s, expected a SHA-256" % (label, show(oracle.get("output_sha256"))))
    return c


def check_coverage(run):
    c = Check("coverage", "3", "one record per case x variant x round; declared cases, variants, rounds")
    if run.case_ids is None or run.variants is None or run.rounds is None:
        c.skip("config cases, variants or rounds unusable")
        return c
    counts = {}
    for i, rec in run.records:
        label = record_label(rec)
        ok = True
        if rec["case"] not in run.case_ids:
            c.fail("%s: unknown case %s (not in config.cases)" % (label, show(rec["case"])))
            ok = False
        if rec["variant"] not in run.variants:
            c.fail("%s: unknown variant %s (not in config.variants)" % (label, show(rec["variant"])))
            ok = False
        if not 0 <= rec["round"] < run.rounds:
            c.fail("%s: round %d outside [0, %d)" % (label, rec["round"], run.rounds))
            ok = False
        if ok:
            key = (rec["case"], rec["variant"], rec["round"])
            counts[key] = counts.get(key, 0) + 1
    pairs = [(cid, v) for cid in run.case_ids for v in run.variants]
    for r in range(run.rounds):
        missing = [(cid, v) for cid, v in pairs if counts.get((cid, v, r), 0) == 0]
        c.checked += len(pairs)
        if pairs and len(missing) == len(pairs):
            c.fail("round %d: no records at all (all %s missing)" % (r, plural(len(pairs), "case/variant pair")))
        else:
            for cid, v in missing:
                c.fail("record %s/%s/round %d: missing" % (cid, v, r))
        for cid, v in pairs:
            n = counts.get((cid, v, r), 0)
            if n > 1:
                c.fail("record %s/%s/round %d: %d records, expected exactly one" % (cid, v, r, n))
    return c


def usable_samples(fam):
    """The samples of an available family when all are finite numbers, else None."""
    if not isinstance(fam, dict) or "unavailable" in fam:
        return None
    samples = fam.get("samples")
    if not isinstance(samples, list) or not samples or not all(is_finite(x) for x in samples):
        return None
    return samples


def check_samples(run):
    c = Check("samples", "3", "families declared; config.samples finite positive samples each")
    if run.families is None:
        c.skip("config.families unusable")
        return c
    for i, rec in run.all_records:
        fams = rec.get("families")
        if not isinstance(fams, dict):
            continue  # reported by the document check
        label = label_of(run, i, rec)
        for name in fams:
            if name not in run.families:
                c.fail("%s: family %s is not in config.families" % (label, show(name)))
        for name in run.families:
            c.checked += 1
            if name not in fams:
                c.fail("%s: family %s absent (expected null or an object)" % (label, name))
                continue
            fam = fams[name]
            if fam is None:
                continue
            if not isinstance(fam, dict):
                c.fail("%s: %s is %s, expected null or an object" % (label, name, type_name(fam)))
                continue
            if "unavailable" in fam:
                if not isinstance(fam["unavailable"], str) or not fam["unavailable"]:
                    c.fail("%s: %s.unavailable is %s, expected a reason string"
                           % (label, name, show(fam["unavailable"])))
                continue
            if run.backend == "cpu" and name in ("gpu_time", "stream_time"):
                c.fail("%s: %s has measurements on the cpu backend (expected unavailable)" % (label, name))
            lps = fam.get("launches_per_sample")
            if not is_int(lps) or lps < 1:
                c.fail("%s: %s launches_per_sample is %s, expected a positive integer" % (label, name, show(lps)))
            samples = fam.get("samples")
            if not isinstance(samples, list):
                c.fail("%s: %s samples is %s, expected a list" % (label, name, show(samples)))
                continue
            if run.samples is not None and len(samples) != run.samples:
                c.fail("%s: %s has %d samples, expected %d (config.samples)"
                       % (label, name, len(samples), run.samples))
            for k, x in enumerate(samples):
                if not is_finite(x) or x <= 0:
                    what = "not finite" if is_num(x) and not math.isfinite(x) else (
                        "not positive" if is_num(x) else "not a number")
                    c.fail("%s: %s sample %d is %s (%s), expected a finite positive number"
                           % (label, name, k, show(x), what))
    return c


def check_order(run):
    c = Check("order", "4", "ABBA order and record positions")
    if run.variants is None or run.rounds is None or run.config is None:
        c.skip("config variants or rounds unusable")
        return c
    order = run.config.get("order")
    c.checked += 1
    if not isinstance(order, list):
        c.fail("config.order is %s, expected a list of rounds" % show(order))
        return c
    if len(order) != run.rounds:
        c.fail("config.order has %s, expected %d (config.rounds)" % (plural(len(order), "round"), run.rounds))
    rounds = []
    for r, names in enumerate(order):
        c.checked += 1
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            c.fail("order round %d is %s, expected a list of variant names" % (r, show(names)))
            rounds.append(None)
        else:
            rounds.append(names)
    first = rounds[0] if rounds else None
    if first is not None:
        for v in run.variants:
            n = first.count(v)
            if n == 0:
                c.fail("order round 0 lacks variant %s" % show(v))
            elif n > 1:
                c.fail("order round 0 lists variant %s %d times" % (show(v), n))
        for v in sorted(set(first) - set(run.variants)):
            c.fail("order round 0 lists unknown variant %s" % show(v))
    for r in range(1, len(rounds)):
        prev, cur = rounds[r - 1], rounds[r]
        if prev is None or cur is None:
            continue
        if cur != prev[::-1]:
            c.fail("order round %d is %s, not the reverse of round %d %s (expected %s)"
                   % (r, show(cur), r - 1, show(prev), show(prev[::-1])))
    for i, rec in run.records:
        r = rec["round"]
        pos = rec.get("position")
        if not is_int(pos) or not 0 <= r < len(rounds) or rounds[r] is None:
            continue
        c.checked += 1
        names = rounds[r]
        label = record_label(rec)
        if rec["variant"] not in names:
            if rec["variant"] in run.variants:
                c.fail("%s: variant %s is not in round %d's order %s" % (label, show(rec["variant"]), r, show(names)))
            continue  # an unknown variant is reported by the coverage check
        want = names.index(rec["variant"])
        if pos != want:
            c.fail("%s: position %d, but %s is at index %d of round %d's order %s"
                   % (label, pos, show(rec["variant"]), want, r, show(names)))
    return c


def plan_diff(a, b):
    """Differences between two plan objects as 'field A vs B' strings."""
    out = []
    for key in sorted(set(a) | set(b), key=str):
        if key in a and key in b and a[key] == b[key]:
            continue
        out.append("%s %s vs %s" % (key, show(a[key]) if key in a else "absent",
                                    show(b[key]) if key in b else "absent"))
    return out


def iter_artifacts(run):
    """(variant, case, index, entry) for every artifact entry that is an object."""
    arts = run.artifacts
    if not isinstance(arts, dict):
        return
    for v, per_case in arts.items():
        if not isinstance(per_case, dict):
            continue
        for cid, entries in per_case.items():
            if not isinstance(entries, list):
                continue
            for k, e in enumerate(entries):
                if isinstance(e, dict):
                    yield v, cid, k, e


def check_artifacts(run):
    c = Check("artifacts", "5", "one artifact per native variant x case x round; same source, cubin, plan")
    if run.artifacts is None:
        c.skip("no artifacts object")
        return c
    if run.variants is None or run.case_ids is None or run.rounds is None:
        c.skip("config variants, cases or rounds unusable")
        return c
    arts = run.artifacts
    for v in arts:
        if v not in run.variants:
            c.fail("artifacts: unknown variant %s (not in config.variants)" % show(v))
        elif run.variants[v] != "native":
            c.fail("artifacts: variant %s is %s; artifacts are for native variants only" % (show(v), run.variants[v]))
    for v, kind in run.variants.items():
        if kind != "native":
            continue
        if v not in arts:
            c.fail("artifacts: native variant %s has no entry" % show(v))
            continue
        per_case = arts[v]
        if not isinstance(per_case, dict):
            c.fail("artifacts %s is %s, expected an object keyed by case id" % (v, type_name(per_case)))
            continue
        for cid in per_case:
            if cid not in run.case_ids:
                c.fail("artifacts %s: unknown case %s (not in config.cases)" % (v, show(cid)))
        for cid in run.case_ids:
            where = "artifact %s/%s" % (v, cid)
            if cid not in per_case:
                c.fail("%s: missing" % where)
                continue
            entries = per_case[cid]
            if not isinstance(entries, list):
                c.fail("%s is %s, expected a list with one entry per round" % (where, type_name(entries)))
                continue
            by_round = {}
            for k, e in enumerate(entries):
                c.checked += 1
                if not isinstance(e, dict):
                    c.fail("%s entry %d is %s, not an object" % (where, k, type_name(e)))
                    continue
                r = e.get("round")
                if not is_int(r) or not 0 <= r < run.rounds:
                    c.fail("%s entry %d: round %s outside [0, %d)" % (where, k, show(r), run.rounds))
                    continue
                by_round.setdefault(r, []).append(e)
                here = "%s round %d" % (where, r)
                if not isinstance(e.get("plan"), dict):
                    c.fail("%s: plan is %s, expected the resolved plan object" % (here, show(e.get("plan"))))
                if not isinstance(e.get("kernel_name"), str) or not e.get("kernel_name"):
                    c.fail("%s: kernel_name is %s, expected a non-empty string" % (here, show(e.get("kernel_name"))))
                if not is_hex64(e.get("source_sha256")):
                    c.fail("%s: source_sha256 is %s, expected a SHA-256" % (here, show(e.get("source_sha256"))))
                if "cubin_sha256" not in e:
                    c.fail("%s: missing cubin_sha256 (a SHA-256 or null)" % here)
                elif e["cubin_sha256"] is not None and not is_hex64(e["cubin_sha256"]):
                    c.fail("%s: cubin_sha256 is %s, expected a SHA-256 or null" % (here, show(e["cubin_sha256"])))
                opts = e.get("compile_options")
                if not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
                    c.fail("%s: compile_options is %s, expected a list of strings" % (here, show(opts)))
                ms = e.get("compile_ms")
                if not is_finite(ms) or ms < 0:
                    c.fail("%s: compile_ms is %s, expected a finite non-negative number" % (here, show(ms)))
                if isinstance(e.get("source_sha256"), str):
                    want = "sources/%s.cu" % e["source_sha256"]
                    if e.get("source_file") != want:
                        c.fail("%s: source_file is %s, expected %s" % (here, show(e.get("source_file")), show(want)))
                elif not isinstance(e.get("source_file"), str):
                    c.fail("%s: source_file is %s, expected a path" % (here, show(e.get("source_file"))))
            missing = [r for r in range(run.rounds) if r not in by_round]
            if by_round and missing:
                c.fail("%s: no entry for round %s" % (where, ", ".join(str(r) for r in missing)))
            elif not by_round:
                c.fail("%s: no entries (expected one per round)" % where)
            for r in sorted(by_round):
                if len(by_round[r]) > 1:
                    c.fail("%s: %d entries for round %d, expected one" % (where, len(by_round[r]), r))
            if not by_round:
                continue
            r0 = min(by_round)
            ref = by_round[r0][0]
            req = run.requested_plans.get(v)
            if isinstance(req, dict) and isinstance(ref.get("plan"), dict):
                for key in sorted(req):
                    if key not in ref["plan"]:
                        c.fail("%s round %d: resolved plan lacks requested field %s" % (where, r0, key))
                    elif ref["plan"][key] != req[key]:
                        c.fail("%s round %d: plan %s is %s, but config.variants requests %s"
                               % (where, r0, key, show(ref["plan"][key]), show(req[key])))
            for r in sorted(by_round):
                for e in by_round[r]:
                    if e is ref:
                        continue
                    here = "%s round %d" % (where, r)
                    for key in ("source_sha256", "cubin_sha256"):
                        if e.get(key) != ref.get(key):
                            c.fail("%s: %s %s differs from round %d's %s"
                                   % (here, key, show(e.get(key)), r0, show(ref.get(key))))
                    pa, pb = e.get("plan"), ref.get("plan")
                    if isinstance(pa, dict) and isinstance(pb, dict):
                        diff = plan_diff(pa, pb)
                        if diff:
                            c.fail("%s: plan differs from round %d's: %s" % (here, r0, "; ".join(diff)))
                    elif pa != pb:
                        c.fail("%s: plan %s differs from round %d's %s" % (here, show(pa), r0, show(pb)))
    return c


def check_sources(run):
    c = Check("sources", "", "each artifact's source_file exists and hashes to source_sha256")
    if run.sources_dir is not None:
        sources_dir = os.path.abspath(run.sources_dir)
    elif run.run_dir is not None:
        sources_dir = os.path.join(run.run_dir, "sources")
    else:
        sources_dir = None
    if sources_dir is None or not os.path.isdir(sources_dir):
        if sources_dir is None:
            sources_dir = "(no run path given)"
        if run.require_sources:
            c.fail("no sources folder at %s (--require-sources)" % sources_dir)
        else:
            c.skip("no sources folder at %s" % sources_dir, failure=False)
        return c
    hashes = {}  # path -> sha256 or None when unreadable
    reported = set()
    for v, cid, k, e in iter_artifacts(run):
        rel = e.get("source_file")
        expected = e.get("source_sha256")
        here = "artifact %s/%s round %s" % (v, cid, show(e.get("round")))
        if not isinstance(rel, str) or not rel:
            continue  # reported by the artifacts check
        parts = rel.replace("\\", "/").split("/")
        if os.path.isabs(rel) or ".." in parts:
            c.fail("%s: source_file %s is not a relative path inside the run folder" % (here, show(rel)))
            continue
        if parts[0] == "sources" and len(parts) > 1:
            path = os.path.join(sources_dir, *parts[1:])
        elif run.run_dir is not None:
            path = os.path.join(run.run_dir, *parts)
        else:
            c.fail("%s: source_file %s is not under sources/" % (here, show(rel)))
            continue
        if (path, expected) in reported:
            continue
        reported.add((path, expected))
        c.checked += 1
        if path not in hashes:
            try:
                with open(path, "rb") as f:
                    hashes[path] = hashlib.sha256(f.read()).hexdigest()
            except FileNotFoundError:
                hashes[path] = None
                c.fail("%s (%s): file not found at %s" % (rel, here, path))
                continue
            except OSError as err:
                hashes[path] = None
                c.fail("%s (%s): cannot read %s: %s" % (rel, here, path, err.strerror or err))
                continue
        got = hashes[path]
        if got is None:
            continue
        if got != expected:
            c.fail("%s (%s): content SHA-256 %s does not match source_sha256 %s" % (rel, here, got, show(expected)))
    return c


def check_statistics(run):
    c = Check("statistics", "6", "median/min/max/mean recomputed from samples")
    for i, rec in run.all_records:
        fams = rec.get("families")
        if not isinstance(fams, dict):
            continue
        label = label_of(run, i, rec)
        for name in sorted(fams, key=lambda n: (FAMILIES.index(n) if n in FAMILIES else 99, str(n))):
            fam = fams[name]
            samples = usable_samples(fam)
            if samples is None:
                continue  # null, unavailable, or bad samples (reported by the samples check)
            c.checked += 1
            want = {"median": median(samples), "min": min(samples), "max": max(samples), "mean": mean(samples)}
            for stat in STATS:
                got = fam.get(stat)
                if stat not in fam:
                    c.fail("%s: %s %s missing (recomputed %s)" % (label, name, stat, show(want[stat])))
                elif not is_num(got):
                    c.fail("%s: %s %s is %s, recomputed %s" % (label, name, stat, show(got), show(want[stat])))
                elif not close(got, want[stat]):
                    c.fail("%s: %s %s %s stored, %s recomputed"
                           % (label, name, stat, show(got), show(want[stat])))
    return c


def check_summary(run):
    c = Check("summary", "6", "summary entries recomputed from the records' round medians")
    if run.case_ids is None or run.variants is None or run.families is None:
        c.skip("config cases, variants or families unusable")
        return c
    if not isinstance(run.doc, dict) or not isinstance(run.doc.get("summary"), list):
        c.skip("no summary list")
        return c
    medians = {}
    indeterminate = set()
    rounds_seen = {}
    for i, rec in run.records:
        if rec["case"] not in run.case_ids or rec["variant"] not in run.variants:
            continue
        if run.rounds is not None and not 0 <= rec["round"] < run.rounds:
            continue
        rounds_seen.setdefault((rec["case"], rec["variant"]), set()).add(rec["round"])
        fams = rec.get("families")
        if not isinstance(fams, dict):
            continue
        for name in run.families:
            fam = fams.get(name)
            samples = usable_samples(fam)
            key = (rec["case"], rec["variant"], name)
            if samples is not None:
                medians.setdefault(key, []).append(median(samples))
            elif isinstance(fam, dict) and "unavailable" not in fam:
                # Measured, but its samples are unusable (the samples check says why): the
                # round median is unknown, so this entry cannot be recomputed.
                indeterminate.add(key)
    # A case/variant with rounds missing from the records (the coverage check lists them)
    # cannot be recomputed as it was summarised: its entries are not compared.
    if run.rounds is not None:
        for cid in run.case_ids:
            for v in run.variants:
                if len(rounds_seen.get((cid, v), ())) < run.rounds:
                    for name in run.families:
                        indeterminate.add((cid, v, name))
    expected = {}
    for key, meds in medians.items():
        expected[key] = {"median": median(meds), "round_min": min(meds), "round_max": max(meds), "n": len(meds)}
    seen = {}
    not_compared = 0
    for i, ent in run.summary:
        key = (ent["case"], ent["variant"], ent["family"])
        label = "summary %s/%s/%s" % key
        bad = False
        if key[0] not in run.case_ids:
            c.fail("%s: unknown case %s" % (label, show(key[0])))
            bad = True
        if key[1] not in run.variants:
            c.fail("%s: unknown variant %s" % (label, show(key[1])))
            bad = True
        if key[2] not in run.families:
            c.fail("%s: family %s is not in config.families" % (label, show(key[2])))
            bad = True
        c.checked += 1
        if bad:
            continue
        if key in seen:
            c.fail("%s: listed more than once (summary[%d] and summary[%d])" % (label, seen[key], i))
            continue
        seen[key] = i
        if key in indeterminate:
            not_compared += 1
            c.checked -= 1
            continue
        if key not in expected:
            c.fail("%s: no round of the records has samples of this family to summarise" % label)
            continue
        want = expected[key]
        for stat in ("median", "round_min", "round_max"):
            got = ent.get(stat)
            if not is_num(got):
                continue  # reported by the document check
            if not close(got, want[stat]):
                c.fail("%s: %s %s stored, %s recomputed from %s"
                       % (label, stat, show(got), show(want[stat]), plural(want["n"], "round median")))
    for key in sorted(expected, key=lambda k: (str(k[0]), str(k[1]), str(k[2]))):
        if key not in seen and key not in indeterminate:
            c.checked += 1
            c.fail("summary %s/%s/%s: missing (%s in the records)"
                   % (key + (plural(expected[key]["n"], "round median"),)))
    if not_compared:
        c.info = "%s not recomputed: records incomplete or samples unusable" % plural(not_compared, "entry", "entries")
    return c


CHECKS = (
    check_schema,
    check_document,
    check_config,
    check_provenance,
    check_oracle,
    check_coverage,
    check_samples,
    check_order,
    check_artifacts,
    check_sources,
    check_statistics,
    check_summary,
)


class Verdict:
    def __init__(self, run, checks):
        self.run = run
        self.checks = checks
        self.problem_count = sum(len(c.problems) for c in checks)
        # A check that could not run because of a broken prerequisite is a failure too; its
        # prerequisite's check has reported the cause, so it adds no problem of its own unless
        # nothing else did.
        blocked = [c for c in checks if c.status == "SKIP" and c.skip_is_failure]
        if blocked and self.problem_count == 0:
            self.problem_count = len(blocked)
        self.passed = self.problem_count == 0
        doc = run.doc if isinstance(run.doc, dict) else {}
        records = doc.get("records")
        self.counts = {
            "records": len(records) if isinstance(records, list) else 0,
            "rounds": run.rounds or 0,
            "variants": len(run.variants) if run.variants is not None else 0,
            "cases": len(run.case_ids) if run.case_ids is not None else 0,
        }

    @property
    def final_line(self):
        if self.passed:
            return "audit: PASS (%d records, %d rounds, %d variants, %d cases)" % (
                self.counts["records"], self.counts["rounds"], self.counts["variants"], self.counts["cases"])
        return "audit: FAIL (%s)" % plural(self.problem_count, "problem")

    def lines(self, cap=LIST_CAP):
        out = []
        width = max(len(c.name) for c in self.checks)
        for c in self.checks:
            head = "%-*s %s  %d checked, %s  [%s: %s]" % (
                width, c.name, c.status, c.checked, plural(len(c.problems), "problem"),
                "rule " + c.rule if c.rule else "extra", c.title)
            if c.skip_reason is not None and not c.problems:
                head += " (skipped: %s)" % c.skip_reason
            if c.info:
                head += " (%s)" % c.info
            out.append(head)
            for p in c.problems[:cap]:
                out.append("  - " + p)
            if len(c.problems) > cap:
                out.append("  ... and %d more" % (len(c.problems) - cap))
        for n in self.run.notes:
            out.append("note: " + n)
        out.append(self.final_line)
        return out

    def as_json(self):
        return {
            "tool": "bench/audit.py",
            "schema": SCHEMA,
            "run": self.run.path,
            "verdict": "PASS" if self.passed else "FAIL",
            "problems": self.problem_count,
            "counts": self.counts,
            "notes": list(self.run.notes),
            "checks": [c.as_json() for c in self.checks],
            "summary_line": self.final_line,
        }


def audit(doc, path=None, sources_dir=None, require_sources=False):
    """Audits a parsed run document; `path` locates the run folder (for sources/)."""
    run = Run(doc, path, sources_dir, require_sources)
    checks = []
    for fn in CHECKS:
        try:
            checks.append(fn(run))
        except Exception as err:  # a malformed document the checks did not foresee
            c = Check(fn.__name__[len("check_"):], "", "")
            c.fail("could not complete this check on this document: %s: %s" % (type(err).__name__, err))
            checks.append(c)
    return Verdict(run, checks)


def load(path):
    """The parsed document, or raises OSError / ValueError for unreadable input."""
    with open(path, "rb") as f:
        data = f.read()
    return json.loads(data.decode("utf-8"))


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="audit.py", description="Audit a saved tile-repeat/1 benchmark run (bench/SCHEMA.md).")
    ap.add_argument("run", metavar="RUN.json", help="the run document")
    ap.add_argument("--sources", metavar="DIR",
                    help="folder holding the sources/<sha256>.cu files (default: sources/ next to RUN.json)")
    ap.add_argument("--require-sources", action="store_true",
                    help="fail when the sources folder does not exist (default: skip that check)")
    ap.add_argument("--json", metavar="OUT", help="also write the verdict as JSON to OUT")
    args = ap.parse_args(argv)

    try:
        doc = load(args.run)
    except (OSError, ValueError) as err:
        if isinstance(err, OSError):
            reason = err.strerror or str(err)
        else:
            reason = "invalid JSON: %s" % err
        print("audit: cannot read %s: %s" % (args.run, reason), file=sys.stderr)
        print("audit: UNREADABLE (%s)" % args.run)
        if args.json:
            try:
                write_json(args.json, {"tool": "bench/audit.py", "schema": SCHEMA, "run": args.run,
                                       "verdict": "UNREADABLE", "error": reason, "problems": None, "checks": []})
            except OSError:
                pass
        return EXIT_UNREADABLE

    verdict = audit(doc, args.run, args.sources, args.require_sources)
    print("audit of %s" % args.run)
    for line in verdict.lines():
        print(line)
    if args.json:
        try:
            write_json(args.json, verdict.as_json())
        except OSError as err:
            print("audit: cannot write %s: %s" % (args.json, err.strerror or err), file=sys.stderr)
            return EXIT_UNREADABLE
    return EXIT_PASS if verdict.passed else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
