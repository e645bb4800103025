"""The MCP client against a server that sends what a hostile one may (tests/mcp_servers/hostile_server.py): a schema
nested thousands of levels deep, broken schemas among good ones, thousands of tools, a flood of tools-changed notices,
and names that become the same once made safe. None of it may hang the client, cost it more than linear time, take the
good tools away, or end in a traceback."""
import json, os, subprocess, sys

import pytest

from reach_nb.mcp_tools import MCPTools
from reach_nb.tools import ToolRegistry

from mcp_servers.support import HERE

HOSTILE = HERE / 'hostile_server.py'
ROOT = HERE.parent.parent


def hostile(*args) -> dict:
    "An `mcpServers` entry that starts the hostile server."
    return {'command': sys.executable, 'args': [str(HOSTILE), *map(str, args)]}


def _reach(*args, cwd, timeout=120):
    return subprocess.run(['reach', *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def _script(path, *steps) -> str:
    path.write_text(json.dumps(list(steps)))
    return f'scripted:{path}'


def test_a_schema_too_deep_to_read_ends_the_start_at_once(tmp_path):
    "The JSON reader refuses the answer; the listing waiting for it stops there, not at a timeout (or never)."
    (tmp_path/'mcp.json').write_text(json.dumps({'mcpServers': {'deep': hostile('deep', 5000)}}))
    r = _reach('ask', '--mcp', str(tmp_path/'mcp.json'), '--model', 'echo', 'q', cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-3000:]
    assert ("Error: MCP server 'deep' did not start (its tools could not be listed: it sent a message that could not "
            "be read (Invalid JSON: recursion limit exceeded") in r.stderr, r.stderr[-3000:]


def test_a_schema_deeper_than_the_limit_skips_that_tool_only(capfd):
    "Deep enough to pass the JSON reader (80 levels), too deep for the walks over schemas: that tool is left out."
    with MCPTools() as hub:
        assert hub.add('deep', hostile('deep', 80)) == ['ok']
        assert hub.skipped == ["MCP server 'deep': skipped tool 'deep' (Tool 'deep': its schema nests more than 64 "
                               "levels deep.)"]
        assert hub.registry.call('ok', {'text': 'x'}).content == 'ok {"text": "x"}'
    assert "Note: MCP server 'deep': skipped tool 'deep' (Tool 'deep': its schema nests" in capfd.readouterr().err


def test_broken_schemas_skip_those_tools_with_a_note(capfd):
    with MCPTools() as hub:
        assert hub.add('h', hostile('invalid')) == ['first', 'last']
        assert hub.registry.call('last', {'text': 'x'}).content == 'last {"text": "x"}'
        skipped = hub.skipped
    err = capfd.readouterr().err
    assert [n.split(' (')[0] for n in skipped] == ["MCP server 'h': skipped tool 'not_a_schema'",
                                                   "MCP server 'h': skipped tool {'description': 'a tool with no name'}",
                                                   "MCP server 'h': skipped tool 'bad_props'"]
    assert all(f'Note: {n}' in err for n in skipped) and 'Traceback' not in err, err


def test_the_trace_says_which_tools_were_skipped():
    from reach_nb.llm.models import ScriptedLLM
    from reach_nb.agents.react import ReActAgent
    with MCPTools() as hub:
        hub.add('h', hostile('invalid'))
        reply = json.dumps({'thought': 'Nothing to look up.', 'answer': 'ok'})
        for ask_user in (False, True):  # with ask_user the agent works on a copy of the registry
            run = ReActAgent(ScriptedLLM([reply]), hub.registry, ask_user=ask_user).run('q')
            assert run.meta['tool_notes'] == hub.skipped and len(run.meta['tool_notes']) == 3


def test_broken_schemas_are_one_note_each_in_a_cli_run(tmp_path):
    (tmp_path/'mcp.json').write_text(json.dumps({'mcpServers': {'h': hostile('invalid')}}))
    model = _script(tmp_path/'script.json', {'thought': 'Use it.', 'action': {'tool': 'last', 'args': {'text': 'hi'}}},
                    {'thought': 'Done.', 'answer': 'It answered.'})
    r = _reach('ask', '--mcp', str(tmp_path/'mcp.json'), '--model', model, 'q', cwd=tmp_path)
    assert r.returncode == 0 and 'Traceback' not in r.stderr, r.stderr[-3000:]
    assert 'last {"text": "hi"}' in r.stdout
    notes = [line for line in r.stderr.splitlines() if line.startswith('Note: ')]
    assert len(notes) == 3 and "Note: MCP server 'h': skipped tool 'not_a_schema' (inputSchema: " in notes[0], r.stderr


def test_thousands_of_tools_are_one_change_of_the_registry():
    "A complexity proxy, not a timing: the registry rebuilds its indexes once per listing, not once per tool."
    reg = ToolRegistry()
    with MCPTools(reg) as hub:
        names = hub.add('many', hostile('many', 5000))
        assert (len(names), names[:2], names[-1], reg.version) == (5000, ['t0', 't1'], 't4999', 1)
        from reach_nb.mcp_tools import _block
        _block(hub.servers['many'].refresh())
        assert (len(reg), reg.version) == (5000, 2)
        assert reg.call('t4321', {'text': 'x'}).content == 't4321 {"text": "x"}'


FLOOD = '''
import sys
sys.path.insert(0, {tests!r})
from reach_nb.mcp_tools import MCPTools
from test_mcp_hostile import hostile
with MCPTools(mode={mode!r}) as hub:
    hub.add('h', hostile('flood', 3000))
    print(hub.registry.call('flood').content)
    print(hub.registry.call('lists').content)
'''


@pytest.mark.parametrize('mode', ['auto', 'legacy'])
def test_a_flood_of_changed_notices_is_coalesced(mode):
    "3,000 notices during one call: one listing runs, one more follows it; no task fails, nothing is printed."
    code = FLOOD.format(tests=str(HERE.parent), mode=mode)
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    flood, lists = r.stdout.split()[-3:-1], int(r.stdout.split()[-1])
    assert flood == ['flood', '{}'] and 2 <= lists <= 3, r.stdout  # the first listing, then one or two more
    assert r.stderr == '', r.stderr[-3000:]


def test_names_that_become_the_same_are_kept_apart():
    long = 'x' * 64
    with MCPTools() as hub:
        names = hub.add('h', hostile('collide'))
        assert names == ['a_b_2', 'a_b', long, 'x' * 56 + '_2', 'a_b_3']  # 'a_b' is already safe: it keeps its name
        said = [hub.registry.call(n, {'text': 'q'}).content.split(' {')[0] for n in names]
        assert said == ['a b', 'a_b', long + '_one', long + '_two', 'a.b']  # each call reaches its own tool
        assert hub.renamed == {'a_b_2': 'a_b', 'x' * 56 + '_2': long, 'a_b_3': 'a_b'}
        assert "MCP server 'h': tool 'a b' is called 'a_b_2' here: 'a_b' is another tool's" in hub.skipped
    with MCPTools() as again: assert again.add('h', hostile('collide')) == names  # the same names every time


def test_a_collision_with_local_tools_and_their_aliases():
    "Local tools keep their names and aliases; the server's tools go around them."
    def a_b(text:str): # what to say
        "A local tool named like a server's tool."
        return f'local {text}'
    def h__a_b(text:str): # what to say
        "A local tool with the name the server's prefix would give."
        return f'prefixed {text}'
    def cases(text:str): # what to say
        "A local tool that also answers to T0."
        return f'cases {text}'
    from reach_nb.tools import Tool
    with MCPTools(ToolRegistry([a_b, h__a_b, Tool(cases, aliases=['T0'])])) as hub:
        got = hub.add('h', hostile('collide'))
        assert got[:2] == ['h__a_b_3', 'h__a_b_2'] and got[-1] == 'h__a_b_4', got
        assert hub.add('many', hostile('many', 2)) == ['t0_2', 't1']  # 't0' is an alias of `cases`
        call = lambda n: hub.registry.call(n, {'text': 'q'}).content.split('\n')[0].split(' {')[0]
        assert [call(n) for n in ['a_b', 'h__a_b', 'T0', 'h__a_b_2', 'h__a_b_3', 't0_2']] == [
            'local q', 'prefixed q', 'cases q', 'a_b', 'a b', 't0']
