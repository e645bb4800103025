"The `reach` console script, run as a user runs it: in a subprocess, against real HTTP where a model is needed."
import json, subprocess, time
import pytest
from reach_nb.core import Run

from reach_cli import REACH, clean_env, run_reach, served


def test_demo_runs_offline_and_writes_its_trace(tmp_path):
    r = run_reach('demo', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert 'offline stand-in' in r.stdout and '== stopped: answer' in r.stdout
    run = Run.load(tmp_path/'traces'/'demo.jsonl')
    assert run.stop_reason == 'answer' and run.meta['simulated'] is True
    assert [s.action.tool for s in run.steps if s.action][:2] == ['list_datasets', 'describe_dataset']

def test_ask_without_a_model_says_what_to_set(tmp_path):
    r = run_reach('ask', 'hello', cwd=tmp_path)
    assert r.returncode == 2
    assert 'REACH_API_KEY' in r.stdout + r.stderr

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
    from reach_nb.risk_data import ensure_dataset, ground_truth
    spike = next(i for i in ground_truth(ensure_dataset()) if i['pattern'] == 'channel_spike')
    with served('sim-analyst') as base:
        r = run_reach('ask', 'Why did recharge volume jump last week?', '--base-url', base, '--model', 'openai:sim-analyst',
                   '--max-steps', '20', '--trace', str(tmp_path/'spike.jsonl'), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run = Run.load(tmp_path/'spike.jsonl')
    assert spike['channel_id'] in run.answer and spike['game_id'] in run.answer
    assert run.meta['simulated'] is True and 'served over HTTP' in run.meta['simulated_note']

def test_data_build_writes_a_dataset_with_its_meta(tmp_path):
    from reach_nb.risk_data import read_meta
    r = run_reach('data', 'build', '--rows', '20000', '--seed', '3', '--path', str(tmp_path/'small.duckdb'), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = read_meta(tmp_path/'small.duckdb')
    assert int(meta['seed']) == 3 and abs(int(meta['rows']) - 20000) < 2000
    assert 'small.duckdb' in r.stdout

def test_killed_ask_leaves_a_readable_trace(tmp_path):
    "The trace is written as the run goes (to NAME.partial.jsonl): kill `reach ask` half-way and the steps so far load back."
    from reach_nb.risk_data import ensure_dataset
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
