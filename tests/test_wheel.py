"""A built wheel is a whole install: installed into a new virtual environment outside the checkout, with none
of the checkout on any path, the demo, `reach eval --level 1`, the stage pipeline and `reach bench recall` work,
and every file they write lands in the user cache, the working folder or REACH_* folders, never in the checkout.
"""
import json, os, subprocess, sys, zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ['reach_nb/data/kb/proxy_recharge.md', 'reach_nb/data/eval/tasks/level1.yaml',
           'reach_nb/data/eval/task.schema.json', 'reach_nb/data/pipelines/think_act_observe.yaml',
           'reach_nb/data/pipelines/think.md', 'reach_nb/data/memory/recall_pairs.jsonl',
           'reach_nb/data/router/questions.jsonl']


def _run(cmd:list, timeout:int=600, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f'{cmd} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}'
    return r


@pytest.fixture(scope='module')
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp('dist')
    _run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '-w', str(out), str(ROOT)])
    return next(out.glob('reach_nb-*.whl'))


@pytest.fixture(scope='module')
def installed(wheel, tmp_path_factory) -> Path:
    "A fresh virtual environment outside the checkout with the wheel (and its locked dependencies) installed."
    venv = tmp_path_factory.mktemp('venv')/'v'
    _run([sys.executable, '-m', 'venv', str(venv)])
    _run([str(venv/'bin'/'python'), '-m', 'pip', 'install', '-q', '-c', str(ROOT/'requirements.lock'), str(wheel)])
    return venv


def _user(venv:Path, home:Path, **extra) -> dict:
    "An environment like a new user's: no REACH_* settings, no key, no PYTHONPATH, a home of its own."
    keep = {k: v for k, v in os.environ.items()
            if not (k.startswith(('REACH_', 'PYTHON', 'XDG_', 'VIRTUAL_ENV')) or k == 'OPENAI_API_KEY')}
    return keep | {'HOME': str(home), 'PATH': f"{venv/'bin'}:{os.environ['PATH']}"} | extra


def _checkout_changes() -> set[str]:
    "Untracked or changed paths in the checkout, ignored files included."
    r = _run(['git', 'status', '--porcelain', '--ignored', '--untracked-files=all'], cwd=ROOT)
    return {l[3:] for l in r.stdout.splitlines() if '/.venv/' not in f'/{l[3:]}' and '__pycache__' not in l}


def test_wheel_carries_the_shipped_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(SHIPPED) <= names, sorted(set(SHIPPED) - names)
    kb = {n for n in names if n.startswith('reach_nb/data/kb/')}
    assert kb == {f'reach_nb/data/kb/{p.name}' for p in (ROOT/'data'/'kb').glob('*.md')}
    assert not [n for n in names if n.endswith(('.duckdb', '.sqlite', '.lock'))], 'generated data got into the wheel'


def test_wheel_install_runs_outside_the_checkout(installed, tmp_path):
    before = _checkout_changes()
    home, work = tmp_path/'home', tmp_path/'work'
    home.mkdir(); work.mkdir()
    env = _user(installed, home)
    reach = str(installed/'bin'/'reach')
    where = _run([str(installed/'bin'/'python'), '-c', 'import reach_nb; print(reach_nb.__file__)'], cwd=work, env=env)
    assert where.stdout.startswith(str(installed)), where.stdout

    demo = _run([reach, 'demo'], cwd=work, env=env)
    assert 'answer  :' in demo.stdout, demo.stdout[-2000:]
    assert (home/'.cache'/'reach_nb'/'generated'/'risk.duckdb').is_file()
    found = [e['observation']['content'] for e in map(json.loads, (work/'traces'/'demo.jsonl').open())
             if e.get('type') == 'tool_end' and e['observation']['tool'] == 'search_knowledge']
    assert found and all(c.startswith('[1] ') and '.md' in c for c in found), found

    ev = _run([reach, 'eval', '--level', '1', '--out', 'ev'], cwd=work, env=env)
    assert (work/'ev'/'results.duckdb').is_file(), ev.stdout[-2000:]

    pipe = _run([reach, 'ask', '--model', 'sim-analyst', '--agent', 'pipeline',
                 'Why did recharge volume jump last week?'], cwd=work, env=env)
    assert 'answer  :' in pipe.stdout and 'stopped: answer' in pipe.stdout, pipe.stdout[-2000:]

    recall = _run([reach, 'bench', 'recall', '--memories', '1000', '--queries', '5'], cwd=work,
                  env=env | {'REACH_DATA_DIR': str(tmp_path/'elsewhere')})
    assert 'recall@5' in recall.stdout, recall.stdout[-2000:]
    assert _checkout_changes() == before, 'a run from a wheel install wrote into the checkout'
