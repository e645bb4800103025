"The `reach` console script, run as a user runs it: in a subprocess, against real HTTP where a model is needed."
import json, select, subprocess, time
import httpx
import pytest
from reach_nb.core import Run

from reach_cli import REACH, clean_env, run_reach, served


def test_demo_runs_offline_and_writes_its_trace(tmp_path):
    r = run_reach('demo', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert 'SimAnalyst, the offline simulated analyst, answers' in r.stderr and '== stopped: answer' in r.stdout
    assert r.stdout.rstrip().endswith(f"Trace written to {tmp_path/'traces'/'demo.jsonl'}")  # its full path
    run = Run.load(tmp_path/'traces'/'demo.jsonl')
    assert run.stop_reason == 'answer' and run.meta['simulated'] is True
    assert [s.action.tool for s in run.steps if s.action][:2] == ['list_datasets', 'describe_dataset']

def test_ask_without_a_model_falls_back_to_the_offline_analyst_as_the_demo_does(tmp_path):
    r = run_reach('ask', 'Why did recharge volume jump last week?', '--trace', str(tmp_path/'ask.jsonl'), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    note = r.stderr.splitlines()[0]
    assert note.startswith('No model configured, so SimAnalyst, the offline simulated analyst, answers;'), r.stderr
    assert 'REACH_API_KEY' in note and '--model' in note and "get_model('echo')" not in r.stderr
    assert Run.load(tmp_path/'ask.jsonl').meta['simulated'] is True
    demo = run_reach('demo', cwd=tmp_path)
    assert demo.stderr.splitlines()[0] == note  # the same words, the same fallback


def test_a_model_named_but_not_configured_says_what_to_set(tmp_path):
    r = run_reach('ask', '--model', 'gpt-4o', 'hello', cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count('\n') == 1, r.stderr
    assert "cannot use the model 'gpt-4o': no model endpoint is configured in option --model: set REACH_API_KEY" in r.stderr
    assert '--model sim-analyst' in r.stderr and "get_model(" not in r.stderr

@pytest.fixture
def served_model(tmp_path):
    "A scripted analyst served over HTTP."
    script = [json.dumps({'thought': 'Which datasets are there?', 'action': {'tool': 'list_datasets', 'args': {'category': 'payments'}}}),
              json.dumps({'thought': 'Done.', 'answer': 'The payments data is in the transactions dataset.'})]
    (tmp_path/'script.json').write_text(json.dumps(script))
    with served(f'scripted:{tmp_path/"script.json"}') as base: yield base

def test_ask_over_real_http_against_served_model(tmp_path, served_model):
    r = run_reach('ask', 'Where are the payments?', '--base-url', served_model, '--model', 'scripted-analyst',
               '--trace', str(tmp_path/'ask.jsonl'), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    run = Run.load(tmp_path/'ask.jsonl')
    assert run.answer == 'The payments data is in the transactions dataset.'
    assert 'transactions' in run.steps[0].observation and run.steps[0].observations[0].ok
    assert run.usage.prompt_tokens > 0 and run.usage.llm_calls == 2

def test_sim_analyst_served_by_name_answers_reach_ask(tmp_path):
    "The stand-in served by name over HTTP, asked through `reach ask`: it finds the labelled spike."
    from reach_nb.risk.data import ensure_dataset, ground_truth
    spike = next(i for i in ground_truth(ensure_dataset()) if i['pattern'] == 'channel_spike')
    with served('sim-analyst') as base:
        r = run_reach('ask', 'Why did recharge volume jump last week?', '--base-url', base, '--model', 'openai:sim-analyst',
                   '--max-steps', '20', '--trace', str(tmp_path/'spike.jsonl'), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run = Run.load(tmp_path/'spike.jsonl')
    assert spike['channel_id'] in run.answer and spike['game_id'] in run.answer
    assert run.meta['simulated'] is True and 'served over HTTP' in run.meta['simulated_note']

def test_a_served_context_window_is_learned_and_layered_context_keeps_the_answer(tmp_path):
    """`reach serve-model --context-window 5000` refuses a longer prompt as llama.cpp's server does. `reach ask`, not told
    the window, learns it from the first refusal and fits its prompts, the oldest turns left out, so the run goes on (and
    loses what they held); under `--context layered` no prompt reaches the window and the spike is found."""
    from reach_nb.risk.data import ensure_dataset, ground_truth
    spike = next(i for i in ground_truth(ensure_dataset()) if i['pattern'] == 'channel_spike')
    runs = {}
    with served('sim-analyst', '--context-window', '5000') as base:
        for ctx in ('full', 'layered'):
            r = run_reach('ask', 'Why did recharge volume jump last week?', '--base-url', base, '--model', 'openai:sim-analyst',
                          '--max-steps', '20', '--context', ctx, '--trace', str(tmp_path/f'{ctx}.jsonl'), cwd=tmp_path)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            runs[ctx] = Run.load(tmp_path/f'{ctx}.jsonl')
    kinds = {ctx: [g for s in run.steps for g in s.safeguards] for ctx, run in runs.items()}
    fitted = [s for s in runs['full'].steps
              if any(g.kind == 'size_cap' and "context window (5,000 tokens" in g.detail for g in s.safeguards)]
    assert fitted and all(s.prompt for s in fitted) and not any(g.kind == 'llm_error' for g in kinds['full'])
    assert not any(g.kind in ('size_cap', 'llm_error') for g in kinds['layered'])
    assert spike['channel_id'] in runs['layered'].answer and spike['channel_id'] not in runs['full'].answer

def test_data_build_writes_a_dataset_with_its_meta(tmp_path):
    from reach_nb.risk.data import read_meta
    r = run_reach('data', 'build', '--rows', '20000', '--seed', '3', '--path', str(tmp_path/'small.duckdb'), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = read_meta(tmp_path/'small.duckdb')
    assert int(meta['seed']) == 3 and abs(int(meta['rows']) - 20000) < 2000
    assert 'small.duckdb' in r.stdout

def test_killed_ask_leaves_a_readable_trace(tmp_path):
    "The trace is written as the run goes (to NAME.partial.jsonl): kill `reach ask` half-way and the steps so far load back."
    from reach_nb.risk.data import ensure_dataset
    ensure_dataset()
    trace, partial = tmp_path/'killed.jsonl', tmp_path/'killed.partial.jsonl'
    with served('sim-analyst', '--latency', '0.5') as base:
        proc = subprocess.Popen([REACH, 'ask', 'Why did recharge volume jump last week?', '--base-url', base, '--model', 'openai:sim-analyst',
                                 '--max-steps', '20', '--trace', str(trace)], cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                if partial.exists() and partial.read_text().count('"step_end"') >= 2: break
                time.sleep(0.05)
            else: pytest.fail('no steps were written to the trace')
        finally: proc.kill(); proc.wait(10)
    run = Run.load(partial)
    assert run.stop_reason is None and run.answer is None and run.status == 'incomplete' and not trace.exists()
    assert 2 <= len(run.steps) < 11 and run.steps[0].action.tool == 'list_datasets'

def test_serve_model_prints_the_base_url_to_use(tmp_path):
    proc = subprocess.Popen([REACH, 'serve-model', '--port', '0'], cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        said, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if said else ''
        assert ' at ' in line, f'no address printed: {line!r}'
        base = line.split(' at ')[1].split()[0]
        assert line.startswith('Serving echo at http://127.0.0.1:') and base.endswith('/v1'), line
        assert httpx.get(f'{base}/models', timeout=5).json()['data'][0]['id'] == 'echo'
    finally: proc.terminate(); proc.wait(10)


def test_demo_into_a_closed_pipe_finishes_its_run_quietly(tmp_path):
    "`reach demo | head -3`: the reader goes after three lines, while the model is slow; the run still ends, traced."
    with served('sim-analyst', '--latency', '0.3') as base:
        proc = subprocess.Popen([REACH, 'demo', '--trace', str(tmp_path/'demo.jsonl')], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=clean_env(REACH_BASE_URL=base))
        head = [proc.stdout.readline() for _ in range(3)]
        proc.stdout.close()  # as `head -3` does once it has its lines
        err = proc.stderr.read().decode(); proc.wait(120)
    assert head[0].startswith(b'Question: ') and proc.returncode == 0, err
    assert 'Traceback' not in err and 'BrokenPipe' not in err and 'did not answer' not in err, err
    run = Run.load(tmp_path/'demo.jsonl')
    assert run.stop_reason == 'answer' and len(run.steps) > 3


def test_the_first_demo_shows_the_build_of_its_data(tmp_path):
    "With no dataset yet, `reach demo` shows the build's progress bar on stderr at once (killed then: the bar is enough)."
    db = tmp_path/'risk.duckdb'
    proc = subprocess.Popen([REACH, 'demo'], cwd=tmp_path, env=clean_env(REACH_DATA_DB=str(db)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        seen, deadline = b'', time.monotonic() + 60
        while b'stage' not in seen and time.monotonic() < deadline and proc.poll() is None:
            seen += proc.stderr.read1(4096)
    finally: proc.kill(); proc.wait(10)
    assert b'Building risk.duckdb (1,000,000 rows, seed 7)' in seen and b'stage' in seen, seen


def test_files_written_are_named_by_their_full_path(tmp_path):
    r = run_reach('ask', '--model', 'sim-analyst', '--trace', 'rel.jsonl', 'Why did recharge volume jump last week?',
                  cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.rstrip().endswith(f'Trace written to {tmp_path/"rel.jsonl"}'), r.stderr
    r = run_reach('data', 'build', '--rows', '20000', '--path', 'small.duckdb', cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith(f'{tmp_path/"small.duckdb"}: '), r.stdout + r.stderr
