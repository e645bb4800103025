"""Write README.md from nbs/index.ipynb (what `nbdev-readme` does, without Quarto).

Markdown cells are copied; code cells become fenced Python followed by their stored outputs (markdown
as is, text in a plain fence). Hidden cells (`#| hide`), cell directives (`#| ...`) and nbval markers (`# NBVAL_...`) are left out.
`--check` exits 1 when README.md differs from what the notebook gives, or when a command given after it (the
test command `.ci/run` runs) is not in the README word for word.
"""
import json, sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent

def _output(o) -> str:
    if o.get('output_type') == 'stream': return '```\n' + ''.join(o['text']).rstrip('\n') + '\n```'
    data = o.get('data', {})
    if 'text/markdown' in data: return ''.join(data['text/markdown']).strip('\n')
    if 'text/plain' in data: return '```\n' + ''.join(data['text/plain']).rstrip('\n') + '\n```'
    return ''

def _cell(c) -> list[str]:
    lines = ''.join(c['source']).splitlines()
    if c['cell_type'] == 'markdown': return ['\n'.join(lines).strip('\n')]
    if any(l.strip() in ('#| hide', '#|hide') or l.startswith('#| default_exp') for l in lines): return []
    code = '\n'.join(l for l in lines if not l.startswith(('#|', '# NBVAL_'))).strip('\n')
    return (['```python\n' + code + '\n```'] if code else []) + [t for t in map(_output, c.get('outputs', [])) if t]

def readme_text() -> str:
    nb = json.loads((root/'nbs'/'index.ipynb').read_text(encoding='utf-8'))
    parts = [p for c in nb['cells'] for p in _cell(c)]
    return '<!-- Generated from nbs/index.ipynb by .ci/make_readme.py; edit the notebook, not this file. -->\n\n' + '\n\n'.join(parts) + '\n'

if __name__ == '__main__':
    text, out = readme_text(), root/'README.md'
    if '--check' in sys.argv:
        if not out.exists() or out.read_text(encoding='utf-8') != text:
            sys.exit('README.md is out of date with nbs/index.ipynb: run `python .ci/make_readme.py` and commit.')
        for cmd in sys.argv[sys.argv.index('--check') + 1:]:
            if f'\n{cmd}\n' not in text: sys.exit(f'README.md does not give the command .ci/run runs: {cmd}')
    else: out.write_text(text, encoding='utf-8')
