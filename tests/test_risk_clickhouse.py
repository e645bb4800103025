"The risk dataset in ClickHouse (chdb): `reach data build --engine clickhouse` copies the same rows, read-only."
import json, subprocess, sys

import pytest

from reach_cli import REACH, clean_env

# Each check runs in its own process: chdb holds one engine folder per process, and the tests' own process stays free.
CHECK = r'''
import json, re, sys
from reach_nb.risk.clickhouse import clickhouse_meta, database_name, embedded, guards, read_sorted
from reach_nb.risk.data import TABLES, read_meta
from reach_nb.core import UserError
db, other = sys.argv[1], sys.argv[2]
e = embedded()
def refused(sql):
    try: e.execute(f'{sql} {guards(2)}'); return None
    except Exception as x: return re.search(r'\(([A-Z_]+)\)', str(x))[1]
name = database_name(db)
try: embedded(other); second = None
except UserError as x: second = str(x)
print(json.dumps({
    'same': {t: (lambda a, b: [len(a), a == b])(*read_sorted(db, t, e)) for t in TABLES},
    'meta': clickhouse_meta(db, e) == read_meta(db),
    'refused': {'file': refused("SELECT * FROM file('/etc/passwd', 'LineAsString')"),
                'url': refused("SELECT * FROM url('http://127.0.0.1:9/x', 'CSV')"),
                'write': refused(f'INSERT INTO "{name}".games SELECT * FROM "{name}".games'),
                'drop': refused(f'DROP TABLE "{name}".games'),
                'slow': refused('SELECT count() FROM numbers(10000000000000)')},
    'second': second, 'path': str(e.path)}))
'''


def build(tmp, *args, **env):
    return subprocess.run([REACH, 'data', 'build', '--rows', '20000', '--path', str(tmp/'risk.duckdb'), *args],
                          capture_output=True, text=True, timeout=300, env=clean_env(REACH_DATA_DIR=str(tmp), **env))


def check(tmp, **env):
    r = subprocess.run([sys.executable, '-c', CHECK, str(tmp/'risk.duckdb'), str(tmp/'elsewhere')],
                       capture_output=True, text=True, timeout=300, env=clean_env(REACH_DATA_DIR=str(tmp), **env))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.fixture(scope='module')
def copied(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('ch')
    r = build(tmp, '--engine', 'clickhouse')
    assert r.returncode == 0, r.stderr[-2000:]
    return tmp, r.stdout


def test_every_table_has_the_same_rows_in_clickhouse(copied):
    tmp, out = copied
    assert f"ClickHouse {tmp/'clickhouse'}, database risk_" in out and ': 20240 transactions' in out
    got = check(tmp, TZ='Asia/Shanghai')  # the machine's zone does not move a time
    assert got['meta'] is True and got['path'] == str(tmp/'clickhouse')
    assert all(same for _, same in got['same'].values()), got['same']
    assert got['same']['transactions'][0] == 20240 and got['same']['fraud_labels'][0] > 0


def test_the_tools_guards_refuse_files_urls_writes_and_long_queries(copied):
    got = check(copied[0])
    assert got['refused'] == {'file': 'READONLY', 'url': 'READONLY', 'write': 'READONLY', 'drop': 'READONLY',
                              'slow': 'TIMEOUT_EXCEEDED'}
    assert got['second'].startswith(f"the embedded ClickHouse of this process is at {copied[0]/'clickhouse'}, not ")


def test_a_rebuilt_dataset_is_copied_again(copied):
    tmp, _ = copied
    r = build(tmp, '--engine', 'clickhouse', '--seed', '8', '--force')
    assert r.returncode == 0, r.stderr[-2000:]
    got = check(tmp)
    assert got['meta'] is True and all(same for _, same in got['same'].values())


def test_an_unknown_engine_is_one_error_line(tmp_path):
    r = build(tmp_path, '--engine', 'postgres')
    assert r.returncode == 2 and r.stdout == ''
    assert r.stderr.strip() == "Error: unknown engine 'postgres' in option --engine: use duckdb or clickhouse"


def test_a_folder_another_process_holds_is_one_error_line(tmp_path):
    hold = subprocess.Popen([sys.executable, '-c', 'import sys, time; from reach_nb.risk.clickhouse import embedded; '
                             'embedded(sys.argv[1]).execute("SELECT 1"); print("held", flush=True); time.sleep(60)',
                             str(tmp_path/'clickhouse')], stdout=subprocess.PIPE, text=True)
    try:
        assert hold.stdout.readline().strip() == 'held'
        r = build(tmp_path, '--engine', 'clickhouse')
    finally: hold.kill(); hold.wait()
    assert r.returncode == 2 and 'Traceback' not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"Error: cannot open the embedded ClickHouse at {tmp_path/'clickhouse'} (")
    assert 'another process may be using that folder' in r.stderr
