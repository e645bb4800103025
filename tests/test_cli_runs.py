"""`reach ask` / `reach demo` runs through the real script: exit status, traces that never overwrite a good one, content
that JSON can't hold as it is, questions from stdin or a file, printing, timeouts, retries and waits on the model."""
import json, subprocess
import httpx, pytest
from reach_nb.core import Run
from browser import free_port
from reach_cli import REACH, clean_env, run_reach, served

ANSWER = 'The payments data is in the transactions dataset.'
LOOK = json.dumps({'thought': 'Which datasets are there?', 'action': {'tool': 'list_datasets', 'args': {'category': 'payments'}}})
DONE = json.dumps({'thought': 'Done.', 'answer': ANSWER})


def _script(tmp_path, *replies, name='script.json'):
    p = tmp_path/name
    p.write_text(json.dumps(list(replies)))
    return f'scripted:{p}'


def test_failed_run_exits_nonzero_and_keeps_the_good_trace(tmp_path):
    trace = tmp_path/'run.jsonl'
    r = run_reach('ask', '--model', _script(tmp_path, LOOK, DONE), '--trace', str(trace), 'Where are the payments?', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    good = trace.read_text()
    assert Run.load(trace).answer == ANSWER and f'Trace written to {trace}' in r.stdout
    # the model fails on its second call (the script runs out): llm_error, exit 1, the good trace untouched
    r = run_reach('ask', '--model', _script(tmp_path, LOOK, name='short.json'), '--trace', str(trace), 'Again?', cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert '== stopped: llm_error' in r.stdout and 'Traceback' not in r.stderr
    failed = tmp_path/'run.failed.jsonl'
    assert trace.read_text() == good and not (tmp_path/'run.partial.jsonl').exists()
    assert Run.load(failed).stop_reason == 'llm_error' and Run.load(failed).question == 'Again?'
    assert f'its trace is in {failed}' in r.stderr and 'did not answer (stopped: llm_error)' in r.stderr


def test_run_stopped_at_max_steps_prints_its_answer_once_and_exits_1(tmp_path):
    look2 = json.dumps({'thought': 'And the dimensions?', 'action': {'tool': 'list_datasets', 'args': {'category': 'dimensions'}}})
    r = run_reach('ask', '--model', _script(tmp_path, LOOK, look2, DONE), '--max-steps', '2', '--trace', str(tmp_path/'t.jsonl'),
               'Where are the payments?', cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.count(ANSWER) == 1, r.stdout
    assert '== stopped: max_steps' in r.stdout and Run.load(tmp_path/'t.failed.jsonl').answer == ANSWER


def test_sim_analyst_answer_is_printed_once(tmp_path):
    from reach_nb.risk.data import ensure_dataset
    ensure_dataset()
    r = run_reach('ask', '--model', 'sim-analyst', '--trace', str(tmp_path/'spike.jsonl'),
               'Why did recharge volume jump last week?', cwd=tmp_path)
    traced = tmp_path/('spike.jsonl' if r.returncode == 0 else 'spike.failed.jsonl')
    run = Run.load(traced)
    assert run.answer and r.stdout.count(run.answer) == 1, r.stdout[-3000:]


def nested(n):
    d = x = {}
    for _ in range(n): x['a'] = {}; x = x['a']
    return d


def test_trace_saves_lone_surrogates_and_deep_nesting(tmp_path):
    """Replies holding lone surrogates (as characters and as JSON escapes) and nesting a few hundred deep (refused by the parser: a correction) or just
    under the parser's limit (arguments of a real call): the run answers, and its trace saves and loads."""
    too_deep = json.dumps({'thought': 'Deep \ud800', 'action': {'tool': 'list_datasets', 'args': {'deep': nested(300)}}}, ensure_ascii=False)
    look = json.dumps({'thought': 'Look \ud800 here', 'action': {'tool': 'list_datasets',
                       'args': {'category': 'pay\ud800', 'deep': nested(190)}}}, ensure_ascii=False)
    done = json.dumps({'thought': 'Done \udfff.', 'answer': 'An answer with \ud800 inside.'})
    trace = tmp_path/'odd.jsonl'
    r = run_reach('ask', '--model', _script(tmp_path, too_deep, look, done), '--trace', str(trace), 'Where?', cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert 'Traceback' not in r.stderr
    run = Run.load(trace)
    assert run.answer == 'An answer with \ufffd inside.' and len(run.steps) == 3
    assert 'Deep \ufffd' in run.steps[0].raw and run.steps[0].parse_level == 'failed'
    step = run.steps[1]
    assert step.thought == 'Look \ufffd here' and step.actions[0].args['category'] == 'pay\ufffd'
    assert 'nested deeper than' in json.dumps(step.actions[0].args)
    assert '\ufffd' in step.raw and "got 'pay" in step.observation


def test_question_from_stdin_and_from_a_file(tmp_path):
    question = 'Where are the payments?\n' + 'Consider every dataset. ' * 200
    r = subprocess.run([REACH, 'ask', '--model', _script(tmp_path, DONE), '--trace', str(tmp_path/'in.jsonl'), '-'],
                       input=question, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert Run.load(tmp_path/'in.jsonl').question == question.strip()
    (tmp_path/'q.txt').write_text(question, encoding='utf-8')
    r = run_reach('ask', '--model', _script(tmp_path, DONE), '--file', str(tmp_path/'q.txt'), '--trace', str(tmp_path/'f.jsonl'),
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert Run.load(tmp_path/'f.jsonl').question == question.strip()


def test_timeout_flag_bounds_each_model_request(tmp_path):
    "A model slower than --timeout: the calls time out, the run fails with llm_error, exit 1, a failed trace."
    with served(_script(tmp_path, LOOK, DONE), '--latency', '3') as base:
        r = run_reach('ask', '--base-url', base, '--model', 'openai:slow', '--timeout', '0.3', '--trace', str(tmp_path/'t.jsonl'),
                   'Where are the payments?', cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert '! llm_error' in r.stdout and 'timeout' in r.stdout.split('! llm_error', 1)[1].lower()
    assert Run.load(tmp_path/'t.failed.jsonl').stop_reason == 'llm_error' and not (tmp_path/'t.jsonl').exists()


def test_retries_and_waiting_show_but_only_on_stderr_and_in_the_step(tmp_path):
    "A 429 is retried and shown in the step printout; a slow model shows the time waited on stderr only."
    with served(_script(tmp_path, LOOK, DONE), '--errors', '429', '--latency', '2.6') as base:
        r = run_reach('ask', '--base-url', base, '--model', 'openai:scripted', '--trace', str(tmp_path/'t.jsonl'),
                   'Where are the payments?', cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert '  ! retry: ' in r.stdout
    run = Run.load(tmp_path/'t.jsonl')
    assert [g.kind for g in run.steps[0].safeguards] == ['retry']
    assert 'waiting for the model… 2s' in r.stderr
    assert 'waiting for the model' not in r.stdout + (tmp_path/'t.jsonl').read_text()


def test_data_build_validates_and_reuses(tmp_path):
    "`reach data build` builds, then reuses an identical dataset unless --force."
    from reach_nb.risk.data import read_meta
    db = tmp_path/'small.duckdb'
    r = run_reach('data', 'build', '--rows', '20000', '--seed', '3', '--path', str(db), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert int(read_meta(db)['seed']) == 3
    built = db.stat().st_mtime_ns
    r = run_reach('data', 'build', '--rows', '20000', '--seed', '3', '--path', str(db), cwd=tmp_path)
    assert r.returncode == 0 and db.stat().st_mtime_ns == built
    assert 'reusing' in (r.stdout + r.stderr).lower()
    r = run_reach('data', 'build', '--rows', '20000', '--seed', '3', '--path', str(db), '--force', cwd=tmp_path)
    assert r.returncode == 0 and db.stat().st_mtime_ns != built


def test_demo_with_a_failing_model_exits_1_and_keeps_the_good_trace(tmp_path):
    r = run_reach('demo', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    good = (tmp_path/'traces'/'demo.jsonl').read_text()
    nowhere = f'http://127.0.0.1:{free_port()}/v1'  # nothing listens there: every call fails
    r = run_reach('demo', cwd=tmp_path, env=clean_env(REACH_BASE_URL=nowhere, REACH_REQUEST_TIMEOUT='1'))
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert '== stopped: llm_error' in r.stdout and 'Traceback' not in r.stderr
    assert (tmp_path/'traces'/'demo.jsonl').read_text() == good
    assert Run.load(tmp_path/'traces'/'demo.failed.jsonl').stop_reason == 'llm_error'


def test_serve_model_wire_option_shapes_the_replies(tmp_path):
    spec = _script(tmp_path, DONE)
    with served(spec, '--wire', 'think') as base:
        r = httpx.post(f'{base}/chat/completions', json={'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}]})
    content = r.json()['choices'][0]['message']['content']
    assert content.startswith('<think>') and content.rstrip().endswith(DONE), content
