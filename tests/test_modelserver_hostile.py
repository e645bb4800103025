"""The local model server under hostile and heavy clients, over real sockets on loopback: a client that sends half a
body and waits gets a 408 instead of holding the connection open, and 300 requests, 50 at a time, of which many are
broken, each get an answer, every error in OpenAI's format."""
import json, socket
from concurrent.futures import ThreadPoolExecutor

import httpx

from reach_nb.llm.models import ScriptedLLM
from reach_nb.llm.server import ModelServer

ANSWER = json.dumps({'thought': 'ok', 'answer': '42'})


def test_a_body_cut_short_gets_408_not_a_hang():
    with ModelServer(ScriptedLLM([ANSWER]), body_timeout=1.0) as srv:
        with socket.create_connection((srv.host, srv.port), timeout=10) as s:
            s.sendall(b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
                      b'Content-Length: 1000\r\n\r\n{"model": "m", "messa')
            reply = s.recv(65536).decode()  # within the 10 s socket timeout, or this raises
            while '\r\n\r\n' not in reply or not reply.rstrip().endswith('}'):  # the body may come in a later segment
                if not (more := s.recv(65536)): break
                reply += more.decode()
        assert reply.startswith('HTTP/1.1 408'), reply[:200]
        error = json.loads(reply.split('\r\n\r\n', 1)[1])['error']
        assert error['code'] == '408' and 'did not arrive within 1 s' in error['message']
        ok = httpx.post(f'{srv.base_url}/chat/completions', json={'model': 'm', 'messages': [{'role': 'user', 'content': 'q'}]})
        assert ok.status_code == 200  # the server still serves


BAD = [b'not json', b'{"model": "m"}', b'{"model": "m", "messages": "x"}', b'[' * 100_000, b'{"model": "m", "messages": [{"role": 7}]}']


def test_300_requests_50_at_a_time_all_answered_in_openai_format():
    good = {'model': 'm', 'messages': [{'role': 'user', 'content': 'q'}]}
    with ModelServer(ScriptedLLM([ANSWER] * 300), max_body=50_000) as srv:
        url = f'{srv.base_url}/chat/completions'
        def one(i:int):
            with httpx.Client(timeout=30) as c:
                if i % 3 == 0: return c.post(url, json=good)
                if i % 3 == 1: return c.post(url, content=BAD[i % len(BAD)], headers={'content-type': 'application/json'})
                return c.post(url, content=b'x' * 60_000, headers={'content-type': 'application/json'})
        with ThreadPoolExecutor(50) as ex: replies = list(ex.map(one, range(300)))
    assert len(replies) == 300
    statuses = sorted({r.status_code for r in replies})
    assert statuses == [200, 400, 413], statuses
    for r in replies:
        body = r.json()
        if r.status_code == 200: assert body['choices'][0]['message']['content'] == ANSWER
        else: assert set(body['error']) == {'message', 'type', 'param', 'code'} and body['error']['code'] == str(r.status_code)
    assert sum(r.status_code == 200 for r in replies) == 100
