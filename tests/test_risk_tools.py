"The risk tools across processes, under time limits and attack, and on the generated dataset."
import json, subprocess, sys, textwrap, threading
from pathlib import Path
import duckdb, pytest
from reach_nb.risk.data import build_dataset, ground_truth, table_checksums
from reach_nb.risk.db import RiskDB, configure_duckdb, tiny_dataset
from reach_nb.risk.tools import RiskWorkspace, risk_registry

LAST_WEEK = ('2026-06-24', '2026-06-30')

@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    "The notebook's small dataset with its planted spike (channel c05, game g02)."
    return tiny_dataset(tmp_path_factory.mktemp('tiny')/'tiny.duckdb')

@pytest.fixture(scope='module')
def generated(tmp_path_factory):
    "A 200,000-row dataset from reach_nb.risk.data."
    return build_dataset(tmp_path_factory.mktemp('gen')/'risk.duckdb', rows=200_000)

@pytest.fixture
def workspace(tiny, tmp_path):
    "A workspace over the tiny dataset, closed after the test: DuckDB keeps one configuration per open file."
    with RiskWorkspace(tiny, store=tmp_path/'s.sqlite', kb=tmp_path) as ws: yield ws

def _python(code:str, timeout=120) -> str:
    "Run `code` in a fresh interpreter; its stdout."
    r = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout

def test_procedures_tasks_and_results_persist_across_processes(tiny, tmp_path):
    store = tmp_path/'store.sqlite'
    made = _python(f"""
        from reach_nb.risk.tools import RiskWorkspace
        ws = RiskWorkspace({str(tiny)!r}, store={str(store)!r}, kb={str(tmp_path)!r})
        print(ws.create_procedure('spike drivers', [{{'operator': 'concentration', 'params': {{'dims': ['channel_id', 'game_id']}}}}, {{'operator': 'trend'}}]))
        print(ws.create_task('proc_0001', '2026-06-24', '2026-06-30', filters={{'currency': ['CNY', 'HKD']}}, name='last week'))""")
    assert made.startswith("Created procedure proc_0001 'spike drivers' with 2 steps:") and "Created task task_0001 'last week'" in made
    ran = _python(f"""
        from reach_nb.risk.tools import RiskWorkspace
        ws = RiskWorkspace({str(tiny)!r}, store={str(store)!r}, kb={str(tmp_path)!r})
        print(ws.list_tasks())
        print(ws.run_task('task_0001'))""")
    assert '| task_0001 | last week | proc_0001 | 2026-06-24..2026-06-30 | 2026-05-27..2026-06-23 | currency=CNY/HKD | created |' in ran
    assert "task_0001 'last week' done:" in ran and '[1] concentration: amount ' in ran and '[2] trend: daily amount ' in ran
    read = _python(f"""
        from reach_nb.risk.tools import RiskWorkspace
        ws = RiskWorkspace({str(tiny)!r}, store={str(store)!r}, kb={str(tmp_path)!r})
        print(ws.list_tasks(status='done'))
        print(ws.get_result('task_0001', step=1, top=1))""")
    assert '| task_0001 | last week |' in read and '| channel_id | 1 | c05 | Bargain Top-up (discount) |' in read and '| game_id | 1 | g02 |' in read

def test_ids_stay_unique_when_processes_write_at_once(tiny, tmp_path):
    code = f"""
        from reach_nb.risk.tools import RiskWorkspace
        ws = RiskWorkspace({str(tiny)!r}, store={str(tmp_path/'store.sqlite')!r}, kb={str(tmp_path)!r})
        for i in range(5): print(ws.create_procedure(f'p{{i}}', [{{'operator': 'trend'}}]).split()[2])"""
    procs = [subprocess.Popen([sys.executable, '-c', textwrap.dedent(code)], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    ids = [line for p in procs for line in p.communicate(timeout=120)[0].split()]
    assert sorted(ids) == [f'proc_{n:04d}' for n in range(1, 21)]

def test_time_limit_gives_a_clear_error_and_the_connection_survives(generated, tmp_path):
    ws = RiskWorkspace(generated, store=tmp_path/'s.sqlite', kb=tmp_path)
    reg = risk_registry(ws)
    dims = ['user_id', 'muid', 'payer_id', 'item_id', 'channel_id', 'game_id', 'currency', 'channel_type']
    ws.create_procedure('everything', [{'operator': 'concentration', 'params': {'dims': dims}}, {'operator': 'trend'}])
    ws.create_task('proc_0001', '2026-05-01', '2026-06-30', '2026-04-02', '2026-04-30')
    ws.db.query_timeout = 0.001  # far too short for a scan of 200,000 rows over 8 grouping sets
    out = reg.call('run_task', {'task_id': 'task_0001'}).content
    assert '[1] concentration: FAILED: query exceeded 0.001 s; narrow the window or filters' in out, out
    assert "task_0001 'everything 2026-05-01..2026-06-30' failed" in out and "[2] trend: " in out  # the other step still ran
    assert '| task_0001 | everything 2026-05-01..2026-06-30 | proc_0001 |' in ws.list_tasks('failed')
    ws.db.query_timeout = 20  # the same connection with a sane limit still answers
    out = reg.call('run_task', {'task_id': 'task_0001'}).content
    assert "'everything 2026-05-01..2026-06-30' done" in out and '[1] concentration: amount ' in out, out
    assert ws.db.run("SELECT count(*) FROM transactions").rows[0][0] > 190_000

def test_read_only_and_injection(tiny, workspace):
    before = table_checksums(tiny)
    ws = workspace
    for sql in ["DROP TABLE fraud_labels", "INSERT INTO transactions (txn_id) VALUES (-1)", "CREATE TABLE x AS SELECT 1"]:
        with pytest.raises(duckdb.Error, match='read-only'): ws.db.con.execute(sql)
    reg = risk_registry(ws)
    assert reg.call('create_procedure', {'name': 'p', 'steps': [{'operator': 'concentration'}]}).ok
    evil = ["x' OR 1=1 --", "'; DROP TABLE transactions; --", 'c05" OR "1"="1']
    assert reg.call('create_task', {'procedure_id': 'proc_0001', 'start': LAST_WEEK[0], 'end': LAST_WEEK[1], 'filters': {'channel_id': evil}}).ok
    out = reg.call('run_task', {'task_id': 'task_0001'}).content
    assert '[1] concentration: no successful payments in the window or the baseline' in out, out  # the values are only values
    bad = reg.call('create_procedure', {'name': 'p', 'steps': [{'operator': 'aggregate', 'params': {'by': ['user_id; DROP TABLE x']}}]})
    assert not bad.ok and "unknown dimension 'user_id; DROP TABLE x'" in bad.content and 'allowed: user_id, muid' in bad.content
    bad = reg.call('create_task', {'procedure_id': 'proc_0001', 'start': LAST_WEEK[0], 'end': LAST_WEEK[1], 'filters': {'1=1) OR (channel_id': 'c05'}})
    assert not bad.ok and 'unknown filter column' in bad.content
    assert table_checksums(tiny) == before

def test_the_ground_truth_is_invisible(workspace):
    reg = risk_registry(workspace)
    listed = reg.call('list_datasets', {}).content + reg.call('list_operators', {}).content + reg.call('describe_dataset', {'dataset': 'transactions'}).content
    assert 'fraud' not in listed and 'incident' not in listed and 'dataset_meta' not in listed
    for name in ['fraud_labels', 'fraud_incidents', 'dataset_meta']:
        ob = reg.call('describe_dataset', {'dataset': name})
        assert not ob.ok and ob.content.endswith('available: transactions, games, items, channels, users, devices.'), ob.content
        ob = reg.call('create_task', {'procedure_id': 'proc_0001', 'start': LAST_WEEK[0], 'end': LAST_WEEK[1], 'dataset': name})
        assert not ob.ok
    for col in ['incident_id', 'pattern']:
        ob = reg.call('create_procedure', {'name': 'p', 'steps': [{'operator': 'aggregate', 'params': {'by': [col]}}]})
        assert not ob.ok and 'unknown dimension' in ob.content

def test_schemas_have_no_self(workspace):
    reg = risk_registry(workspace)
    assert len(reg) == 9
    for s in reg.schemas():
        assert 'self' not in s['function']['parameters']['properties'] and s['function']['description']

def test_concentration_finds_the_labelled_spike(generated, tmp_path):
    spike = next(g for g in ground_truth(generated) if g['pattern'] == 'channel_spike')
    ws = RiskWorkspace(generated, store=tmp_path/'s.sqlite')
    ws.create_procedure('spike drivers', [{'operator': 'concentration'}, {'operator': 'sharing', 'params': {'min_users': 50}}])
    ws.create_task('proc_0001', *LAST_WEEK)
    out = ws.run_task('task_0001')
    conc, shared = ws.store.results('task_0001')
    top = {r[0]: r[2] for r in conc.rows if r[1] == 1}
    assert (top['channel_id'], top['game_id']) == (spike['channel_id'], spike['game_id']), out
    assert top['item_id'] in spike['key_entities']['items']
    assert f"channel_id={spike['channel_id']} " in out.split('\n')[2]
    assert set(spike['key_entities']['muids']) <= {r[0] for r in shared.rows}
    shown = ws.get_result('task_0001', step=1, top=1)
    assert f"| channel_id | 1 | {spike['channel_id']} |" in shown and len(shown) <= 3000

# --- hardening --------------------------------------------------------------------------------------------

def _finishes(fn, seconds:float) -> bool:
    "Whether `fn()` returns within `seconds` (a guard against pathological slowness, not a benchmark)."
    t = threading.Thread(target=fn, daemon=True)
    t.start(); t.join(seconds)
    return not t.is_alive()

def test_bench_settings_go_in_before_the_lock(tiny):
    "`reach bench data` opens a RiskDB, then sets its options with configure_duckdb: they must take effect, and the lock stay."
    from reach_nb.bench.data import _reach_side
    rdb = RiskDB(tiny, config={'memory_limit': '300MB'})
    try:
        con = configure_duckdb(rdb.con, {'threads': 1, 'memory_limit': '200MB'})
        assert con is rdb.con
        q = "SELECT current_setting('threads'), current_setting('memory_limit'), current_setting('lock_configuration'), current_setting('enable_external_access')"
        threads, memory, locked, external = rdb.run(q).rows[0]
        assert (threads, locked, external) == (1, True, False) and memory.startswith('190.') and 'MiB' in memory
        with pytest.raises(duckdb.Error, match='locked'): rdb.con.execute("SET threads = 4")
        with pytest.raises(duckdb.Error, match='disabled'): rdb.con.execute("SELECT * FROM read_csv('/etc/passwd')")
    finally: rdb.close()
    r = _reach_side(str(tiny), settings={'threads': 1, 'memory_limit': '200MB'})
    assert r['top5']['channel_id'][0] == 'c05'

def test_hostile_arguments_through_the_registry(workspace):
    reg = risk_registry(workspace)
    assert reg.call('CreateAnalysisFlowProcedure', {'name': 'p', 'steps': [{'operator': 'trend'}]}).ok
    ok = {'procedure_id': 'proc_0001', 'start': LAST_WEEK[0], 'end': LAST_WEEK[1]}
    ob = reg.call('create_task', ok | {'start': "2026-06-24' OR 1=1 --"})
    assert not ob.ok and "'start' expects a date like '2026-06-24' (YYYY-MM-DD), got \"2026-06-24' OR 1=1 --\"" in ob.content
    ob = reg.call('create_task', ok | {'name': 'n' * 1_000_000})
    assert not ob.ok and 'name is 1,000,000 characters: at most 65,536 are stored per value' in ob.content and len(ob.content) < 4200
    assert reg.call('list_tasks', {}).content.startswith('No tasks yet')  # nothing half-stored
    zeros = '0' * 40_000 + 'x'
    assert _finishes(lambda: reg.call('run_task', {'task_id': zeros}), 10)  # the id pattern took 40 s when it backtracked
    ob = reg.call('run_task', {'task_id': zeros})
    assert not ob.ok and 'is not a task id (too long)' in ob.content and len(ob.content) < 1000

def test_create_task_with_a_task_id_updates_it(workspace):
    ws = workspace
    reg = risk_registry(ws)
    reg.call('create_procedure', {'name': 'a', 'steps': [{'operator': 'trend'}]})
    reg.call('create_procedure', {'name': 'b', 'steps': [{'operator': 'velocity'}]})
    reg.call('create_task', {'procedure_id': 'proc_0001', 'start': LAST_WEEK[0], 'end': LAST_WEEK[1]})
    assert 'done' in reg.call('run_task', {'task_id': 'task_0001'}).content
    ob = reg.call('CreateAnalysisTask', {'task_id': 'task_0001', 'procedure_id': 'proc_0002', 'start': '2026-06-20',
                                         'end': '2026-06-30', 'name': 'renamed'})
    assert ob.ok and ob.content.startswith("Updated task task_0001 'renamed' for proc_0002 'b'"), ob.content
    t = ws.store.get('tasks', 'task_0001')
    assert (t['procedure_id'], t['frame']['start'], t['status'], ws.store.results('task_0001')) == ('proc_0002', '2026-06-20', 'created', [])
    assert len(ws.store.all('tasks')) == 1
    assert '[1] velocity: 1 user made' in reg.call('RunAnalysisTask', {'task_id': 'task_0001'}).content

def test_threads_opening_one_file_at_once(tiny):
    "Connections opened from many threads at once: each is configured and locked before the next looks at it."
    errors = []
    def open_close():
        try: RiskDB(tiny).close()
        except Exception as e: errors.append(repr(e))
    for _ in range(10):
        threads = [threading.Thread(target=open_close) for _ in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
    assert errors == []
