"""The MCP commands of `reach`, in real processes: `reach ask --mcp CONFIG` gives the agent the tools of the servers
in a desktop-client config file (one that names no server is an error); `reach mcp serve --http PORT` serves the
risk tools to the SDK's client, says the URL to connect to, and refuses a port in use."""
import json, subprocess, sys
from browser import free_port
from test_mcp_server import _session, _check

NOTES = '''
from reach_nb.tools import ToolRegistry
from reach_nb.mcp_tools import serve_mcp
def lookup_note(key:str): # the note's key
    "Read a note the analysts left."
    return f"note {key}: channel c09 sells g02-i05 below list price"
serve_mcp(ToolRegistry([lookup_note]))
'''

def _reach(*args, cwd, timeout=180):
    return subprocess.run(['reach', *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def test_ask_uses_the_tools_of_an_mcp_server(tmp_path):
    (tmp_path/'notes.py').write_text(NOTES)
    cfg = tmp_path/'mcp.json'
    cfg.write_text(json.dumps({'mcpServers': {'notes': {'command': sys.executable, 'args': [str(tmp_path/'notes.py')]}}}))
    script = tmp_path/'script.json'
    script.write_text(json.dumps([{'thought': 'Check the notes.', 'action': {'tool': 'lookup_note', 'args': {'key': 'c09'}}},
                                  {'thought': 'Enough.', 'answer': 'c09 resells g02-i05 cheaply.'}]))
    r = _reach('ask', '--mcp', str(cfg), '--model', f'scripted:{script}', 'Who sells g02-i05 cheaply?', cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'note c09: channel c09 sells g02-i05 below list price' in r.stdout and 'stopped: answer' in r.stdout


def test_a_bad_mcp_config_is_one_error_line(tmp_path):
    (tmp_path/'bad.json').write_text('{"mcpServers": ')
    r = _reach('ask', '--mcp', str(tmp_path/'bad.json'), '--model', 'echo', 'q', cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith('Error:') and 'Traceback' not in r.stderr
    assert 'bad.json' in r.stderr


def test_mcp_serve_over_http_serves_the_risk_tools(tmp_path):
    import asyncio
    port = free_port()
    proc = subprocess.Popen(['reach', 'mcp', 'serve', '--http', str(port)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # said once the port listens
        url = f'http://127.0.0.1:{port}/mcp'
        assert line.strip().endswith(f'clients connect to {url}'), (line, proc.stderr.read()[-2000:] if not line else '')
        _check(asyncio.run(_session(url)))
    finally:
        proc.terminate(); proc.wait(10)


def test_mcp_serve_on_a_port_in_use_is_one_error_line(tmp_path):
    import socket
    with socket.create_server(('127.0.0.1', 0)) as taken:
        port = taken.getsockname()[1]
        r = _reach('mcp', 'serve', '--http', str(port), cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert r.stderr.startswith(f'Error: cannot listen on 127.0.0.1:{port} (Address already in use) in option --http: '
                               'give another port, or stop what listens on it'), r.stderr


def test_mcp_serve_on_an_address_not_here_names_the_host(tmp_path):
    r = _reach('mcp', 'serve', '--http', '8765', '--host', '192.0.2.1', '--token', 'x' * 16, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert r.stderr.startswith('Error: cannot listen on 192.0.2.1:8765 (Cannot assign requested address) in option '
                               '--host: give an address of this machine, e.g. 127.0.0.1'), r.stderr

def test_an_mcp_config_with_no_server_is_one_error_line(tmp_path):
    (tmp_path/'empty.json').write_text('{"mcpServers": {}}')
    r = _reach('ask', '--mcp', str(tmp_path/'empty.json'), '--model', 'echo', 'q', cwd=tmp_path)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert r.stderr.startswith(f'Error: "mcpServers" names no server in {tmp_path/"empty.json"}: add a server'), r.stderr


def test_mcp_serve_refuses_a_bad_port(tmp_path):
    r = _reach('mcp', 'serve', '--http', '70000', cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith('Error: port 70000 is not a port in option --http')


def test_mcp_serve_off_loopback_wants_a_token(tmp_path):
    r = _reach('mcp', 'serve', '--http', '8799', '--host', '0.0.0.0', cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith('Error: ') and 'token' in r.stderr and r.stderr.count('\n') == 1, r.stderr
