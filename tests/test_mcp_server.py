"""reach_nb's MCP server (`serve_mcp`, by default the nine risk tools) in real processes, driven by the SDK's own
client over stdio and streamable HTTP, and by a third-party client: the MCP Inspector's command-line mode (npm,
installed on demand), the project's reference tool for poking at servers."""
import hashlib, json, subprocess, sys, time

import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from reach_nb.risk.data import default_db_path, ensure_dataset
from reach_nb.risk.tools import risk_registry
from reach_nb.tools import run_sync

from mcp_servers.support import INSPECTOR, SERVE_RISK, ensure_npm, free_port

RISK_TOOLS = ['list_datasets', 'describe_dataset', 'list_operators', 'create_procedure', 'create_task', 'list_tasks',
              'run_task', 'get_result', 'search_knowledge']
NOISY = '''
from reach_nb.mcp_tools import serve_mcp
from reach_nb.tools import ToolRegistry
def noisy(text: str): # what to say
    "Print to stdout, then answer."
    print("this would corrupt the protocol")
    return text
serve_mcp(ToolRegistry([noisy]))
'''


def stdio(code:str=SERVE_RISK) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=['-c', code])


@pytest.fixture
def http_server():
    "`serve_mcp(http_port=...)` in a process of its own, as a command-line server runs it."
    port = free_port()
    code = f'from reach_nb.mcp_tools import serve_mcp; serve_mcp(http_port={port})'
    proc = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url, deadline = f'http://127.0.0.1:{port}/mcp', time.monotonic() + 60
    while True:
        try: httpx.get(f'http://127.0.0.1:{port}/', timeout=1); break
        except httpx.TransportError:
            if proc.poll() is not None: raise RuntimeError(f'serve_mcp exited: {proc.stderr.read()[-2000:]}')
            if time.monotonic() > deadline: proc.kill(); raise RuntimeError('serve_mcp did not listen within 60s')
            time.sleep(0.2)
    yield url
    proc.terminate(); proc.wait(10)


async def _session(server) -> dict:
    "What a client sees of the server: its tools, a good call, a bad call and an unknown tool."
    async with Client(server) as c:
        tools = (await c.list_tools()).tools
        good = await c.call_tool('describe_dataset', {'dataset': 'users'})
        bad = await c.call_tool('describe_dataset', {'datset': 'users'})
        try: await c.call_tool('describe_datasets', {'dataset': 'users'}); unknown = None
        except MCPError as e: unknown = e.error
    return dict(tools=tools, good=good, bad=bad, unknown=unknown)


def _check(seen:dict):
    reg = risk_registry()
    assert [t.name for t in seen['tools']] == RISK_TOOLS
    for t in seen['tools']:
        assert t.input_schema == reg[t.name].parameters
        assert t.description == f"{reg[t.name].description}\nExample: {reg[t.name].example}"
        assert (t.annotations.read_only_hint, t.annotations.destructive_hint) == (True, False)
    good, bad, unknown = seen['good'], seen['bad'], seen['unknown']
    assert not good.is_error and good.content[0].text.startswith('users [dimensions]: game accounts\nrows: 83,573')
    assert bad.is_error and bad.content[0].text.startswith(
        "Bad arguments for describe_dataset: unknown parameter 'datset' (did you mean 'dataset'?)")
    assert unknown.code == -32602 and "Unknown tool 'describe_datasets'. Did you mean 'describe_dataset'?" in unknown.message


def test_sdk_client_over_stdio():
    _check(run_sync(_session(stdio())))


def test_sdk_client_over_streamable_http(http_server):
    _check(run_sync(_session(http_server)))


def test_stray_prints_do_not_corrupt_stdio():
    async def go():
        async with Client(stdio(NOISY)) as c: return await c.call_tool('noisy', {'text': 'clean'})
    r = run_sync(go())
    assert (r.is_error, r.content[0].text) == (False, 'clean')


def test_the_risk_data_stays_read_only(tmp_path):
    "Tools that write (procedures, tasks, results) write to the workspace store only; the dataset is unchanged."
    db = ensure_dataset(default_db_path())
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    store = tmp_path / 'ws.sqlite'
    code = ('from reach_nb.mcp_tools import serve_mcp; from reach_nb.risk.tools import RiskWorkspace, risk_registry; '
            f'serve_mcp(risk_registry(RiskWorkspace(store={str(store)!r})))')
    steps = [{'operator': 'concentration', 'params': {'top': 3}}]
    async def go():
        async with Client(stdio(code)) as c:
            made = await c.call_tool('create_procedure', {'name': 'drivers', 'steps': steps})
            assert made.content[0].text.startswith('Created procedure proc_0001')
            await c.call_tool('create_task', {'procedure_id': 'proc_0001', 'start': '2026-06-24', 'end': '2026-06-30'})
            return await c.call_tool('run_task', {'task_id': 'task_0001'})
    ran = run_sync(go())
    assert not ran.is_error and "task_0001 'drivers 2026-06-24..2026-06-30' done" in ran.content[0].text
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before and store.exists()


def _inspector(*args:str) -> dict:
    r = subprocess.run([str(ensure_npm(INSPECTOR)), '--cli', *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
    return json.loads(r.stdout)


def test_inspector_cli_over_stdio():
    listed = _inspector(sys.executable, '-c', SERVE_RISK, '--method', 'tools/list')
    assert [t['name'] for t in listed['tools']] == RISK_TOOLS
    assert listed['tools'][0]['annotations']['readOnlyHint'] is True
    called = _inspector(sys.executable, '-c', SERVE_RISK, '--method', 'tools/call', '--tool-name', 'describe_dataset',
                        '--tool-arg', 'dataset=users')
    assert called['isError'] is False and called['content'][0]['text'].startswith('users [dimensions]: game accounts')


def test_inspector_cli_over_streamable_http(http_server):
    listed = _inspector(http_server, '--transport', 'http', '--method', 'tools/list')
    assert [t['name'] for t in listed['tools']] == RISK_TOOLS
    bad = _inspector(http_server, '--transport', 'http', '--method', 'tools/call', '--tool-name', 'describe_dataset',
                     '--tool-arg', 'dataset=nope')
    assert bad['isError'] is True and "unknown dataset 'nope'" in bad['content'][0]['text']


INIT = {'jsonrpc': '2.0', 'id': 1, 'method': 'initialize',
        'params': {'protocolVersion': '2025-06-18', 'capabilities': {}, 'clientInfo': {'name': 'probe', 'version': '1'}}}
MCP_HEADERS = {'Content-Type': 'application/json', 'Accept': 'application/json, text/event-stream'}


def _post(url:str, body=INIT, **headers) -> int:
    "The status of one MCP request, sent to a loopback address only."
    assert url.startswith('http://127.0.0.1:')
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url, content=content, headers={**MCP_HEADERS, **headers}, timeout=30).status_code


def test_loopback_http_checks_host_origin_and_body_size():
    "As measured before: a DNS-rebinding Host or a foreign Origin is refused, and so is a body over 4 MiB."
    from reach_nb.mcp_tools import MCPHTTPServer
    with MCPHTTPServer() as s:
        port = s.port
        assert _post(s.url) == 200
        assert _post(s.url, Host=f'localhost:{port}', Origin=f'http://localhost:{port}') == 200
        assert _post(s.url, Host=f'evil.example:{port}') == 421
        assert _post(s.url, Origin='http://evil.example') == 403
        assert _post(s.url, body=b' ' * (4 * 1024 * 1024 + 1)) == 413


@pytest.fixture
def public_server():
    "`serve_mcp` bound to every interface (0.0.0.0) with a token from REACH_MCP_TOKEN; it is only sent requests on 127.0.0.1."
    import os
    port, token = free_port(), 'T0ken-for-the-tests-only'
    code = (f"from reach_nb.mcp_tools import serve_mcp; serve_mcp(http_port={port}, host='0.0.0.0', "
            "allow_hosts=['mcp.example.org'])")
    proc = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, 'REACH_MCP_TOKEN': token})
    line = proc.stdout.readline()  # said once the port listens
    try:
        assert line.strip() == (f'Serving MCP over streamable HTTP; clients connect to http://0.0.0.0:{port}/mcp '
                                'with "Authorization: Bearer <token>"'), (line, proc.stderr.read()[-2000:] if not line else '')
        yield f'http://127.0.0.1:{port}/mcp', port, token
    finally:
        proc.terminate(); proc.wait(10)


def test_a_public_server_asks_for_its_token_and_still_checks_host_and_origin(public_server):
    url, port, token = public_server
    bearer = f'Bearer {token}'
    assert _post(url) == 401
    assert _post(url, Authorization='Bearer not-the-token') == 401
    assert _post(url, Authorization=token) == 401  # no "Bearer"
    assert _post(url, Authorization=bearer) == 200
    assert _post(url, Authorization=bearer, Host=f'mcp.example.org:{port}', Origin='https://mcp.example.org') == 200
    assert _post(url, Authorization=bearer, Host=f'evil.example:{port}') == 421
    assert _post(url, Authorization=bearer, Origin='http://evil.example') == 403


def test_a_public_server_serves_a_client_that_sends_the_token(public_server):
    from reach_nb.core import UserError
    from reach_nb.mcp_tools import MCPTools
    url, _, token = public_server
    with MCPTools() as hub:
        hub.add('risk', {'url': url, 'headers': {'Authorization': f'Bearer {token}'}})
        assert hub.registry.names == RISK_TOOLS
        assert hub.registry.call('describe_dataset', {'dataset': 'users'}).content.startswith('users [dimensions]')
        with pytest.raises(UserError, match="MCP server 'anon' could not be reached"): hub.add('anon', url)


def _refusal(**kw):
    "The `UserError` with which `serve_mcp(**kw)` refuses to serve (in a thread, so that serving instead fails the test)."
    import threading
    from reach_nb.core import UserError
    from reach_nb.mcp_tools import serve_mcp
    said = []
    def serve():
        try: serve_mcp(http_port=free_port(), **kw)
        except UserError as e: said.append(e)
    t = threading.Thread(target=serve, daemon=True)
    t.start(); t.join(20)
    assert said, f'serve_mcp({kw}) served instead of refusing'
    return str(said[0])


def test_a_server_open_to_the_network_needs_a_token(monkeypatch):
    monkeypatch.delenv('REACH_MCP_TOKEN', raising=False)
    for host in ['0.0.0.0', '::', '192.0.2.7']:  # refused before anything listens
        assert _refusal(host=host).startswith(f'no token for a server listening on {host}, which other machines can '
                                              'reach in option --token: give --token (or set REACH_MCP_TOKEN)')
    assert _refusal(host='0.0.0.0', token='secret').startswith('the token has 6 characters in option --token')
