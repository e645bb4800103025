"""A session store that is damaged, read-only, locked by another process or on a full disk, met by `reach ask --session`
and `reach resume` run as a user runs them: one `Error:` line that names the store file and says what to do, a
non-zero exit, and nothing that was committed before is lost (the file is never rewritten by the failure).

The damage is real (pages of the file zeroed), so is the read-only file (`chattr +i` where the file system allows it,
else permissions, which only bind a user who is not root), the lock (another process holding SQLite's write lock) and
the full disk (a small tmpfs mounted for the test, which needs root; without it the test is skipped, and the notebook
shows the same error on any machine through SQLite's `PRAGMA max_page_count`).
"""
import hashlib, json, os, sqlite3, subprocess, sys, uuid
from pathlib import Path

import pytest

from reach_nb.core import RunStart
from reach_nb.memory.sessions import SQLiteSessionStore

from reach_cli import REACH, clean_env, run_reach

DONE = json.dumps({'thought': 'Done.', 'answer': 'Fine.'})


def script(tmp_path:Path, *replies) -> str:
    "A `--model` spec for a scripted model that gives `replies` in turn."
    p = tmp_path/f'script-{uuid.uuid4().hex[:8]}.json'
    p.write_text(json.dumps(list(replies)))
    return f'scripted:{p}'


def env_for(traces:Path) -> dict: return clean_env(REACH_TRACE_DIR=str(traces))


def made_store(tmp_path:Path, traces:Path) -> tuple[Path, str]:
    "A store holding a finished run (made by `reach ask --session`) and a cut one; its path and the cut run's id."
    r = run_reach('ask', '--model', script(tmp_path, DONE), '--session', 'alice', 'Hi?', cwd=tmp_path,
                  env=env_for(traces))
    assert r.returncode == 0, r.stdout + r.stderr
    db = traces/'sessions.sqlite'
    with SQLiteSessionStore(db) as store:
        cut = store.new_run('alice', question='Cut short?')
        store.append(cut, RunStart(question='Cut short?'))
    return db, cut


def digest(p:Path) -> str: return hashlib.sha256(p.read_bytes()).hexdigest()


def one_error_line(r:subprocess.CompletedProcess, db:Path, *says:str) -> str:
    "The one `Error:` line of a failed run, which names the store `db` and says each of `says`."
    assert r.returncode != 0, r.stdout + r.stderr
    assert 'Traceback' not in r.stderr and '╭' not in r.stderr, r.stderr[-3000:]
    errors = [l for l in r.stderr.splitlines() if l.startswith('Error: ')]
    assert len(errors) == 1 and r.stderr.rstrip().endswith(errors[0]), r.stderr[-3000:]
    assert str(db) in errors[0], errors[0]
    for s in says: assert s in errors[0], errors[0]
    return errors[0]


def ask_and_resume(tmp_path:Path, traces:Path, cut:str) -> list[subprocess.CompletedProcess]:
    "`reach ask --session alice` and `reach resume CUT`, run at the same time."
    env = env_for(traces)
    cmds = [[REACH, 'ask', '--model', script(tmp_path, DONE), '--session', 'alice', 'Again?'],
            [REACH, 'resume', cut, '--model', script(tmp_path, DONE)]]
    procs = [subprocess.Popen(c, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for c in cmds]
    outs = [p.communicate(timeout=180) for p in procs]
    return [subprocess.CompletedProcess(c, p.returncode, o, e) for c, p, (o, e) in zip(cmds, procs, outs)]


def zero_pages(db:Path, pages:slice):
    "Overwrite pages of an SQLite file with zeros, as a disk or a copy that went wrong leaves it."
    b = bytearray(db.read_bytes())
    size = int.from_bytes(b[16:18], 'big')
    start, stop = pages.start * size, len(b) if pages.stop is None else pages.stop * size
    b[start:stop] = bytes(stop - start)
    db.write_bytes(bytes(b))


@pytest.mark.parametrize('pages, says', [(slice(1, None), ['.dump']), (slice(0, 1), ['or is not an SQLite file'])],
                         ids=['tables zeroed', 'header zeroed'])
def test_a_damaged_store_is_one_error_line_and_is_left_as_it_is(tmp_path, pages, says):
    traces = tmp_path/'traces'
    db, cut = made_store(tmp_path, traces)
    zero_pages(db, pages)
    before = digest(db)
    for r in ask_and_resume(tmp_path, traces, cut):
        one_error_line(r, db, 'the session store is damaged', 'move it away', *says)
    assert digest(db) == before  # nothing rewrote or cut the file


def _immutable(p:Path) -> bool:
    "Make `p` immutable with `chattr +i`; False where the file system or the user cannot."
    return subprocess.run(['chattr', '+i', str(p)], capture_output=True).returncode == 0 if os.geteuid() == 0 else False


class ReadOnly:
    "Makes paths read-only: immutable where it can, else without write permission (which binds only a user not root)."
    def __init__(self): self.undo = []

    def __call__(self, p:Path):
        if _immutable(p): self.undo.append(lambda: subprocess.run(['chattr', '-i', str(p)], check=True))
        elif os.geteuid() == 0: pytest.skip('chattr +i does not work here, and permissions do not bind root')
        else:
            mode = p.stat().st_mode
            p.chmod(0o555 if p.is_dir() else 0o444)
            self.undo.append(lambda: p.chmod(mode))

    def restore(self):
        while self.undo: self.undo.pop()()


@pytest.fixture
def read_only():
    made = ReadOnly()
    yield made
    made.restore()


@pytest.mark.parametrize('what', ['file', 'folder'])
def test_a_read_only_store_is_one_error_line_and_keeps_its_runs(tmp_path, read_only, what):
    traces = tmp_path/'traces'
    db, cut = made_store(tmp_path, traces)
    before = digest(db)
    read_only(db if what == 'file' else traces)
    for r in ask_and_resume(tmp_path, traces, cut):
        one_error_line(r, db, 'make the file and its folder writable')
    assert digest(db) == before
    read_only.restore()
    with SQLiteSessionStore(db) as store:
        assert [i.status for i in store.runs('alice')] == ['finished', 'incomplete']


HOLD = r'''
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute('BEGIN IMMEDIATE')  # SQLite's write lock, held until this process ends
print('locked', flush=True)
time.sleep(600)
'''


def test_a_store_locked_by_another_process_for_30_s_is_one_error_line(tmp_path):
    traces = tmp_path/'traces'
    db, cut = made_store(tmp_path, traces)
    holder = subprocess.Popen([sys.executable, '-c', HOLD, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'locked'
        results = ask_and_resume(tmp_path, traces, cut)
    finally:
        holder.kill(); holder.wait(30)
    for r in results: one_error_line(r, db, 'is locked by another process for more than 30 s')
    with SQLiteSessionStore(db) as store:
        assert [i.status for i in store.runs('alice')] == ['finished', 'incomplete']
    r = run_reach('resume', cut, '--model', script(tmp_path, DONE), cwd=tmp_path, env=env_for(traces))
    assert r.returncode == 0 and 'Fine.' in r.stdout, r.stdout + r.stderr  # once the lock is gone, it goes on


@pytest.fixture
def small_disk(tmp_path):
    "A 4 MiB tmpfs mounted on a folder for the test (root only); unmounted afterwards."
    disk = tmp_path/'disk'
    disk.mkdir()
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', str(disk)], capture_output=True, text=True)
    if r.returncode: pytest.skip(f'a small file system cannot be mounted here: {r.stderr.strip()[:200]}')
    try: yield disk
    finally: subprocess.run(['umount', str(disk)], check=True)


def fill(disk:Path, leave:int) -> Path:
    "A file that takes the disk's free space but `leave` bytes."
    st = os.statvfs(disk)
    filler = disk/'filler'
    filler.write_bytes(b'0' * (st.f_bavail * st.f_frsize - leave))
    return filler


def test_a_full_disk_mid_run_is_one_error_line_and_keeps_what_was_stored(tmp_path, small_disk):
    traces = small_disk/'traces'
    db, _ = made_store(tmp_path, traces)
    with SQLiteSessionStore(db) as store: first = store.events(store.runs('alice')[0].run_id)
    look = [json.dumps({'thought': f'Look {i}. ' + 'x' * 150_000, 'action': {'tool': 'list_datasets', 'args': {}}})
            for i in range(8)]
    filler = fill(small_disk, 1_200_000)
    r = run_reach('ask', '--model', script(tmp_path, *look, DONE), '--max-steps', '20', '--session', 'alice', 'Big?',
                  cwd=tmp_path, env=env_for(traces))
    one_error_line(r, db, 'the disk holding the session store is full', 'free some space')
    filler.unlink()
    con = sqlite3.connect(db)
    assert con.execute('PRAGMA integrity_check').fetchone() == ('ok',)
    con.close()
    with SQLiteSessionStore(db) as store:
        infos = store.runs('alice')
        assert store.events(infos[0].run_id) == first
        cut = infos[-1]
        assert (cut.question, cut.status) == ('Big?', 'incomplete') and cut.n_events > 3
        assert len(store.events(cut.run_id)) == cut.n_events and f'Run: {cut.run_id}' in r.stdout
        stored = len(store.run(cut.run_id).steps)
    assert stored >= 1
    r = run_reach('resume', cut.run_id, '--model', script(tmp_path, DONE, DONE), cwd=tmp_path, env=env_for(traces))
    assert r.returncode == 0 and 'Fine.' in r.stdout, r.stdout + r.stderr  # with room again, the cut run goes on
    with SQLiteSessionStore(db) as store:
        run = store.run(cut.run_id)
        assert run.answer == 'Fine.' and len(run.steps) >= stored + 1
