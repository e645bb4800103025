"""Write README.md from nbs/index.ipynb (what `nbdev-readme` does, without Quarto).

Hidden cells (`#| hide`) and cell directives (`#| ...`) are left out; code cells keep their stored
outputs. `--check` exits 1 when README.md differs from what the notebook gives.
"""
import sys, warnings
from pathlib import Path
import nbformat
from nbconvert import MarkdownExporter

root = Path(__file__).resolve().parent.parent

def readme_text() -> str:
    warnings.filterwarnings('ignore')  # nbformat's notice about cell ids, which nbdev-clean manages
    nb = nbformat.read(root/'nbs'/'index.ipynb', as_version=4)
    keep = []
    for c in nb.cells:
        lines = c.source.splitlines()
        if c.cell_type == 'code' and any(l.strip() in ('#| hide', '#|hide') or l.startswith('#| default_exp') for l in lines): continue
        c.source = '\n'.join(l for l in lines if not l.startswith('#|')).strip('\n')
        if c.source or c.get('outputs'): keep.append(c)
    nb.cells = keep
    nb.metadata['language_info'] = {'name': 'python'}
    body, _ = MarkdownExporter().from_notebook_node(nb)
    return '<!-- Generated from nbs/index.ipynb by .ci/make_readme.py; edit the notebook, not this file. -->\n\n' + body.strip() + '\n'

if __name__ == '__main__':
    text, out = readme_text(), root/'README.md'
    if '--check' in sys.argv:
        if not out.exists() or out.read_text(encoding='utf-8') != text:
            sys.exit('README.md is out of date with nbs/index.ipynb: run `python .ci/make_readme.py` and commit.')
    else: out.write_text(text, encoding='utf-8')
