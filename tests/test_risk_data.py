"The sample risk dataset at its default size: what its patterns guarantee, builds killed half-way, and where it may be built."
import os, signal, subprocess, sys, time
from pathlib import Path
import duckdb, pytest
from reach_nb.risk.data import DEFAULT_ROWS, PATTERNS, build_dataset, ensure_dataset, ground_truth, read_meta

LAST, PREV = "ts >= DATE '2026-06-24'", "ts >= DATE '2026-05-27' AND ts < DATE '2026-06-24'"

@pytest.fixture(scope='session')
def db(tmp_path_factory):
    "The default-size dataset, built once for the session."
    return build_dataset(tmp_path_factory.mktemp('risk')/'risk.duckdb')

@pytest.fixture(scope='session')
def con(db):
    with duckdb.connect(str(db), read_only=True) as c: yield c

@pytest.fixture(scope='session')
def gt(db): return {g['pattern']: g for g in ground_truth(db)}

def one(con, sql): return con.execute(sql).fetchone()

def test_size_date_range_and_meta(con, db):
    n, lo, hi = one(con, "SELECT count(*), min(ts), max(ts) FROM transactions")
    assert abs(n - DEFAULT_ROWS) <= 0.05 * DEFAULT_ROWS
    assert (str(lo.date()), str(hi.date())) == ('2026-04-02', '2026-06-30')
    meta = read_meta(db)
    assert (meta['rows'], meta['seed'], meta['transactions']) == (str(DEFAULT_ROWS), '7', str(n))

def test_schema_is_the_contract(con):
    cols = lambda t: [r[0] for r in con.execute(f"DESCRIBE {t}").fetchall()]
    assert cols('transactions') == ['txn_id', 'ts', 'user_id', 'muid', 'payer_id', 'game_id', 'item_id', 'channel_id',
                                    'currency', 'amount', 'amount_cny', 'status', 'refund_ts']
    assert cols('fraud_incidents') == ['incident_id', 'pattern', 'description', 'start_ts', 'end_ts', 'game_id', 'channel_id', 'key_entities']
    assert cols('users') == ['user_id', 'register_ts', 'region', 'home_currency'] and cols('devices') == ['muid', 'os', 'first_seen']
    assert set(r[0] for r in con.execute("SELECT DISTINCT status FROM transactions").fetchall()) == {'success', 'refunded', 'failed'}
    assert one(con, "SELECT count(*) FROM transactions WHERE (status = 'refunded') <> (refund_ts IS NOT NULL) OR refund_ts < ts") == (0,)

def test_every_key_joins(con):
    for table, key in [('users', 'user_id'), ('devices', 'muid'), ('items', 'item_id'), ('channels', 'channel_id'), ('games', 'game_id')]:
        assert one(con, f"SELECT count(*) FROM transactions t ANTI JOIN {table} USING ({key})") == (0,), table

def test_labels_join_transactions_and_incidents(con, gt):
    assert tuple(gt) == PATTERNS
    assert one(con, "SELECT count(*) FROM fraud_labels ANTI JOIN transactions USING (txn_id)") == (0,)
    assert one(con, "SELECT count(*) FROM fraud_labels ANTI JOIN fraud_incidents USING (incident_id)") == (0,)
    per = dict(con.execute("SELECT incident_id, count(*) FROM fraud_labels GROUP BY 1").fetchall())
    assert all(per.get(g['incident_id'], 0) >= 100 for g in gt.values())
    for g in gt.values():  # the incident's game/channel are those of its labelled rows
        games, chans = one(con, f"""SELECT list(DISTINCT game_id), list(DISTINCT channel_id) FROM fraud_labels
                                    JOIN transactions USING (txn_id) WHERE incident_id = '{g['incident_id']}'""")
        assert g['game_id'] in (None, *games) and (g['game_id'] is None or games == [g['game_id']])
        assert g['channel_id'] is None or chans == [g['channel_id']]

def _labelled(con, gt, pattern, what):
    return one(con, f"""SELECT {what} FROM fraud_labels JOIN transactions USING (txn_id) JOIN items i USING (item_id)
                        WHERE incident_id = '{gt[pattern]['incident_id']}'""")

def test_proxy_recharge_ring(con, gt):
    users, muids, payers, share = _labelled(con, gt, 'proxy_recharge', "count(DISTINCT user_id), count(DISTINCT muid), count(DISTINCT payer_id), avg(amount_cny / price)")
    assert users >= 150 and muids <= 5 and payers <= 4 and share < 0.8
    assert one(con, f"SELECT channel_type FROM channels WHERE channel_id = '{gt['proxy_recharge']['channel_id']}'") == ('discount',)

def test_device_farm(con, gt):
    new, muids, top = _labelled(con, gt, 'device_farm', """count(DISTINCT user_id) FILTER (user_id IN (SELECT user_id FROM users
        WHERE register_ts >= DATE '2026-04-02')), count(DISTINCT muid), max(amount_cny)""")
    assert new >= 100 and muids <= 8 and top <= 6

def test_the_spike_is_findable(con, gt):
    spike = gt['channel_spike']
    n_last, n_prev, cny_last, cny_prev = one(con, f"""SELECT count(*) FILTER ({LAST}), count(*) FILTER ({PREV}) / 4,
        sum(amount_cny) FILTER ({LAST}), sum(amount_cny) FILTER ({PREV}) / 4 FROM transactions WHERE game_id = 'g02' AND status = 'success'""")
    assert spike['game_id'] == 'g02' and n_last >= 1.4 * n_prev and cny_last >= 1.4 * cny_prev
    inc = lambda dim: con.execute(f"""SELECT {dim}, count(*) FILTER ({LAST}) - count(*) FILTER ({PREV}) / 4 AS inc FROM transactions
        WHERE game_id = 'g02' AND status = 'success' GROUP BY 1 ORDER BY inc DESC LIMIT 2""").fetchall()
    (top_channel, top_inc), (_, second_inc) = inc('channel_id')
    assert top_channel == spike['channel_id'] and top_inc > 0.8 * (n_last - n_prev) and top_inc > 10 * second_inc
    assert one(con, f"SELECT channel_type FROM channels WHERE channel_id = '{top_channel}'") == ('discount',)
    assert [inc('item_id')[0][0]] == spike['key_entities']['items']
    top_devices = {m for m, _ in inc('muid')[:2]} | {m for m, _ in con.execute(f"""SELECT muid, count(*) FROM transactions
        WHERE game_id = 'g02' AND {LAST} GROUP BY 1 ORDER BY 2 DESC LIMIT 3""").fetchall()}
    assert top_devices == set(spike['key_entities']['muids']) and len(top_devices) <= 5
    assert len(spike['key_entities']['users']) >= 150 and len(spike['key_entities']['payers']) <= 4

def test_no_other_game_jumps(con):
    lifts = dict(con.execute(f"""SELECT game_id, count(*) FILTER ({LAST}) / (count(*) FILTER ({PREV}) / 4) - 1 FROM transactions
                                 WHERE status = 'success' GROUP BY 1""").fetchall())
    assert lifts.pop('g02') >= 0.4 and all(abs(v) < 0.1 for v in lifts.values()), lifts

def test_velocity_burst(con, gt):
    fast = {u for (u,) in con.execute("""SELECT DISTINCT user_id FROM (SELECT user_id, count(*) OVER (PARTITION BY user_id ORDER BY ts
        RANGE BETWEEN INTERVAL 10 MINUTE PRECEDING AND CURRENT ROW) AS n FROM transactions) WHERE n >= 20""").fetchall()}
    assert 3 <= len(fast) <= 10 and fast == set(gt['velocity_burst']['key_entities']['users'])

def test_refund_abuse(con, gt):
    abusers = {u for (u,) in con.execute("""SELECT user_id FROM transactions GROUP BY user_id
        HAVING count(*) >= 5 AND avg((status = 'refunded')::INT) > 0.5""").fetchall()}
    labelled = set(gt['refund_abuse']['key_entities']['users'])
    found = abusers & labelled  # a rule this simple also catches the odd unlucky ordinary player, rarely
    assert len(found) >= 30 and len(found) >= 0.9 * len(abusers) and len(found) >= 0.8 * len(labelled)

def test_currency_mismatch_concentrated_in_one_channel(con, gt):
    by_channel = con.execute("""SELECT channel_id, count(*) FROM transactions t JOIN users u USING (user_id) JOIN items i USING (item_id)
        WHERE t.currency <> u.home_currency AND t.currency <> i.currency GROUP BY 1 ORDER BY 2 DESC""").fetchall()
    total = sum(n for _, n in by_channel)
    assert by_channel[0][0] == gt['currency_mismatch']['channel_id'] and by_channel[0][1] >= 0.8 * total
    labelled_ok, labelled = _labelled(con, gt, 'currency_mismatch', """count(*) FILTER (transactions.currency <> i.currency AND
        transactions.currency <> (SELECT home_currency FROM users WHERE users.user_id = transactions.user_id)), count(*)""")
    assert labelled_ok == labelled >= 300

def test_second_ensure_does_not_rebuild(db):
    before = db.stat().st_mtime_ns
    assert ensure_dataset(db) == db and ensure_dataset(db, rows=DEFAULT_ROWS, seed=7) == db
    assert db.stat().st_mtime_ns == before

# --- builds killed half-way --------------------------------------------------------------------------------

def _start_build(path, rows=DEFAULT_ROWS, force=False):
    code = f"from reach_nb.risk.data import build_dataset; build_dataset({str(path)!r}, rows={rows}, force={force})"
    return subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

def _kill_mid_build(proc, path, timeout=30):
    "SIGKILL `proc` about a second into writing `<path>.building`."
    building, t0 = Path(f'{path}.building'), time.monotonic()
    while not building.exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() - t0 < timeout, 'the build never started writing'
        time.sleep(0.02)
    time.sleep(1.0)
    assert proc.poll() is None, 'the build finished before it could be killed; kill it sooner'
    os.kill(proc.pid, signal.SIGKILL); proc.wait()
    assert proc.returncode == -signal.SIGKILL

def test_killed_build_is_never_taken_for_a_dataset(tmp_path):
    path = tmp_path/'risk.duckdb'
    _kill_mid_build(_start_build(path), path)
    assert read_meta(path) is None  # nothing at the target: the half-written file is elsewhere
    assert ensure_dataset(path) == path
    meta = read_meta(path)
    assert meta['complete'] == 'true' and meta['rows'] == str(DEFAULT_ROWS)
    with duckdb.connect(str(path), read_only=True) as c:
        assert c.execute("SELECT count(*) FROM fraud_incidents").fetchone() == (6,)
    assert sorted(f.name for f in tmp_path.iterdir()) == ['risk.duckdb', 'risk.duckdb.lock']  # the leftover is cleaned

def test_killed_rebuild_keeps_the_old_dataset(tmp_path):
    path = build_dataset(tmp_path/'risk.duckdb', rows=20_000)
    _kill_mid_build(_start_build(path, force=True), path)
    assert read_meta(path)['rows'] == '20000'  # still the finished old one
    with duckdb.connect(str(path), read_only=True) as c:
        assert c.execute("SELECT count(*) FROM fraud_labels ANTI JOIN transactions USING (txn_id)").fetchone() == (0,)

# --- where it is built, and what a build says ---------------------------------------------------------------

def test_a_build_shows_progress_and_a_reuse_says_so(tmp_path):
    path = tmp_path/'risk.duckdb'
    code = f"""import sys
from reach_nb.risk.data import build_dataset
p = build_dataset({str(path)!r}, rows=20_000, progress=True)
print(type(p).__name__, p.reused, str(p) == {str(path)!r})"""
    run = lambda: subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    first, second = run(), run()
    assert first.returncode == 0 and first.stdout.split() == ['DatasetPath', 'False', 'True'], first.stderr
    assert 'Building risk.duckdb (20,000 rows, seed 7)' in first.stderr and '7/7' in first.stderr, first.stderr
    assert second.stdout.split() == ['DatasetPath', 'True', 'True'] and 'Building' not in second.stderr
    assert f'Reusing the finished dataset at {path} (20,000 rows, seed 7); force=True rebuilds it.' in second.stderr

def test_a_finished_dataset_is_read_without_writing_to_its_folder(tmp_path):
    "What lets a read-only folder serve its dataset: reusing it writes nothing there, not even the build lock."
    path = build_dataset(tmp_path/'risk.duckdb', rows=20_000)
    Path(f'{path}.lock').unlink()
    before = sorted(f.name for f in tmp_path.iterdir())
    assert build_dataset(path, rows=20_000).reused and ensure_dataset(path) == path
    assert sorted(f.name for f in tmp_path.iterdir()) == before == ['risk.duckdb']
    assert not build_dataset(path, rows=20_000, force=True).reused

def test_an_unwritable_folder_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r'not writable and holds no finished dataset in /proc/reach_nb_x: make it writable'):
        ensure_dataset('/proc/reach_nb_x/risk.duckdb')
    with pytest.raises(ValueError, match='rows=0 is not a positive number of transactions'):
        build_dataset('/proc/reach_nb_x/risk.duckdb', rows=0)
