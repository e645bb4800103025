"""The MCP client against servers that others wrote, each started by the test as a subprocess:

- `mcp-server-time` and `mcp-server-git` (PyPI): the reference servers of the MCP project, in Python, that run
  offline with no key; time zones need no data beyond the package, and git works on a repository the test makes.
- `@modelcontextprotocol/server-everything` (npm): the reference server written with the TypeScript SDK, which
  returns every kind of content (images, embedded resources, resource links, structured content), takes numbers
  and enums, has a long-running tool, and also serves streamable HTTP.
The Python ones are in the dev extras (installed here on demand if missing); the npm one is installed on demand."""
import json, os, subprocess, sys, time

import httpx
import pytest

from reach_nb.llm.models import ScriptedLLM
from reach_nb.mcp_tools import MCPTools
from reach_nb.agents.react import ReActAgent

from mcp_servers.support import EVERYTHING, ensure_npm, ensure_python_package, free_port


def time_spec() -> dict:
    ensure_python_package('mcp_server_time', 'mcp-server-time')
    return {'command': sys.executable, 'args': ['-m', 'mcp_server_time', '--local-timezone', 'UTC']}


def git_spec(repo) -> dict:
    ensure_python_package('mcp_server_git', 'mcp-server-git')
    return {'command': sys.executable, 'args': ['-m', 'mcp_server_git', '--repository', str(repo)]}


@pytest.fixture
def repo(tmp_path):
    "A git repository with two commits."
    r = tmp_path / 'repo'
    env = os.environ | {'GIT_AUTHOR_NAME': 'Ana', 'GIT_AUTHOR_EMAIL': 'ana@example.invalid',
                        'GIT_COMMITTER_NAME': 'Ana', 'GIT_COMMITTER_EMAIL': 'ana@example.invalid'}
    subprocess.run(['git', 'init', '-q', '-b', 'main', str(r)], check=True)
    for i, msg in enumerate(['Add refund rules', 'Raise the refund threshold to 500']):
        (r / 'rules.txt').write_text(f'threshold {100 * (i + 4)}\n')
        subprocess.run(['git', '-C', str(r), 'add', 'rules.txt'], check=True, env=env)
        subprocess.run(['git', '-C', str(r), 'commit', '-q', '-m', msg], check=True, env=env)
    return r


def test_time_server():
    with MCPTools() as hub:
        assert hub.add('time', time_spec()) == ['get_current_time', 'convert_time']
        reg = hub.registry
        assert "- source_timezone (string, required)" in reg.render_prompt()
        ob = reg.call('convert_time', {'sourceTimezone': 'UTC', 'time': '12:00', 'target_timezone': 'Asia/Shanghai'})
        assert ob.ok and ob.args == {'source_timezone': 'UTC', 'time': '12:00', 'target_timezone': 'Asia/Shanghai'}
        assert json.loads(ob.content.split('\n(note')[0])['target']['datetime'].endswith('T20:00:00+08:00')
        ob = reg.call('get_current_time', {'timezone': 'Mars/Olympus'})
        assert (ob.ok, ob.error) == (False, 'tool_error')
        assert ob.content.startswith("MCP server 'time' reported an error from 'get_current_time':")
        assert 'Invalid timezone' in ob.content


def test_git_server(repo):
    with MCPTools() as hub:
        names = hub.add('git', git_spec(repo))
        assert {'git_status', 'git_log', 'git_show'} <= set(names)
        ob = hub.registry.call('git_log', {'repo_path': str(repo), 'max_count': '1'})
        assert ob.ok and 'Raise the refund threshold to 500' in ob.content and 'Add refund rules' not in ob.content
        assert 'working tree clean' in hub.registry.call('git_status', {'repoPath': str(repo)}).content


def test_everything_server_content_and_coercion():
    with MCPTools() as hub:
        hub.add('everything', {'command': str(ensure_npm(EVERYTHING)), 'args': ['stdio']})
        reg = hub.registry
        assert {'echo', 'get-sum', 'get-tiny-image', 'get-structured-content'} <= set(reg.names)
        assert reg.call('get-sum', {'a': '2', 'b': 3}).content == 'The sum of 2 and 3 is 5.'
        image = reg.call('get-tiny-image').content.split('\n')
        assert image[1].startswith('[image image/png, ') and image[1].endswith(' bytes: not shown, this agent reads text only]')
        ob = reg.call('get-structured-content', {'location': 'chicago'})  # an enum in the wrong case
        assert ob.ok and ob.args == {'location': 'Chicago'} and '"conditions"' in ob.content
        ob = reg.call('get-resource-reference', {'resourceType': 'Text', 'resourceId': 3})
        assert '[resource demo://resource/dynamic/text/3, text/plain]\nResource 3: This is a plaintext resource' in ob.content
        ob = reg.call('get-resource-links', {'count': 1})
        assert "[link to resource 'Blob Resource 1': demo://resource/dynamic/blob/1" in ob.content


def test_everything_server_timeout_then_next_call():
    with MCPTools() as hub:
        hub.add('everything', {'command': str(ensure_npm(EVERYTHING)), 'args': ['stdio'], 'timeout': 1})
        t0 = time.perf_counter()
        ob = hub.registry.call('trigger-long-running-operation', {'duration': 30, 'steps': 3})
        assert time.perf_counter() - t0 < 10 and (ob.ok, ob.error) == (False, 'timeout')
        assert hub.registry.call('echo', {'message': 'hi'}).content == 'Echo: hi'


def test_everything_server_over_streamable_http():
    port = free_port()
    proc = subprocess.Popen([str(ensure_npm(EVERYTHING)), 'streamableHttp'], env=os.environ | {'PORT': str(port)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url, deadline = f'http://127.0.0.1:{port}/mcp', time.monotonic() + 30
        while True:
            try: httpx.get(f'http://127.0.0.1:{port}/', timeout=1); break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None: raise RuntimeError('server-everything did not listen')
                time.sleep(0.2)
        with MCPTools() as hub:
            hub.add('remote', url)
            assert hub.registry.call('echo', {'message': 'over HTTP'}).content == 'Echo: over HTTP'
            assert hub.registry['echo'].source == "MCP server 'remote'"
    finally:
        proc.terminate(); proc.wait(10)


def test_an_agent_with_tools_from_two_servers_at_once(repo):
    both = json.dumps({'thought': 'The last commit, and noon UTC in Shanghai.', 'actions': [
        {'tool': 'git_log', 'args': {'repo_path': str(repo), 'max_count': 1}},
        {'tool': 'convert_time', 'args': {'source_timezone': 'UTC', 'time': '12:00', 'target_timezone': 'Asia/Shanghai'}}]})
    answer = json.dumps({'thought': 'Done.', 'answer': 'The threshold rose to 500; noon UTC is 20:00 in Shanghai.'})
    with MCPTools() as hub:
        hub.add('git', git_spec(repo))
        hub.add('time', time_spec())
        llm = ScriptedLLM([both, answer])
        run = ReActAgent(llm, hub.registry).run('What changed last, and what time is noon UTC in Shanghai?')
    system = llm.calls[0]['messages'][0]['content']
    assert "From MCP server 'git'." in system and "From MCP server 'time'." in system
    obs = run.steps[0].observations
    assert [(o.tool, o.ok) for o in obs] == [('git_log', True), ('convert_time', True)]
    assert 'Raise the refund threshold to 500' in obs[0].content and '20:00:00+08:00' in obs[1].content
    assert run.stop_reason == 'answer'
