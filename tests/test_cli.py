"The `reach` console script, run as a user runs it: in a subprocess, against real HTTP where a model is needed."
import json, os, socket, subprocess, sys, time
from pathlib import Path
import shutil
import httpx, pytest
from reach_nb.core import Run

REACH = shutil.which('reach') or pytest.fail('the `reach` console script is not installed: pip install -e .')

def _env(**kw):
    env = {k: v for k, v in os.environ.items() if not (k.startswith('REACH_') or k == 'OPENAI_API_KEY')}
    return env | kw

def _free_port():
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

def _reach(*args, cwd, env=None, timeout=120):
    return subprocess.run([REACH, *args], cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=timeout)

def test_demo_runs_offline_and_writes_its_trace(tmp_path):
    r = _reach('demo', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert 'offline stand-in' in r.stdout and 'Answer (answer)' in r.stdout
    run = Run.load(tmp_path/'traces'/'demo.jsonl')
    assert run.stop_reason == 'answer' and run.meta['simulated'] is True

def test_ask_without_a_model_says_what_to_set(tmp_path):
    r = _reach('ask', 'hello', cwd=tmp_path)
    assert r.returncode == 2
    assert 'REACH_API_KEY' in r.stdout + r.stderr

@pytest.fixture
def served_model(tmp_path):
    "`reach serve-model` in its own process, playing a scripted analyst over HTTP."
    script = [json.dumps({'thought': 'Need the first rate.', 'action': {'tool': 'lookup', 'args': {'game': 'Starfall Saga', 'metric': 'refund_rate'}}}),
              json.dumps({'thought': 'Done.', 'answer': 'Starfall Saga refunds 2.1% of recharges.'})]
    (tmp_path/'script.json').write_text(json.dumps(script))
    port = _free_port()
    proc = subprocess.Popen([REACH, 'serve-model', '--model', f'scripted:{tmp_path/"script.json"}', '--port', str(port)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f'http://127.0.0.1:{port}/v1'
    for _ in range(100):
        try:
            if httpx.get(f'{base}/models', timeout=0.5).status_code == 200: break
        except httpx.HTTPError: time.sleep(0.1)
    else:
        proc.kill(); pytest.fail(f'serve-model did not start: {proc.stdout.read().decode()[-2000:]}')
    yield base
    proc.terminate(); proc.wait(10)

def test_ask_over_real_http_against_served_model(tmp_path, served_model):
    r = _reach('ask', 'What is the refund rate of Starfall Saga?', '--base-url', served_model, '--model', 'scripted-analyst',
               '--trace', str(tmp_path/'ask.jsonl'), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    run = Run.load(tmp_path/'ask.jsonl')
    assert run.answer == 'Starfall Saga refunds 2.1% of recharges.'
    assert run.steps[0].observation == '0.021'
    assert run.usage.prompt_tokens > 0 and run.usage.llm_calls == 2
