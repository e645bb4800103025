"""The session-store contract, run on both stores: SQLite on a temp file, and Redis on a real redis-server."""
import json, multiprocessing, threading, uuid

import pytest

from reach_nb.core import Observation, Run, RunStart, Step, StepEnd, StepStart, TokenDelta, ToolCall, ToolEnd
from reach_nb.llm.models import ScriptedLLM
from reach_nb.agents.react import ReActAgent
from reach_nb.memory.sessions import (RedisSessionStore, SessionLog, SessionStore, SQLiteSessionStore,
                               completed_tool_results, cut_at_step, open_store)
from reach_nb.tools import tool

from reach_cli import clean_env, run_reach
from redis_server import redis_server


@pytest.fixture(scope='module')
def redis_url(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp('redis')) as server: yield server.url


@pytest.fixture(params=['sqlite', 'redis'])
def opener(request, tmp_path):
    "A function that opens the store under test; called twice it gives two handles on the same data."
    if request.param == 'sqlite':
        where = tmp_path/'sessions.sqlite'
        make = lambda **kw: SQLiteSessionStore(where, **kw)
    else:
        url, prefix = request.getfixturevalue('redis_url'), f't{uuid.uuid4().hex[:8]}:'
        make = lambda **kw: RedisSessionStore(url, prefix=prefix, **kw)
    opened = []
    def _open(**kw):
        opened.append(s := make(**kw)); return s
    yield _open
    for s in opened: s.close()


@pytest.fixture
def store(opener): return opener()


@tool
def search(query:str): # what to look for
    "Search the knowledge base."
    return f'3 hits for {query}.'


def say(thought, tool=None, answer=None, **args):
    if tool is None: return json.dumps({'thought': thought, 'answer': answer})
    return json.dumps({'thought': thought, 'action': {'tool': tool, 'args': args}})


SCRIPT = [say('Look.', 'search', query='refund'), say('Again.', 'search', query='proxy'),
          say('Done.', answer='Two patterns.')]


def recorded_run(store, session='alice', question='Which patterns?'):
    "A real ReAct run recorded through SessionLog; returns its run id and the events the consumer saw."
    log = SessionLog.new(store, session, question)
    return log.run_id, list(log.record(ReActAgent(ScriptedLLM(SCRIPT), [search]).stream(question)))


def test_a_recorded_run_reads_back_whole_from_another_handle(opener):
    store = opener()
    rid, seen = recorded_run(store)
    again = opener()
    assert again.events(rid) == seen
    assert again.run(rid) == Run.from_events(seen) and again.run(rid).answer == 'Two patterns.'
    info = again.info(rid)
    assert (info.session_id, info.status, info.n_events) == ('alice', 'finished', len(seen))
    assert info.question == 'Which patterns?'
    assert isinstance(again, SessionStore)


def test_listing_statuses_forks_and_deleting(store):
    done, evs = recorded_run(store)
    broken = store.new_run('alice', question='cut short', meta={'user': 'a'})
    for e in evs[:4]: store.append(broken, e)
    fork = store.new_run('alice', question='forked', parent=done, fork_step=1)
    for e in cut_at_step(store.events(done), 1): store.append(fork, e)
    other = store.new_run('bob', question='hello')
    assert store.sessions() == ['alice', 'bob']
    runs = store.runs('alice')
    assert [(r.run_id, r.status, r.parent, r.fork_step) for r in runs] == [
        (done, 'finished', None, None), (broken, 'incomplete', None, None), (fork, 'incomplete', done, 1)]
    assert runs[1].meta == {'user': 'a'} and runs[0].created <= runs[1].created <= runs[2].created
    assert store.run(broken).meta['incomplete'] is True and store.run(broken).stop_reason is None
    assert store.run(fork).steps == store.run(done).steps[:1]
    store.delete_session('alice')
    assert store.sessions() == ['bob'] and store.runs('alice') == [] and store.info(done) is None
    with pytest.raises(ValueError, match='unknown run'): store.events(done)
    assert [r.run_id for r in store.runs('bob')] == [other]


def test_a_run_with_no_events_or_no_run_start_still_reads_back(store):
    rid = store.new_run('s', question='just begun')
    assert store.events(rid) == [] and store.run(rid).question == 'just begun'
    assert store.run(rid).meta == {'incomplete': True}
    store.append(rid, StepStart(index=1))
    assert store.run(rid).steps == []


def test_mistakes_are_one_line_errors(store):
    rid = store.new_run('s')
    with pytest.raises(ValueError, match=r"^Error: unknown run 'nope' in append"):
        store.append('nope', RunStart(question='q'))
    with pytest.raises(TypeError, match='is not an event in append'): store.append(rid, 42)
    with pytest.raises(ValueError, match='bad session_id'): store.new_run('')
    with pytest.raises(ValueError, match='bad session_id'): store.new_run('x' * 1000)
    with pytest.raises(ValueError, match='fork_step without parent'): store.new_run('s', fork_step=2)
    with pytest.raises(ValueError, match="unknown run 'gone' in new_run"): store.new_run('s', parent='gone')
    with pytest.raises(ValueError, match='in SessionLog'): SessionLog(store, 'nope')
    assert store.events(rid) == []  # nothing was stored by the refused calls


def test_oversized_and_hostile_values_are_stored_cut_never_refused(opener):
    store = opener(max_event_bytes=50_000)
    rid = store.new_run('s', question='q' * 100_000, meta={'blob': 'm' * 200_000, 'bad': 'x\ud800y'})
    big = ToolEnd(index=1, observation=Observation(tool='fetch', content='z' * 5_000_000))
    step = Step(index=1, raw='r' * 300_000, actions=[ToolCall(tool='t', args={'s': 'a\udfffb'})],
                prompt=[{'role': 'user', 'content': 'p' * 300_000}])
    for e in (big, StepEnd(step=step)): store.append(rid, e)
    assert all(len(b.encode()) <= 50_000 for b in store._bodies(rid))
    got_big, got_step = store.events(rid)
    assert got_big.observation.content.endswith('[cut by the session store: 5,000,000 chars]')
    assert got_step.step.safeguards[-1].kind == 'size_cap' and got_step.step.actions[0].args == {'s': 'a\ufffdb'}
    info = store.info(rid)
    assert len(info.question) < 25_000 and info.meta['bad'] == 'x\ufffdy' and len(json.dumps(info.meta)) <= 65_536


# session ids that would mean something if they were pasted into SQL, a Redis key pattern, a path or a terminal
HOSTILE_IDS = ["alice'; DROP TABLE runs; --", 'alice" OR 1=1 --', '%', '_', '*', '?', '[a-z]*', 'reach:sessions',
               'session:*', '{alice}', '}{', '../../etc/passwd', 'a\nb', 'nul\x00byte', '\u202eevil', '🦜' * 200]


def test_hostile_session_ids_are_stored_as_plain_data(store):
    plain = store.new_run('alice', question='plain')
    rids = {sid: store.new_run(sid, question=sid) for sid in HOSTILE_IDS}
    assert sorted(store.sessions()) == sorted(['alice', *HOSTILE_IDS])
    for sid, rid in rids.items():
        assert [(i.run_id, i.session_id, i.question) for i in store.runs(sid)] == [(rid, sid, sid)]
        store.append(rid, TokenDelta(index=1, text=sid))
        assert [e.text for e in store.events(rid)] == [sid]
    assert store.runs('al%') == store.runs('a*') == store.runs('alice\x00') == []
    gone = ["alice'; DROP TABLE runs; --", '%', '*', 'session:*', '[a-z]*']
    for sid in gone: store.delete_session(sid)
    assert sorted(store.sessions()) == sorted(['alice', *(s for s in HOSTILE_IDS if s not in gone)])
    assert [i.run_id for i in store.runs('alice')] == [plain] and store.info(rids['_']).session_id == '_'


def test_a_hostile_session_id_from_the_command_line_is_plain_data(tmp_path):
    sid = "x'; DROP TABLE runs; --"
    env = clean_env(REACH_TRACE_DIR=str(tmp_path/'traces'))
    model = tmp_path/'script.json'
    model.write_text(json.dumps([json.dumps({'thought': 'Done.', 'answer': 'Fine.'})] * 2))
    for who in (sid, 'alice'):
        r = run_reach('ask', '--model', f'scripted:{model}', '--session', who, 'Hi?', cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    with SQLiteSessionStore(tmp_path/'traces'/'sessions.sqlite') as store:
        assert store.sessions() == [sid, 'alice']
        assert [(i.session_id, i.status) for i in store.runs(sid)] == [(sid, 'finished')]


def test_threads_appending_to_their_own_runs_and_to_one_shared_run(store):
    own = [store.new_run('t', question=f'q{k}') for k in range(6)]
    shared = store.new_run('t', question='shared')
    def work(k):
        for i in range(60):
            store.append(own[k], TokenDelta(index=k, text=str(i)))
            store.append(shared, TokenDelta(index=k, text=str(i)))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads: t.start()
    for t in threads: t.join()
    for k, r in enumerate(own): assert [(e.index, e.text) for e in store.events(r)] == [(k, str(i)) for i in range(60)]
    got = [(e.index, e.text) for e in store.events(shared)]
    assert len(got) == 360 and sorted(got) == sorted((k, str(i)) for k in range(6) for i in range(60))
    for k in range(6): assert [t for i, t in got if i == k] == [str(i) for i in range(60)]  # each writer's order kept
    assert store.info(shared).n_events == 360


def _fill(store, run_id, n):
    for i in range(n): store.append(run_id, TokenDelta(index=1, text=str(i)))


def test_a_store_opened_before_a_fork_works_in_the_children(store):
    "A store made before `fork` (multiprocessing, preloading servers) works in the children, on their own connections."
    rids = [store.new_run('forked') for _ in range(3)]
    store.append(rids[0], TokenDelta(index=0, text='parent'))  # the parent's connection is in use before the fork
    children = [multiprocessing.get_context('fork').Process(target=_fill, args=(store, r, 150)) for r in rids]
    for c in children: c.start()
    for c in children: c.join(120)
    assert [c.exitcode for c in children] == [0, 0, 0]
    assert [store.info(r).n_events for r in rids] == [151, 150, 150]
    assert [e.text for e in store.events(rids[1])] == [str(i) for i in range(150)]
    store.append(rids[0], TokenDelta(index=2, text='parent again'))
    assert store.events(rids[0])[-1].text == 'parent again'


def test_long_runs_read_back_in_order(store):
    rid = store.new_run('long')
    for i in range(2345): store.append(rid, TokenDelta(index=1, text=str(i)))  # more than two Redis XRANGE pages
    assert [e.text for e in store.events(rid)] == [str(i) for i in range(2345)]


def test_resume_helpers_on_a_stored_crash(store):
    rid, seen = recorded_run(store)
    upto = next(i for i, e in enumerate(seen) if e.type == 'tool_end' and e.index == 2)
    crashed = store.new_run('alice', question='crashed')
    for e in seen[:upto + 1]: store.append(crashed, e)
    done = completed_tool_results(store.events(crashed))
    assert {k: o.content for k, o in done.items()} == {(1, 0): '3 hits for refund.', (2, 0): '3 hits for proxy.'}
    assert [e.type for e in cut_at_step(store.events(rid), 2)][-1] == 'step_end'
    with pytest.raises(ValueError, match='step 2 did not finish'): cut_at_step(store.events(crashed), 2)


def test_open_store_picks_the_store_by_url(tmp_path, redis_url):
    with open_store(tmp_path/'a.sqlite') as s: assert isinstance(s, SQLiteSessionStore)
    with open_store(redis_url) as s: assert isinstance(s, RedisSessionStore) and s.sessions() is not None


def test_a_lease_runs_out_unless_renewed(opener):
    "Who makes a run: a lease one handle takes is seen by another, renewed it lasts, left alone it runs out."
    import time
    a, b = opener(), opener()
    rid = a.new_run('alice', question='q')
    assert b.leased(rid) is None
    a.lease(rid, 'worker-1', ttl=0.5)
    assert b.leased(rid) == 'worker-1'
    time.sleep(0.3); a.lease(rid, 'worker-1', ttl=0.5); time.sleep(0.3)
    assert b.leased(rid) == 'worker-1'
    time.sleep(0.4)
    assert b.leased(rid) is None
