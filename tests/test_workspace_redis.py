"""The tools' workspace in Redis (`RedisWorkspaceStore`) against a real redis-server: the same rows, ids, errors and
results as the SQLite file for the same operations, an idempotent add that stays one row under concurrent workers,
and the risk tools working on it end to end."""
import threading

import pytest

from reach_nb.memory.sessions import RedisSessionStore
from reach_nb.risk.agents import session_workspace
from reach_nb.risk.tools import RedisWorkspaceStore, WorkspaceStore
from reach_nb.risk.operators import StepResult

from redis_server import redis_server


@pytest.fixture(scope='module')
def redis_url(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp('redis')) as r: yield r.url


def _script(st) -> list:
    "One sequence of the store's operations; what each returned (or the error it raised)."
    out = []
    def do(f, *a, **kw):
        try: got = f(*a, **kw)
        except ValueError as e: got = f"ValueError: {e}"
        out.append(got)
        return got
    pid = do(st.add, 'procedures', name='代充 spike', description=None, steps=[{'operator': 'trend'}])
    do(st.add, 'procedures', key='k-1', name='again', steps=[])
    do(st.add, 'procedures', key='k-1', name='again, retried', steps=[])  # the same key: the first id
    tid = do(st.add, 'tasks', name='t', procedure_id=pid, frame={'days': 7}, filters={'game_id': ['g01']})
    do(st.add, 'tasks', procedure_id=pid, frame={})
    do(st.update, tid, status='done', notes={'why': 'checked'})
    do(st.update, 'task_0099', status='done')  # no such task: nothing changes
    for table in ('procedures', 'tasks'): do(st.all, table)
    do(st.all, 'tasks', status='done')
    do(st.get, 'tasks', 'task_1')
    do(st.get, 'tasks', 'task_0009')
    do(st.get, 'procedures', 'task_0001')
    do(st.add, 'procedures', name='x' * 100_000, steps=[])
    sr = StepResult(step=1, operator='trend', ok=True, text='up 40%')
    do(st.save_results, tid, [sr, sr])
    do(st.results, tid)
    do(st.save_results, tid, [])
    do(st.results, tid)
    do(st.results, 'task_0042')
    return out


def _same(rows):
    "Rows without the creation time (a clock reading)."
    if isinstance(rows, dict): return {k: v for k, v in rows.items() if k != 'created'}
    if isinstance(rows, list): return [_same(r) for r in rows]
    return rows


def test_redis_rows_are_the_files_rows(tmp_path, redis_url):
    redis = RedisSessionStore(redis_url, prefix='t1:').r
    assert _same(_script(RedisWorkspaceStore(redis, 't1:ws:a:'))) == _same(_script(WorkspaceStore(tmp_path/'ws.sqlite')))
    assert RedisWorkspaceStore(redis, 't1:ws:b:').all('tasks') == []  # another prefix: another workspace


def test_concurrent_adds_get_their_own_ids_and_a_key_stays_one_row(redis_url):
    sessions = RedisSessionStore(redis_url, prefix='t2:')
    st = session_workspace('alice', sessions=sessions)
    assert isinstance(st, RedisWorkspaceStore) and st.prefix.startswith('t2:ws:')
    made, keyed = [], []
    def worker(i):
        for j in range(20): made.append(st.add('tasks', procedure_id='proc_0001', frame={'i': i, 'j': j}))
        keyed.append(st.add('tasks', key='retry-me', procedure_id='proc_0001', frame={}))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert len(set(made)) == 80 and len(set(keyed)) == 1
    assert len(st.all('tasks')) == 81 and [t['n'] for t in st.all('tasks')] == list(range(1, 82))
    assert session_workspace('alice', sessions=sessions).get('tasks', keyed[0])['frame'] == {}  # a new handle sees it
