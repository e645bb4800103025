"""pytest set-up shared by tests/ and the notebooks checked with nbval.

nbdev-clean removes execution counts from committed notebooks, and nbval treats a cell without one
as never run (it then refuses stored outputs). The notebooks are read here with their code cells
numbered, so nbval compares every stored output with what the cell prints now.
"""
import types
import nbformat

def _read_numbered(path, as_version=4, **kw):
    nb = nbformat.read(path, as_version=as_version, **kw)
    for i, c in enumerate((c for c in nb.cells if c.cell_type == 'code'), 1): c.execution_count = i
    return nb

try:
    import nbval.plugin as _nbval
    _nbval.nbformat = types.SimpleNamespace(**{k: getattr(nbformat, k) for k in dir(nbformat) if not k.startswith('__')} | {'read': _read_numbered})
except ImportError: pass  # nbval is a dev extra; without it only tests/ run
