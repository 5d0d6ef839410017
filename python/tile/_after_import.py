"""Runs a function right after a module is first imported: tile's custom ops are defined as
soon as torch is loaded, even when torch is imported after tile (as `import tile, torch`
sorts), so that a first call traced by torch.compile finds them.

A finder at the head of sys.meta_path answers for that one module only: it asks the finders
after it for the module's spec and wraps the loader's exec_module, then removes itself. Any
failure of the function is reported as a warning and never fails the import.
"""
import sys
import warnings


class _After:
    def __init__(self, name, fn):
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        self._remove()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec
        fn = self.fn

        def exec_then_call(module):
            exec_module(module)
            try:
                fn(module)
            except Exception as e:  # noqa: BLE001 - the import itself must not fail for tile
                warnings.warn(f"tile: setting up the torch integration failed ({type(e).__name__}: {e})",
                              RuntimeWarning, stacklevel=2)

        loader.exec_module = exec_then_call
        return spec

    def _remove(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def call_after_import(name, fn):
    """fn(module) once `name` has been imported; at once if it already is."""
    module = sys.modules.get(name)
    if module is not None:
        fn(module)
        return
    sys.meta_path.insert(0, _After(name, fn))
