"The risk dataset in ClickHouse (chdb): `reach data build --engine clickhouse` copies the same rows, read-only."
import json, re, subprocess, sys

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
    "Rebuilt with the engine setting (no --engine), the copy is made again."
    tmp, _ = copied
    r = build(tmp, '--seed', '8', '--force', REACH_ENGINE='clickhouse')
    assert r.returncode == 0 and f"ClickHouse {tmp/'clickhouse'}, database risk_" in r.stdout, r.stderr[-2000:]
    got = check(tmp)
    assert got['meta'] is True and all(same for _, same in got['same'].values())


def test_an_unknown_engine_is_one_error_line(tmp_path):
    r = build(tmp_path, '--engine', 'postgres')
    assert r.returncode == 2 and r.stdout == ''
    assert r.stderr.strip() == ("Error: engine must be one of duckdb, clickhouse, got 'postgres' in option --engine: "
                                "use duckdb or clickhouse (the default is 'duckdb')")


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


def _script(code:str, tmp, **env) -> dict:
    "What the Python `code` prints as JSON, run in a fresh process over the copied dataset in `tmp`."
    r = subprocess.run([sys.executable, '-c', code, str(tmp/'risk.duckdb')], capture_output=True, text=True, timeout=600,
                       env=clean_env(REACH_DATA_DIR=str(tmp), **env))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


SAME = r'''
import json, math, sys, tempfile
from pathlib import Path
from reach_nb.risk.tools import RiskWorkspace, risk_registry
from reach_nb.risk.db import RiskDB
from reach_nb.risk.clickhouse import ClickHouseDB
from reach_nb.risk.operators import OPERATORS, run_operator
db = sys.argv[1]
steps = [('concentration', {}), ('concentration', {'top': 3, 'dims': ['channel_type', 'payer_id']}),
         ('aggregate', {'by': ['channel_id']}), ('aggregate', {'by': ['game_id', 'channel_type'], 'metric': 'users'}),
         ('trend', {}), ('trend', {'granularity': 'hour', 'metric': 'txns'}), ('trend', {'granularity': 'week', 'metric': 'users'}),
         ('zscore', {'by': 'channel_id'}), ('zscore', {'by': 'user_id', 'metric': 'txns', 'threshold': 2}),
         ('velocity', {}), ('velocity', {'min_txns': 3, 'minutes': 60}),
         ('sharing', {}), ('sharing', {'entity': 'payer_id', 'min_users': 2}),
         ('cohort_compare', {'by': 'channel_id'}), ('cohort_compare', {'by': 'currency'}),
         ('refund_rate', {}), ('refund_rate', {'by': 'channel_type', 'threshold': 0.01, 'min_txns': 1})]
filters = [None, {'game_id': 'g02'}, {'channel_type': ['discount', 'wallet']}]
def same(a, b):
    if isinstance(a, float) and isinstance(b, float): return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b and type(a) is type(b)
duck, ch = RiskDB(db), ClickHouseDB(db)
windows = [('2026-06-24', '2026-06-30'), ('2026-05-01', '2026-06-30', '2026-04-02', '2026-04-30')]
diffs, rows = [], {}
for f, w in [(f, windows[0]) for f in filters] + [(None, windows[1])]:
    for op, params in steps:
        a, b = (run_operator(x, {'operator': op, 'params': params}, *w, filters=f) for x in (duck, ch))
        ok = (a.columns == b.columns and len(a.rows) == len(b.rows) and a.text() == b.text() and a.headline == b.headline
              and all(len(x) == len(y) and all(map(same, x, y)) for x, y in zip(a.rows, b.rows)))
        if not ok: diffs.append([op, params, f, w])
        rows[op] = rows.get(op, 0) + len(a.rows)
calls = ([('list_datasets', {}), ('list_operators', {})] +
         [('describe_dataset', {'dataset': t}) for t in ('transactions', 'games', 'items', 'channels', 'users', 'devices')] +
         [('create_procedure', {'name': 'all', 'steps': [{'operator': o} for o in OPERATORS if o not in ('aggregate', 'zscore', 'cohort_compare')]
                                + [{'operator': 'aggregate', 'params': {'by': ['channel_type']}}, {'operator': 'zscore', 'params': {'by': 'item_id'}},
                                   {'operator': 'cohort_compare', 'params': {'by': 'game_id'}}]}),
          ('create_task', {'procedure_id': 'proc_0001', 'start': '2026-06-24', 'end': '2026-06-30'}),
          ('create_task', {'procedure_id': 'proc_0001', 'start': '2026-06-01', 'end': '2026-06-30', 'filters': {'channel_type': 'discount'}}),
          ('list_tasks', {}), ('run_task', {'task_id': 'task_0001'}), ('run_task', {'task_id': 'task_0002'}),
          ('get_result', {'task_id': 'task_0001'}), ('get_result', {'task_id': 'task_0002', 'step': 1, 'top': 10}),
          ('search_knowledge', {'query': 'proxy recharge discount channel'})])
said = {}
for engine in ('duckdb', 'clickhouse'):
    with tempfile.TemporaryDirectory() as d, RiskWorkspace(db, store=Path(d)/'s.sqlite', engine=engine) as ws:
        reg = risk_registry(ws)
        said[engine] = [reg.call(n, a).content for n, a in calls]
tools = {n for n, _ in calls}
print(json.dumps({'diffs': diffs, 'rows': rows, 'tools': len(tools),
                  'tool_diffs': [c[0] for c, x, y in zip(calls, said['duckdb'], said['clickhouse']) if x != y],
                  'ran': said['clickhouse'][calls.index(('run_task', {'task_id': 'task_0001'}))][:200]}))
'''

def test_every_operator_and_tool_answers_the_same_on_both_engines(copied):
    "Every operator (17 parameter sets, over 3 filters and 2 windows) and the nine tools' texts, DuckDB against the ClickHouse copy."
    got = _script(SAME, copied[0])
    assert got['diffs'] == [] and got['tool_diffs'] == [], got
    assert len(got['rows']) == 8 and all(got['rows'].values()) and got['tools'] == 9, got  # every operator found rows
    assert "task_0001 'all 2026-06-24..2026-06-30' done" in got['ran'], got['ran']

PROBES = r'''
import json, sys, tempfile
from pathlib import Path
from reach_nb.risk.tools import RiskWorkspace, risk_registry
db = sys.argv[1]
out = {}
with tempfile.TemporaryDirectory() as d, RiskWorkspace(db, store=Path(d)/'s.sqlite', engine='clickhouse') as ws:
    reg = risk_registry(ws)
    reg.call('create_procedure', {'name': 'p', 'steps': [{'operator': 'concentration'}]})
    evil = ["x' OR 1=1 --", "'; DROP TABLE transactions; --", 'c05" OR "1"="1', "c05') OR ('1'='1", '{x:String}', '$ws']
    out['made'] = reg.call('create_task', {'procedure_id': 'proc_0001', 'start': '2026-06-24', 'end': '2026-06-30',
                                           'filters': {'channel_id': evil}}).ok
    out['ran'] = reg.call('run_task', {'task_id': 'task_0001'}).content
    out['dim'] = reg.call('create_procedure', {'name': 'p', 'steps': [{'operator': 'aggregate', 'params': {'by': ['user_id; DROP TABLE x']}}]}).content
    refused = {}
    for k, sql in {'file': "SELECT * FROM file('/etc/passwd', 'LineAsString')", 'url': "SELECT * FROM url('http://127.0.0.1:9/x', 'CSV')",
                   'drop': f'DROP TABLE {ws.db.table("transactions")}', 'insert': f'INSERT INTO {ws.db.table("games")} SELECT * FROM {ws.db.table("games")}',
                   'set': 'SET readonly = 0'}.items():
        try: ws.db.run(sql); refused[k] = None
        except RuntimeError as e: refused[k] = str(e)[:200]
    out['refused'] = refused
    ws.db.query_timeout = 0.3
    try: ws.db.run('SELECT count() FROM numbers(10000000000000)'); out['slow'] = None
    except Exception as e: out['slow'] = f'{type(e).__name__}: {e}'
    ws.db.query_timeout = 20
    out['after'] = ws.db.run(f"SELECT count() FROM {ws.db.table('transactions')}").rows[0][0]
from reach_nb.risk.db import RiskDB
out['duckdb'] = RiskDB(db).count('transactions')
print(json.dumps(out))
'''

def test_clickhouse_refuses_what_duckdb_refuses(copied):
    "The SQL-injection probes of the DuckDB tools, on ClickHouse: values stay values, names are checked, writes, files and URLs are refused."
    got = _script(PROBES, copied[0])
    assert got['made'] and '[1] concentration: no successful payments in the window or the baseline' in got['ran'], got['ran']
    assert "unknown dimension 'user_id; DROP TABLE x'" in got['dim']
    assert all(v and ('READONLY' in v or 'readonly' in v) for v in got['refused'].values()), got['refused']
    assert got['slow'] == 'QueryTimeout: query exceeded 0.3 s; narrow the window or filters', got['slow']
    assert got['after'] == got['duckdb'] > 20_000  # the engine answers again after the time limit, and nothing was written


def _demo(tmp, *args, **env):
    return subprocess.run([REACH, 'demo', *args], capture_output=True, text=True, timeout=300, cwd=tmp,
                          env=clean_env(REACH_DATA_DIR=str(tmp), REACH_TRACE_DIR=str(tmp/'traces'), **env))


def _demo_dataset(tmp):
    "The 20,000-row dataset the demo reads, built where `_demo` looks for it."
    r = subprocess.run([REACH, 'data', 'build', '--rows', '20000', '--path', str(tmp/'generated'/'risk.duckdb')],
                       capture_output=True, text=True, timeout=300, env=clean_env(REACH_DATA_DIR=str(tmp)))
    assert r.returncode == 0, r.stderr[-2000:]


def _untimed(out:str) -> str: return re.sub(r'\d+\.\d+s\b', 'Ns', out)


def test_the_demo_answers_the_same_on_clickhouse(tmp_path):
    "`reach demo --engine clickhouse` (and REACH_ENGINE) runs the same analysis to the same answer as on DuckDB."
    _demo_dataset(tmp_path)
    duck, ch, env = _demo(tmp_path), _demo(tmp_path, '--engine', 'clickhouse'), _demo(tmp_path, REACH_ENGINE='clickhouse')
    assert duck.returncode == ch.returncode == env.returncode == 0, (ch.stderr[-2000:], env.stderr[-2000:])
    assert '== stopped: answer' in duck.stdout and 'tool calls' in duck.stdout
    assert _untimed(ch.stdout) == _untimed(duck.stdout) == _untimed(env.stdout)
    assert (tmp_path/'clickhouse').is_dir()
    bad = _demo(tmp_path, '--engine', 'postgres')
    assert bad.returncode == 2 and bad.stdout == '' and bad.stderr.strip() == (
        "Error: engine must be one of duckdb, clickhouse, got 'postgres' in option --engine: use duckdb or clickhouse "
        "(the default is 'duckdb')")


# The server path: clickhouse-connect, ClickHouse's own client, as against a server or cluster. No server new enough runs
# here (Debian's is 18.16), so the client speaks to chdb's engine through its `chdb://` transport: the same client calls
# and result decoding as over HTTP.
def _server(tmp) -> dict:
    return dict(REACH_CLICKHOUSE_URL=f"chdb://{tmp/'server'}")


def test_the_server_path_answers_the_same_and_refuses_the_same(copied):
    "Through clickhouse-connect: the dataset copied over the client, every operator and tool equal to DuckDB, the probes refused."
    tmp = copied[0]
    built = build(tmp, '--engine', 'clickhouse', **_server(tmp))
    assert built.returncode == 0, built.stderr[-2000:]
    assert f"ClickHouse chdb://{tmp/'server'}, database risk_" in built.stdout and ': 20240 transactions' in built.stdout
    same = _script(SAME, tmp, **_server(tmp))
    assert same['diffs'] == [] and same['tool_diffs'] == [] and all(same['rows'].values()), same
    probes = _script(PROBES, tmp, **_server(tmp))
    assert probes['made'] and '[1] concentration: no successful payments' in probes['ran'], probes['ran']
    assert all(v and ('READONLY' in v or 'readonly' in v) for v in probes['refused'].values()), probes['refused']
    assert probes['slow'] == 'QueryTimeout: query exceeded 0.3 s; narrow the window or filters', probes['slow']
    assert probes['after'] == probes['duckdb'] > 20_000


def test_the_demo_on_a_server_and_a_server_that_is_not_there(tmp_path):
    "`reach demo --engine clickhouse` with REACH_CLICKHOUSE_URL answers as on DuckDB; an address with nothing behind it is one Error line, its password unsaid."
    _demo_dataset(tmp_path)
    duck, srv = _demo(tmp_path), _demo(tmp_path, '--engine', 'clickhouse', **_server(tmp_path))
    assert duck.returncode == srv.returncode == 0, srv.stderr[-2000:]
    assert _untimed(srv.stdout) == _untimed(duck.stdout) and (tmp_path/'server').is_dir()
    assert not (tmp_path/'clickhouse').exists()  # the embedded engine was not used
    gone = _demo(tmp_path, '--engine', 'clickhouse', REACH_CLICKHOUSE_URL='http://risk:s3cret@127.0.0.1:9')
    assert gone.returncode == 2 and gone.stdout == '', gone
    err = gone.stderr.strip().splitlines()[-1]  # after the demo's note that the simulated analyst answers
    assert len(gone.stderr.strip().splitlines()) == 2 and gone.stderr.startswith('No model configured'), gone.stderr
    assert err.startswith('Error: cannot reach ClickHouse at http://risk:***@127.0.0.1:9 (Connection refused)'), err
    assert err.endswith('in the clickhouse_url setting: check the address, the user and that the server runs'), err
    assert 's3cret' not in gone.stderr
