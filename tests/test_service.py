"""`reach serve` as its clients meet it: a real service process on a loopback port, streams read with a client
written from the SSE format, AG-UI events read back with the `ag-ui-protocol` package's own models, a stream
broken and picked up again, a run cancelled by a closed stream and by the cancel endpoint, a service killed with
SIGKILL mid-run and its runs read by the next one, and the probes an attacker would try."""
import json, os, signal, subprocess, time

import httpx, pytest
from ag_ui.core import Event as AGUIEvent
from pydantic import TypeAdapter

from reach_nb.core import Run, event_from_json
from reach_nb.agents.registry import AGENTS
from reach_nb.risk.analysis import SPIKE_QUESTION

from browser import free_port
from reach_cli import REACH, clean_env, served
from service_proc import service, small_db  # noqa: F401  (a fixture)

read_agui = TypeAdapter(AGUIEvent).validate_python
ALICE, BOB = 'alice-token-0123456789', 'bob-token-0123456789ab'


def sse(lines) -> list[dict]:
    "Events of an SSE stream, as the format defines them: fields until a blank line; data joined and parsed."
    out, cur = [], {}
    for line in lines:
        if not line:
            if 'data' in cur:
                out.append({'event': cur.get('event', 'message'), 'id': cur.get('id'), 'data': json.loads(cur['data'])})
            cur = {}
        elif not line.startswith(':'):
            name, _, value = line.partition(':')
            value = value.removeprefix(' ')
            cur[name] = cur['data'] + '\n' + value if name == 'data' and 'data' in cur else value
    return out


def stream(base, body, headers=None, until=None):
    "POST /v1/runs streaming; the response and its events (read to the end, or until `until(event)` is true)."
    got = []
    with httpx.stream('POST', f'{base}/v1/runs', json=body, headers=headers, timeout=120) as r:
        if r.status_code != 200:
            r.read()
            return r, []
        buf = []
        for line in r.iter_lines():
            buf.append(line)
            if line == '':
                got += sse(buf); buf = []
                if until and got and until(got[-1]): break
    return r, got


def events_of(base, run_id, after=None, vocabulary='reach', headers=None):
    h = {**(headers or {}), **({'Last-Event-ID': after} if after else {})}
    with httpx.stream('GET', f'{base}/v1/runs/{run_id}/events', params={'events': vocabulary}, headers=h,
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        return sse(r.iter_lines())


def wait_finished(base, run_id, headers=None, within=60) -> dict:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = httpx.get(f'{base}/v1/runs/{run_id}', headers=headers, timeout=10).json()
        if got['status'] == 'finished': return got
        time.sleep(0.2)
    pytest.fail(f'run {run_id} did not finish within {within}s: {got}')


def test_a_streamed_run_rebuilds_and_its_session_is_kept(tmp_path, small_db):
    with service(tmp_path, small_db, '--model', 'sim-analyst') as (base, _):
        r, got = stream(base, {'question': SPIKE_QUESTION, 'session_id': 'alice'})
        run = Run.from_events([event_from_json(x['data']) for x in got])
        again = httpx.post(f'{base}/v1/runs', json={'question': 'How many games are there?', 'session_id': 'alice',
                                                    'stream': False}, timeout=120)
        session = httpx.get(f'{base}/v1/sessions/alice').json()
        listed = httpx.get(f'{base}/v1/runs').json()['runs']
    assert r.status_code == 200 and r.headers['content-type'].startswith('text/event-stream')
    assert run.stop_reason == 'answer' and 'c09' in run.answer, run.answer
    assert got[0]['data']['meta']['run_id'] == r.headers['reach-run-id']
    ids = [tuple(map(int, x['id'].split('.'))) for x in got]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert again.status_code == 200 and again.json()['answer'] == 'The games dataset has 6 rows.'
    assert [x['run_id'] for x in session['runs']] == [r.headers['reach-run-id'], again.json()['run_id']]
    assert {x['run_id'] for x in listed} == {x['run_id'] for x in session['runs']}


@pytest.mark.parametrize('agent', AGENTS)
def test_every_architecture_streams_valid_ag_ui(tmp_path, small_db, agent):
    with service(tmp_path, small_db, '--model', 'sim-analyst') as (base, _):
        r, got = stream(base, {'question': SPIKE_QUESTION, 'agent': agent, 'events': 'ag-ui'})
    assert r.status_code == 200, r.read()
    for x in got: assert read_agui(x['data']).type.value == x['event']
    names = [x['event'] for x in got]
    assert names[0] == 'RUN_STARTED' and got[0]['data']['runId'] == r.headers['reach-run-id']
    assert names[-1] in ('RUN_FINISHED', 'RUN_ERROR') and names.count('RUN_STARTED') == 1
    for a, b in [('STEP_STARTED', 'STEP_FINISHED'), ('REASONING_MESSAGE_START', 'REASONING_MESSAGE_END'),
                 ('TOOL_CALL_START', 'TOOL_CALL_END'), ('TOOL_CALL_START', 'TOOL_CALL_RESULT')]:
        assert names.count(a) == names.count(b), (agent, a, b)
    started = {x['data']['toolCallId'] for x in got if x['event'] == 'TOOL_CALL_START'}
    assert {x['data']['toolCallId'] for x in got if x['event'] == 'TOOL_CALL_RESULT'} == started


def test_blocks_stream_ends_with_the_final_output(tmp_path, small_db):
    with service(tmp_path, small_db, '--model', 'sim-analyst') as (base, _):
        r, got = stream(base, {'question': SPIKE_QUESTION, 'agent': 'pipeline', 'events': 'blocks'})
    open_, text = {}, {}
    for x in got:
        d = x['data']
        assert d['type'] == x['event']
        if x['event'] == 'content_block_start': open_[d['index']] = d['content_block']['type']
        if x['event'] == 'content_block_delta':
            assert d['index'] in open_, 'a delta for a block that was not started'
            text[d['index']] = text.get(d['index'], '') + d['delta'].get('text', d['delta'].get('partial_json', ''))
        if x['event'] == 'content_block_stop': assert open_.pop(d['index'], None) is not None
    assert not open_ and [x['event'] for x in got][-2:] == ['message_delta', 'message_stop']
    assert got[-2]['data']['delta']['stop_reason'] == 'answer' and got[-2]['data']['delta']['answer']


@pytest.fixture(scope='module')
def slow_model():
    "The simulated analyst behind a real HTTP endpoint that waits 0.3 s before each answer."
    with served('sim-analyst', '--latency', '0.3') as base: yield base


def test_a_broken_stream_picks_up_where_it_stopped(tmp_path, small_db, slow_model):
    with service(tmp_path, small_db, '--model', 'openai:sim-analyst', '--base-url', slow_model) as (base, _):
        r, first = stream(base, {'question': SPIKE_QUESTION, 'on_disconnect': 'continue'},
                          until=lambda x: x['event'] == 'tool_end')
        run_id = r.headers['reach-run-id']
        rest = events_of(base, run_id, after=first[-1]['id'])
        whole = events_of(base, run_id)
    assert first[-1]['event'] == 'tool_end' and rest[-1]['event'] == 'run_end'
    assert [x['id'] for x in first + rest] == [x['id'] for x in whole]
    assert [x['data'] for x in first + rest] == [x['data'] for x in whole]


def test_closing_the_stream_cancels_the_run(tmp_path, small_db, slow_model):
    with service(tmp_path, small_db, '--model', 'openai:sim-analyst', '--base-url', slow_model) as (base, _):
        r, first = stream(base, {'question': SPIKE_QUESTION}, until=lambda x: x['event'] == 'step_end')
        end = wait_finished(base, r.headers['reach-run-id'])
    assert end['stop_reason'] == 'stopped' and end['steps'] >= 1


def test_the_cancel_endpoint_stops_a_run(tmp_path, small_db, slow_model):
    with service(tmp_path, small_db, '--model', 'openai:sim-analyst', '--base-url', slow_model) as (base, _):
        got = []
        with httpx.stream('POST', f'{base}/v1/runs', json={'question': SPIKE_QUESTION}, timeout=120) as r:
            run_id = r.headers['reach-run-id']
            cancel = httpx.post(f'{base}/v1/runs/{run_id}/cancel', timeout=10)
            got = sse(r.iter_lines())
        twice = httpx.post(f'{base}/v1/runs/{run_id}/cancel', timeout=10)
    assert cancel.status_code == 202 and got[-1]['event'] == 'run_end'
    assert got[-1]['data']['stop_reason'] == 'stopped'
    assert twice.status_code == 409 and twice.json()['error']['code'] == 'not_running'


def test_a_killed_service_leaves_its_runs_readable(tmp_path, small_db, slow_model):
    with service(tmp_path, small_db, '--model', 'openai:sim-analyst', '--base-url', slow_model) as (base, proc):
        got = []
        with pytest.raises(httpx.HTTPError):  # the stream ends with the process: an error, not a hang
            with httpx.stream('POST', f'{base}/v1/runs', json={'question': SPIKE_QUESTION}, timeout=30) as r:
                run_id = r.headers['reach-run-id']
                for line in r.iter_lines():
                    got.append(line)
                    if line.startswith('event: tool_end'): os.kill(proc.pid, signal.SIGKILL)
    with service(tmp_path, small_db, '--model', 'sim-analyst') as (base, _):
        stored = events_of(base, run_id)
        info = httpx.get(f'{base}/v1/runs/{run_id}').json()
    assert sum(l == 'event: tool_end' for l in got) >= 1
    assert info['status'] == 'incomplete'
    assert stored[-1]['event'] == 'run_end' and stored[-1]['data']['meta'] == {'orphaned': True}
    assert [x['event'] for x in stored].count('tool_end') >= 1


def test_tokens_keep_owners_apart(tmp_path, small_db):
    auth = lambda t: {'Authorization': f'Bearer {t}'}
    with service(tmp_path, small_db, '--model', 'sim-analyst', '--token', ALICE, env={'REACH_TOKENS': BOB}) as (base, _):
        mine = httpx.post(f'{base}/v1/runs', json={'question': 'How many games are there?', 'stream': False,
                                                   'session_id': 'a-1'}, headers=auth(ALICE), timeout=60).json()
        probes = {
            'no token': httpx.get(f'{base}/v1/runs'),
            'wrong token': httpx.get(f'{base}/v1/runs', headers=auth('x' * 22)),
            "another's run": httpx.get(f"{base}/v1/runs/{mine['run_id']}", headers=auth(BOB)),
            "another's events": httpx.get(f"{base}/v1/runs/{mine['run_id']}/events", headers=auth(BOB)),
            "another's session": httpx.get(f'{base}/v1/sessions/a-1', headers=auth(BOB)),
            "asking in another's session": httpx.post(f'{base}/v1/runs', json={'question': 'x', 'session_id': 'a-1'},
                                                      headers=auth(BOB)),
            "cancelling another's run": httpx.post(f"{base}/v1/runs/{mine['run_id']}/cancel", headers=auth(BOB)),
            'path in an id': httpx.get(f'{base}/v1/runs/..%2F..%2Fetc%2Fpasswd', headers=auth(BOB)),
            'SQL in an id': httpx.get(f"{base}/v1/sessions/a-1' OR '1'='1", headers=auth(BOB)),
        }
        bobs = httpx.get(f'{base}/v1/runs', headers=auth(BOB)).json()['runs']
    codes = {k: (r.status_code, r.json()['error']['code']) for k, r in probes.items()}
    assert codes == {'no token': (401, 'unauthorized'), 'wrong token': (401, 'unauthorized'),
                     "another's run": (404, 'not_found'), "another's events": (404, 'not_found'),
                     "another's session": (404, 'not_found'), "asking in another's session": (409, 'session_taken'),
                     "cancelling another's run": (404, 'not_found'), 'path in an id': (404, 'not_found'),
                     'SQL in an id': (404, 'not_found')}
    assert mine['stop_reason'] == 'answer' and bobs == []


def test_hostile_requests_get_one_error_shape(tmp_path, small_db):
    with service(tmp_path, small_db, '--model', 'sim-analyst') as (base, _):
        probes = {
            'bad JSON': httpx.post(f'{base}/v1/runs', content=b'{"question": ', headers={'content-type': 'application/json'}),
            'not an object': httpx.post(f'{base}/v1/runs', json=['question']),
            'huge body': httpx.post(f'{base}/v1/runs', content=b'{"question": "' + b'x' * 200_000 + b'"}',
                                    headers={'content-type': 'application/json'}),
            'huge question': httpx.post(f'{base}/v1/runs', json={'question': 'x' * 5000}),
            'a field more': httpx.post(f'{base}/v1/runs', json={'question': 'x', 'tools': ['shell']}),
            'control characters': httpx.post(f'{base}/v1/runs', json={'question': 'x', 'session_id': 'a\nb'}),
            'bad Last-Event-ID': httpx.get(f'{base}/v1/runs/abc/events', headers={'Last-Event-ID': "1' OR 1=1"}),
            'DNS rebinding': httpx.get(f'{base}/v1/runs', headers={'Host': 'attacker.example'}),
        }
        alive = httpx.post(f'{base}/v1/runs', json={'question': 'How many games are there?', 'stream': False},
                           timeout=60)
    codes = {k: r.status_code for k, r in probes.items()}
    assert codes == {'bad JSON': 400, 'not an object': 422, 'huge body': 413, 'huge question': 422, 'a field more': 422,
                     'control characters': 422, 'bad Last-Event-ID': 404, 'DNS rebinding': 400}
    for r in probes.values(): assert set(r.json()) == {'error'} and set(r.json()['error']) == {'code', 'message'}
    assert alive.json()['stop_reason'] == 'answer'


@pytest.mark.parametrize('env, allowed', [({}, ALICE), ({'REACH_TOKENS': BOB}, BOB)])
def test_tokens_from_settings_ini_let_a_public_bind_start(tmp_path, small_db, env, allowed):
    "The `tokens` setting from settings.ini (REACH_TOKENS overrides it) lets the service listen on all addresses."
    (tmp_path/'settings.ini').write_text(f'[reach]\ntokens = {ALICE}, \n')
    with service(tmp_path, small_db, '--model', 'sim-analyst', '--host', '0.0.0.0', env=env) as (base, _):
        codes = {t: httpx.get(f'{base}/v1/runs', headers={'Authorization': f'Bearer {t}'}).status_code
                 for t in (ALICE, BOB)}
    assert codes == {t: 200 if t == allowed else 401 for t in (ALICE, BOB)}


def test_a_public_bind_needs_tokens(tmp_path, small_db):
    r = subprocess.run([REACH, 'serve', '--host', '0.0.0.0', '--port', str(free_port())], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, env=clean_env(REACH_DATA_DB=str(small_db)))
    assert r.returncode == 2 and r.stdout == ''
    assert r.stderr.strip() == ('Error: no token for a service listening on 0.0.0.0, which other machines can reach in '
                                'option --host: give --token (or the tokens setting, REACH_TOKENS), or listen on 127.0.0.1')


@pytest.mark.parametrize('args, said', [
    (['--token', 'short'], 'Error: a token of 5 characters in option --token: give tokens of 16 characters or more'),
    (['--store', '/proc/no-such-dir/s.sqlite'], "Error: cannot open the session store '/proc/no-such-dir/s.sqlite'"),
    (['--port', '99999'], 'Error: --port must be from 0 to 65535, got 99999 in option --port'),
    (['--rate', '0'], 'Error: --rate must be at least 0.1, got 0.0 in option --rate'),
    (['--max-streams-per-token', '0'], 'Error: --max-streams-per-token must be at least 1, got 0 in option '
                                       '--max-streams-per-token'),
])
def test_a_bad_option_is_one_error_line(tmp_path, small_db, args, said):
    r = subprocess.run([REACH, 'serve', '--model', 'sim-analyst', '--port', str(free_port()), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, env=clean_env(REACH_DATA_DB=str(small_db)))
    assert r.returncode == 2 and r.stderr.startswith(said) and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_each_agent_is_an_mcp_tool_for_its_token(tmp_path, small_db):
    "The `mcp` SDK's own client, over streamable HTTP with a bearer token: the tools, a question, its run stored."
    import anyio
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    auth = lambda t: {'Authorization': f'Bearer {t}'}

    async def session(url, token):
        import httpx2
        async with httpx2.AsyncClient(headers=auth(token), timeout=120) as http:
            async with Client(streamable_http_client(url, http_client=http)) as c:
                tools = [t.name for t in (await c.list_tools()).tools]
                said = await c.call_tool('ask_react', {'question': 'How many games are there?', 'session_id': 'm-1'})
                bad = await c.call_tool('ask_dag', {'question': 'x' * 5000})
        return tools, said, bad

    with service(tmp_path, small_db, '--model', 'sim-analyst', '--token', ALICE, '--token', BOB) as (base, _):
        tools, said, bad = anyio.run(session, f'{base}/mcp', ALICE)
        anon = httpx.post(f'{base}/mcp', json={'jsonrpc': '2.0', 'id': 1, 'method': 'tools/list'})
        alices = httpx.get(f'{base}/v1/sessions/m-1', headers=auth(ALICE)).json()
        bobs = httpx.get(f'{base}/v1/sessions/m-1', headers=auth(BOB))
    assert tools == [f"ask_{a.replace('-', '_')}" for a in AGENTS]
    assert not said.is_error and said.content[0].text.startswith('The games dataset has 6 rows.')
    assert bad.is_error and 'at most 4000 characters' in bad.content[0].text
    assert anon.status_code == 401 and anon.json()['error']['code'] == 'unauthorized'
    assert len(alices['runs']) == 1 and bobs.status_code == 404


def test_two_workers_share_a_redis_store_and_a_killed_one_is_carried_on(tmp_path, small_db):
    ("Two `reach serve` over one real redis-server, each with its own folders as on two machines: B streams A's run "
     "live; A is killed; B ends the stream and resumes it, with the tasks A's tools made (kept in the same Redis).")
    import threading
    from collections import Counter
    from redis_server import redis_server
    with served('sim-analyst', '--latency', '1.0') as slower, redis_server(tmp_path/'redis') as r:
        opts = ('--model', 'openai:sim-analyst', '--base-url', slower)
        store = ('--store', r.url)
        host_a, host_b = tmp_path/'a', tmp_path/'b'  # no folder shared: the trace dirs differ
        host_a.mkdir(), host_b.mkdir()
        with service(host_a, small_db, *opts, *store) as (a, proc_a), service(host_b, small_db, *opts, *store) as (b, _):
            seen_b = []
            with httpx.stream('POST', f'{a}/v1/runs', json={'question': SPIKE_QUESTION, 'on_disconnect': 'continue'},
                              timeout=120) as resp:
                run_id = resp.headers['reach-run-id']
                def watch():
                    with httpx.stream('GET', f'{b}/v1/runs/{run_id}/events', timeout=120) as w:
                        buf = []
                        for line in w.iter_lines():
                            buf.append(line)
                            if line == '': seen_b.extend(sse(buf)); buf = []
                watcher = threading.Thread(target=watch)
                watcher.start()
                # killed once A's tools have made and run a task: B's remaining steps read that task's results
                ran = lambda x: x['event'] == 'tool_end' and x['data']['call']['tool'] == 'run_task'
                buf = []
                for line in resp.iter_lines():
                    buf.append(line)
                    if line == '' and any(map(ran, sse(buf))): break
                    if line == '': buf = []
                deadline = time.monotonic() + 30
                while not any(map(ran, seen_b)) and time.monotonic() < deadline: time.sleep(0.05)
                os.kill(proc_a.pid, signal.SIGKILL)
            t0 = time.monotonic()
            watcher.join(60)
            ended_in = time.monotonic() - t0
            resumed = httpx.post(f'{b}/v1/runs/{run_id}/resume', json={'stream': False}, timeout=180).json()
            again = httpx.post(f'{b}/v1/runs/{run_id}/resume', json={'stream': False}, timeout=10)
            fresh = httpx.post(f'{b}/v1/runs', json={'question': SPIKE_QUESTION, 'stream': False}, timeout=180).json()
            stored = events_of(b, run_id)
    assert not watcher.is_alive() and ended_in < 30, ended_in  # an error end, not a hang
    assert seen_b[-1]['event'] == 'run_end' and seen_b[-1]['data']['meta'] == {'orphaned': True}
    assert any(map(ran, seen_b))  # B followed A's run while it ran, to the task it made
    assert not any(x['event'] == 'tool_end' and x['data']['call']['tool'] == 'get_result' for x in seen_b[:-1])
    assert resumed['run_id'] == run_id and resumed['stop_reason'] == 'answer' and resumed['status'] == 'finished'
    assert resumed['answer'] == fresh['answer']
    assert again.status_code == 409 and again.json()['error']['code'] == 'finished'
    done = Counter(json.dumps(x['data']['call'], sort_keys=True) for x in stored if x['event'] == 'tool_end')
    assert done and max(done.values()) == 1, done  # no finished call ran again
    assert sum(done.values()) == fresh['usage']['tool_calls']


def test_a_fork_is_a_new_run_of_its_owner(tmp_path, small_db):
    auth = {'Authorization': f'Bearer {ALICE}'}
    with service(tmp_path, small_db, '--model', 'sim-analyst', '--token', ALICE) as (base, _):
        first = httpx.post(f'{base}/v1/runs', json={'question': SPIKE_QUESTION, 'stream': False, 'session_id': 'f-1'},
                           headers=auth, timeout=120).json()
        forked = httpx.post(f"{base}/v1/runs/{first['run_id']}/fork", json={'step': 3, 'stream': False},
                            headers=auth, timeout=120)
        bad = httpx.post(f"{base}/v1/runs/{first['run_id']}/fork", json={'step': 99, 'stream': False},
                         headers=auth, timeout=60)
        session = httpx.get(f'{base}/v1/sessions/f-1', headers=auth).json()
    assert forked.status_code == 200, forked.text
    f = forked.json()
    assert f['parent'] == first['run_id'] and f['stop_reason'] == 'answer' and f['answer'] == first['answer']
    assert [r['run_id'] for r in session['runs']] == [first['run_id'], f['run_id']]
    assert bad.status_code == 400 and bad.json()['error']['code'] == 'bad_request' and 'step 99' in bad.text


def test_a_request_head_that_never_ends_is_cut_off(tmp_path, small_db):
    "A slowloris client (a head sent a byte now and then, never finished) gets 408 in the one error shape, then is closed."
    import socket
    with service(tmp_path, small_db, '--model', 'sim-analyst') as (base, _):
        port = int(base.rsplit(':', 1)[1])
        slow = socket.create_connection(('127.0.0.1', port))
        t = time.monotonic()
        slow.sendall(b'GET /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n')
        slow.settimeout(1)
        got = b''
        while time.monotonic() - t < 30:
            try: part = slow.recv(4000)
            except socket.timeout:
                slow.sendall(b'X')  # a byte now and then keeps nothing alive
                assert httpx.get(f'{base}/openapi.json', timeout=5).status_code == 200  # others are served meanwhile
                continue
            if not part: break
            got += part
        took = time.monotonic() - t
        slow.close()
    head, _, body = got.partition(b'\r\n\r\n')
    assert head.split(b'\r\n')[0] == b'HTTP/1.1 408 Request Timeout' and 9 < took < 20, (got, took)
    assert json.loads(body) == {'error': {'code': 'request_timeout', 'message': 'the request head did not arrive in time'}}
