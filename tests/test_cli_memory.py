"""`reach ask --context/--dialect/--session`, `reach resume` and `reach bench context/recall`, run as a user runs them: in
subprocesses, a conversation kept in the session store across invocations, a run killed with SIGKILL and resumed."""
import json, signal, subprocess, time
import pytest
from reach_nb.core import Run
from reach_nb.memory.sessions import SQLiteSessionStore
from reach_cli import REACH, clean_env, run_reach, served

LOOK = {'thought': 'Which datasets are there?', 'action': {'tool': 'list_datasets', 'args': {'category': 'payments'}}}
COLUMNS = {'thought': 'Its columns.', 'action': {'tool': 'describe_dataset', 'args': {'dataset': 'transactions'}}}
ANSWER = 'The payments data is in the transactions dataset.'
DONE = {'thought': 'Done.', 'answer': ANSWER}


def _script(tmp_path, name, *replies):
    p = tmp_path/f'{name}.json'
    p.write_text(json.dumps([json.dumps(r) for r in replies]))
    return f'scripted:{p}'


def _store_env(tmp_path):
    return clean_env(REACH_TRACE_DIR=str(tmp_path/'traces'))


def _one_error_line(r):
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == '' and r.stderr.count('\n') == 1 and r.stderr.startswith('Error: '), r.stderr
    assert 'Traceback' not in r.stderr
    return r.stderr.strip()


def test_context_and_dialect_reach_the_agent(tmp_path):
    risk_look = {'Thought': 'Which datasets?', 'Action': {'function': 'list_datasets', 'parameters': {}}}
    risk_done = {'Thought': 'Enough.', 'Conclusion': ANSWER}
    trace = tmp_path/'risk.jsonl'
    r = run_reach('ask', '--model', _script(tmp_path, 'risk', risk_look, risk_done), '--context', 'window:2', '--dialect', 'risk',
               '--trace', str(trace), 'Where are the payments?', cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    run = Run.load(trace)
    assert (run.answer, run.meta['dialect'], run.meta['context']) == (ANSWER, 'risk', {'name': 'window', 'k': 2})
    assert '"Conclusion"' in run.prompt_at(1)[0]['content']  # the risk dialect's system prompt
    r = run_reach('ask', '--model', _script(tmp_path, 'lay', LOOK, DONE), '--context', 'layered', '--trace', str(trace),
               'Where?', cwd=tmp_path)
    run = Run.load(trace)
    assert r.returncode == 0 and run.meta['context']['name'] == 'layered' and run.steps[0].summary


@pytest.mark.parametrize('args, says', [
    (('ask', 'Why?', '--context', 'recent'), "bad context policy 'recent' in option --context: use full, window"),
    (('ask', 'Why?', '--context', 'window:many'), "bad context policy 'window:many' in option --context"),
    (('ask', 'Why?', '--dialect', 'yaml'), "unknown dialect 'yaml' in option --dialect: use one of default, risk, reach"),
    (('ask', 'Why?', '--native', '--dialect', 'risk'), '--dialect with --native in option --dialect: drop one'),
    (('ask', 'Why?', '--session', ' '), "bad session id ' ' in option --session"),
    (('resume', 'nosuch'), "no stored run 'nosuch' in the RUN_ID argument: reach runs lists the stored runs"),
    (('bench', 'context', '--steps', '0'), '--steps must be at least 1, got 0 in option --steps'),
    (('bench', 'recall', '--queries', '0'), '--queries must be at least 1, got 0 in option --queries'),
])
def test_mistakes_are_one_error_line(tmp_path, args, says):
    assert says in _one_error_line(run_reach(*args, cwd=tmp_path, env=_store_env(tmp_path)))


def test_session_carries_the_conversation_across_invocations(tmp_path):
    env = _store_env(tmp_path)
    r1 = run_reach('ask', '--model', _script(tmp_path, 'one', LOOK, DONE), '--session', 'alice', '--trace',
                str(tmp_path/'one.jsonl'), 'Where are the payments?', cwd=tmp_path, env=env)
    then = {'thought': 'As found before.', 'answer': 'In transactions, as found.'}
    r2 = run_reach('ask', '--model', _script(tmp_path, 'two', then), '--session', 'alice', '--trace',
                str(tmp_path/'two.jsonl'), 'And where was that again?', cwd=tmp_path, env=env)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    second = Run.load(tmp_path/'two.jsonl')  # the trace is still written
    sent = second.prompt_at(1)
    assert [m['role'] for m in sent] == ['system', 'user', 'assistant', 'user']
    assert sent[1]['content'] == 'Where are the payments?' and sent[2]['content'].startswith(ANSWER)
    assert "- list_datasets(category='payments') → " in sent[2]['content']  # a fact the first run found
    with SQLiteSessionStore(tmp_path/'traces'/'sessions.sqlite') as store:
        infos = store.runs('alice')
        assert [i.question for i in infos] == ['Where are the payments?', 'And where was that again?']
        assert store.run(infos[1].run_id).prompt_at(1) == sent
    assert f'Run: {infos[1].run_id} · session: alice' in r2.stdout


def test_session_history_follows_the_context_policy(tmp_path):
    env = _store_env(tmp_path)
    for i in range(1, 4):
        r = run_reach('ask', '--model', _script(tmp_path, f's{i}', {'thought': '.', 'answer': f'Answer {i}.'}), '--session', 'bob',
                   '--context', 'window:1', '--trace', str(tmp_path/f's{i}.jsonl'), f'Question {i}?', cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
    sent = Run.load(tmp_path/'s3.jsonl').prompt_at(1)
    assert [m['content'] for m in sent[1:]] == ['Question 2?', 'Answer 2.',
                                                'Question 3?\n\n(1 earlier turn of this conversation not shown.)']


def _wait_for_step(db, session, step, proc, timeout=60):
    "The id of the session's run once step `step` is stored (polling the store while another process writes it)."
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if db.exists():
            with SQLiteSessionStore(db) as store:
                runs = store.runs(session)
                if runs and any(e.type == 'step_end' and e.step.index == step for e in store.events(runs[0].run_id)):
                    return runs[0].run_id
        time.sleep(0.1)
    pytest.fail(f'step {step} was not stored in {timeout}s')


def test_resume_a_run_killed_at_a_step(tmp_path):
    "`reach ask --session` over HTTP with a slow model, killed with SIGKILL while step 2 waits; `reach resume` finishes it."
    env, db = _store_env(tmp_path), tmp_path/'traces'/'sessions.sqlite'
    with served(_script(tmp_path, 'served', LOOK, COLUMNS, DONE), '--latency', '1.5') as base:
        proc = subprocess.Popen([REACH, 'ask', '--base-url', base, '--model', 'slow-analyst', '--session', 'carol',
                                 'Where are the payments?'], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try: run_id = _wait_for_step(db, 'carol', 1, proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL and f'Run: {run_id} · session: carol' in out
    with SQLiteSessionStore(db) as store:
        assert store.info(run_id).status == 'incomplete' and len(store.run(run_id).steps) == 1
    trace = tmp_path/'resumed.jsonl'
    r = run_reach('resume', run_id, '--model', _script(tmp_path, 'rest', COLUMNS, DONE), '--trace', str(trace),
               cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert '── step 1' in r.stdout and 'action  : describe_dataset' in r.stdout and r.stdout.count(ANSWER) == 1
    run = Run.load(trace)
    assert (run.answer, [s.index for s in run.steps]) == (ANSWER, [1, 2, 3])
    with SQLiteSessionStore(db) as store:
        assert store.info(run_id).status == 'finished' and store.run(run_id).answer == ANSWER
        starts = [e.call.tool for e in store.events(run_id) if e.type == 'tool_start']
    assert starts == ['list_datasets', 'describe_dataset']  # step 1's call was not made again
    again = run_reach('resume', run_id, '--model', 'echo', cwd=tmp_path, env=env)  # finished: nothing to do
    assert again.returncode == 0 and 'nothing to resume' in again.stderr and again.stdout.count(ANSWER) == 1


def test_bench_context_prints_the_table(tmp_path):
    r = run_reach('bench', 'context', '--steps', '12', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split()[:5] == ['policy', 'step', '1', 'step', '5']
    rows = {l.split('  ')[0].strip(): l for l in lines[2:]}
    assert list(rows) == ['full', 'window k=4', 'layered', 'layered summaries=500']
    assert rows['full'].endswith('right') and 'wrong' in rows['window k=4']


def test_bench_recall_runs_the_recall_benchmark(tmp_path):
    r = run_reach('bench', 'recall', '--memories', '300', '--queries', '3', cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'labelled set: 65 memories' in r.stdout and 'recall@5' in r.stdout
    assert 'latency with 365 memories' in r.stdout and 'over 3 questions' in r.stdout


def test_resume_uses_the_model_the_run_was_made_with(tmp_path):
    "No --model: `reach resume` makes the model the run recorded (its spec and endpoint), not the settings' default."
    env, db = _store_env(tmp_path), tmp_path/'traces'/'sessions.sqlite'
    with served(_script(tmp_path, 'served', LOOK, COLUMNS, DONE, DONE), '--latency', '1.5') as base:
        proc = subprocess.Popen([REACH, 'ask', '--base-url', base, '--model', 'slow-analyst', '--session', 'dora',
                                 'Where are the payments?'], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try: run_id = _wait_for_step(db, 'dora', 1, proc)
        finally: proc.send_signal(signal.SIGKILL); proc.wait(30)
        with SQLiteSessionStore(db) as store:
            meta = store.run(run_id).meta
        assert (meta['model_spec'], meta['base_url']) == ('slow-analyst', base)
        r = run_reach('resume', run_id, '--trace', str(tmp_path/'resumed.jsonl'), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run = Run.load(tmp_path/'resumed.jsonl')
    assert (run.answer, run.model) == (ANSWER, 'slow-analyst')
