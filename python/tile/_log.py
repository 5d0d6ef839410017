"""Reports of JIT compiles: the logger "tile" and TILE_LOG.

Every launch asks the extension for the record of a call that compiled or loaded its kernel
(`events=True`: a record only when cache_origin is not "launch-cache", so a call that reuses
a loaded kernel builds nothing). Each such record is logged at INFO on the logger "tile":
kernel, plan, milliseconds and whether a cache held the binary. TILE_LOG=1 in the environment
(read at import) sends these lines to stderr; otherwise configure the logger as any other.
tile.precompile collects the same records while it runs.
"""
import json
import logging
import os
import sys

logger = logging.getLogger("tile")

# cache_origin -> words for the log: how this call obtained the kernel binary.
_ORIGINS = {
    "compiled": "compiled with NVRTC (cache miss)",
    "disk": "read from the disk cache (cache hit)",
    "memory": "taken from the memory cache (cache hit)",
}

# Lists that tile.precompile reads: each open collection receives every event.
_collectors = []


def configure_from_environment(environ=os.environ):
    """TILE_LOG=1 (or info, debug): a handler on "tile" printing to stderr, once."""
    value = environ.get("TILE_LOG", "").strip().lower()
    if value in ("", "0", "false", "off", "no"):
        return
    if not any(getattr(h, "_tile_env", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("tile: %(message)s"))
        handler._tile_env = True
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if value == "debug" else logging.INFO)


def event(op, rec):
    """Reports a launch record whose kernel was compiled or loaded by the call."""
    origin = rec.get("cache_origin", "")
    if not origin or origin == "launch-cache":
        return
    entry = {"op": op, "kernel": rec.get("kernel_name", ""), "cache_origin": origin,
             "cache_hit": origin != "compiled", "compile_ms": rec.get("compile_ms", 0.0),
             "arch": rec.get("arch", ""), "plan": rec.get("plan")}
    for c in _collectors:
        c.append(entry)
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s: kernel %s %s in %.1f ms for %s; plan %s", op, entry["kernel"],
                    _ORIGINS.get(origin, origin), entry["compile_ms"], entry["arch"] or "the device",
                    json.dumps(entry["plan"], separators=(",", ":")))


class collect:
    """A context that gathers the events of the calls made inside it (tile.precompile)."""

    def __enter__(self):
        self.events = []
        _collectors.append(self.events)
        return self.events

    def __exit__(self, *exc):
        _collectors.remove(self.events)
        return False
