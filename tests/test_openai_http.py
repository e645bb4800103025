"""OpenAIChat against the local OpenAI-compatible server: the real `openai` SDK over real HTTP, nothing patched.

Most tests run the server in a background thread (`ModelServer`); one starts it as a separate process
through `serve_model_cli`, the function behind `reach serve-model`.
"""
import asyncio, json, os, socket, subprocess, sys, time
from pathlib import Path

import httpx, pytest

from reach_nb.config import Settings
from reach_nb.core import ToolCall
from reach_nb.llm import (FunctionLLM, LLMError, LLMResponse, ModelNotConfigured, OpenAIChat, ScriptedLLM,
                          count_message_tokens, count_tokens, get_model)
from reach_nb.modelserver import ModelServer

ROOT = Path(__file__).resolve().parents[1]
ASK = [{'role': 'system', 'content': 'Answer in JSON.'}, {'role': 'user', 'content': 'Why did recharge volume jump?'}]
SEARCH = {'type': 'function', 'function': {'name': 'search', 'description': 'Search the knowledge base.',
          'parameters': {'type': 'object', 'properties': {'query': {'type': 'string'}, 'limit': {'type': 'integer'}}, 'required': ['query']}}}


def client(srv, **kw):
    "An OpenAIChat pointed at `srv`, with small timeouts."
    return OpenAIChat('test-model', base_url=srv.base_url, **{'timeout': 5, 'max_retries': 3, **kw})


def test_plain_answer_and_usage():
    backing = ScriptedLLM(['{"thought": "Look at the data.", "answer": "A proxy-recharge ring."}'])
    with ModelServer(backing) as srv:
        llm = client(srv)
        r = llm.chat(ASK, temperature=0.0)
        sent = srv.app.state.requests
    assert json.loads(r.content) == {'thought': 'Look at the data.', 'answer': 'A proxy-recharge ring.'}
    assert (r.prompt_tokens, r.completion_tokens) == (count_message_tokens(ASK), count_tokens(r.content))
    assert (r.model, r.finish_reason, r.tool_calls) == ('test-model', 'stop', [])
    assert (llm.usage.llm_calls, llm.usage.prompt_tokens, llm.usage.completion_tokens) == (1, r.prompt_tokens, r.completion_tokens)
    assert llm.retries == 0
    assert (sent[0]['messages'], sent[0]['temperature'], 'response_format' in sent[0]) == (ASK, 0.0, False)
    assert backing.calls[0]['messages'] == ASK


def test_json_mode_passes_response_format_through():
    seen = []
    def model(messages, json_mode=False, **kw):
        seen.append(json_mode)
        return json.dumps({'answer': 'json'}) if json_mode else 'prose'
    with ModelServer(FunctionLLM(model)) as srv:
        llm = client(srv)
        on, off = llm.chat(ASK, json_mode=True), llm.chat(ASK)
        sent = srv.app.state.requests
    assert seen == [True, False]
    assert (json.loads(on.content), off.content) == ({'answer': 'json'}, 'prose')
    assert sent[0]['response_format'] == {'type': 'json_object'} and 'response_format' not in sent[1]


def test_native_tool_calls_round_trip():
    def model(messages, tools=None, **kw):
        assert tools == [SEARCH], tools
        return LLMResponse(tool_calls=[ToolCall(tool='search', args={'query': 'refund abuse', 'limit': 3}, id='call_abc'),
                                       ToolCall(tool='search', args={'_raw': '{"query": "unterminated'}, id='call_def')])
    with ModelServer(FunctionLLM(model)) as srv:
        llm = client(srv)
        r = llm.chat(ASK, tools=[SEARCH])
        streamed = list(llm.stream(ASK, tools=[SEARCH]))
    want = [ToolCall(tool='search', args={'query': 'refund abuse', 'limit': 3}, id='call_abc'),
            ToolCall(tool='search', args={'_raw': '{"query": "unterminated'}, id='call_def')]
    assert (r.tool_calls, r.content, r.finish_reason) == (want, '', 'tool_calls')
    final = streamed[-1]
    assert (final.tool_calls, final.finish_reason, streamed[:-1]) == (want, 'tool_calls', [])
    assert final.completion_tokens == r.completion_tokens > 0


def test_429_then_success_counts_the_retry():
    with ModelServer(ScriptedLLM(['{"answer": "ok"}']), errors=[429], retry_after=0.02) as srv:
        llm = client(srv)
        r = llm.chat(ASK)
        n_requests = len(srv.app.state.requests)
    assert (json.loads(r.content), llm.retries, n_requests) == ({'answer': 'ok'}, 1, 2)
    assert llm.usage.llm_calls == 1


def test_500_then_success():
    with ModelServer(ScriptedLLM(['first', 'second']), errors=[500, 503], retry_after=0.02) as srv:
        llm = client(srv)
        a, b = llm.chat(ASK), llm.chat(ASK)
    assert (a.content, b.content, llm.retries) == ('first', 'second', 2)


def test_persistent_500_raises_llm_error_after_max_retries():
    with ModelServer(ScriptedLLM(['never']), errors=[500] * 4, retry_after=0.02) as srv:
        llm = client(srv, max_retries=3)
        with pytest.raises(LLMError) as e:
            llm.chat(ASK)
        n_requests = len(srv.app.state.requests)
    assert (e.value.status, e.value.retries, llm.retries, n_requests) == (500, 3, 3, 4)
    assert 'HTTP 500' in str(e.value) and 'after 3 retries' in str(e.value) and 'Injected HTTP 500' in str(e.value)


def test_backing_model_failure_is_not_retried():
    with ModelServer(ScriptedLLM([])) as srv:
        llm = client(srv)
        with pytest.raises(LLMError) as e:
            llm.chat(ASK)
        n_requests = len(srv.app.state.requests)
    assert (e.value.status, e.value.retries, n_requests) == (500, 0, 1)
    assert 'ScriptExhausted' in str(e.value)


def test_malformed_body_is_a_clear_llm_error():
    with ModelServer(ScriptedLLM(['ok', 'ok']), malformed=2) as srv:
        llm = client(srv)
        with pytest.raises(LLMError) as plain:
            llm.chat(ASK)
        with pytest.raises(LLMError) as streamed:
            list(llm.stream(ASK))
        after = llm.chat(ASK)
    for e in (plain, streamed):
        assert type(e.value) is LLMError and 'malformed response body' in str(e.value)
        assert isinstance(e.value.__cause__, json.JSONDecodeError)
    assert after.content == 'ok'


def test_streamed_answer_has_deltas_and_usage():
    text = '{"thought": "Stream it.", "answer": "The ring used 14 proxy accounts."}'
    backing = ScriptedLLM([text])
    with ModelServer(backing) as srv:
        llm = client(srv)
        items = list(llm.stream(ASK, json_mode=True))
        sent = srv.app.state.requests
    deltas, final = items[:-1], items[-1]
    assert all(isinstance(d, str) for d in deltas) and len(deltas) > 3
    assert ''.join(deltas) == final.content == text
    assert (final.prompt_tokens, final.completion_tokens, final.finish_reason) == (count_message_tokens(ASK), count_tokens(text), 'stop')
    assert (llm.usage.llm_calls, llm.usage.completion_tokens) == (1, count_tokens(text))
    assert sent[0]['stream_options'] == {'include_usage': True} and backing.calls[0]['json_mode'] is True


async def test_achat_uses_the_async_client():
    def model(messages, **kw): return json.dumps({'answer': messages[-1]['content'].upper()})
    with ModelServer(FunctionLLM(model), latency=0.05) as srv:
        llm = client(srv)
        rs = await asyncio.gather(*[llm.achat([{'role': 'user', 'content': f'q{i}'}]) for i in range(3)])
        used_async_client = llm._aclient is not None
        await llm.aclose()
    assert [json.loads(r.content)['answer'] for r in rs] == ['Q0', 'Q1', 'Q2']
    assert (llm.usage.llm_calls, used_async_client, llm._aclient) == (3, True, None)


def test_timeout_becomes_llm_error():
    with ModelServer(ScriptedLLM(['late', 'late']), latency=1.0) as srv:
        llm = client(srv, timeout=0.2, max_retries=1)
        with pytest.raises(LLMError) as e:
            llm.chat(ASK)
    assert 'timeout' in str(e.value) and e.value.status is None
    assert (e.value.retries, llm.retries, llm.usage.llm_calls) == (1, 1, 0)


def test_model_not_configured(monkeypatch, tmp_path):
    for k in ('OPENAI_API_KEY', 'OPENAI_BASE_URL'): monkeypatch.delenv(k, raising=False)
    for k in [k for k in os.environ if k.startswith('REACH_')]: monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)  # no settings.ini to find
    for make in (lambda: OpenAIChat('gpt-4o-mini'), OpenAIChat.from_settings, lambda: get_model('qwen-plus')):
        with pytest.raises(ModelNotConfigured) as e:
            make()
        assert 'REACH_API_KEY' in str(e.value) and 'REACH_BASE_URL' in str(e.value) and 'offline backend' in str(e.value)
    monkeypatch.setenv('REACH_BASE_URL', 'http://127.0.0.1:9/v1')
    assert OpenAIChat.from_settings().client.api_key == 'sk-no-key-needed'


def test_get_model_reaches_the_server_through_settings():
    with ModelServer(ScriptedLLM(['{"answer": "via settings"}'])) as srv:
        llm = get_model('openai:some-model', Settings(base_url=srv.base_url, temperature=0.3))
        r = llm.chat(ASK)
        sent = srv.app.state.requests
    assert (type(llm), json.loads(r.content)['answer'], sent[0]['model'], sent[0]['temperature']) == (OpenAIChat, 'via settings', 'some-model', 0.3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _wait_until_up(url:str, proc, timeout:float=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server process exited early:\n{proc.stderr.read().decode()}"
        try:
            if httpx.get(url, timeout=0.5).status_code == 200: return
        except httpx.HTTPError: pass
        time.sleep(0.1)
    raise AssertionError(f"server at {url} did not answer within {timeout}s")


def test_server_in_a_subprocess():
    port = _free_port()
    code = f"from reach_nb.modelserver import serve_model_cli; serve_model_cli('echo', port={port}, errors='429', retry_after=0.05)"
    env = {**os.environ, 'PYTHONPATH': f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, '-c', code], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f'http://127.0.0.1:{port}/v1'
        _wait_until_up(f'{base}/models', proc)
        assert httpx.get(f'{base}/models').json()['data'][0]['id'] == 'echo'
        llm = OpenAIChat('echo', base_url=base, timeout=5, max_retries=2)
        r = llm.chat(ASK)
        items = list(llm.stream([{'role': 'user', 'content': 'stream me'}]))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stderr.close()
    assert (json.loads(r.content)['answer'], llm.retries) == ('Why did recharge volume jump?', 1)
    assert json.loads(''.join(items[:-1]))['answer'] == 'stream me' == json.loads(items[-1].content)['answer']
