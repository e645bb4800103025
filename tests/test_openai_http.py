"""OpenAIChat against the local OpenAI-compatible server: the real `openai` SDK over real HTTP, nothing patched.

Most tests run the server in a background thread (`ModelServer`); one starts it as a separate process
through `serve_model_cli`, the function behind `reach serve-model`.
"""
import asyncio, http.server, json, os, socket, subprocess, sys, threading, time
from pathlib import Path

import httpx, pytest

from reach_nb.config import Settings
from reach_nb.core import ToolCall
from reach_nb.llm.models import (EchoLLM, FunctionLLM, LLMError, LLMResponse, MalformedResponse, ModelNotConfigured, OpenAIChat,
                          ScriptedLLM, count_message_tokens, count_tokens, get_model)
from reach_nb.llm.models import ChatModel, ContextOverflow
from reach_nb.llm.server import ModelServer

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


def _answer(llm, how, messages=ASK) -> LLMResponse:
    "One call made the way `how` names: chat, stream (the deltas must join to the content) or achat."
    if how == 'achat': return asyncio.run(llm.achat(messages))
    if how == 'chat': return llm.chat(messages)
    *deltas, r = llm.stream(messages)
    assert ''.join(deltas) == r.content
    return r


@pytest.mark.parametrize('how', ['chat', 'stream', 'achat'])
def test_one_malformed_body_is_retried_like_a_5xx(how):
    with ModelServer(ScriptedLLM(['Recharge volume doubled.']), malformed=1) as srv:
        llm = client(srv)
        r = _answer(llm, how)
        n_requests = len(srv.app.state.requests)
    assert (r.content, r.retries, r.malformed_retries, llm.retries, n_requests) == ('Recharge volume doubled.', 1, 1, 1, 2)


class _Proxy(http.server.BaseHTTPRequestHandler):
    "Answers 200 with the bodies in `server.bodies`, in order, then with a chat completion."
    def do_POST(self):
        self.rfile.read(int(self.headers['content-length']))
        kind, body = self.server.bodies.pop(0) if self.server.bodies else ('application/json', _COMPLETION)
        self.send_response(200)
        self.send_header('content-type', kind)
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args): pass

_COMPLETION = json.dumps({'id': 'c1', 'object': 'chat.completion', 'created': 0, 'model': 'm', 'choices': [
    {'index': 0, 'finish_reason': 'stop', 'message': {'role': 'assistant', 'content': 'ok'}}]})


@pytest.fixture
def proxy():
    "A standard-library HTTP server standing in for a proxy that sometimes answers with a body of its own."
    srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Proxy)
    srv.bodies = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_bodies_that_are_not_chat_completions_are_retried(proxy):
    proxy.bodies[:] = [('text/html', '<html>502 Bad Gateway</html>'), ('application/json', '{}'),
                       ('application/json', '{"choices": [1]}')]
    llm = OpenAIChat('m', base_url=f'http://127.0.0.1:{proxy.server_port}/v1', timeout=5, max_retries=3)
    r = llm.chat(ASK)
    assert (r.content, r.retries, r.malformed_retries, proxy.bodies) == ('ok', 3, 3, [])


@pytest.mark.parametrize('how', ['chat', 'stream'])
def test_malformed_bodies_past_max_retries_are_a_clear_llm_error(how):
    with ModelServer(ScriptedLLM(['never']), malformed=3) as srv:
        llm = client(srv, max_retries=2)
        with pytest.raises(MalformedResponse) as e:
            _answer(llm, how)
        n_requests = len(srv.app.state.requests)
        after = llm.chat(ASK)
    assert (e.value.retries, e.value.malformed_retries, llm.retries, n_requests) == (2, 2, 2, 3)
    assert 'malformed response body, not a chat completion' in str(e.value) and '(after 2 retries)' in str(e.value)
    assert isinstance(e.value, LLMError) and isinstance(e.value.__cause__, json.JSONDecodeError)
    assert (after.content, after.retries) == ('never', 0)


def test_server_errors_and_malformed_bodies_share_max_retries():
    with ModelServer(ScriptedLLM(['ok']), errors=[500], malformed=1, retry_after=0.02) as srv:
        r = client(srv).chat(ASK)
    with ModelServer(ScriptedLLM(['never']), errors=[500], malformed=5, retry_after=0.02) as srv:
        with pytest.raises(MalformedResponse) as e:
            client(srv, max_retries=3).chat(ASK)
        n_requests = len(srv.app.state.requests)
    assert (r.content, r.retries, r.malformed_retries) == ('ok', 2, 1)
    assert (e.value.retries, e.value.malformed_retries, n_requests) == (3, 2, 4)


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
        assert 'REACH_API_KEY' in str(e.value) and 'REACH_BASE_URL' in str(e.value) and '--model sim-analyst' in str(e.value)
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
    code = f"from reach_nb.llm.server import serve_model_cli; serve_model_cli('echo', port={port}, errors='429', retry_after=0.05)"
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


# ---------------------------------------------------------------- hardening of the model boundary

def test_each_response_reports_its_own_retries():
    calls = {'chat': lambda llm: llm.chat(ASK), 'stream': lambda llm: list(llm.stream(ASK))[-1],
             'achat': lambda llm: asyncio.run(llm.achat(ASK))}
    for how, call in calls.items():
        with ModelServer(ScriptedLLM(['first', 'second']), errors=[429, 500], retry_after=0.02) as srv:
            llm = client(srv)
            first, second = call(llm), call(llm)  # two errors, then the answer; then the answer at once
        assert (first.content, first.retries, second.content, second.retries, llm.retries) == ('first', 2, 'second', 0, 2), how


def test_401_says_which_key_to_set():
    with ModelServer(ScriptedLLM(['never']), errors=[401]) as srv:
        with pytest.raises(LLMError) as e:
            client(srv).chat(ASK)
    assert e.value.status == 401 and e.value.retries == 0
    assert 'REACH_API_KEY' in str(e.value) and 'OPENAI_API_KEY' in str(e.value)


def test_request_timeout_comes_from_the_settings():
    with ModelServer(ScriptedLLM(['late']), latency=1.0) as srv:
        llm = OpenAIChat.from_settings(Settings(base_url=srv.base_url, request_timeout=0.2), max_retries=0)
        with pytest.raises(LLMError) as e:
            llm.chat(ASK)
    assert 'timeout=0.2s' in str(e.value)


def test_importing_the_agent_does_not_import_the_sdk():
    code = ("import sys, reach_nb.llm.models, reach_nb.agents.react; "
            "print(sorted(m for m in ('openai', 'tiktoken') if m in sys.modules))")
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '[]'


def test_server_keeps_only_the_latest_requests():
    with ModelServer(FunctionLLM(lambda messages, **kw: 'ok'), keep_requests=5) as srv:
        llm = client(srv)
        for i in range(8): llm.chat([{'role': 'user', 'content': f'q{i}'}])
        kept = [r['messages'][0]['content'] for r in srv.app.state.requests]
    assert kept == ['q3', 'q4', 'q5', 'q6', 'q7']


def test_default_server_keeps_at_most_100_requests():
    with ModelServer(FunctionLLM(lambda messages, **kw: 'ok')) as srv:
        with httpx.Client(base_url=srv.base_url) as h:
            for i in range(105): h.post('/chat/completions', json={'messages': [{'role': 'user', 'content': f'{i}'}]})
        kept = list(srv.app.state.requests)
    assert len(kept) == 100 and kept[0]['messages'][0]['content'] == '5'


def _error(r) -> dict:
    "The OpenAI-format error of a response (it must be JSON with an `error` object)."
    assert r.headers['content-type'].startswith('application/json'), (r.status_code, r.text[:200])
    return r.json()['error']


def _read_reply(s) -> str:
    "An HTTP reply read from socket `s`: the head, then as many body bytes as its Content-Length says."
    data = b''
    while b'\r\n\r\n' not in data and (piece := s.recv(4096)): data += piece
    head, _, body = data.partition(b'\r\n\r\n')
    n = int(next(l.split(b':')[1] for l in head.split(b'\r\n') if l.lower().startswith(b'content-length')))
    while len(body) < n and (piece := s.recv(4096)): body += piece
    return (head + b'\r\n\r\n' + body).decode()


def test_oversized_body_is_refused_by_its_content_length_before_it_is_read():
    with ModelServer(EchoLLM(), max_body=1000) as srv:
        with socket.create_connection((srv.host, srv.port), timeout=5) as s:
            s.sendall(b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
                      b'Content-Length: 100000000\r\n\r\n{"messages": [')  # the rest is never sent
            reply = _read_reply(s)
        ok = httpx.post(f'{srv.base_url}/chat/completions', json={'messages': [{'role': 'user', 'content': 'x' * 100}]})
    head, _, body = reply.partition('\r\n\r\n')
    assert head.startswith('HTTP/1.1 413')
    assert json.loads(body)['error']['code'] == '413'
    assert ok.status_code == 200


def test_oversized_body_without_a_length_is_refused_while_streaming_it():
    def pieces():
        for _ in range(4): yield b' ' * 600
        yield b'{"messages": [{"role": "user", "content": "hi"}]}'
    with ModelServer(EchoLLM(), max_body=2000) as srv:
        r = httpx.post(f'{srv.base_url}/chat/completions', content=pieces(), headers={'content-type': 'application/json'})
        small = httpx.post(f'{srv.base_url}/chat/completions', content=iter([b'{"messages": [{"role": "user", "content": "hi"}]}']))
        n_kept = len(srv.app.state.requests)
    assert 'content-length' not in r.request.headers and r.status_code == 413
    assert _error(r)['type'] == 'invalid_request_error' and '2000 bytes' in _error(r)['message']
    assert small.status_code == 200 and n_kept == 1


SURROGATE = b'{"messages": [{"role": "user", "content": "broken \\ud800 text"}]}'  # valid JSON, invalid UTF-16


def test_a_lone_surrogate_is_answered_not_a_crash():
    with ModelServer(EchoLLM()) as srv:
        plain = httpx.post(f'{srv.base_url}/chat/completions', content=SURROGATE, headers={'content-type': 'application/json'})
        streamed = httpx.post(f'{srv.base_url}/chat/completions', content=SURROGATE.replace(b'{', b'{"stream": true, ', 1),
                              headers={'content-type': 'application/json'})
    assert plain.status_code == 200, plain.text[:200]
    assert json.loads(plain.json()['choices'][0]['message']['content'])['answer'] == 'broken \ufffd text'
    assert streamed.status_code == 200 and '"error"' not in streamed.text and streamed.text.rstrip().endswith('[DONE]')


def test_a_lone_surrogate_from_the_model_is_sent_as_an_escape():
    "A backing model's own output can hold one too: the server writes it as a JSON escape instead of crashing."
    with ModelServer(FunctionLLM(lambda messages, **kw: 'odd \ud800 reply')) as srv:
        llm = client(srv)
        whole, streamed = llm.chat(ASK), list(llm.stream(ASK))[-1]
    assert whole.content == streamed.content == 'odd \ud800 reply'


def test_a_lone_surrogate_in_a_message_can_be_sent():
    "A tool's undecodable output can hold a lone surrogate; the SDK can't encode it, so it is replaced first."
    with ModelServer(EchoLLM()) as srv:
        r = client(srv).chat([{'role': 'user', 'content': 'broken \ud800 text'}])
    assert json.loads(r.content)['answer'] == 'broken \ufffd text'


class _BadLabels(ChatModel):
    "A backing model whose labels raise: a bug inside the server, after the model answered."
    name = 'bad-labels'
    meta = property(lambda self: 1 / 0)
    def _complete(self, messages, tools, json_mode, temperature): return LLMResponse(content='ok')


def test_every_error_is_in_openais_format():
    with ModelServer(_BadLabels()) as srv, httpx.Client(base_url=srv.base_url) as h:
        rs = {'404': h.get('/nothing'), '405': h.get('/chat/completions'), 'not json': h.post('/chat/completions', content=b'{"messages": '),
              'not a request': h.post('/chat/completions', json={'messages': 'nope'}),
              'too deep': h.post('/chat/completions', content=b'[' * 100_000),
              'server bug': h.post('/chat/completions', json={'messages': [{'role': 'user', 'content': 'hi'}]})}
    assert {k: r.status_code for k, r in rs.items()} == {'404': 404, '405': 405, 'not json': 400, 'not a request': 400,
                                                        'too deep': 400, 'server bug': 500}
    assert {k: _error(r)['type'] for k, r in rs.items()}['server bug'] == 'server_error'
    assert all(_error(r)['message'] for r in rs.values())


class _Refuser(http.server.BaseHTTPRequestHandler):
    "Refuses every request as too long for its context window, in llama.cpp's words, with the figures in `server.said`."
    def do_POST(self):
        self.rfile.read(int(self.headers['content-length']))
        self.server.seen += 1
        window, asked = self.server.said
        body = json.dumps({'error': {'message': f"This model's maximum context length is {window} tokens. However, you "
                                                f"requested {asked} tokens ({asked} in the messages, None in the completion).",
                                     'type': 'invalid_request_error', 'param': 'messages', 'code': 'context_length_exceeded'}})
        self.send_response(400)
        self.send_header('content-type', 'application/json')
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args): pass


@pytest.fixture
def refuser():
    "An endpoint that refuses every prompt as past its window, however short: a broken or hostile server."
    srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Refuser)
    srv.seen = 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


LONG = [{'role': 'system', 'content': 'Answer briefly.'}, {'role': 'user', 'content': 'Which channel grew?'},
        *[{'role': r, 'content': f'turn {i}: ' + 'c06 grew ' * 150} for i in range(12) for r in ('assistant', 'user')]]


@pytest.mark.parametrize('how', ['chat', 'stream', 'achat'])
def test_an_endpoint_that_refuses_every_prompt_as_too_long_is_tried_twice_at_most(refuser, how):
    "The prompt is fitted to the window it names and sent once more; a second refusal is the error, not a loop."
    refuser.said = (3000, 5000)
    llm = OpenAIChat('m', base_url=f'http://127.0.0.1:{refuser.server_port}/v1', timeout=5, max_retries=0)
    with pytest.raises(ContextOverflow) as e:
        _answer(llm, how, LONG)
    assert (refuser.seen, e.value.window, e.value.prompt_tokens, llm.context_window) == (2, 3000, 5000, 3000)
    assert 'answered HTTP 400' in str(e.value) and 'context_length_exceeded' in str(e.value)


def test_an_endpoints_token_count_is_believed_only_so_far(refuser):
    "A count a million times the prompt's own raises the client's token scale to 4 at most, and nothing is resent."
    refuser.said = (100_000, 10 ** 9)
    llm = OpenAIChat('m', base_url=f'http://127.0.0.1:{refuser.server_port}/v1', timeout=5, max_retries=0)
    with pytest.raises(ContextOverflow):
        llm.chat(ASK)
    assert (refuser.seen, llm.token_scale, llm.context_window) == (1, 4.0, 100_000)
