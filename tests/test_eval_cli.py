"""`reach eval` as a user runs it, in a subprocess: against `reach serve-model --model sim-analyst` over real HTTP
(`--model openai:sim-analyst`), the ablation grid, a second run that reuses the results, and a bad task file."""
import re, subprocess

import pytest

from reach_nb.eval import Results
from reach_nb.risk.data import build_dataset

from reach_cli import REACH, clean_env, served


@pytest.fixture(scope='module')
def small_db(tmp_path_factory):
    "A 100,000-row copy of the sample data (every pattern planted): the runs take a third of the time."
    return build_dataset(tmp_path_factory.mktemp('data')/'risk.duckdb', rows=100_000)


def _env(db=None): return clean_env(**({'REACH_DATA_DB': str(db)} if db else {}))


def _reach(*args, cwd, db=None, timeout=600):
    return subprocess.run([REACH, *args], cwd=cwd, env=_env(db), capture_output=True, text=True, timeout=timeout)


def test_reach_eval_over_http_prints_the_level_table(tmp_path, small_db):
    with served('sim-analyst') as base:
        r = _reach('eval', '--model', 'openai:sim-analyst', '--base-url', base, '--level', '3', '--out', 'ev',
                   '--concurrency', '3', cwd=tmp_path, db=small_db)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith('18 tasks · 1 configuration · 1 seed · results in ')
    assert re.match(r'react · openai:sim-analyst +3 +18 +\d+% \(\d+%-\d+%\) +\d+ ', lines[4]), r.stdout
    with Results(tmp_path/'ev'/'results.duckdb') as res: rows = res.rows()
    assert len(rows) == 18 and all(r['simulated'] and r['model'] == 'openai:sim-analyst' for r in rows)
    demo = {r['task_id']: r['status'] for r in rows if 'demo' in r['tags'].split(',')}
    assert demo and set(demo.values()) == {'passed'}
    assert not any(r['passed'] for r in rows if r['status'] == 'not_simulated')


def test_reach_eval_ablation_and_a_second_run(tmp_path, small_db):
    args = ('eval', '--tag', 'demo', '--out', 'ev', '--ablation', '--rates', '0,0.5', '--ablation-seeds', '1',
            '--ablation-tag', 'demo', '--concurrency', '2')
    r = _reach(*args, cwd=tmp_path, db=small_db)
    assert r.returncode == 0, r.stderr
    table = r.stdout.split('Ablation: ')[1].splitlines()
    assert table[0] == '5 tasks tagged demo x 1 seed, react · sim-analyst'
    assert table[2].startswith('completion, 5 runs per cell') and 'faults 0.5' in table[2]
    variants = [l.split('  ')[0] for l in table[4:]]
    assert variants == ['all on', 'no tolerant parsing', 'no correction round', 'no name suggestions',
                        'no synonyms or coercion', 'no repeat guard', 'layered context']
    assert table[4].split()[2:4] == ['100%', '(57%-100%)']
    with Results(tmp_path/'ev'/'results.duckdb') as res: n = len(res.rows())
    assert n == 5 + 7 * 2 * 5
    again = _reach(*args, cwd=tmp_path, db=small_db)  # everything is stored: nothing runs again
    assert again.returncode == 0 and again.stdout.split('Ablation: ')[1] == r.stdout.split('Ablation: ')[1]
    with Results(tmp_path/'ev'/'results.duckdb') as res: assert len(res.rows()) == n


def test_reach_eval_refuses_a_bad_task_file_in_one_line(tmp_path):
    (tmp_path/'bad.yaml').write_text('tasks:\n  - id: x\n    level: 5\n    lang: en\n    question: Why?\n    steps: 1\n'
                                     '    truth: {sql: SELECT 1}\n    grader: {kind: exact}\n')
    r = _reach('eval', '--tasks', 'bad.yaml', '--out', 'ev', cwd=tmp_path)
    assert (r.returncode, r.stdout) == (2, '')
    assert r.stderr == ("Error: task 'x': level: 5 is not one of [1, 2, 3] in bad.yaml: fix it as "
                        "data/eval/task.schema.json describes (data/eval/README.md has examples)\n")
    assert not (tmp_path/'ev'/'results.duckdb').exists()


def test_reach_eval_runs_the_tasks_named_by_id(tmp_path, small_db):
    r = _reach('eval', '--id', 'l2-top-channel-june,l1-games-count', '--out', 'ev', cwd=tmp_path, db=small_db)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith('2 tasks · 1 configuration · 1 seed · results in '), r.stdout
    with Results(tmp_path/'ev'/'results.duckdb') as res:
        assert sorted(row['task_id'] for row in res.rows()) == ['l1-games-count', 'l2-top-channel-june']
    bad = _reach('eval', '--id', 'l1-games-count,l9-none', '--level', '1', '--out', 'ev', cwd=tmp_path, db=small_db)
    assert bad.returncode == 2 and bad.stdout == '', bad
    assert bad.stderr.strip() == ("Error: no task 'l9-none' among the 19 tasks chosen in option --id: "
                                  "give ids of the task files (`id:` of each task)")


def test_each_run_records_the_engine_its_tools_ran_on(tmp_path, small_db):
    "The same task on DuckDB and on ClickHouse (chdb): both pass, and each row says which engine answered."
    for engine in ('duckdb', 'clickhouse'):
        r = subprocess.run([REACH, 'eval', '--id', 'l2-top-channel-june', '--engine', engine, '--out', engine],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600,
                           env=clean_env(REACH_DATA_DB=str(small_db), REACH_DATA_DIR=str(tmp_path/'data')))
        assert r.returncode == 0, r.stderr[-2000:]
        with Results(tmp_path/engine/'results.duckdb') as res:
            assert [(row['engine'], row['status']) for row in res.rows()] == [(engine, 'passed')]


def test_a_results_file_from_before_engines_gets_the_column(tmp_path):
    "A results file written before runs recorded their engine opens, and takes new rows with it."
    import duckdb
    from reach_nb.eval import _TYPES
    con = duckdb.connect(str(tmp_path/'results.duckdb'))
    con.execute("CREATE TABLE runs (" + ', '.join(f'{k} {v}' for k, v in _TYPES.items() if k != 'engine') + ");"
                "CREATE TABLE safeguards (key VARCHAR, kind VARCHAR, n INTEGER);"
                "INSERT INTO runs (key, config, task_id, seed, status) VALUES ('c|t|0', 'c', 't', 0, 'passed')")
    con.close()
    with Results(tmp_path/'results.duckdb') as res:
        res.add(dict(config='c', task_id='u', seed=0, status='passed', engine='duckdb'))
        assert [(row['task_id'], row['engine']) for row in res.rows()] == [('t', None), ('u', 'duckdb')]
