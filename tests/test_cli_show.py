"""`reach runs` and `reach show`, run as a user runs them: the runs of the session store and of the trace folder, newest
first; one printed as `reach ask` prints it, or written as a page."""
import json
from reach_nb.core import Run
from reach_nb.memory.sessions import SQLiteSessionStore
from reach_cli import clean_env, run_reach

ANSWER = 'The payments data is in the transactions dataset.'


def test_runs_lists_stored_runs_and_traces_and_show_prints_or_pages_them(tmp_path):
    env = clean_env(REACH_TRACE_DIR=str(tmp_path/'traces'))
    empty = run_reach('runs', cwd=tmp_path, env=env)
    assert empty.returncode == 0 and empty.stdout.startswith('No runs yet'), empty.stdout + empty.stderr
    (tmp_path/'s.json').write_text(json.dumps([json.dumps({'thought': 'Done.', 'answer': ANSWER})]))
    r = run_reach('ask', '--model', f'scripted:{tmp_path/"s.json"}', '--session', 'alice', 'Where are the payments?',
                  cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert run_reach('demo', cwd=tmp_path, env=env).returncode == 0
    with SQLiteSessionStore(tmp_path/'traces'/'sessions.sqlite') as store: rid = store.runs('alice')[0].run_id
    listed = run_reach('runs', cwd=tmp_path, env=env)
    rows = [l.split(None, 4) for l in listed.stdout.splitlines()[:3]]
    assert rows == [['ID', 'AGENT', 'STATUS', 'SESSION', 'QUESTION'],
                    ['demo.jsonl', 'react', 'answer', '-', 'Why did recharge volume jump last week?'],
                    [rid, 'react', 'answer', 'alice', 'Where are the payments?']], listed.stdout
    shown = run_reach('show', rid, cwd=tmp_path, env=env)
    assert shown.returncode == 0 and f'Run: {rid} · session: alice' in shown.stdout, shown.stderr
    assert f'answer  : {ANSWER}' in shown.stdout and '== stopped: answer' in shown.stdout
    demo = run_reach('show', 'demo.jsonl', cwd=tmp_path, env=env)
    assert demo.stdout == run_reach('show', str(tmp_path/'traces'/'demo.jsonl'), cwd=tmp_path, env=env).stdout
    assert 'action  : run_task' in demo.stdout
    page = run_reach('show', rid, '--html', 'run.html', cwd=tmp_path, env=env)
    assert page.returncode == 0 and page.stdout == f'Page written to {tmp_path/"run.html"}\n', page.stderr
    html = (tmp_path/'run.html').read_text()
    assert html.startswith('<!doctype html>') and ANSWER in html and '<script src=' not in html


def test_show_of_an_unknown_id_says_how_to_find_ids(tmp_path):
    env = clean_env(REACH_TRACE_DIR=str(tmp_path/'traces'))
    (tmp_path/'junk.jsonl').write_text('not a trace\n')
    for ref, what in (('nosuch', "no run 'nosuch'"), ('junk.jsonl', 'cannot read the trace')):
        r = run_reach('show', ref, cwd=tmp_path, env=env)
        assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'Traceback' not in r.stderr, r.stderr
        assert r.stderr.startswith(f'Error: {what}') and 'reach runs lists them' in r.stderr, r.stderr
